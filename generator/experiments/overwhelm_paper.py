"""`tcert experiment overwhelm-paper`: the overwhelm paper's section-6 experiments on a trained text model.

Cells (paper section 6.1): a fixed string s of one of three kinds and n_fix tokens, the free set
"every permutation of" one of two quotes, query token "?", method naive, lp or tight. Each cell records
the worst-case deviation bound W (for tight, the analogue (PTP + b)/2 of its bound b on
max_j logit_j - logit_k over T, with b itself in `tight_bound`), the peak-to-peak difference PTP of the sample (the quote in its own
order), the verdict, and, when Overwhelmed, a certificate re-checked by the checker (`verify`).
- fixed kinds: `alnum` (a random string of letters, digits, spaces and punctuation, tokenized),
  `heldout` (random held-out sentences of the training corpus, concatenated), `whatisit` ("what is
  it" repeated); the first n_fix tokens are used;
- `--generate K` (paper section 6.2, Figure 4): from the longest repeated-string prefix, generate
  greedily K tokens, appending each prediction to the fixed string, and record W and PTP/2 each time.

Results go to `<out-dir>/cells.jsonl` (one line per finished cell: a rerun skips them, so an
interrupted sweep resumes), `points.csv` (every point), `fig2_deviation.png`, `fig3_ptp.png`,
`fig4_generation.png`. Cells are tasks of the execution layer (`execution.py`: a local Dask cluster of
`--jobs` workers, or `--scheduler`); certificate paths in the rows are relative to OUT_DIR.
"""

import csv
import os
import random
import string
import time

from tcert.checker.errors import BadInput
from tcert.generator.experiments import execution, families
from tcert.generator.experiments.execution import Cell, File

FREE_TEXTS = {
    "blotches": "The blotches ran well down the sides of his face",
    "hamlet": ("To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
               "The slings and arrows of outrageous fortune,"),
}
FIXED_KINDS = ("alnum", "heldout", "whatisit")
ALNUM = string.ascii_letters + string.digits + " " * 12 + ".,;:!?'\"-()"
QUERY_TEXT = "?"
METHODS = ("naive", "lp", "tight")
COLORS = {"naive": "C0", "lp": "C1", "tight": "C2"}


