"""`tcert experiment maxofk-sweep`: the compact-proofs paper's Table 1 over trained Max-of-K seeds.

Per seed (`--seeds 0-150`): train the model with the reference recipe (`tcert train maxofk`, cached in
the run folder as models/maxof<K>_v<V>_s<steps>_seed<S>.safetensors, reused on a resume), then one cell
per strategy: generate the certificate (brute force, cubic, every subcubic variant `tcert accuracy
--strategy` accepts) and check it with the checker. Every cell is a Dask task of the execution layer
(`execution.py`): training is a task, each (seed, strategy) is a task, results stream into
<out-dir>/cells.jsonl and a resume recomputes nothing that is logged. When d_vocab^K is beyond brute
force, an importance-sampled ESTIMATE of the accuracy (never a certificate) is the reference instead.

Outputs in the run folder: `table.md` (Table 1 analogue: per strategy bound / brute count and bound /
inputs as mean ± sd over seeds, generator and checker time, checks), `summary.json` (the same numbers,
the comparison with the published figures, the cost of the run; strict JSON), `per_seed.csv` (one row
per seed and strategy), `bound_vs_cost.png` (every seed's bound against its proof cost).
"""

import csv
import os
import time

from tcert.generator.experiments import execution, families
from tcert.generator.experiments.execution import Cell, File, Produced

SUBCUBIC = ("svd", "svd2", "svd-rec1", "svd-rec2", "svd-rec4", "svd-rec", "exact-eqke")
EU_VARIANTS = ("svd", "svd2", "svd-rec", "exact-eqke")
DEFAULT_STRATEGIES = ("brute", "cubic") + tuple(f"subcubic:{v}" for v in SUBCUBIC) + \
    tuple(f"subcubic:{v}+eu" for v in EU_VARIANTS) + ("refine:2x", "refine")
BRUTE_LIMIT = 1 << 26                  # d_vocab^K up to which brute force is run (64^4 = 2^24)
# The published Max-of-4 figures of the reference implementation (151 seeds, mean ± sd, accuracy =
# bound / inputs), and its best subcubic bound / exact count on the two shipped anchors (docs/accuracy.md).
PUBLISHED = {"brute": (0.99915, 0.00148), "cubic": (0.9531, 0.0087)}
REFERENCE_SUBCUBIC_ANCHORS = {"maxof4_seed123": 11_287_877 / 16_763_235, "maxof4_seed50": 11_542_074 / 16_771_350}
ANCHOR_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "certificates", "anchors", "maxofk")


# ---------------------------------------------------------------------------------------------- cells

def train_cell(task):
    """Worker: train one seed; the model file comes back as bytes for the run folder."""
    import tempfile
    import warnings
    wall, cpu = time.perf_counter(), time.thread_time()
    with warnings.catch_warnings():   # torch's float(loss) warning, once per seed, says nothing here
        warnings.simplefilter("ignore", UserWarning)
        tensors, config, history = families.train_maxofk(task["k"], task["seed"], task["d_vocab"], task["steps"])
    seconds, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        sha = families.save_model(path, tensors, config)
        with open(path, "rb") as f:
            data = f.read()
    return {"kind": "train", "seed": task["seed"], "model": task["model"], "sha256": sha,
            "train_seconds": seconds, "train_cpu": cpu, "final_loss": history[-1] if history else None,
            "files": {task["model"]: data}}


