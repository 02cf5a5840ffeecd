"""`tcert accuracy`: Max-of-K accuracy certificates (brute | cubic | subcubic[:NAME] | refine[:BUDGET]), optionally
under an input distribution; demo section."""

import json
import os
import sys
import time

from tcert.checker.errors import BadInput
from tcert.checker.modelfile import load_model

from tcert.generator import certificate

STRATEGIES = ("brute", "cubic", "subcubic", "refine")
# Exact counts established by verified brute-force certificates (model file SHA-256 -> correct inputs).
KNOWN_EXACT = {"9dbb098693d185abc736125322aef131a5c7acfd9d743c784181279764d59f25": 16_763_235}  # maxof4_seed123


def is_maxofk(model) -> bool:
    """Whether the model has the architecture the accuracy kind speaks about."""
    c = model.config
    return (c.n_layers == 1 and c.n_heads == 1 and c.attn_only and not c.has_ln and not c.rotary
            and c.n_ctx >= 2 and c.d_vocab >= 2)


def cmd_accuracy(args) -> int:
    """Generate one accuracy certificate; print its report (wall times only here, never in the file)."""
    from tcert.generator.accuracy.strategies import make_certificate
    model = load_model(args.model)
    if not is_maxofk(model):
        raise BadInput("accuracy: needs a 1-layer, 1-head, attention-only model with learned positions")
    name = args.strategy.partition(":")[0]
    if name not in STRATEGIES or (name in ("brute", "cubic") and ":" in args.strategy):
        raise BadInput(f"--strategy must be one of brute, cubic, subcubic[:NAME], refine[:BUDGET] (got {args.strategy!r})")
    try:
        if args.strategy.startswith("subcubic"):
            from tcert.generator.accuracy.subcubic import parse_name
            parse_name(args.strategy.partition(":")[2] or None)
        if args.strategy.startswith("refine"):
            from tcert.generator.accuracy.refine import parse_budget
            parse_budget(args.strategy.partition(":")[2] or None)
    except ValueError as e:
        raise BadInput(f"--strategy: {e}") from None
    distribution = read_distribution(args.distribution)
    c = model.config
    if args.strategy == "brute" and c.d_vocab ** c.n_ctx > 1 << 26:
        raise BadInput(f"brute force over {c.d_vocab}^{c.n_ctx} inputs is out of range")
    if args.strategy == "cubic" and c.d_vocab >= 256:
        print(f"note: the cubic checker does O(d_vocab^3 n_ctx^2) exact-integer work: measured 4.7 CPU-minutes "
              f"at d_vocab 512 (docs/accuracy.md); subcubic[:svd-rec|:exact-eqke][+eu] is the practical choice at "
              f"d_vocab {c.d_vocab}", file=sys.stderr)
    true_count = args.true_count if args.true_count is not None else KNOWN_EXACT.get(model.sha256)
    start = time.perf_counter()
    cert, report = make_certificate(model, args.strategy, true_count, distribution)
    certificate.write(args.out, cert)
    report.update(out=args.out, seconds=round(time.perf_counter() - start, 3))
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        what = f"correct on >= {report['bound']} of {report['inputs']} inputs" if distribution is None else \
            f"the inputs answered correctly weigh >= {report['bound']} under the distribution"
        print(f"{args.strategy}: {what} ({report['bound_over_inputs']})"
              + (f", bound/true {report['bound_over_true']}" if "bound_over_true" in report else "")
              + f"; {report['complexity']}, {report['flops']:.3g} FLOPs, {report['seconds']:.2f} s -> {args.out}")
    return 0


def read_distribution(text):
    """--distribution: None, a JSON object (claim.distribution's form) inline, or the path of a file holding
    one. Malformed: BadInput (the checker's own parser validates the fields when the claim is made)."""
    if text is None:
        return None
    try:
        if text.lstrip().startswith("{"):
            value = json.loads(text)
        else:
            with open(text, encoding="utf-8") as f:
                value = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"--distribution: not a JSON object or a file holding one ({str(e)[:60]})") from None
    if not isinstance(value, dict):
        raise BadInput("--distribution: must be a JSON object")
    return value


def add_commands(sub):
    """Register `tcert accuracy`."""
    p = sub.add_parser("accuracy", help="certify a lower bound on a Max-of-K model's accuracy")
    p.add_argument("--model", required=True)
    p.add_argument("--strategy", default="cubic",
                   help="brute | cubic | subcubic[:svd|:svd2|:svd-rec|:svd-recN|:exact-eqke][+eu] | "
                        "refine[:BUDGET] (BUDGET: FLOPs such as 2e7, a multiple of cubic's such as 2x, or max)")
    p.add_argument("--distribution", default=None,
                   help='claim under an input distribution: JSON (or a file of it), e.g. {"max_at_least": 32} or '
                        '{"position_weights": [[w_0(0), ...], ...]} (exact numbers)')
    p.add_argument("--out", required=True)
    p.add_argument("--true-count", type=int, default=None,
                   help="exact number of correct inputs, if known (reported as bound / true accuracy)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_accuracy)
    e = sub.add_parser("accuracy-estimate", help="importance-sampled accuracy ESTIMATE (no certificate; large K)")
    e.add_argument("--model", required=True)
    e.add_argument("--samples", type=int, default=100_000)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_estimate)


def cmd_estimate(args) -> int:
    """Print an importance-sampled accuracy estimate (clearly labelled; never a certificate)."""
    from tcert.generator.accuracy.strategies import estimate_accuracy
    model = load_model(args.model)
    if not is_maxofk(model):
        raise BadInput("accuracy-estimate: needs a 1-layer, 1-head, attention-only model with learned positions")
    start = time.perf_counter()
    r = estimate_accuracy(model, args.samples, args.seed)
    r["seconds"] = round(time.perf_counter() - start, 3)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"ESTIMATE (not a certificate): accuracy ~ {r['estimate']:.6f} +- {r['stderr']:.6f} (1 s.e.; "
              f"{r['samples']} stratified samples, seed {r['seed']}, {r['seconds']:.2f} s)")
    return 0


def demo_section(model, out_dir: str, backend: str) -> bool:
    """Cubic accuracy certificate for the demo model (the Max-of-4 anchor by default), then check it."""
    from tcert.generator.accuracy.strategies import make_certificate
    from tcert.generator.demo import check_and_report
    if not is_maxofk(model):
        print("[accuracy] skipped: the demo model is not a 1-layer attention-only Max-of-K model")
        return True
    c = model.config
    print(f"[accuracy] Max-of-{c.n_ctx}, d_vocab {c.d_vocab}: cubic proof over pure sequences "
          f"({c.d_vocab ** c.n_ctx} inputs)")
    start = time.perf_counter()
    cert, report = make_certificate(model, "cubic", KNOWN_EXACT.get(model.sha256))
    path = os.path.join(out_dir, "accuracy_cubic.json")
    certificate.write(path, cert)
    exact = f"; {report['bound_over_true']} of the exact count {report['true_count']}" \
        if "true_count" in report else ""
    print(f"  generator ({time.perf_counter() - start:.2f} s): correct on >= {report['bound']} of "
          f"{report['inputs']} inputs ({report['bound_over_inputs']}{exact}), "
          f"{len(cert['evidence']['cases'])} cases -> {path}")
    return check_and_report(path, model.path, backend)
