"""`tcert experiment overwhelm-repetition`: the overwhelm paper's appendix F on a model without positions.

The repetition restriction: fixed string s = r repeated n_fix times, query q = r, free string any
n_free tokens (`any:n_free`). On a model with positional_embedding_type "none" (`tcert train text
--no-rope`), Lemma F.3 says the sample X = e_r^n (the free tokens set to r too) has the same logits
for every n, so PTP does not depend on n_fix, while every fixed position has the query's own score,
so alpha_fix = n_fix + 1 exactly and the free mass bounds amin_h, amax_h (per head) and the value
table bounds lo_hj, hi_hj do not depend on n_fix either. The naive bound is then a closed form in n:

    beta_min(n) = amin / (n + 1 + amin),  beta_max(n) = amax / (n + 1 + amax),
    W(n) = max_j sum_h (beta_max hi if hi >= 0 else beta_min hi) - (beta_max lo if lo <= 0 else beta_min lo)
         ~ K / n  as n -> infinity,  K = max_j sum_h (amax hi+ + amin hi- - amax lo- - amin lo+)

(hi+ = max(hi, 0), ...), which is Theorem F.2's convergence: W -> 0 at rate n_free / n_fix, so once
W(n) < PTP/2 the model's output is fixed for every free string. The experiment measures W (naive,
tight) per cell with the certificate generators, checks the certificates, and plots the measured
points with this predicted curve, its asymptote K/n and the predicted crossing n* (W(n*) = PTP/2).
"""

import math
import os
import time

import numpy as np

from tcert.checker.errors import BadInput
from tcert.generator.experiments import execution, families

COLUMNS = ["id", "repeated", "n_fix", "n_free", "method", "W", "W_float", "ptp", "margin", "tight_bound",
           "W_predicted", "verdict", "predicted", "gen_seconds", "checked", "check_seconds", "certificate"]


def default_lengths(n_ctx, n_free):
    """1, 3, 10, 30, ... below the context, then the longest prefix that fits (n_fix + n_free + 1 <= n_ctx)."""
    top = n_ctx - n_free - 1
    out = [n for e in range(0, 8) for n in (10 ** e, 3 * 10 ** e) if n < top]
    return out + [top]


def closed_form(model, r, n_free):
    """The n-independent parts of the naive bound under the repetition restriction (float64):
    per head (amin, amax, lo, hi) with lo/hi the per-logit extremes of the value table, the sample's
    PTP, and alpha_fix at n_fix = 1 (which must be 2: the consistency check of the argument)."""
    T, WO, WU = families.overwhelm_float_tables(model, [r], r, n_free)
    heads = []
    for h in range(model.config.n_heads):
        e = np.exp(T["S"][h] - T["lq"][h])
        D = (T["values"][h] @ WO[h]) @ WU
        heads.append((float(e.min(axis=0).sum()), float(e.max(axis=0).sum()), D.min(axis=0), D.max(axis=0)))
    lg = np.sort(families.logits(model, np.asarray([[r] * (n_free + 2)]))[0])
    return heads, float(lg[-1] - lg[-2]), [float(a) for a in T["alpha_fix"]]


def predicted_w(heads, n):
    """W(n) of the module docstring for an array of n (float64)."""
    n = np.asarray(n, dtype=np.float64)[:, None]
    total = 0.0
    for amin, amax, lo, hi in heads:
        bmin, bmax = amin / (n + 1 + amin), amax / (n + 1 + amax)
        top = np.where(hi >= 0, bmax * hi, bmin * hi)
        bottom = np.where(lo <= 0, bmax * lo, bmin * lo)
        total = total + (top - bottom)
    return total.max(axis=1)


def asymptote_k(heads):
    """K with W(n) ~ K / n."""
    total = 0.0
    for amin, amax, lo, hi in heads:
        total = total + (amax * np.maximum(hi, 0) + amin * np.minimum(hi, 0)
                         - amax * np.minimum(lo, 0) - amin * np.maximum(lo, 0))
    return float(np.max(total))


def crossing(heads, ptp, n_max=10 ** 12):
    """The smallest real n >= 1 with W(n) < PTP/2 (bisection; W decreases in n), or None."""
    if predicted_w(heads, [n_max])[0] >= ptp / 2:
        return None
    lo, hi = 1.0, float(n_max)
    if predicted_w(heads, [lo])[0] < ptp / 2:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if predicted_w(heads, [mid])[0] >= ptp / 2 else (lo, mid)
    return hi


