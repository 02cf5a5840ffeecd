"""`tcert influence`: influence certificates and their one-input robustness corollary (tcert.api.influence);
demo section."""

import os

from tcert.generator import SHIPPED as SHIPPED_ROOT
from tcert.generator.cli import EXIT_OK, Outcome, outcome_command
from tcert.generator.influence.constants import DEFAULT_POWER


@outcome_command
def cmd_influence(args) -> Outcome:
    """Write an influence certificate (with the corollary when --tokens is given; exit 4 when none holds)."""
    import time
    import tcert.api as tc
    from tcert.api.files import writable
    out = writable(args.out)
    model = tc.load_model(args.model)
    start = time.perf_counter()
    if args.local:
        return local_outcome(args, model, out)
    cert = tc.influence(model, args.n_min, args.n_max, args.power, args.tokens, args.substitutions)
    cert.save(out)
    f = dict(cert.figures, seconds=round(time.perf_counter() - start, 3))
    return Outcome(EXIT_OK, "written", out, f, f"{summary_line(f, model.config.n_layers)}; wrote {out}")


def local_outcome(args, model, out) -> Outcome:
    """`--local --tokens x`: the local certificate on x (docs/influence.md, 'Local certificates')."""
    import tcert.api as tc
    from tcert.generator import certificate
    from tcert.generator.cli import parse_tokens
    from tcert.generator.influence.local import local_certificate
    if args.tokens is None:
        raise tc.BadInputError("--local needs --tokens")
    tokens = parse_tokens(args.tokens)
    if not 2 <= len(tokens) <= model.config.n_ctx or min(tokens) < 0 or max(tokens) >= model.config.d_vocab:
        raise tc.BadInputError(f"--tokens: need 2..{model.config.n_ctx} ids in [0, {model.config.d_vocab})")
    cert, info = local_certificate(model, tokens, args.substitutions)
    if cert is None:
        raise tc.InconclusiveError(f"no local certificate: {info['reason']}", info)
    certificate.write(out, cert)
    return Outcome(EXIT_OK, "written", out, info,
                   f"influence local: one change moves y by <= {info['change']:.6g}, p by <= {info['change_prob']:.4g}; "
                   f"token {info['predicted']} survives any {info['R']} non-final substitution(s) ({info['competitors']} "
                   f"competitor(s) along their own direction); wrote {out}")


def summary_line(f: dict, n_layers: int) -> str:
    """The influence bound (and corollary) in one line, from the figures tcert.api.influence returns."""
    r = "1/n" if f["rate"] == "inverse" else f"H_n^{n_layers - 1}/n"
    line = (f"influence: ||y - y'|| <= min({f['C']:.6g}*{r}, {f['C_abs']:.6g}), ||p - p'||_1 <= "
            f"min({f['C_prob']:.6g}*{r}, {f['C_prob_abs']:.4g}) for n in [{f['n_min']}, {f['n_max']}]")
    if "R" in f:
        line += f"; corollary: token {f['predicted']} survives any {f['R']} non-final substitution(s)"
    return line


def add_commands(sub):
    """Register `tcert influence`."""
    p = sub.add_parser("influence", help="certify that one non-final token moves the output by <= C r(n)")
    p.add_argument("--model", required=True, help="the model file")
    p.add_argument("--n-min", type=int, default=2, help="smallest input length covered (>= 2)")
    p.add_argument("--n-max", type=int, default=None, help="largest input length covered (default n_ctx)")
    p.add_argument("--power", type=int, default=DEFAULT_POWER,
                   help="operator norms via tr((W^T W)^(2^p)); larger p is tighter and slower to check")
    p.add_argument("--tokens", default=None, help="corollary: the input x (comma-separated ids)")
    p.add_argument("--substitutions", type=int, default=None,
                   help="corollary: R, the number of changed non-final tokens (default: the largest certifiable)")
    p.add_argument("--local", action="store_true",
                   help="with --tokens: certify x with its own attention pattern (1-layer models)")
    p.add_argument("--out", required=True, help="where to write the certificate (its folder must exist)")
    p.set_defaults(func=cmd_influence)


SHIPPED = os.path.join(SHIPPED_ROOT, "influence")
ROBUST_MODEL = os.path.join(SHIPPED, "robust2.safetensors")
ROBUST_TOKENS = [1, 2, 3, 4, 5, 6, 7, 0] * 8


def demo_section(model, out_dir: str, backend: str) -> bool:
    """The influence section: an influence certificate on the demo model, its corollary where the bound
    allows one, and the corollary on the shipped 2-layer causal model `certificates/influence/robust2`."""
    import tcert.api as tc
    from tcert.generator.demo import check_and_report
    cfg = model.config
    print(f"[influence] {cfg.n_layers} layer(s), {cfg.attention_dir} attention: how far can one non-final token move the output?")
    cert = tc.influence(model)
    path = cert.save(os.path.join(out_dir, "influence.json"))
    f, c = cert.figures, cert.claim
    print(f"  generator: ||y - y'|| <= min({f['C']:.6g} r(n), {f['C_abs']:.6g}), ||p - p'||_1 <= "
          f"min({f['C_prob']:.6g} r(n), {f['C_prob_abs']:.4g}), rate {c['rate']}, n in [{c['n_min']}, {c['n_max']}] -> {path}")
    ok = check_and_report(path, model.path, backend)
    # corollary on the demo model: an input whose answer sits at the last position is the best case
    tokens = [m % cfg.d_vocab for m in range(cfg.n_ctx - 1)] + [cfg.d_vocab - 1]
    try:
        cc = tc.influence(model, tokens=tokens)
        cpath = cc.save(os.path.join(out_dir, "influence_corollary.json"))
        print(f"  corollary on {tokens}: token {cc.figures['predicted']} survives any {cc.figures['R']} changed "
              f"non-final token(s) -> {cpath}")
        ok = check_and_report(cpath, model.path, backend) and ok
    except tc.InconclusiveError as e:
        print(f"  corollary on {tokens}: {e} (the bound is worst-case over all inputs)")
    robust = tc.load_model(ROBUST_MODEL)
    try:
        cc = tc.influence(robust, tokens=ROBUST_TOKENS)
    except tc.InconclusiveError as e:
        print(f"  shipped robust2 model: {e}")
        return False
    cpath = cc.save(os.path.join(out_dir, "influence_corollary_robust2.json"))
    i = cc.figures
    print(f"  corollary on shipped {os.path.basename(ROBUST_MODEL)} (2 layers, causal, rate H_n/n), n = {i['n']}: "
          f"next token {i['predicted']} survives ANY {i['R']} changed non-final tokens "
          f"(per change <= {i['per_change']:.4g}, margin {i['margin']:.4g}) -> {cpath}")
    return check_and_report(cpath, ROBUST_MODEL, backend) and ok
