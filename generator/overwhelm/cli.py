"""`tcert overwhelm`: generate (and optionally self-check) an overwhelm certificate; demo section."""

import json
import os

from tcert.checker.errors import BadInput
from tcert.checker.modelfile import load_model

from tcert.generator import SHIPPED as SHIPPED_ROOT, certificate
from tcert.generator.cli import parse_tokens

SHIPPED = os.path.join(SHIPPED_ROOT, "overwhelm")
SHIPPED_MODEL = os.path.join(SHIPPED, "neox1l_tiny.safetensors")
SHIPPED_CERT = os.path.join(SHIPPED, "perm_lp.json")


def _tokenizer_ids(model, text, what):
    """Token ids of `text` with the tokenizer the model file names (tcert.generator.train.text_data), or BadInput."""
    from tcert.generator.train.text_data import encode, model_tokenizer
    ids = encode(model_tokenizer(model.path, model.config.tokenizer_name), text)
    if not ids:
        raise BadInput(f"{what}: {text[:40]!r} encodes to no tokens")
    return ids


def cmd_overwhelm(args) -> int:
    """Run Algorithm 1/2 in floats; write a certificate only when Overwhelmed (else exit 3)."""
    from tcert.generator.overwhelm.claim import parse_free
    from tcert.generator.overwhelm.naive_lp import format_report, generate
    model = load_model(args.model)
    if args.prefix_text is not None:
        prefix = _tokenizer_ids(model, args.prefix_text, "--prefix-text")
    else:
        prefix = parse_tokens(args.prefix_ids or "")
    if args.query_text is not None:
        ids = _tokenizer_ids(model, args.query_text, "--query-text")
        if len(ids) != 1:
            raise BadInput("--query-text must be exactly one token")
        query = ids[0]
    elif args.query_id is not None:
        query = args.query_id
    else:
        raise BadInput("give --query-id or --query-text")
    free = args.free
    if free.startswith("upto:"):   # generator/overwhelm/upto.py
        from tcert.generator.overwhelm.upto import format_report as upto_report, generate_upto, parse_upto
        cert, report = generate_upto(model, prefix, query, parse_upto(free), args.method, args.value_bound,
                                     args.hints)
        return _finish(args, cert, report, upto_report)
    if free.startswith("perm-text:"):
        free = "perm:" + ",".join(str(t) for t in _tokenizer_ids(model, free[len("perm-text:"):], "--free"))
    spec = parse_free(free)
    c = model.config
    toks = prefix + [query] + (spec[2] or [])
    if any(not 0 <= t < c.d_vocab for t in toks):
        raise BadInput(f"token ids must lie in [0, {c.d_vocab})")
    if len(prefix) + spec[1] + 1 > c.n_ctx or spec[1] < 1:
        raise BadInput(f"need 1 <= n_free and n_fix + n_free + 1 <= n_ctx = {c.n_ctx}")
    if args.method == "tight":   # generator/overwhelm/tight.py
        from tcert.generator.overwhelm.tight import format_report, generate_tight
        cert, report = generate_tight(model, prefix, query, spec)
    else:
        cert, report = generate(model, prefix, query, spec, args.method, args.value_bound, args.hints)
    return _finish(args, cert, report, format_report)


def _finish(args, cert, report, format_report) -> int:
    """Write the certificate (if any), print the report; exit 0 when written, else 3."""
    if cert is not None:
        certificate.write(args.out, cert)
        report["out"] = args.out
    if args.json:
        print(json.dumps(report, default=float))
    else:
        print(format_report(report))
        print(f"wrote {args.out}" if cert is not None else "no certificate written (Inconclusive)")
    return 0 if cert is not None else 3


def add_commands(sub):
    """Register `tcert overwhelm`."""
    p = sub.add_parser("overwhelm", help="certify that a prefix overwhelms the model (paper Algorithms 1-5)")
    p.add_argument("--model", required=True)
    p.add_argument("--prefix-ids", help="comma-separated prefix token ids")
    p.add_argument("--prefix-text")
    p.add_argument("--query-id", type=int)
    p.add_argument("--query-text")
    p.add_argument("--free", required=True, help="any:N | perm:ID,ID,... | perm-text:TEXT | upto:N (every length 0..N)")
    p.add_argument("--method", choices=["naive", "lp", "tight"], default="lp",
                   help="tight: competitor-wise, exact per head (Dinkelbach); ignores --value-bound/--hints")
    p.add_argument("--value-bound", choices=["auto", "table", "norm"], default="auto")
    p.add_argument("--hints", choices=["auto", "tight", "float"], default="auto",
                   help="tight: hints from the checker's own enclosures (small models); float: float64 + slack")
    p.add_argument("--out", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_overwhelm)


def demo_section(model, out_dir: str, backend: str) -> bool:
    """Generate a perm/lp overwhelm certificate on the shipped tiny neox1l model and check it."""
    from tcert.generator.demo import check_and_report
    from tcert.generator.overwhelm.naive_lp import format_report, generate
    with open(SHIPPED_CERT) as f:
        claim = json.load(f)["claim"]
    m = load_model(SHIPPED_MODEL)
    spec = ("perm", len(claim["free"]["tokens"]), claim["free"]["tokens"])
    print(f"[overwhelm] {os.path.basename(SHIPPED_MODEL)}: prefix of {len(claim['prefix'])} tokens, "
          f"query {claim['query']}, every permutation of {spec[2]}")
    cert, report = generate(m, claim["prefix"], claim["query"], spec, "lp")
    print("  " + format_report(report).replace("\n", "\n  "))
    if cert is None:
        return False
    path = os.path.join(out_dir, "overwhelm.json")
    certificate.write(path, cert)
    return check_and_report(path, SHIPPED_MODEL, backend)
