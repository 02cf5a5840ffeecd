"""`tcert influence`: influence certificates and their one-input robustness corollary; demo section."""

import json
import os
import time

from checker.errors import BadInput
from checker.modelfile import load_model

from . import certio
from .commands import parse_tokens
from .influence import DEFAULT_POWER, corollary_certificate, influence_certificate


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
    certio.write(args.out, cert)
    claim = cert["claim"]
    summary = {"out": args.out, "rate": claim["rate"], "n_min": claim["n_min"], "n_max": claim["n_max"],
               "C": float(certio_fraction(claim["C"])), "C_prob": float(certio_fraction(claim["C_prob"])),
               "seconds": round(time.perf_counter() - start, 3), **info}
    if args.json:
        print(json.dumps(summary))
    else:
        r = "1/n" if claim["rate"] == "inverse" else f"H_n^{cfg.n_layers - 1}/n"
        line = (f"influence: ||y - y'|| <= {summary['C']:.6g}*{r}, ||p - p'||_1 <= {summary['C_prob']:.6g}*{r} "
                f"for n in [{claim['n_min']}, {claim['n_max']}]")
        if "R" in info:
            line += f"; corollary: token {info['predicted']} survives any {info['R']} non-final substitution(s)"
        print(f"{line}; wrote {args.out}")
    return 0


def certio_fraction(text):
    """The Fraction an exact certificate number denotes."""
    from checker.exact import parse_number
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


def demo_section(model, out_dir: str, backend: str) -> bool:
    """The influence section: one influence certificate and its corollary on the demo model."""
    from .demo import check_and_report
    cfg = model.config
    print(f"[influence] {cfg.attention} attention, {cfg.n_layers} layer(s): how far can one non-final token move the output?")
    cert = influence_certificate(model)
    path = os.path.join(out_dir, "influence.json")
    certio.write(path, cert)
    c = cert["claim"]
    print(f"  generator: C = {float(certio_fraction(c['C'])):.6g}, C' = {float(certio_fraction(c['C_prob'])):.6g}, "
          f"rate {c['rate']}, n in [{c['n_min']}, {c['n_max']}] -> {path}")
    ok = check_and_report(path, model.path, backend)
    best = None
    for start in range(cfg.d_vocab):
        tokens = [(start + 5 * i) % cfg.d_vocab for i in range(cfg.n_ctx)]
        cc, info = corollary_certificate(model, tokens, None)
        if cc is not None:
            best = (cc, info, tokens)
            break
        if best is None or info.get("max_R", 0) >= 0:
            best = (None, info, tokens)
        if start >= 16:
            break
    cc, info, tokens = best
    if cc is None:
        print(f"  corollary on {tokens}: the certified bound moves the logit gap by "
              f"{info.get('per_change', float('nan')):.4g} per change, more than the margin "
              f"{info.get('margin', info.get('gap', 0)):.4g}: no substitution count is certifiable here")
        return ok
    cpath = os.path.join(out_dir, "influence_corollary.json")
    certio.write(cpath, cc)
    print(f"  corollary on {tokens}: next token {info['predicted']} survives any {info['R']} changed non-final "
          f"token(s) (per-change gap movement {info['per_change']:.4g} < margin {info['margin']:.4g}) -> {cpath}")
    return check_and_report(cpath, model.path, backend) and ok
