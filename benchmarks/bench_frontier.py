"""The Max-of-K accuracy frontier: certified fraction vs counted FLOPs and vs check time, every strategy.

    python benchmarks/bench_frontier.py [--seeds 0,1,2] [--budgets 1.25x,1.5x,2x,4x] [--repeat 3] \
        [--before-checker /work/venvs/main/bin/tcert-check] [--plot docs/accuracy_bound_vs_flops.png] [--no-anchors] \
        [--trained DIR] [--rounds 3]

Models: both shipped anchors (certificates/anchors/maxofk) and freshly trained seeds (`tcert train maxofk
--seed S`, the reference recipe). Per model, in one run: generate and check (Arb) brute force, cubic, the
best subcubic variants and refine at each budget and unlimited; then print the issue's same-run ratios:

* refine (unlimited) bound == brute-force count; its counted FLOPs / brute force's (generator-side counted
  FLOPs, docs/accuracy.md's rule; also / the pruned brute checker's counted FLOPs); its check time / brute
  force's check time (the pruned brute checker of this tree, and, with --before-checker, an older checker
  run as a subprocess on the same certificate and model: the "before" of the brute-force check time);
* refine:2x (a budget of twice cubic's counted FLOPs): bound / exact count.

Check times are wall and CPU seconds of the verify call (the before-checker's CPU is its child rusage).
Nothing is written into certificates; the figure (two panels) goes to --plot.

    python benchmarks/bench_frontier.py --large-k M8.safetensors,M10.safetensors [--samples 200000]

Where brute force is impossible (e.g. K = 8, 10 at d_vocab 64, `tcert train maxofk --k 8`): cubic, the best
subcubic variants and refine (2x and unlimited), each checked (Arb), against the importance-sampled
ESTIMATE (`tcert accuracy-estimate`; labelled, never a certificate) with one standard error.
"""

import argparse
import glob
import json
import os
import resource
import subprocess
import tempfile
import time

from tcert.checker.modelfile import load_model
from tcert.checker.verify import verify
from tcert.generator import certificate
from tcert.generator.accuracy.strategies import make_certificate
from tcert.generator.model.files import save_model
from tcert.generator.model.importers import import_npz
from tcert.testing import ROOT

SUBCUBIC = ("subcubic:svd", "subcubic:exact-eqke", "subcubic:exact-eqke+eu")
# The reference implementation run here on the anchors' weights (certificates/anchors/maxofk/README.md):
# bound, proof wall seconds (its FLOPs are not known, so the FLOPs panel shows them as levels).
REFERENCE = {"maxof4_seed123": {"cubic": (15_821_617, 55.0), "best subcubic": (11_287_877, 2.9)},
             "maxof4_seed50": {"cubic": (15_868_028, 43.0), "best subcubic": (11_542_074, 2.9)}}


def models(seeds, tmp, anchors=True, trained=None):
    """(name, model path) of the anchors and of freshly trained seeds (a seed already trained into the
    directory `trained` as seed<S>.safetensors, by the same command, is used from there)."""
    out = []
    for npz in sorted(glob.glob(str(ROOT / "certificates" / "anchors" / "maxofk" / "*.npz")) if anchors else []):
        name = os.path.basename(npz)[:-4]
        path = os.path.join(tmp, name + ".safetensors")
        save_model(path, *import_npz(npz))
        out.append((name, path))
    for s in seeds:
        if trained and os.path.exists(os.path.join(trained, f"seed{s}.safetensors")):
            out.append((f"seed{s}", os.path.join(trained, f"seed{s}.safetensors")))
            continue
        path = os.path.join(tmp, f"seed{s}.safetensors")
        t0 = time.perf_counter()
        run = subprocess.run(["tcert", "train", "maxofk", "--seed", str(s), "--out", path], capture_output=True,
                             text=True)
        if run.returncode != 0:
            raise SystemExit(f"training seed {s} failed: {run.stderr.strip()[-300:]}")
        print(f"trained seed {s} in {time.perf_counter() - t0:.1f} s", flush=True)
        out.append((f"seed{s}", path))
    return out


REPEAT = 1      # --repeat: check times are the least of this many runs (the machine is shared and noisy)
ROUNDS = 1      # --rounds: every strategy's check timed in this many rounds, alternating, the least kept


def timed_check(cert_path, model_path, backend):
    """(wall, CPU) seconds of the verify call: the least of REPEAT runs each."""
    best = (float("inf"), float("inf"))
    for _ in range(REPEAT):
        t0, c0 = time.perf_counter(), time.process_time()
        verify(cert_path, model_path, backend)
        best = (min(best[0], time.perf_counter() - t0), min(best[1], time.process_time() - c0))
    return best


