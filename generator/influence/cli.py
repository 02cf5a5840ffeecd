"""`tcert influence`: influence certificates and their one-input robustness corollary; demo section."""

import json
import os
import time

from tcert.checker.errors import BadInput
from tcert.checker.modelfile import load_model

from tcert.generator import SHIPPED as SHIPPED_ROOT, certificate
from tcert.generator.cli import parse_tokens
from tcert.generator.influence.constants import DEFAULT_POWER, influence_certificate
from tcert.generator.influence.corollary import corollary_certificate


def cmd_influence(args) -> int:
    """Write an influence certificate (with the corollary when --tokens is given)."""
    model = load_model(args.model)
    cfg = model.config
    start = time.perf_counter()
    if args.tokens is None:
        if args.substitutions is not None:
            raise BadInput("--substitutions needs --tokens")
        cert, info = influence_certificate(model, args.n_min, args.n_max, args.power), {}
    else:
        tokens = parse_tokens(args.tokens)
        if not 2 <= len(tokens) <= cfg.n_ctx or min(tokens) < 0 or max(tokens) >= cfg.d_vocab:
            raise BadInput(f"--tokens: need 2..{cfg.n_ctx} ids in [0, {cfg.d_vocab})")
        cert, info = corollary_certificate(model, tokens, args.substitutions, args.n_min, args.n_max, args.power)
        if cert is None:
            msg = f"no corollary certificate: {info['reason']}"
            print(json.dumps(dict(info, verdict="none")) if args.json else msg)
            return 3
    certificate.write(args.out, cert)
    claim = cert["claim"]
    summary = {"out": args.out, "rate": claim["rate"], "n_min": claim["n_min"], "n_max": claim["n_max"],
               **{k: float(certio_fraction(claim[k])) for k in ("C", "C_prob", "C_abs", "C_prob_abs")},
               "seconds": round(time.perf_counter() - start, 3), **info}
    if args.json:
        print(json.dumps(summary))
    else:
        r = "1/n" if claim["rate"] == "inverse" else f"H_n^{cfg.n_layers - 1}/n"
        line = (f"influence: ||y - y'|| <= min({summary['C']:.6g}*{r}, {summary['C_abs']:.6g}), ||p - p'||_1 <= "
                f"min({summary['C_prob']:.6g}*{r}, {summary['C_prob_abs']:.4g}) for n in [{claim['n_min']}, {claim['n_max']}]")
        if "R" in info:
            line += f"; corollary: token {info['predicted']} survives any {info['R']} non-final substitution(s)"
        print(f"{line}; wrote {args.out}")
    return 0


def certio_fraction(text):
    """The Fraction an exact certificate number denotes."""
    from tcert.checker.numbers import parse_number
    return parse_number(text, "claim")


def add_commands(sub):
    """Register `tcert influence`."""
    p = sub.add_parser("influence", help="certify that one non-final token moves the output by <= C r(n)")
    p.add_argument("--model", required=True)
    p.add_argument("--n-min", type=int, default=2, help="smallest input length covered (>= 2)")
    p.add_argument("--n-max", type=int, default=None, help="largest input length covered (default n_ctx)")
    p.add_argument("--power", type=int, default=DEFAULT_POWER,
                   help="operator norms via tr((W^T W)^(2^p)); larger p is tighter and slower to check")
    p.add_argument("--tokens", default=None, help="corollary: the input x (comma-separated ids)")
    p.add_argument("--substitutions", type=int, default=None,
                   help="corollary: R, the number of changed non-final tokens (default: the largest certifiable)")
    p.add_argument("--out", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_influence)


SHIPPED = os.path.join(SHIPPED_ROOT, "influence")
ROBUST_MODEL = os.path.join(SHIPPED, "robust2.safetensors")
ROBUST_TOKENS = [1, 2, 3, 4, 5, 6, 7, 0] * 8


def demo_section(model, out_dir: str, backend: str) -> bool:
    """The influence section: an influence certificate on the demo model, its corollary where the bound
    allows one, and the corollary on the shipped 2-layer causal model `certificates/influence/robust2`."""
    from tcert.generator.demo import check_and_report
    cfg = model.config
    print(f"[influence] {cfg.n_layers} layer(s), {cfg.attention_dir} attention: how far can one non-final token move the output?")
    cert = influence_certificate(model)
    path = os.path.join(out_dir, "influence.json")
    certificate.write(path, cert)
    c = cert["claim"]
    f = {k: float(certio_fraction(c[k])) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
    print(f"  generator: ||y - y'|| <= min({f['C']:.6g} r(n), {f['C_abs']:.6g}), ||p - p'||_1 <= "
          f"min({f['C_prob']:.6g} r(n), {f['C_prob_abs']:.4g}), rate {c['rate']}, n in [{c['n_min']}, {c['n_max']}] -> {path}")
    ok = check_and_report(path, model.path, backend)
    # corollary on the demo model: an input whose answer sits at the last position is the best case
    tokens = [m % cfg.d_vocab for m in range(cfg.n_ctx - 1)] + [cfg.d_vocab - 1]
    cc, info = corollary_certificate(model, tokens)
    if cc is None:
        print(f"  corollary on {tokens}: no certificate: {info.get('reason', '')} (the bound is worst-case over all inputs)")
    else:
        cpath = os.path.join(out_dir, "influence_corollary.json")
        certificate.write(cpath, cc)
        print(f"  corollary on {tokens}: token {info['predicted']} survives any {info['R']} changed non-final token(s) -> {cpath}")
        ok = check_and_report(cpath, model.path, backend) and ok
    robust = load_model(ROBUST_MODEL)
    cc, info = corollary_certificate(robust, ROBUST_TOKENS)
    if cc is None:
        print(f"  shipped robust2 model: no corollary ({info.get('reason')})")
        return False
    cpath = os.path.join(out_dir, "influence_corollary_robust2.json")
    certificate.write(cpath, cc)
    print(f"  corollary on shipped {os.path.basename(ROBUST_MODEL)} (2 layers, causal, rate H_n/n), n = {info['n']}: "
          f"next token {info['predicted']} survives ANY {info['R']} changed non-final tokens "
          f"(per change <= {info['per_change']:.4g}, margin {info['margin']:.4g}) -> {cpath}")
    return check_and_report(cpath, ROBUST_MODEL, backend) and ok