def strategy_cell(task, shipped):
    """Worker: generate one strategy's certificate for one model and check it."""
    model = execution.model_of(shipped)
    row = {"kind": "strategy", "seed": task["seed"], "strategy": task["strategy"], "sha256": model.sha256}
    wall, cpu = time.perf_counter(), time.thread_time()
    cert, report = families.accuracy_certificate(model, task["strategy"])
    row.update(gen_seconds=time.perf_counter() - wall, gen_cpu=time.thread_time() - cpu, bound=report["bound"],
               inputs=report["inputs"], flops=report["flops"], checker_flops=report.get("checker_flops"),
               complexity=report.get("complexity"))
    text = families.certificate_text(cert)
    import hashlib
    row["certificate_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    row.update(execution.check_outcome(cert, model, task["backend"]))
    if task["keep"]:
        rel = os.path.join("certs", f"{task['name']}_{task['strategy'].replace(':', '_')}.json")
        row["certificate"] = rel
        row["files"] = {rel: text.encode()}
    return row


def estimate_cell(task, shipped):
    """Worker: the importance-sampled accuracy ESTIMATE (the reference when brute force is out of range)."""
    model = execution.model_of(shipped)
    wall = time.perf_counter()
    est = families.accuracy_estimate(model, task["samples"], 0)
    return {"kind": "estimate", "seed": task["seed"], "estimate": est["estimate"], "stderr": est["stderr"],
            "samples": est["samples"], "est_seconds": time.perf_counter() - wall}


# ---------------------------------------------------------------------------------------------- plan

def parse_seeds(text):
    """Seeds from "0-150" or "0,3,10-12"."""
    seeds = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not (lo.isdigit() and (not dash or hi.isdigit())):
            raise ValueError(f"--seeds: {part!r} is not N or N-M")
        seeds += list(range(int(lo), int(hi) + 1)) if dash else [int(lo)]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError("--seeds: give each seed once, at least one")
    return seeds


def model_name(k, v, steps, seed):
    return f"maxof{k}_v{v}_s{steps}_seed{seed}"


def plan(args, strategies, out_dir):
    """(cells, models): every cell of the sweep (ids stable across runs) and name -> seed label."""
    cells, models = [], {}
    brute = args.d_vocab ** args.k <= BRUTE_LIMIT
    todo = [s for s in strategies if brute or s != "brute"]
    sources = []
    for i, seed in enumerate(args.seeds):
        name = model_name(args.k, args.d_vocab, args.steps, seed)
        rel = os.path.join("models", name + ".safetensors")
        if os.path.exists(os.path.join(out_dir, rel)):
            src = File(rel)
        else:
            cells.append(Cell(train_cell, {"id": f"train-{name}", "k": args.k, "seed": seed, "d_vocab": args.d_vocab,
                                           "steps": args.steps, "model": rel}, priority=-i))
            src = Produced(f"train-{name}", rel)
        sources.append((name, seed, src, -i))
    if args.anchors and args.k == 4 and args.d_vocab == 64:
        for j, name in enumerate(("maxof4_seed123", "maxof4_seed50")):
            rel = os.path.join("models", f"anchor_{name}.safetensors")
            path = os.path.join(out_dir, rel)
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                families.save_model(path, *families.import_npz(os.path.join(ANCHOR_DIR, name + ".npz")))
            sources.append((f"anchor_{name}", f"anchor:{name}", File(rel), -len(args.seeds) - j))
    for name, seed, src, prio in sources:
        models[name] = seed
        base = {"seed": seed, "name": name, "backend": args.backend, "keep": args.keep_certificates}
        for strategy in todo:
            cells.append(Cell(strategy_cell, dict(base, id=f"{name}-{strategy}", strategy=strategy), (src,), prio))
        if not brute:
            cells.append(Cell(estimate_cell, dict(base, id=f"{name}-estimate", samples=args.samples), (src,), prio))
    return cells, models


# ------------------------------------------------------------------------------------------- results

def mean_sd(xs):
    """(mean, sample standard deviation); (None, None) for no values."""
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    return m, ((sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0)


def per_model(rows, models, strategies):
    """name -> {"seed", "reference" (brute count or estimate * inputs), "reference_kind", strategy: row}."""
    out = {}
    for name, seed in models.items():
        got = {s: rows.get(f"{name}-{s}") for s in strategies}
        brute = got.get("brute")
        est = rows.get(f"{name}-estimate")
        entry = {"seed": seed, "reference": None, "reference_kind": None}
        if brute and brute.get("status") == "done" and brute.get("checked") == "VERIFIED":
            entry.update(reference=brute["bound"], reference_kind="brute")
        elif est and est.get("status") == "done":
            inputs = next((r["inputs"] for r in got.values() if r and r.get("inputs")), None)
            if inputs:
                entry.update(reference=est["estimate"] * inputs, reference_kind="ESTIMATE")
        entry.update({s: r for s, r in got.items() if r is not None})
        out[name] = entry
    return out


def complete(entry, strategies):
    """Whether every strategy cell of a model is logged."""
    return all(s in entry for s in strategies)


def table(table_models, strategies):
    """Per strategy: the Table 1 numbers over the given models (only VERIFIED bounds count)."""
    lines = []
    for s in strategies:
        ok = [(e[s], e["reference"]) for e in table_models if s in e and e[s].get("checked") == "VERIFIED"]
        tried = [e[s] for e in table_models if s in e]
        ratio = mean_sd([r["bound"] / ref for r, ref in ok if ref])
        frac = mean_sd([r["bound"] / r["inputs"] for r, _ in ok])
        gen = [r for r in tried if r.get("gen_seconds") is not None]
        chk = [r for r in tried if r.get("check_seconds") is not None]
        lines.append({
            "strategy": s, "models": len(tried), "verified": len(ok),
            "failures": {c: sum(1 for r in tried if execution.verdict_class(r.get("checked")) == c
                                or r.get("status") == c) for c in execution.FAILURE_CLASSES},
            "bound_over_reference": ratio, "bound_over_inputs": frac,
            "generator_seconds": mean_sd([r["gen_seconds"] for r in gen])[0],
            "generator_cpu": mean_sd([r["gen_cpu"] for r in gen])[0],
            "checker_seconds": mean_sd([r["check_seconds"] for r in chk])[0],
            "checker_cpu": mean_sd([r["check_cpu"] for r in chk])[0],
            "flops": mean_sd([r["flops"] for r in gen])[0],
            "checker_flops": mean_sd([r["checker_flops"] for r in gen if r.get("checker_flops")])[0]})
    return lines


def _pm(ms, digits=4):
    m, sd = ms
    return "-" if m is None else f"{m:.{digits}f} ± {sd:.{digits}f}"


def _t(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def table_markdown(lines, reference_kind):
    ref = "brute count" if reference_kind == "brute" else "ESTIMATE"
    out = [f"| strategy | seeds | VERIFIED | bound / {ref} (mean ± sd) | bound / inputs (mean ± sd) | "
           "generator wall [CPU] s | checker wall [CPU] s | FLOPs (counted) |",
           "|---|---|---|---|---|---|---|---|"]
    for t in lines:
        fails = ", ".join(f"{n} {c}" for c, n in t["failures"].items() if n)
        out.append(f"| {t['strategy']} | {t['models']} | {t['verified']}{' (' + fails + ')' if fails else ''} | "
                   f"{_pm(t['bound_over_reference'])} | {_pm(t['bound_over_inputs'])} | "
                   f"{_t(t['generator_seconds'])} [{_t(t['generator_cpu'])}] | "
                   f"{_t(t['checker_seconds'])} [{_t(t['checker_cpu'])}] | "
                   f"{'-' if t['flops'] is None else format(t['flops'], '.2g')} |")
    return "\n".join(out)


def comparison(lines, entries, strategies):
    """Our numbers next to the published ones and the reference implementation's subcubic bounds."""
    by = {t["strategy"]: t for t in lines}
    comp = {}
    for s, (m, sd) in PUBLISHED.items():
        if s in by:
            comp[s] = {"published_accuracy": [m, sd], "ours_bound_over_inputs": by[s]["bound_over_inputs"],
                       "ours_bound_over_brute": by[s]["bound_over_reference"]}
    sub = [t for t in lines if t["strategy"].startswith("subcubic") and t["bound_over_reference"][0] is not None]
    if sub:
        best = max(sub, key=lambda t: t["bound_over_reference"][0])
        comp["best_subcubic"] = {"strategy": best["strategy"], "ours_bound_over_brute": best["bound_over_reference"],
                                 "reference_best_subcubic_on_anchors": REFERENCE_SUBCUBIC_ANCHORS}
    anchors = {}
    for name, e in entries.items():
        if name.startswith("anchor_") and e["reference"]:
            anchors[name] = {s: e[s]["bound"] / e["reference"] for s in strategies
                             if s in e and e[s].get("checked") == "VERIFIED"}
    if anchors:
        comp["anchors_bound_over_brute"] = anchors
    return comp


CSV_COLUMNS = ["model", "seed", "strategy", "status", "checked", "bound", "inputs", "reference", "reference_kind",
               "bound_over_reference", "bound_over_inputs", "gen_seconds", "gen_cpu", "check_seconds", "check_cpu",
               "flops", "checker_flops", "train_seconds", "final_loss", "sha256", "certificate_sha256", "worker"]


def write_csv(path, entries, strategies, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for name, e in sorted(entries.items(), key=lambda kv: (isinstance(kv[1]["seed"], str), kv[1]["seed"])):
            train = rows.get(f"train-{name}") or {}
            for s in strategies:
                r = e.get(s)
                if r is None:
                    continue
                d = dict(r, model=name, seed=e["seed"], strategy=s, reference=e["reference"],
                         reference_kind=e["reference_kind"], train_seconds=train.get("train_seconds"),
                         final_loss=train.get("final_loss"))
                if r.get("bound") is not None:
                    d["bound_over_inputs"] = f"{r['bound'] / r['inputs']:.7f}"
                    if e["reference"]:
                        d["bound_over_reference"] = f"{r['bound'] / e['reference']:.7f}"
                for key in ("gen_seconds", "gen_cpu", "check_seconds", "check_cpu", "train_seconds"):
                    if d.get(key) is not None:
                        d[key] = f"{d[key]:.3f}"
                w.writerow(d)


def plot(path, entries, strategies):
    """Every model's bound / reference against the proof cost (counted FLOPs and measured checker CPU)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for i, s in enumerate(strategies):
        pts = [(e[s]["flops"], e[s]["check_cpu"], e[s]["bound"] / e["reference"]) for e in entries.values()
               if s in e and e[s].get("checked") == "VERIFIED" and e["reference"]]
        if not pts:
            continue
        color, marker = f"C{i % 10}", "o^sDv<>p*hX"[i % 11]
        for ax, col in zip(axes, (0, 1)):
            ax.scatter([p[col] for p in pts], [p[2] for p in pts], s=8, alpha=0.35, color=color, marker=marker)
            mx = sum(p[col] for p in pts) / len(pts)
            my = sum(p[2] for p in pts) / len(pts)
            ax.scatter([mx], [my], s=70, color=color, marker=marker, edgecolors="k", zorder=3,
                       label=s if col == 0 else None)
    axes[0].set_xlabel("proof cost: counted FLOPs of the generator")
    axes[1].set_xlabel("proof cost: checker CPU seconds (Arb, measured)")
    axes[0].set_ylabel("bound / brute-force count")
    for ax in axes:
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    n = sum(1 for e in entries.values() if e["reference"])
    fig.suptitle(f"Max-of-K accuracy bounds against proof cost, {n} trained seeds (small: one seed; large: mean)")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def report(out_dir, rows, models, strategies, run_seconds=None):
    """Write table.md, summary.json, per_seed.csv and bound_vs_cost.png; return the summary."""
    entries = per_model(rows, models, strategies)
    seeds = {n: e for n, e in entries.items() if not n.startswith("anchor_")}
    done = {n: e for n, e in seeds.items() if complete(e, strategies)}
    kinds = {e["reference_kind"] for e in done.values() if e["reference_kind"]}
    lines = table(list(done.values()), strategies)
    trains = [r for r in rows.values() if r.get("kind") == "train" and r.get("status") == "done"]
    cells = [r for r in rows.values() if r.get("cell_seconds") is not None]
    cpu = sum((r.get("gen_cpu") or 0) + (r.get("check_cpu") or 0) + (r.get("train_cpu") or 0) for r in cells)
    sessions = _sessions(out_dir, run_seconds)
    summary = {
        "seeds_asked": len(seeds), "seeds_complete": len(done), "strategies": list(strategies),
        "reference": sorted(kinds), "table": lines, "comparison": comparison(lines, entries, strategies),
        "cost": {"cells_logged": len(cells), "worker_seconds": sum(r["cell_seconds"] for r in cells),
                 "worker_cpu_seconds_in_cells": cpu,
                 "train_seconds_mean": mean_sd([r["train_seconds"] for r in trains])[0],
                 "train_cpu_mean": mean_sd([r["train_cpu"] for r in trains])[0],
                 "driver_sessions": sessions, "driver_wall_seconds": sum(s["wall_seconds"] for s in sessions)},
        "failures": [{"id": r["id"], "status": r.get("status"), "checked": r.get("checked"), "detail": r.get("detail")}
                     for r in rows.values() if r.get("status") != "done"
                     or (r.get("kind") == "strategy" and r.get("checked") != "VERIFIED")]}
    execution.write_json(os.path.join(out_dir, "summary.json"), summary)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(f"{len(done)} of {len(seeds)} seeds complete; mean over complete seeds, only VERIFIED bounds.\n\n")
        f.write(table_markdown(lines, "brute" if kinds <= {"brute"} else "ESTIMATE") + "\n")
    write_csv(os.path.join(out_dir, "per_seed.csv"), entries, strategies, rows)
    plot(os.path.join(out_dir, "bound_vs_cost.png"), done, strategies)
    return summary


def _sessions(out_dir, run_seconds):
    """The driver sessions of this run folder (each run appends its wall time; a report-only call none)."""
    import json
    path = os.path.join(out_dir, "sessions.jsonl")
    if run_seconds is not None:
        with open(path, "a") as f:
            f.write(execution.dumps({"ended": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_seconds": run_seconds}) + "\n")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------------------------------ command

def cmd_maxofk_sweep(args):
    """Train or reuse the seeds, run every (seed, strategy) cell on the cluster, write the outputs."""
    _, BadInput = families.checker_errors()
    try:
        args.seeds = parse_seeds(args.seeds)
    except ValueError as e:
        raise BadInput(str(e)) from None
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        err = families.accuracy_strategy_error(s)
        if err:
            raise BadInput(f"--strategies: {err}")
    if args.d_vocab ** args.k > BRUTE_LIMIT:
        strategies = [s for s in strategies if s != "brute"]
    if not strategies:
        raise BadInput("--strategies: nothing to run")
    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    cells, models = plan(args, strategies, out)
    seconds = None
    if not args.report_only:  # else: read the log (another driver may be writing it) and write the outputs
        with execution.Executor(execution.options(args)) as ex:
            ex.run(out, "cells.jsonl", cells, "max-of-k cells")
        seconds = time.perf_counter() - start
    logged = execution.read_log(os.path.join(out, "cells.jsonl"), repair=False)
    ids = {c.id for c in cells} | {f"train-{name}" for name in models}   # seeds trained in an earlier run too
    rows = {k: r for k, r in logged.items() if k in ids}
    summary = report(out, rows, models, strategies, seconds)
    print(f"{summary['seeds_complete']} of {summary['seeds_asked']} seeds complete "
          f"({len(rows)} cells logged); {time.perf_counter() - start:.0f} s this run")
    with open(os.path.join(out, "table.md")) as f:
        print(f.read(), end="")
    bad = [f for f in summary["failures"]]
    if bad:
        print(f"{len(bad)} cells not VERIFIED (see summary.json 'failures')")
    return 1 if bad else 0


def add_command(esub):
    """Register `tcert experiment maxofk-sweep`."""
    p = esub.add_parser("maxofk-sweep", help="Table 1 of the compact-proofs paper over trained Max-of-K seeds")
    p.add_argument("--out-dir", required=True, help="the run folder (log, models, outputs; resumable, movable)")
    p.add_argument("--seeds", default="0-150", help="seeds to train or reuse, e.g. 0-150 or 0,5,7-9")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--d-vocab", type=int, default=64)
    p.add_argument("--steps", type=int, default=3000, help="training steps (reference recipe: 3000)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help="comma-separated `tcert accuracy --strategy` values")
    p.add_argument("--anchors", action="store_true",
                   help="also the two shipped Max-of-4 anchors (reported beside the seeds, not in the means)")
    p.add_argument("--samples", type=int, default=200_000, help="estimate samples when brute force is out of range")
    p.add_argument("--keep-certificates", action="store_true",
                   help="keep every certificate in OUT_DIR/certs (about 250 kB each at d_vocab 64)")
    p.add_argument("--backend", choices=("flint", "mpmath"), default="flint")
    p.add_argument("--report-only", action="store_true",
                   help="compute nothing: write table, summary, CSV and figure from the cells logged so far")
    execution.add_arguments(p)
    p.set_defaults(func=cmd_maxofk_sweep)
