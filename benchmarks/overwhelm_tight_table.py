"""Shortest certified n_fix per overwhelm method (naive, lp, tight) by bisection on a trained text model.

For each query token, free set (the paper's quotes) and fixed-string family/sample of `tcert experiment
overwhelm-paper` (generator/experiments/overwhelm_paper.py: same strings; the paper's query "?" plus the extra queries
chosen by `--survey`), bisect n_fix in [0, n_max] for the smallest prefix length whose generator verdict
is Overwhelmed, with n_max = min(--max, n_ctx - n_free - 1) (the longest prefix the model's context
allows). Bisection assumes the verdict is monotone in n_fix; by construction the verdict at the
reported n is Overwhelmed and the one at n - 1 is not. When n_max is not certified, a grid of
smaller n_fix is scanned before reporting "> n_max" (column <method>_note). The certificate at that n is then checked by the
checker (Arb). Writes docs/results/overwhelm_tight/table.csv (+ table.png) and prints a markdown table
with the ratios tight/lp and tight/naive and a summary line.

    nice -n 10 python benchmarks/overwhelm_tight_table.py [--model M] [--max N] [--queries Q ...]
        [--jobs J] [--no-check]
    nice -n 10 python benchmarks/overwhelm_tight_table.py --survey   # which queries are not degenerate
"""

import argparse
import collections
import csv
import os
import random
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from tcert.checker.verify import verify
from tcert.checker.modelfile import load_model
from tcert.generator import certificate
from tcert.generator.train import text_data
from tcert.generator.experiments.overwhelm_paper import FREE_TEXTS, QUERY_TEXT, fixed_tokens
from tcert.generator.overwhelm.naive_lp import generate
from tcert.generator.overwhelm.tight import generate_tight
from tcert.testing import ROOT

DEFAULT_MODEL = os.path.join(ROOT, "certificates", "models", "text_small.safetensors")
METHODS = ("naive", "lp", "tight")
KINDS = ("whatisit", "alnum", "heldout")
# The paper's "?" plus the queries whose no-prefix prediction is not stable across permutations of
# either quote on text_small (measured by --survey; see docs/overwhelm.md).
DEFAULT_QUERIES = (QUERY_TEXT, ",", "was", "it")
SURVEY_QUERIES = ("?", ".", ",", "!", ";", ":", "-", "'", "(", "the", "and", "of", "a", "to", "is", "in",
                  "he", "it", "was", "his", "that", "with")


def run(model, prefix, query, free, method):
    """(certificate or None, report) of one method on one prefix."""
    spec = ("perm", len(free), free)
    if method == "tight":
        return generate_tight(model, prefix, query, spec)
    return generate(model, prefix, query, spec, method)


def shortest(model, tok, kind, sample, sentences, query, free, method, n_max):
    """(n, note): the smallest n in [0, n_max] with an Overwhelmed verdict found by bisection.

    If n_max itself is not certified, the grid 0, 16, 32, ..., 1024 (< n_max) is scanned too (the verdict
    need not be monotone in n_fix); then n is the bisection threshold below the first certified grid
    point and the note says so. (None, note) when neither n_max nor any grid point is certified."""
    def ok(n):
        return run(model, fixed_tokens(tok, kind, n, sample, sentences), query, free, method)[0] is not None
    lo, hi, note = -1, n_max, ""    # invariant: ok(hi), not ok(lo) (lo = -1 stands for "below 0")
    if not ok(n_max):
        grid = [0] + [2 ** i for i in range(4, 11) if 2 ** i < n_max]
        hits = [g for g in grid if ok(g)]
        if not hits:
            return None, f"none at n_max or on grid {grid[0]}..{grid[-1]}"
        hi = hits[0]
        lo = max((g for g in grid if g < hi), default=-1)
        note = f"n_max not certified; grid hits {hits}"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, note


_STATE = {}


def _setup(model_path):
    """Per-process model, tokenizer and held-out sentences (loaded once per worker)."""
    if _STATE.get("path") != model_path:
        model = load_model(model_path)
        _STATE.update(path=model_path, model=model,
                      tok=text_data.model_tokenizer(model_path, model.config.tokenizer_name),
                      sentences=text_data.held_out_sentences("lee+enwiki"))
    return _STATE["model"], _STATE["tok"], _STATE["sentences"]


def one_query_token(tok, text):
    """The token id of a query text that must encode to exactly one token."""
    ids = text_data.encode(tok, text)
    if len(ids) != 1:
        raise SystemExit(f"query {text!r} does not encode to one token: {ids}")
    return ids[0]


def free_tokens(tok, free_name):
    """The free multiset: a quote of FREE_TEXTS by name, or "name:L" for its first L tokens."""
    name, _, length = free_name.partition(":")
    ids = text_data.encode(tok, FREE_TEXTS[name])
    return ids[:int(length)] if length else ids


