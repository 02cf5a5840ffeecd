"""Benchmark the Max-of-K accuracy certificates on the Max-of-4 anchors (Table-1 style summary).

    python benchmarks/bench_accuracy.py [--no-brute-check] [--plot docs/accuracy_bound_vs_flops.png]

For each anchor (certificates/anchors/maxofk/*.npz): generate every strategy's certificate (timed) and
check it with the Arb backend (timed); the brute-force certificate gives the exact count that the other
bounds are divided by. The full rigorous brute-force check (all 64^4 inputs) runs unless --no-brute-check.
Wall times go to stdout only.
"""

import argparse
import glob
import os
import tempfile
import time

from tcert.checker.verify import verify
from tcert.checker.modelfile import load_model
from tcert.generator import certificate
from tcert.generator.accuracy.strategies import make_certificate
from tcert.generator.model.importers import import_npz
from tcert.generator.model.files import save_model
from tcert.testing import ROOT

STRATEGIES = ("brute", "cubic", "subcubic:svd", "subcubic:svd2", "subcubic:svd-rec", "subcubic:exact-eqke",
              "subcubic:svd-rec+eu", "subcubic:exact-eqke+eu")
REFERENCE = {"maxof4_seed123": {"cubic": 15_821_617, "best subcubic": 11_287_877},
             "maxof4_seed50": {"cubic": 15_868_028, "best subcubic": 11_542_074}}


def run(npz, tmp, brute_check: bool, backend: str):
    """Rows (dict per strategy) for one anchor."""
    name = os.path.basename(npz)[:-4]
    model_path = os.path.join(tmp, name + ".safetensors")
    save_model(model_path, *import_npz(npz))
    model = load_model(model_path)
    rows, exact = [], None
    for strategy in STRATEGIES:
        t0, c0 = time.perf_counter(), time.process_time()
        cert, report = make_certificate(model, strategy, exact)
        gen, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
        path = os.path.join(tmp, f"{name}_{strategy.replace(':', '_')}.json")
        certificate.write(path, cert)
        check = check_cpu = None
        if strategy != "brute" or brute_check:
            t0, c0 = time.perf_counter(), time.process_time()
            verify(path, model_path, backend)
            check, check_cpu = time.perf_counter() - t0, time.process_time() - c0
        if strategy == "brute":
            exact = report["bound"]
        rows.append({"model": name, "strategy": strategy, "bound": report["bound"], "exact": exact,
                     "flops": report["flops"], "complexity": report["complexity"], "gen_s": gen, "check_s": check})
        print(f"{name:16s} {strategy:20s} bound {report['bound']:>9d}  bound/exact {report['bound'] / exact:.4f}  "
              f"generator {gen:6.2f} s [{gen_cpu:5.2f} CPU]  checker({backend}) "
              + (f"{check:6.2f} s [{check_cpu:5.2f} CPU]" if check is not None else "   (skipped)")
              + f"  {report['flops']:.3g} FLOPs  {report['complexity']}", flush=True)
    return rows


def plot(rows, out):
    """Bound / exact accuracy versus counted FLOPs, one marker per strategy and model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {"brute": "s", "cubic": "o", "subcubic:svd": "^", "subcubic:svd2": "<", "subcubic:svd-rec": ">",
               "subcubic:exact-eqke": "v", "subcubic:svd-rec+eu": "P", "subcubic:exact-eqke+eu": "X"}
    for strategy in STRATEGIES:
        pts = [(r["flops"], r["bound"] / r["exact"]) for r in rows if r["strategy"] == strategy]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=markers[strategy], label=strategy, s=50)
    ax.set_xscale("log")
    ax.set_xlabel("counted FLOPs of the proof")
    ax.set_ylabel("certified bound / exact accuracy")
    ax.set_title("Max-of-4 anchors: bound vs proof cost")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-brute-check", action="store_true", help="skip the rigorous 64^4 brute-force check")
    parser.add_argument("--backend", default="flint", choices=["flint", "mpmath"])
    parser.add_argument("--plot", default=None, help="write the bound-vs-FLOPs plot (PNG) here")
    args = parser.parse_args()
    print("load:", os.popen("uptime").read().strip())
    anchors = sorted(glob.glob(os.path.join(ROOT, "certificates", "anchors", "maxofk", "*.npz")))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, npz in enumerate(anchors):
            rows += run(npz, tmp, not args.no_brute_check and i == 0, args.backend)
    print("\nTable 1 (bound / exact accuracy; reference implementation on the same weights in brackets;"
          " mean +- sd over the anchors)")
    print(f"{'strategy':22s}" + "".join(f"{r['model']:>32s}" for r in rows if r["strategy"] == "brute")
          + f"{'mean +- sd':>18s}")
    for strategy in STRATEGIES:
        sel = [r for r in rows if r["strategy"] == strategy]
        cells = []
        for r in sel:
            ref = REFERENCE.get(r["model"], {}).get("cubic" if strategy == "cubic" else
                                                    "best subcubic" if strategy.startswith("subcubic") else "")
            cells.append(f"{r['bound'] / r['exact']:.4f} ({r['bound']})" + (f" [{ref / r['exact']:.4f}]" if ref else ""))
        ratios = [r["bound"] / r["exact"] for r in sel]
        mean = sum(ratios) / len(ratios)
        sd = (sum((x - mean) ** 2 for x in ratios) / (len(ratios) - 1)) ** 0.5 if len(ratios) > 1 else 0.0
        print(f"{strategy:22s}" + "".join(f"{c:>32s}" for c in cells) + f"{mean:>10.4f} +- {sd:.4f}")
    print("load:", os.popen("uptime").read().strip())
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
