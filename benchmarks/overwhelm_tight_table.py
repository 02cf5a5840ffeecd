"""Shortest certified n_fix per overwhelm method (naive, lp, tight) by bisection on a trained text model.

For each free set (the paper's quotes) and fixed-string family/sample of `tcert experiment
overwhelm-paper` (generator/experiments.py: same strings, same query "?"), bisect n_fix in [0, N_MAX]
for the smallest prefix length whose generator verdict is Overwhelmed (assumes the verdict is
monotone in n_fix; the row records the verdicts at n and n - 1), then run the checker (Arb) on the
certificate at that n. Writes docs/results/overwhelm_tight/table.csv and prints a markdown table.

    nice -n 19 python benchmarks/overwhelm_tight_table.py [--model M] [--max 1500] [--no-check]
"""

import argparse
import csv
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from checker.cli import verify_files  # noqa: E402
from checker.modelfile import load_model  # noqa: E402
from generator import certio, text_data  # noqa: E402
from generator.experiments import FREE_TEXTS, QUERY_TEXT, fixed_tokens  # noqa: E402
from generator.overwhelm import generate  # noqa: E402
from generator.overwhelm_tight import generate_tight  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("naive", "lp", "tight")


def run(model, prefix, query, free, method):
    """(certificate or None, report) of one method on one prefix."""
    spec = ("perm", len(free), free)
    if method == "tight":
        return generate_tight(model, prefix, query, spec)
    return generate(model, prefix, query, spec, method)


def shortest(model, tok, kind, sample, sentences, query, free, method, n_max):
    """Smallest n in [0, n_max] with an Overwhelmed verdict by bisection (None if n_max is not)."""
    def ok(n):
        return run(model, fixed_tokens(tok, kind, n, sample, sentences), query, free, method)[0] is not None
    if not ok(n_max):
        return None
    lo, hi = -1, n_max          # invariant: ok(hi), not ok(lo) (lo = -1 stands for "below 0")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def plot(csv_path, png_path, n_max):
    """Bar chart of the shortest certified n_fix per row and method ("> n_max" drawn hatched at n_max)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.27
    for m, method in enumerate(METHODS):
        for i, r in enumerate(rows):
            n = r[f"{method}_n"]
            x = i + (m - 1) * width
            if n == "":
                ax.bar(x, n_max, width, color="none", edgecolor=f"C{m}", hatch="//")
            else:
                ax.bar(x, max(int(n), 2), width, color=f"C{m}", label=method if i == 0 else None)
        ax.bar(0, 0, 0, color=f"C{m}", label=method)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['free']}\n{r['kind']} {r['sample']}" for r in rows], fontsize=7)
    ax.set_ylabel("shortest certified n_fix (log; hatched: none up to %d; 0 drawn at 2)" % n_max, fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    seen = {}
    for h, l in zip(handles, labels):
        seen.setdefault(l, h)
    ax.legend(seen.values(), seen.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("overwhelm on text_small, query '?': shortest prefix certified per method")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "certificates", "models", "text_small.safetensors"))
    ap.add_argument("--max", type=int, default=1500)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--free", default="blotches,hamlet")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--query-text", default=QUERY_TEXT, help="one-token query (default the paper's \"?\")")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "overwhelm_tight", "table.csv"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from --out")
    args = ap.parse_args()
    png = os.path.splitext(args.out)[0] + ".png"
    if args.plot_only:
        return plot(args.out, png, args.max)
    model = load_model(args.model)
    tok = text_data.model_tokenizer(args.model, model.config.tokenizer)
    sentences = text_data.held_out_sentences("lee+enwiki")
    query = text_data.encode(tok, args.query_text)
    if len(query) != 1:
        raise SystemExit("--query-text must encode to one token")
    query = query[0]
    rows = []
    tmp = tempfile.mkdtemp()
    for free_name in args.free.split(","):
        free = text_data.encode(tok, FREE_TEXTS[free_name])
        for kind in ("whatisit", "alnum", "heldout"):
            for sample in range(1 if kind == "whatisit" else args.samples):
                row = {"free": free_name, "n_free": len(free), "kind": kind, "sample": sample}
                for method in METHODS:
                    t = time.perf_counter()
                    n = shortest(model, tok, kind, sample, sentences, query, free, method, args.max)
                    row[f"{method}_n"] = "" if n is None else n
                    row[f"{method}_gen_s"] = round(time.perf_counter() - t, 1)
                    row[f"{method}_checked"] = ""
                    if n is not None and not args.no_check:
                        prefix = fixed_tokens(tok, kind, n, sample, sentences)
                        cert, rep = run(model, prefix, query, free, method)
                        path = os.path.join(tmp, "c.json")
                        certio.write(path, cert)
                        t = time.perf_counter()
                        try:
                            verify_files(path, args.model, "flint")
                            row[f"{method}_checked"] = "VERIFIED"
                        except Exception as e:  # a rejection is a result to record
                            row[f"{method}_checked"] = f"REJECTED: {e}"[:80]
                        row[f"{method}_check_s"] = round(time.perf_counter() - t, 1)
                        if method == "tight":
                            row["tight_exact_competitors"] = rep["exact_competitors"]
                rows.append(row)
                print(row, flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("free", "n_free", "kind", "sample"), k))
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    plot(args.out, png, args.max)
    print(f"\nquery {args.query_text!r}\n| quote | fixed kind | sample | naive | lp | tight | tight / best of naive, lp |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        base = [r[f"{m}_n"] for m in ("naive", "lp") if r[f"{m}_n"] != ""]
        ratio = f"{r['tight_n'] / min(base):.3f}" if base and r["tight_n"] != "" and min(base) > 0 else "-"
        cells = [str(r[f"{m}_n"]) if r[f"{m}_n"] != "" else f"> {args.max}" for m in METHODS]
        print(f"| {r['free']} | {r['kind']} | {r['sample']} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main()