def fitted_slope(rows):
    """Least-squares slope of log W against log n_fix over the largest half of the lengths."""
    pts = sorted((r["n_fix"], r["W"]) for r in rows)
    pts = pts[len(pts) // 2:]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def plot(rows, theory, path, n_ctx):
    """One panel per repeated token: measured W (naive, tight), predicted W(n), K/n, PTP/2, crossing."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tcert.generator.experiments.overwhelm_paper import COLORS
    tokens = sorted(theory, key=lambda r: theory[r]["label"])
    fig, axes = plt.subplots(1, len(tokens), figsize=(4.2 * len(tokens), 3.8), squeeze=False)
    for ax, r in zip(axes[0], tokens):
        th = theory[r]
        grid = np.geomspace(1, n_ctx, 200)
        ax.plot(grid, predicted_w(th["heads"], grid), color="C0", lw=0.8, alpha=0.6, label="W naive predicted")
        ax.plot(grid, th["K"] / grid, color="gray", ls=":", lw=0.8, label=f"K/n (K={th['K']:.3g})")
        ax.axhline(th["ptp"] / 2, color="gray", ls="--", label="PTP/2")
        for method in ("naive", "tight"):
            pts = sorted((x["n_fix"], x["W"], x["verdict"]) for x in rows if x["repeated"] == r and x["method"] == method)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="none", marker=".", color=COLORS[method],
                    label=f"W {method}")
            cert = [(p[0], p[1]) for p in pts if p[2] == "Overwhelmed"]
            if cert:
                ax.scatter(*zip(*cert), marker="o", s=50, facecolors="none", edgecolors=COLORS[method], zorder=3)
        if th["n_star"]:
            ax.axvline(th["n_star"], color="C0", lw=0.6, ls="-.", label=f"predicted n* = {th['n_star']:.0f}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"r = {th['label']!r}", fontsize=10)
        ax.set_xlabel("n_fix (r repeated)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("worst-case deviation W (circled: certified)")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def cmd_overwhelm_repetition(args):
    """Run the repetition sweep (resuming), check certificates, write CSV, summary and plot."""
    from tcert.generator.experiments.overwhelm_paper import check_later, run_tasks, write_csv
    model = families.load_model(args.model)
    c = model.config
    if c.positional_embedding_type != "none":
        print("note: appendix F assumes a model without positions; this one is "
              f"{c.positional_embedding_type!r}: PTP and the predicted curve are then only indicative")
    tok = families.model_tokenizer(args.model, c.tokenizer_name) if c.tokenizer_name else None
    tokens = {}
    for word in args.tokens.split():
        ids = [int(word)] if word.isdigit() else families.encode(tok, word)
        if len(ids) != 1:
            raise BadInput(f"--tokens: {word!r} is not one token in this vocabulary")
        tokens[ids[0]] = word
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else default_lengths(c.n_ctx, args.n_free)
    if max(lengths) + args.n_free + 1 > c.n_ctx:
        raise BadInput(f"n_fix {max(lengths)} + n_free {args.n_free} + 1 exceeds n_ctx {c.n_ctx}")
    os.makedirs(args.out_dir, exist_ok=True)
    cert_rel = os.path.relpath(args.cert_dir, args.out_dir) if args.cert_dir else "certs"
    start = time.perf_counter()
    theory = {}
    for r, word in tokens.items():
        heads, ptp, alpha_fix = closed_form(model, r, args.n_free)
        theory[r] = {"label": word, "heads": heads, "ptp": ptp, "K": asymptote_k(heads),
                     "n_star": crossing(heads, ptp), "alpha_fix_n1": alpha_fix}
    tasks = [{"id": f"rep-{r}-n{n}-{m}", "kind": "repetition", "n_fix": n, "sample": 0, "repeated": r,
              "free_name": f"any:{args.n_free}", "method": m, "step": None, "prefix": [r] * n, "query": r,
              "free_spec": ("any", args.n_free, None), "cert": os.path.join(cert_rel, f"rep-{r}-n{n}-{m}.json"),
              "check": not args.no_check and (args.check_max_n is None or n <= args.check_max_n),
              "backend": args.backend}
             for r in tokens for n in lengths for m in args.methods.split(",")]
    with execution.Executor(execution.options(args)) as ex:
        rows = run_tasks(ex, tasks, args.model, args.out_dir, "cells.jsonl", "repetition sweep")
        failed = [x for x in rows if x.get("status") != "done"]
        rows = [x for x in rows if x.get("status") == "done"]
        if args.check_limit:
            rows = check_later(ex, rows, args.check_limit, args.out_dir, "cells.jsonl", args.model, args.backend)
        if args.check_first:   # the smallest certified n_fix of each (token, method): where convergence begins
            firsts = {}
            for x in sorted(rows, key=lambda x: x["n_fix"]):
                if x["verdict"] == "Overwhelmed":
                    firsts.setdefault((x["repeated"], x["method"]), x)
            todo = [x for x in firsts.values() if x["checked"] is None]
            done = {x["id"]: x for x in check_later(ex, todo, len(todo), args.out_dir, "cells.jsonl", args.model,
                                                    args.backend)}
            rows = [done.get(x["id"], x) for x in rows]
    for row in rows:   # the closed form is the naive bound's; tight has none
        row["W_predicted"] = float(predicted_w(theory[row["repeated"]]["heads"], [row["n_fix"]])[0]) \
            if row["method"] == "naive" else None
    write_csv(rows, os.path.join(args.out_dir, "points.csv"), COLUMNS)
    plot(rows, theory, os.path.join(args.out_dir, "fig_repetition.png"), c.n_ctx)
    summary = {}
    for r, th in theory.items():
        mine = [x for x in rows if x["repeated"] == r]
        naive = [x for x in mine if x["method"] == "naive"]
        first = {m: min((x["n_fix"] for x in mine if x["method"] == m and x["verdict"] == "Overwhelmed"), default=None)
                 for m in args.methods.split(",")}
        summary[th["label"]] = {
            "token": r, "ptp": th["ptp"], "K": th["K"], "predicted_n_star": th["n_star"],
            "alpha_fix_at_n1": th["alpha_fix_n1"], "fitted_slope_naive": fitted_slope(naive),
            "max_rel_gap_measured_vs_predicted_naive": max(
                (abs(x["W_float"] - x["W_predicted"]) / x["W_predicted"] for x in naive), default=None),
            "ptp_range": [min(x["ptp"] for x in mine), max(x["ptp"] for x in mine)],
            "first_certified_n_fix": first}
    execution.write_json(os.path.join(args.out_dir, "summary.json"), summary)   # strict: no NaN
    certified = [x for x in rows if x["verdict"] == "Overwhelmed"]
    checked = [x for x in certified if x["checked"] is not None]
    ok = sum(x["checked"] == "VERIFIED" for x in checked)
    for label, s in summary.items():
        slope = "-" if s["fitted_slope_naive"] is None else f"{s['fitted_slope_naive']:.4f}"
        print(f"r={label!r}: PTP {s['ptp']:.4g}, K {s['K']:.4g}, predicted n* {s['predicted_n_star']}, "
              f"fitted slope {slope}, first certified {s['first_certified_n_fix']}")
    print(f"{len(rows)} cells in {time.perf_counter() - start:.0f} s this run; {len(certified)} Overwhelmed; "
          f"{len(checked)} certificates checked by tcert-check ({ok} VERIFIED) in "
          f"{sum(x['check_seconds'] for x in checked):.0f} s of checker time; results in {args.out_dir}")
    for x in failed:
        print(f"  {x['id']}: cell ended with {x['status']}: {x.get('detail')}")
    for x in checked:
        if x["checked"] != "VERIFIED":
            print(f"  {x['id']}: {x['checked']}")
    return 0 if ok == len(checked) and not failed else 1


def add_command(esub):
    """Register `tcert experiment overwhelm-repetition`."""
    p = esub.add_parser("overwhelm-repetition",
                        help="appendix F: a repeated fixed token on a model without positions (W vs n_fix)")
    p.add_argument("--model", required=True, help="a model without positions (tcert train text --no-rope)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--cert-dir", default=None, help="where certificates go (default OUT_DIR/certs)")
    p.add_argument("--tokens", default="the . said what", help="repeated tokens r (words or ids), space-separated")
    p.add_argument("--n-free", type=int, default=4, help="free positions (any token each)")
    p.add_argument("--lengths", default=None, help="n_fix values (default 1, 3, 10, ... up to n_ctx)")
    p.add_argument("--methods", default="naive,tight")
    p.add_argument("--no-check", action="store_true", help="do not run the checker on certificates")
    p.add_argument("--check-max-n", type=int, default=None,
                   help="check certificates inline only up to this n_fix (a check costs time linear in n_fix)")
    p.add_argument("--check-limit", type=int, default=0,
                   help="with --no-check: afterwards check up to N certified cells, largest n_fix first")
    p.add_argument("--check-first", action="store_true",
                   help="with --no-check: afterwards check the smallest certified n_fix of each token and method")
    p.add_argument("--backend", choices=("flint", "mpmath"), default="flint")
    execution.add_arguments(p)
    p.set_defaults(func=cmd_overwhelm_repetition)