def fixed_tokens(tok, kind, n, sample, sentences):
    """The first n token ids of a fixed string of `kind`; `sample` seeds the random kinds."""
    rng = random.Random(f"{kind}:{sample}")
    ids = []
    while len(ids) < n:
        if kind == "alnum":
            text = "".join(rng.choice(ALNUM) for _ in range(4 * n + 16))
        elif kind == "heldout":
            text = " ".join(rng.choice(sentences) for _ in range(n // 8 + 4))
        elif kind == "whatisit":
            text = " ".join(["what is it"] * (n // 3 + 2))
        else:
            raise BadInput(f"unknown fixed-string kind {kind!r}")
        ids += families.encode(tok, text)
    return ids[:n]


def _model(path):
    return families.load_model(path)


def run_cell(task, shipped):
    """Worker: generate one cell's bound; when Overwhelmed, return the certificate (as bytes for the run
    folder) and check it."""
    model = execution.model_of(shipped)
    start = time.perf_counter()
    free_spec = task.get("free_spec") or ("perm", len(task["free"]), task["free"])
    row = {k: task.get(k) for k in ("id", "kind", "n_fix", "sample", "free_name", "method", "step", "repeated")}
    if task["method"] == "tight":
        cert, r = families.overwhelm_generate_tight(model, task["prefix"], task["query"], free_spec)
        ptp = sample_ptp(model, task["prefix"], task["query"], free_spec)
        # W analogue: the tight bound b >= max_j (logit_j - logit_k) over T is certified iff b < 0; the
        # sample's gap is PTP, so (PTP + b) / 2 is the half-loss of gap it certifies: Overwhelmed iff < PTP/2.
        w = (ptp + r["worst_bound"]) / 2
        row.update(W=w, W_float=w, tight_bound=r["worst_bound"], margin=None,
                   exact_competitors=r["exact_competitors"])
    else:
        cert, r = families.overwhelm_generate(model, task["prefix"], task["query"], free_spec, task["method"])
        ptp = r["ptp_float"]
        row.update(W=r["deviation"], W_float=r["deviation_float"], margin=r["margin"], tight_bound=None)
    row.update(n_free=free_spec[1], verdict=r["verdict"], ptp=ptp, predicted=r["predicted"],
               gen_seconds=time.perf_counter() - start, certificate=None, checked=None, check_seconds=None)
    if cert is not None:
        row["certificate"] = task["cert"]
        row["files"] = {task["cert"]: families.certificate_text(cert).encode()}
        if task["check"]:
            row.update(execution.check_outcome(cert, model, task["backend"]))
    return row


def sample_ptp(model, prefix, query, free_spec):
    """PTP of the sample the generators use (the multiset in its own order; `any`: the query repeated)."""
    import numpy as np
    _, n_free, multiset = free_spec
    t0 = list(multiset) if multiset is not None else [query] * n_free
    lg = np.sort(families.logits(model, np.asarray([list(prefix) + t0 + [query]]))[0])
    return float(lg[-1] - lg[-2])


def check_cell(task, shipped_model, shipped_cert):
    """Worker: run the checker on a certificate made earlier; the row is the cell's row with the verdict."""
    import json
    row = dict(task["row"])
    row.update(execution.check_outcome(json.loads(shipped_cert.data), execution.model_of(shipped_model),
                                       task["backend"]))
    return row


CHECK = "#check"     # a later check of cell X is logged as cell X#check (the generating row stays as it was)


def with_checks(rows, logged):
    """`rows` (cell rows in order) with each replaced by its logged later check, if any."""
    out = []
    for r in rows:
        c = logged.get(r["id"] + CHECK)
        out.append(dict(c, id=r["id"]) if c is not None and c.get("status") == "done" else r)
    return out


def check_later(ex, rows, limit, out_dir, log_name, model_path, backend):
    """Check up to `limit` certified-but-unchecked cells (largest n_fix first, then id) on the cluster; each
    check is logged as its own cell (id X#check); return `rows` with the checks in."""
    todo = sorted((r for r in rows if r.get("certificate") and r.get("checked") is None),
                  key=lambda r: (-r["n_fix"], r["id"]))[:limit]
    cells = [Cell(check_cell, {"id": r["id"] + CHECK, "row": r, "backend": backend},
                  (File(os.path.abspath(model_path)), File(r["certificate"]))) for r in todo]
    logged = ex.run(out_dir, log_name, cells, "checking")
    return with_checks(rows, logged)


def sweep_tasks(tok, lengths, samples, methods, frees, sentences, cert_rel, check, backend):
    """Every cell of the fixed-string sweep as a task dict (ids are stable across runs)."""
    query = families.encode(tok, QUERY_TEXT)
    if len(query) != 1:
        raise BadInput(f"the query {QUERY_TEXT!r} is not one token in this vocabulary")
    tasks = []
    for free_name in frees:
        free = families.encode(tok, FREE_TEXTS[free_name])
        for kind in FIXED_KINDS:
            for sample in range(1 if kind == "whatisit" else samples):
                for n in lengths:
                    prefix = fixed_tokens(tok, kind, n, sample, sentences)
                    for method in methods:
                        tid = f"{free_name}-{kind}-s{sample}-n{n}-{method}"
                        tasks.append({"id": tid, "kind": kind, "n_fix": n, "sample": sample, "free_name": free_name,
                                      "method": method, "step": None, "prefix": prefix, "query": query[0],
                                      "free": free, "cert": os.path.join(cert_rel, tid + ".json"), "check": check,
                                      "backend": backend})
    return tasks


def run_tasks(ex, tasks, model_path, out_dir, log_name, desc):
    """Run the cells of `tasks` not yet in the log (each logged as it finishes); return their rows in order,
    later checks (X#check) merged in."""
    model = File(os.path.abspath(model_path))
    cells = [Cell(run_cell, t, (model,), priority=-i) for i, t in enumerate(tasks)]
    logged = ex.run(out_dir, log_name, cells, desc)
    every = execution.read_log(os.path.join(out_dir, log_name))
    return with_checks([logged[t["id"]] for t in tasks if t["id"] in logged], every)


def generation_rows(ex, model_path, tok, prefix, free_name, steps, out_dir, cert_rel, check, backend):
    """Figure 4: grow the fixed string by the predicted token `steps` times (one cell per step; each step
    needs the previous one's prediction, so they run one after the other)."""
    free = families.encode(tok, FREE_TEXTS[free_name])
    query = families.encode(tok, QUERY_TEXT)[0]
    model = File(os.path.abspath(model_path))
    rows = []
    prefix = list(prefix)
    for step in range(steps + 1):
        tid = f"gen-{free_name}-n{len(prefix)}-step{step}"
        task = {"id": tid, "kind": "generation", "n_fix": len(prefix), "sample": 0, "free_name": free_name,
                "method": "lp", "step": step, "prefix": prefix, "query": query, "free": free,
                "cert": os.path.join(cert_rel, tid + ".json"), "check": check, "backend": backend}
        row = ex.run(out_dir, "generation.jsonl", [Cell(run_cell, task, (model,))], "generation")[tid]
        rows.append(row)
        if row.get("status") != "done":
            break               # no prediction to grow the string with
        prefix = prefix + [row["predicted"]]
    return rows


COLUMNS = ["id", "free_name", "kind", "sample", "n_fix", "n_free", "method", "step", "W", "W_float", "ptp",
           "margin", "tight_bound", "verdict", "predicted", "gen_seconds", "checked", "check_seconds", "certificate"]


def write_csv(rows, path, columns=None):
    """Every point, one row per cell."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns or COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def plot_sweep(rows, out_dir, frees):
    """Figures 2 and 3 analogues: W (naive, LP, tight) and PTP against n_fix, one panel per kind and quote."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for fig_name, what in (("fig2_deviation.png", "W"), ("fig3_ptp.png", "ptp")):
        fig, axes = plt.subplots(len(frees), len(FIXED_KINDS), figsize=(4 * len(FIXED_KINDS), 3.3 * len(frees)),
                                 squeeze=False)
        for i, free in enumerate(frees):
            for j, kind in enumerate(FIXED_KINDS):
                ax = axes[i][j]
                cell = [r for r in rows if r["free_name"] == free and r["kind"] == kind]
                present = [m for m in METHODS if any(r["method"] == m for r in cell)]
                methods = present if what == "W" else present[-1:]
                for method in methods:
                    pts = sorted((r["n_fix"], r[what], r["sample"]) for r in cell if r["method"] == method)
                    for s in sorted({p[2] for p in pts}):
                        xs = [p[0] for p in pts if p[2] == s]
                        ys = [p[1] for p in pts if p[2] == s]
                        label = (f"W {method}" if what == "W" else "PTP") if s == 0 else None
                        ax.plot(xs, ys, marker=".", alpha=0.8, color=COLORS[method] if what == "W" else "k",
                                label=label)
                if what == "W":
                    pts = sorted((r["n_fix"], r["ptp"] / 2, r["sample"]) for r in cell if r["method"] == methods[-1])
                    for s in sorted({p[2] for p in pts}):
                        ax.plot([p[0] for p in pts if p[2] == s], [p[1] for p in pts if p[2] == s], ls="--",
                                color="gray", label="PTP/2" if s == 0 else None)
                if what == "ptp":
                    for method, marker in zip(present, ("o", "x", "+")):
                        cert = [(r["n_fix"], r["ptp"]) for r in cell if r["verdict"] == "Overwhelmed"
                                and r["method"] == method]
                        if cert:
                            ax.scatter(*zip(*cert), marker=marker, color=COLORS[method], s=60, zorder=3,
                                       label=f"certified ({method})", facecolors="none" if marker == "o" else None)
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.set_title(f"{kind}, {free}", fontsize=10)
                ax.set_xlabel("n_fix (tokens)")
                ax.grid(alpha=0.3)
                if j == 0:
                    ax.set_ylabel("worst-case deviation W" if what == "W" else "peak-to-peak difference")
                ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fig_name), dpi=90, metadata={"Software": None})
        plt.close(fig)


def plot_generation(rows, path):
    """Figure 4 analogue: W and PTP/2 along greedy generation from an overwhelming prefix."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["n_fix"] for r in rows]
    ax.plot(xs, [r["W"] for r in rows], marker=".", label="W (LP)")
    ax.plot(xs, [r["ptp"] / 2 for r in rows], marker=".", label="PTP/2")
    ax.set_xlabel("n_fix (prefix + generated tokens)")
    ax.set_title(f"generation from an overwhelming prefix ({rows[0]['free_name']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def cmd_overwhelm_paper(args):
    """Run the sweep (resuming), the generation experiment, and write CSV and plots."""
    model = _model(args.model)
    tok = families.model_tokenizer(args.model, model.config.tokenizer_name)
    os.makedirs(args.out_dir, exist_ok=True)
    cert_rel = os.path.relpath(args.cert_dir, args.out_dir) if args.cert_dir else "certs"
    sentences = families.held_out_sentences(args.corpus)
    lengths = _ints(args.lengths)
    if max(lengths) + 64 > model.config.n_ctx:
        raise BadInput(f"--lengths up to {max(lengths)} leave no room for the free tokens in n_ctx {model.config.n_ctx}")
    frees = [f for f in args.free.split(",") if f]
    if any(f not in FREE_TEXTS for f in frees):
        raise BadInput(f"--free names must be among {sorted(FREE_TEXTS)}")
    methods = [m for m in args.methods.split(",") if m]
    start = time.perf_counter()
    tasks = sweep_tasks(tok, lengths, args.samples, methods, frees, sentences, cert_rel, not args.no_check,
                        args.backend)
    with execution.Executor(execution.options(args)) as ex:
        rows = run_tasks(ex, tasks, args.model, args.out_dir, "cells.jsonl", "overwhelm sweep")
        gen = []
        if args.generate:
            prefix = fixed_tokens(tok, "whatisit", max(lengths), 0, sentences)
            gen = generation_rows(ex, args.model, tok, prefix, frees[0], args.generate, args.out_dir, cert_rel,
                                  not args.no_check, args.backend)
        if args.check_limit:
            rows = check_later(ex, rows, args.check_limit, args.out_dir, "cells.jsonl", args.model, args.backend)
    failed = [r for r in rows + gen if r.get("status") != "done"]
    rows = [r for r in rows if r.get("status") == "done"]
    gen = [r for r in gen if r.get("status") == "done"]
    if gen:
        plot_generation(gen, os.path.join(args.out_dir, "fig4_generation.png"))
    write_csv(rows + gen, os.path.join(args.out_dir, "points.csv"))
    plot_sweep(rows, args.out_dir, frees)
    return report(rows + gen, failed, gen, start, args.out_dir)


def report(allrows, failed, gen, start, out_dir):
    """Print the counts of a run; exit code 1 unless every checked certificate VERIFIED and no cell failed."""
    certified = [r for r in allrows if r["verdict"] == "Overwhelmed"]
    checked = [r for r in certified if r["checked"] is not None]
    ok = sum(r["checked"] == "VERIFIED" for r in checked)
    print(f"{len(allrows)} cells ({len(gen)} generation steps) in {time.perf_counter() - start:.0f} s this run; "
          f"{len(certified)} Overwhelmed; {len(checked)} certificates checked by tcert-check "
          f"({ok} VERIFIED) in {sum(r['check_seconds'] for r in checked):.0f} s of checker time; "
          f"results in {out_dir}")
    for r in checked:
        if r["checked"] != "VERIFIED":
            print(f"  {r['id']}: {r['checked']}")
    for r in failed:
        print(f"  {r['id']}: cell ended with {r['status']}: {r.get('detail')}")
    return 0 if ok == len(checked) and not failed else 1


def add_command(esub):
    """Register `tcert experiment overwhelm-paper` under the `experiment` subparsers."""
    p = esub.add_parser("overwhelm-paper", help="the overwhelm paper's section-6 sweep on a text model")
    p.add_argument("--model", required=True, help="a text model from `tcert train text`")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--cert-dir", default=None, help="where certificates go (default OUT_DIR/certs)")
    p.add_argument("--lengths", default="10,30,100,300,1000,1500", help="n_fix values")
    p.add_argument("--samples", type=int, default=3, help="random fixed strings per length (alnum, heldout)")
    p.add_argument("--methods", default="naive,lp,tight")
    p.add_argument("--free", default="blotches,hamlet", help=f"free quotes among {sorted(FREE_TEXTS)}")
    p.add_argument("--generate", type=int, default=20, help="greedy generation steps for Figure 4 (0: skip)")
    p.add_argument("--corpus", default="lee+enwiki", help="corpus whose held-out sentences form `heldout`")
    p.add_argument("--no-check", action="store_true", help="do not run the checker on certificates")
    p.add_argument("--check-limit", type=int, default=0,
                   help="with --no-check: afterwards check up to N certified sweep cells, largest n_fix first")
    p.add_argument("--backend", choices=("flint", "mpmath"), default="flint")
    execution.add_arguments(p)
    p.set_defaults(func=cmd_overwhelm_paper)
