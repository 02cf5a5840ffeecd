"""Benchmark: overwhelm `--method tight` at paper scale (issue 6 speed target).

    python benchmarks/bench_overwhelm_tight.py [--workdir DIR] [--n-fix 1500]

Same model, query, 35-token free multiset and repeated-token prefix as benchmarks/bench_overwhelm.py
--case perm (random neox1l, d_vocab 30522, d_model 512, 8 heads, seed 0); the generator writes the
certificate even when Inconclusive (force=True) and the checker (Arb, fresh process, via
bench_overwhelm.py --check-only) runs every obligation. Targets: generator <= 30 s, checker <= 5 min.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--n-fix", type=int, default=1500)
    args = ap.parse_args()
    import bench_overwhelm as bo
    from tcert.generator import certificate
    from tcert.generator.overwhelm.tight import format_report, generate_tight
    workdir = args.workdir or tempfile.mkdtemp(prefix="tcert-bench-overwhelm-tight-")
    model_path = os.path.join(workdir, "neox1l_paper.safetensors")
    model = bo.build_model(model_path)
    c = model.config
    rng = np.random.default_rng(1)        # the same draws as bench_overwhelm.run_case("perm")
    query = int(rng.integers(0, c.d_vocab))
    spec = ("perm", 35, [int(x) for x in rng.integers(0, c.d_vocab, 35)])
    prefix = [bo.dominant_prefix_token(model, query, args.n_fix, 35)] * args.n_fix
    t0, c0 = time.perf_counter(), time.process_time()
    cert, report = generate_tight(model, prefix, query, spec, force=True)
    t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
    path = os.path.join(workdir, "overwhelm_tight.json")
    certificate.write(path, cert)
    print(format_report(report))
    print(f"generator: {t_gen:.2f} s wall, {c_gen:.2f} s CPU")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_overwhelm.py"), "--check-only",
                          path, model_path], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"checker (Arb, fresh process): {res['seconds']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU, "
          f"peak RSS {res['peak_rss_gb']:.2f} GB; verdict {res['verdict'][:200]}")
    for n, s in res["obligations"]:
        print(f"   {s:8.2f} s  {n}")
    print(f"machine load (1-min average, 2 cores): {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