def cell(task):
    """One table row: bisection per method, then the checker (Arb) on each threshold certificate."""
    model_path, query_text, free_name, kind, sample, max_arg, check = task
    model, tok, sentences = _setup(model_path)
    query = one_query_token(tok, query_text)
    free = free_tokens(tok, free_name)
    n_max = min(max_arg, model.config.n_ctx - len(free) - 1)
    row = {"query": query_text, "free": free_name, "n_free": len(free), "kind": kind, "sample": sample,
           "n_max": n_max}
    tmp = tempfile.mkdtemp()
    for method in METHODS:
        t = time.perf_counter()
        n, row[f"{method}_note"] = shortest(model, tok, kind, sample, sentences, query, free, method, n_max)
        row[f"{method}_n"] = "" if n is None else n
        row[f"{method}_gen_s"] = round(time.perf_counter() - t, 1)
        row[f"{method}_checked"] = ""
        row[f"{method}_check_s"] = ""
        if n is not None and check:
            prefix = fixed_tokens(tok, kind, n, sample, sentences)
            cert, rep = run(model, prefix, query, free, method)
            path = os.path.join(tmp, f"{method}.json")
            certificate.write(path, cert)
            t = time.perf_counter()
            try:
                verify(path, model_path, "flint")
                row[f"{method}_checked"] = "VERIFIED"
            except Exception as e:  # a rejection is a result to record
                row[f"{method}_checked"] = f"REJECTED: {e}"[:80]
            row[f"{method}_check_s"] = round(time.perf_counter() - t, 1)
            if method == "tight":
                row["tight_exact_competitors"] = rep["exact_competitors"]
    for base in ("lp", "naive"):
        a, b = row["tight_n"], row[f"{base}_n"]
        row[f"tight_over_{base}"] = round(a / b, 4) if a != "" and b != "" and b > 0 else ""
    print(row, flush=True)
    return row


def ratio_text(r, base):
    """Markdown text of tight/base: the ratio, '< x' when only tight certifies (x = tight / n_max)."""
    a, b = r["tight_n"], r[f"{base}_n"]
    if a == "":
        return "-"
    if int(a) == 0:
        return "0"
    if b != "":
        return f"{int(a) / int(b):.3f}" if int(b) > 0 else "-"
    return f"< {int(a) / int(r['n_max']):.3f}"


def summary(rows):
    """Summary lines: counts of certified cells and the median of tight/lp, tight/naive where both exist."""
    lines = [f"{len(rows)} cells; certified within n_max: "
             + ", ".join(f"{m} {sum(r[f'{m}_n'] != '' for r in rows)}" for m in METHODS)
             + "; tight at n_fix 0 (prediction already certified with no prefix): "
             + f"{sum(r['tight_n'] != '' and int(r['tight_n']) == 0 for r in rows)}"]
    for base in ("lp", "naive"):
        both = [int(r["tight_n"]) / int(r[f"{base}_n"]) for r in rows
                if r["tight_n"] != "" and r[f"{base}_n"] != "" and int(r[f"{base}_n"]) > 0]
        only = [r for r in rows if r["tight_n"] != "" and r[f"{base}_n"] == ""]
        if both:
            lines.append(f"tight/{base} where both certify: {len(both)} cells, median {statistics.median(both):.3f},"
                         f" max {max(both):.3f}, {sum(x <= 0.5 for x in both)} of {len(both)} <= 0.5 (target)")
        else:
            lines.append(f"tight/{base}: no cell where both certify")
        lines.append(f"tight certifies, {base} not within n_max: {len(only)} cells"
                     + (f" (tight/n_max median {statistics.median(int(r['tight_n']) / int(r['n_max']) for r in only):.3f},"
                        f" max {max(int(r['tight_n']) / int(r['n_max']) for r in only):.3f}: an upper bound on the"
                        f" ratio)" if only else ""))
    base_only = [r for r in rows if r["tight_n"] == "" and (r["lp_n"] != "" or r["naive_n"] != "")]
    lines.append(f"lp or naive certifies but tight not: {len(base_only)} cells")
    return lines