def before_check(checker, cert_path, model_path):
    """(wall, CPU) seconds of an older `tcert-check` on the same certificate (it must say VERIFIED)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run = subprocess.run([checker, cert_path, "--model", model_path], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"before-checker failed: {run.stdout.strip()} {run.stderr.strip()[-300:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def run_model(name, model_path, strategies, tmp, backend, before):
    model = load_model(model_path)
    rows, exact, made = {}, None, {}
    for strategy in strategies:
        t0 = time.perf_counter()
        cert, report = make_certificate(model, strategy, exact)
        made[strategy] = (time.perf_counter() - t0, report, os.path.join(tmp, f"{name}_{strategy.replace(':', '_')}.json"))
        certificate.write(made[strategy][2], cert)
        exact = int(report["bound"]) if strategy == "brute" else exact
    times = {s: (float("inf"), float("inf")) for s in strategies}
    for _ in range(ROUNDS):         # every check once per round, the rounds one after another (the load drifts)
        for strategy in strategies:
            wall, cpu = timed_check(made[strategy][2], model_path, backend)
            times[strategy] = (min(times[strategy][0], wall), min(times[strategy][1], cpu))
    for strategy in strategies:
        gen, report, path = made[strategy]
        wall, cpu = times[strategy]
        row = {"bound": int(report["bound"]), "flops": report["flops"], "checker_flops": report.get("checker_flops"),
               "gen_s": gen, "check_s": wall, "check_cpu": cpu}
        if strategy == "brute":
            exact = row["bound"]
            if before:
                row["before_s"], row["before_cpu"] = before_check(before, path, model_path)
        rows[strategy] = row
        print(f"{name:15s} {strategy:24s} bound {row['bound']:>9d} ({row['bound'] / exact:.5f})  "
              f"{row['flops']:.3g} FLOPs  generator {gen:6.2f} s  check {wall:6.2f} s [{cpu:5.2f} CPU]"
              + (f"  before-checker {row['before_s']:6.2f} s [{row['before_cpu']:5.2f} CPU]" if "before_s" in row
                 else ""), flush=True)
    return rows


def ratios(name, rows):
    """The issue's same-run ratios of one model, as a table row."""
    b, c, r, r2 = rows["brute"], rows["cubic"], rows["refine"], rows["refine:2x"]
    out = {"model": name, "exact": b["bound"], "refine": r["bound"], "refine_exact": r["bound"] == b["bound"],
           "flops_ratio": r["flops"] / b["flops"], "flops_ratio_pruned": r["flops"] / b["checker_flops"],
           "check_ratio": r["check_s"] / b["check_s"], "check_cpu_ratio": r["check_cpu"] / b["check_cpu"],
           "budget2x_fraction": r2["bound"] / b["bound"], "budget2x_flops_over_cubic": r2["flops"] / c["flops"],
           "brute_check_s": b["check_s"], "brute_check_cpu": b["check_cpu"]}
    if "before_s" in b:
        out.update(before_s=b["before_s"], before_cpu=b["before_cpu"], check_ratio_before=r["check_s"] / b["before_s"],
                   check_cpu_ratio_before=r["check_cpu"] / b["before_cpu"])
    return out


