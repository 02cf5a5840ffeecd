"""Benchmark: overwhelm `--method tight` on a paper-scale real GPT-NeoX block (issue 6, part 3).

    python benchmarks/bench_overwhelm_real_blocks.py [--workdir DIR] [--n-fix 1500] [--repeat 1]

bench_overwhelm_tight.py (same query, 35-token multiset, repeated-token prefix, force=True) on another
model: the shape of bench_overwhelm.py (d_vocab 30522, d_model 512, 8 heads of 64, d_mlp 2048) as a
Pythia-style block with separate ln1/ln2, a final LayerNorm, exact-erf GELU, every bias drawn (std 0.1)
and partial rotary (rotary_dim 16 = 25% of the head, as in Pythia), seed 0. Use a workdir of its own:
the model file keeps bench_overwhelm_tight's name.

The generator and the checker (Arb, the default backend) each run in a fresh process, `--repeat` times
alternating, so that each peak RSS is that process's own (both include loading the model). Printed per
round: the generator's time (`generate_tight` only) and peak RSS, the checker's (`verify` after loading)
and peak RSS, and the same-run ratios against the issue's targets: checker <= 5x the generator (CPU and
wall), peak memory <= 2x the generator's.
"""

import argparse
import json
import os
import sys
import tempfile

from tcert.testing.bench import fresh, fresh_check, machine_load, paper_model, timed_tight, usage

MODEL = "neox1l_paper.safetensors"
CERT = "overwhelm_tight.json"


def generate(workdir: str, n_fix: int) -> dict:
    """In this process: load the model, choose the prefix (bench_overwhelm.run_case("perm")'s draws, the
    dominant token repeated n_fix times), run `generate_tight` (timed) and write the certificate."""
    from tcert.generator import certificate
    from tcert.generator.overwhelm.tight import format_report
    cert, report, wall, cpu = timed_tight(paper_model(os.path.join(workdir, MODEL), real_block=True), n_fix)
    certificate.write(os.path.join(workdir, CERT), cert)
    return {"wall": wall, "cpu": cpu, "peak_rss_gb": usage()[1], "report": format_report(report)}


def one_round(workdir: str, n_fix: int) -> None:
    gen = fresh([__file__, "--generate-only", "--workdir", workdir, "--n-fix", n_fix])
    print(gen["report"])
    print(f"generator (fresh process): {gen['wall']:.2f} s wall, {gen['cpu']:.2f} s CPU, peak RSS {gen['peak_rss_gb']:.2f} GB")
    res = fresh_check(os.path.join(workdir, CERT), os.path.join(workdir, MODEL))
    print(f"checker (Arb, fresh process): {res['seconds']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU, "
          f"peak RSS {res['peak_rss_gb']:.2f} GB; verdict {res['verdict'][:200]}")
    for n, s in res["obligations"]:
        print(f"   {s:8.2f} s  {n}")
    print(f"same-run ratios (targets: time <= 5x, memory <= 2x): CPU {res['cpu_seconds'] / gen['cpu']:.2f}x, "
          f"wall {res['seconds'] / gen['wall']:.2f}x, peak RSS {res['peak_rss_gb'] / gen['peak_rss_gb']:.2f}x")
    print(machine_load())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--n-fix", type=int, default=1500)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="tcert-bench-overwhelm-real-")
    if args.generate_only:
        print(json.dumps(generate(workdir, args.n_fix)))
        return
    paper_model(os.path.join(workdir, MODEL), real_block=True)     # written once, before any timed process
    for _ in range(args.repeat):
        one_round(workdir, args.n_fix)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