def plot(csv_path, png_path):
    """Per query a panel: bars of the shortest certified n_fix per row and method (symlog scale;
    hatched at n_max: none certified up to n_max)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    queries = list(dict.fromkeys(r["query"] for r in rows))
    fig, axes = plt.subplots(len(queries), 1, figsize=(11, 3.2 * len(queries)), squeeze=False)
    width = 0.27
    for ax, q in zip(axes[:, 0], queries):
        qrows = [r for r in rows if r["query"] == q]
        for m, method in enumerate(METHODS):
            for i, r in enumerate(qrows):
                n = r[f"{method}_n"]
                x = i + (m - 1) * width
                if n == "":
                    ax.bar(x, int(r["n_max"]), width, color="none", edgecolor=f"C{m}", hatch="//")
                else:
                    ax.bar(x, int(n), width, color=f"C{m}")
                    if int(n) == 0:
                        ax.text(x, 0.3, "0", color=f"C{m}", ha="center", fontsize=8, fontweight="bold")
            ax.bar(0, 0, 0, color=f"C{m}", label=method)
        ax.bar(0, 0, 0, color="none", edgecolor="grey", hatch="//", label="none up to n_max")
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(0, 3000)
        ax.set_xticks(range(len(qrows)))
        ax.set_xticklabels([f"{r['free']}\n{r['kind']} {r['sample']}" for r in qrows], fontsize=7)
        ax.set_ylabel("shortest certified n_fix", fontsize=8)
        ax.set_title(f"query {q!r}", fontsize=9)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.suptitle("overwhelm on text_small: shortest prefix certified per method (symlog; 0 = no prefix needed)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)


def survey(model_path, queries, perms=200):
    """For each quote and candidate query: predictions of `perms` random permutations with no prefix."""
    import numpy as np
    from tcert.generator.model import forward
    model, tok, _ = _setup(model_path)
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
    names = {i: t for t, i in vocab.items()}
    print("| query | quote | distinct predictions (200 random permutations, n_fix 0) | smallest top-2 gap |")
    print("|---|---|---|---|")
    for q in queries:
        ids = text_data.encode(tok, q)
        if len(ids) != 1:
            print(f"| {q!r} | - | not one token | - |")
            continue
        for free_name in FREE_TEXTS:
            free = text_data.encode(tok, FREE_TEXTS[free_name])
            rng = random.Random(0)
            batch = np.array([rng.sample(free, len(free)) + ids for _ in range(perms)])
            lg = forward.logits(model, batch)
            counts = collections.Counter(lg.argmax(-1).tolist())
            top2 = np.sort(lg, axis=-1)[:, -2:]
            shown = ", ".join(f"{names.get(t, t)!r} {c}" for t, c in counts.most_common(4))
            print(f"| {q!r} | {free_name} | {len(counts)}: {shown} | {float((top2[:, 1] - top2[:, 0]).min()):.3f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--max", type=int, default=100000, help="cap on n_fix (always also <= n_ctx - n_free - 1)")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--free", default="blotches,hamlet", help='quotes by name, or "name:L" (first L tokens)')
    ap.add_argument("--queries", nargs="+", default=list(DEFAULT_QUERIES), help="one-token query texts")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (cells in parallel)")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "overwhelm_tight", "table.csv"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot and tables from --out")
    ap.add_argument("--survey", action="store_true", help="print the query-token stability survey and stop")
    args = ap.parse_args()
    png = os.path.splitext(args.out)[0] + ".png"
    if args.survey:
        return survey(args.model, SURVEY_QUERIES)
    if not args.plot_only:
        tasks = [(args.model, q, free_name, kind, sample, args.max, not args.no_check)
                 for q in args.queries for free_name in args.free.split(",") for kind in KINDS
                 for sample in range(1 if kind == "whatisit" else args.samples)]
        start = time.perf_counter()
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                rows = list(pool.map(cell, tasks))
        else:
            rows = [cell(t) for t in tasks]
        print(f"wall {time.perf_counter() - start:.0f} s for {len(tasks)} cells, jobs {args.jobs}")
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        first = ("query", "free", "n_free", "kind", "sample", "n_max")
        keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in first, first.index(k) if k in first else 0, k))
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            w.writerows(rows)
    with open(args.out) as f:
        rows = list(csv.DictReader(f))
    plot(args.out, png)
    print("\n| query | quote (free tokens) | fixed kind | sample | n_max | naive | lp | tight | tight/lp | tight/naive |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r[f"{m}_n"] if r[f"{m}_n"] != "" else f"> {r['n_max']}" for m in METHODS]
        print(f"| {r['query']!r} | {r['free']} ({r['n_free']}) | {r['kind']} | {r['sample']} | {r['n_max']} | "
              + " | ".join(cells) + f" | {ratio_text(r, 'lp')} | {ratio_text(r, 'naive')} |")
    print("\nall rows:")
    for line in summary(rows):
        print("- " + line)
    nondeg = [r for r in rows if not (r["tight_n"] != "" and int(r["tight_n"]) == 0)]
    print(f"\nexcluding the {len(rows) - len(nondeg)} rows where tight certifies with no prefix:")
    for line in summary(nondeg):
        print("- " + line)
    checks = [r[f"{m}_checked"] for r in rows for m in METHODS if r[f"{m}_n"] != ""]
    print(f"\nchecker (Arb) on the threshold certificates: {sum(c == 'VERIFIED' for c in checks)} VERIFIED of {len(checks)}")


if __name__ == "__main__":
    main()