def print_table(table):
    print("\n| model | exact count | refine bound (= exact?) | refine FLOPs / brute FLOPs (/ pruned checker's) | "
          "refine check / brute check, wall [CPU] | refine check / before brute check, wall [CPU] | "
          "refine:2x bound / exact (its FLOPs / cubic's) | brute check now, wall [CPU] s | before, wall [CPU] s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in table:
        before = (f"{t['check_ratio_before']:.3f} [{t['check_cpu_ratio_before']:.3f}]", f"{t['before_s']:.2f} "
                  f"[{t['before_cpu']:.2f}]") if "before_s" in t else ("(not run)", "(not run)")
        print(f"| {t['model']} | {t['exact']:,} | {t['refine']:,} ({'yes' if t['refine_exact'] else 'NO'}) | "
              f"{t['flops_ratio']:.4f} ({t['flops_ratio_pruned']:.3f}) | {t['check_ratio']:.3f} "
              f"[{t['check_cpu_ratio']:.3f}] | {before[0]} | {t['budget2x_fraction']:.5f} "
              f"({t['budget2x_flops_over_cubic']:.2f}) | {t['brute_check_s']:.2f} [{t['brute_check_cpu']:.2f}] | "
              f"{before[1]} |")


def plot(results, strategies, out):
    """Bound / exact vs counted FLOPs (left) and vs check CPU seconds (right), every strategy and model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    marks = "so^v<>PXDdh*p8H+x"
    for i, strategy in enumerate(strategies):
        pts = [(rows[strategy]["flops"], rows[strategy]["check_cpu"], rows[strategy]["bound"] / rows["brute"]["bound"])
               for rows in results.values()]
        for ax, k in zip(axes, (0, 1)):
            ax.scatter([p[k] for p in pts], [p[2] for p in pts], marker=marks[i % len(marks)], s=45, label=strategy)
    for name, ref in REFERENCE.items():
        if name not in results:
            continue
        exact = results[name]["brute"]["bound"]
        for label, (bound, seconds) in ref.items():
            axes[0].axhline(bound / exact, color="grey", lw=0.8, ls="--")
            axes[0].annotate(f"reference impl. {label}, {name[7:]} (FLOPs not known)", (0.01, bound / exact + 0.002),
                             xycoords=("axes fraction", "data"), fontsize=6, color="grey")
            axes[1].scatter([seconds], [bound / exact], marker="x", color="black", s=40,
                            label="reference impl. (reproduced here, wall s)" if label == "cubic" and
                            name == "maxof4_seed123" else None)
    before = [(rows["brute"]["before_cpu"], 1.0) for rows in results.values() if "before_cpu" in rows["brute"]]
    if before:
        axes[1].scatter([b[0] for b in before], [b[1] for b in before], marker="s", facecolors="none",
                        edgecolors="tab:blue", s=45, label="brute (checker before pruning)")
    axes[0].set_xlabel("counted FLOPs of the proof")
    axes[1].set_xlabel("check time, CPU s (Arb); reference points: proof wall s")
    axes[0].set_ylabel("certified bound / exact count")
    for ax in axes:
        ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"Max-of-4 frontier: {', '.join(results)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def large_k(paths, strategies, samples, backend, tmp):
    """Certified bound / inputs of each strategy next to the estimate, per model (no brute force)."""
    from tcert.generator.accuracy.strategies import estimate_accuracy
    for path in paths:
        model = load_model(path)
        c = model.config
        t0 = time.perf_counter()
        est = estimate_accuracy(model, samples, 0)
        print(f"K={c.n_ctx} d_vocab {c.d_vocab} ({os.path.basename(path)}): ESTIMATE {est['estimate']:.6f} +- "
              f"{est['stderr']:.6f} ({samples} samples, {time.perf_counter() - t0:.1f} s; not a certificate)", flush=True)
        for strategy in strategies:
            t0, c0 = time.perf_counter(), time.process_time()
            cert, report = make_certificate(model, strategy, None)
            gen, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
            out = os.path.join(tmp, f"k{c.n_ctx}_{strategy.replace(':', '_')}.json")
            certificate.write(out, cert)
            wall, cpu = timed_check(out, path, backend)
            frac = report["bound"] / report["inputs"]
            print(f"  {strategy:24s} bound/inputs {frac:.6f}  bound/estimate {frac / est['estimate']:.4f}  "
                  f"{report['flops']:.3g} FLOPs  generator {gen:6.2f} s [{gen_cpu:5.2f} CPU]  check {wall:6.2f} s "
                  f"[{cpu:5.2f} CPU]", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="fresh seeds to train (comma list; empty for none)")
    p.add_argument("--budgets", default="1.25x,1.5x,2x,4x")
    p.add_argument("--subcubic", default=",".join(SUBCUBIC))
    p.add_argument("--before-checker", default=None, help="an older tcert-check to time brute force with")
    p.add_argument("--backend", default="flint")
    p.add_argument("--plot", default=None)
    p.add_argument("--no-anchors", action="store_true")
    p.add_argument("--trained", default=None, help="a directory of seeds trained before (seed<S>.safetensors, "
                                                   "`tcert train maxofk --seed S --out DIR/seed<S>.safetensors`)")
    p.add_argument("--large-k", default=None, help="comma list of model files: the estimate mode")
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--json", default=None, help="write the measured rows here")
    p.add_argument("--plot-from", default=None, help="comma list of --json files: only draw --plot from them")
    p.add_argument("--repeat", type=int, default=1, help="time each check this many times, keep the least")
    p.add_argument("--rounds", type=int, default=1, help="time every check in this many alternating rounds")
    args = p.parse_args()
    global REPEAT, ROUNDS
    REPEAT, ROUNDS = max(1, args.repeat), max(1, args.rounds)
    if args.plot_from:
        runs = [json.load(open(path)) for path in args.plot_from.split(",")]
        merged = {name: rows for run in runs for name, rows in run["results"].items()}
        print_table([ratios(name, rows) for name, rows in merged.items()])
        plot(merged, runs[0]["strategies"], args.plot)
        return
    if args.large_k:
        strategies = ["cubic"] + [s for s in args.subcubic.split(",") if s] + ["refine:2x", "refine"]
        with tempfile.TemporaryDirectory() as tmp:
            large_k(args.large_k.split(","), strategies, args.samples, args.backend, tmp)
        return
    seeds = [int(s) for s in args.seeds.split(",") if s]
    budgets = [b for b in args.budgets.split(",") if b]
    if "2x" not in budgets:
        budgets.append("2x")
    strategies = ["brute", "cubic"] + [s for s in args.subcubic.split(",") if s] + \
        [f"refine:{b}" for b in budgets] + ["refine"]
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run_model(name, path, strategies, tmp, args.backend, args.before_checker)
                   for name, path in models(seeds, tmp, not args.no_anchors, args.trained)}
    print_table([ratios(name, rows) for name, rows in results.items()])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"strategies": strategies, "results": results}, f, indent=1)
    if args.plot:
        plot(results, strategies, args.plot)


if __name__ == "__main__":
    main()
