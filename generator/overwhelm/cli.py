"""`tcert overwhelm`: generate an overwhelm certificate (tcert.api.overwhelm); demo section."""

import json
import os

from tcert.checker.errors import BadInput

from tcert.generator import SHIPPED as SHIPPED_ROOT
from tcert.generator.cli import EXIT_INCONCLUSIVE, EXIT_OK, Outcome, outcome_command

SHIPPED = os.path.join(SHIPPED_ROOT, "overwhelm")
SHIPPED_MODEL = os.path.join(SHIPPED, "neox1l_tiny.safetensors")
SHIPPED_CERT = os.path.join(SHIPPED, "perm_lp.json")


def _question(model, args):
    """(prefix ids, query id, free spec) from the token-id or text options."""
    from tcert.api.kinds import _text_ids
    if args.prefix_text is not None:
        prefix = _text_ids(model, args.prefix_text, "--prefix-text")
    else:
        prefix = args.prefix_ids or ""
    if args.query_text is not None:
        ids = _text_ids(model, args.query_text, "--query-text")
        if len(ids) != 1:
            raise BadInput("--query-text must be exactly one token")
        query = ids[0]
    elif args.query_id is not None:
        query = args.query_id
    else:
        raise BadInput("give --query-id or --query-text")
    free = args.free
    if free.startswith("perm-text:"):
        free = "perm:" + ",".join(str(t) for t in _text_ids(model, free[len("perm-text:"):], "--free"))
    return prefix, query, free


@outcome_command
def cmd_overwhelm(args) -> Outcome:
    """Run Algorithm 1/2 (or the tight method) in floats; write a certificate only when Overwhelmed (else exit 4)."""
    import tcert.api as tc
    from tcert.api.files import writable
    out = writable(args.out)
    model = tc.load_model(args.model)
    prefix, query, free = _question(model, args)
    report_text = _formatter(args)
    try:
        cert = tc.overwhelm(model, prefix, query, free, args.method, args.value_bound, args.hints)
    except tc.InconclusiveError as e:
        return Outcome(EXIT_INCONCLUSIVE, "inconclusive", None, e.figures,
                       report_text(e.figures) + "\nno certificate written (Inconclusive)")
    cert.save(out)
    return Outcome(EXIT_OK, "written", out, cert.figures, report_text(cert.figures) + f"\nwrote {out}")


def _formatter(args):
    if args.free.startswith("upto:"):
        from tcert.generator.overwhelm.upto import format_report
    elif args.method == "tight":
        from tcert.generator.overwhelm.tight import format_report
    else:
        from tcert.generator.overwhelm.naive_lp import format_report
    return format_report


def add_commands(sub):
    """Register `tcert overwhelm`."""
    p = sub.add_parser("overwhelm", help="certify that a prefix overwhelms the model (paper Algorithms 1-5)")
    p.add_argument("--model", required=True, help="the model file")
    p.add_argument("--prefix-ids", help="comma-separated prefix token ids")
    p.add_argument("--prefix-text", help="the prefix as text (the tokenizer the model file names)")
    p.add_argument("--query-id", type=int, help="the query token id")
    p.add_argument("--query-text", help="the query token as text (one token)")
    p.add_argument("--free", required=True, help="any:N | perm:ID,ID,... | perm-text:TEXT | upto:N (every length 0..N)")
    p.add_argument("--method", choices=["naive", "lp", "tight"], default="lp",
                   help="lp: perm sets only (any:N and upto:N are refused: use naive); tight: competitor-wise, exact per head "
                        "(Dinkelbach), ignores --value-bound/--hints")
    p.add_argument("--value-bound", choices=["auto", "table", "norm"], default="auto", help="value bound")
    p.add_argument("--hints", choices=["auto", "tight", "float"], default="auto",
                   help="tight: hints from the checker's own enclosures (small models); float: float64 + slack")
    p.add_argument("--out", required=True, help="where to write the certificate (its folder must exist)")
    p.set_defaults(func=cmd_overwhelm)


def demo_section(model, out_dir: str, backend: str) -> bool:
    """Generate a perm/lp overwhelm certificate on the shipped tiny neox1l model and check it."""
    import tcert.api as tc
    from tcert.generator.demo import check_and_report
    from tcert.generator.overwhelm.naive_lp import format_report
    with open(SHIPPED_CERT) as f:
        claim = json.load(f)["claim"]
    m = tc.load_model(SHIPPED_MODEL)
    tokens = claim["free"]["tokens"]
    print(f"[overwhelm] {os.path.basename(SHIPPED_MODEL)}: prefix of {len(claim['prefix'])} tokens, "
          f"query {claim['query']}, every permutation of {tokens}")
    try:
        cert = tc.overwhelm(m, claim["prefix"], claim["query"], "perm:" + ",".join(map(str, tokens)), "lp")
    except tc.InconclusiveError as e:
        print("  " + format_report(e.figures).replace("\n", "\n  "))
        return False
    print("  " + format_report(cert.figures).replace("\n", "\n  "))
    path = cert.save(os.path.join(out_dir, "overwhelm.json"))
    return check_and_report(path, SHIPPED_MODEL, backend)
