"""`tcert accuracy`: Max-of-K accuracy certificates (tcert.api.accuracy: brute | cubic | subcubic[:NAME] |
refine[:BUDGET], optionally under an input distribution); `tcert accuracy-estimate`; demo section."""

import json
import os
import sys
import time

from tcert.checker.errors import BadInput

from tcert.generator.cli import EXIT_OK, Outcome, outcome_command


@outcome_command
def cmd_accuracy(args) -> Outcome:
    """Generate one accuracy certificate; print its report (wall times only here, never in the file)."""
    import tcert.api as tc
    from tcert.api.files import writable
    from tcert.api.kinds import _accuracy_arguments
    out = writable(args.out)
    model = tc.load_model(args.model)
    _accuracy_arguments(model, args.strategy)
    distribution = read_distribution(args.distribution)
    c = model.config
    if args.strategy == "cubic" and c.d_vocab >= 256:
        print(f"note: the cubic checker does O(d_vocab^3 n_ctx^2) exact-integer work: measured 4.7 CPU-minutes "
              f"at d_vocab 512 (docs/accuracy.md); subcubic[:svd-rec|:exact-eqke][+eu] is the practical choice at "
              f"d_vocab {c.d_vocab}", file=sys.stderr)
    start = time.perf_counter()
    cert = tc.accuracy(model, args.strategy, args.true_count, allow_vacuous=args.force, distribution=distribution)
    cert.save(out)
    r = dict(cert.figures, seconds=round(time.perf_counter() - start, 3))
    vacuous = " (VACUOUS: true of every model; written because of --force)" if r["bound"] == 0 else ""
    return Outcome(EXIT_OK, "written", out, r,
                   f"{args.strategy}: " + (f"correct on >= {r['bound']} of {r['inputs']} inputs" if distribution is None
                                           else f"the inputs answered correctly weigh >= {r['bound']} under the "
                                                f"distribution") + f" ({r['bound_over_inputs']})"
                   + (f", bound/true {r['bound_over_true']}" if "bound_over_true" in r else "")
                   + f"; {r['complexity']}, {r['flops']:.3g} FLOPs, {r['seconds']:.2f} s -> {out}{vacuous}")


def add_commands(sub):
    """Register `tcert accuracy`."""
    p = sub.add_parser("accuracy", help="certify a lower bound on a Max-of-K model's accuracy")
    p.add_argument("--model", required=True, help="the model file")
    p.add_argument("--strategy", default="cubic",
                   help="brute | cubic | subcubic[:svd|:svd2|:svd-rec|:svd-recN|:exact-eqke][+eu] | "
                        "refine[:BUDGET] (BUDGET: FLOPs such as 2e7, a multiple of cubic's such as 2x, or max)")
    p.add_argument("--distribution", default=None,
                   help='claim under an input distribution: JSON (or a file of it), e.g. {"max_at_least": 32} or '
                        '{"position_weights": [[w_0(0), ...], ...]} (exact numbers)')
    p.add_argument("--out", required=True, help="where to write the certificate (its folder must exist)")
    p.add_argument("--true-count", type=int, default=None,
                   help="exact number of correct inputs, if known (reported as bound / true accuracy)")
    p.add_argument("--force", action="store_true",
                   help="write the certificate even when the bound is 0 (vacuous; otherwise exit 4)")
    p.set_defaults(func=cmd_accuracy)
    e = sub.add_parser("accuracy-estimate", help="importance-sampled accuracy ESTIMATE (no certificate; large K)")
    e.add_argument("--model", required=True, help="the model file")
    e.add_argument("--samples", type=int, default=100_000, help="number of stratified samples")
    e.add_argument("--seed", type=int, default=0, help="sampling seed")
    e.set_defaults(func=cmd_estimate)


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


@outcome_command
def cmd_estimate(args) -> Outcome:
    """An importance-sampled accuracy estimate (clearly labelled; never a certificate)."""
    import tcert.api as tc
    from tcert.api.kinds import is_maxofk
    from tcert.generator.accuracy.strategies import estimate_accuracy
    model = tc.load_model(args.model)
    if not is_maxofk(model):
        raise BadInput("accuracy-estimate: needs a 1-layer, 1-head, attention-only model with learned positions")
    start = time.perf_counter()
    r = estimate_accuracy(model, args.samples, args.seed)
    r["seconds"] = round(time.perf_counter() - start, 3)
    return Outcome(EXIT_OK, "estimate", None, r,
                   f"ESTIMATE (not a certificate): accuracy ~ {r['estimate']:.6f} +- {r['stderr']:.6f} (1 s.e.; "
                   f"{r['samples']} stratified samples, seed {r['seed']}, {r['seconds']:.2f} s)")


def demo_section(model, out_dir: str, backend: str) -> bool:
    """Cubic accuracy certificate for the demo model (the Max-of-4 anchor by default), then check it."""
    import tcert.api as tc
    from tcert.api.kinds import is_maxofk
    from tcert.generator.demo import check_and_report
    if not is_maxofk(model):
        print("[accuracy] skipped: the demo model is not a 1-layer attention-only Max-of-K model")
        return True
    c = model.config
    print(f"[accuracy] Max-of-{c.n_ctx}, d_vocab {c.d_vocab}: cubic proof over pure sequences "
          f"({c.d_vocab ** c.n_ctx} inputs)")
    start = time.perf_counter()
    try:
        cert = tc.accuracy(model, "cubic")
    except tc.InconclusiveError as e:
        print(f"  generator: {e}")
        return False
    path = cert.save(os.path.join(out_dir, "accuracy_cubic.json"))
    r = cert.figures
    exact = f"; {r['bound_over_true']} of the exact count {r['true_count']}" if "true_count" in r else ""
    print(f"  generator ({time.perf_counter() - start:.2f} s): correct on >= {r['bound']} of "
          f"{r['inputs']} inputs ({r['bound_over_inputs']}{exact}), "
          f"{len(cert.data['evidence']['cases'])} cases -> {path}")
    return check_and_report(path, model.path, backend)
