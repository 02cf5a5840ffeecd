"""Benchmark: overwhelm `--method tight` on a paper-scale real GPT-NeoX block (issue 6, part 3).

    python benchmarks/bench_overwhelm_real_blocks.py [--workdir DIR] [--n-fix 1500]

The shape of benchmarks/bench_overwhelm.py (d_vocab 30522, d_model 512, 8 heads of 64, d_mlp 2048) as a
Pythia-style block: separate ln1/ln2, final LayerNorm, exact-erf GELU, every bias drawn (std 0.1),
partial rotary (rotary_dim 16 = 25% of the head, as in Pythia), seed 0. Query, 35-token multiset and
repeated-token prefix are chosen as in bench_overwhelm_tight.py. The generator writes the certificate even
when Inconclusive (force=True); the checker (Arb, fresh process) runs every obligation.
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


def build_model(path):
    """The paper-scale real-block model (cached at path)."""
    import bench_overwhelm as bo
    from checker.modelfile import load_model
    from generator.modelio import save_model
    from generator.randmodel import random_model
    if not os.path.exists(path):
        t, c = random_model("neox1l", seed=0, shared_ln=False, final_ln=True, act_fn="gelu", rotary_dim=16,
                            bias_std=0.1, **bo.SHAPE)
        save_model(path, t, c)
    return load_model(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--n-fix", type=int, default=1500)
    args = ap.parse_args()
    import bench_overwhelm as bo
    from generator import certio
    from generator.overwhelm_tight import format_report, generate_tight
    workdir = args.workdir or tempfile.mkdtemp(prefix="tcert-bench-overwhelm-real-")
    model_path = os.path.join(workdir, "neox_real_paper.safetensors")
    model = build_model(model_path)
    c = model.config
    rng = np.random.default_rng(1)
    query = int(rng.integers(0, c.d_vocab))
    spec = ("perm", 35, [int(x) for x in rng.integers(0, c.d_vocab, 35)])
    prefix = [bo.dominant_prefix_token(model, query, args.n_fix, 35)] * args.n_fix
    t0, c0 = time.perf_counter(), time.process_time()
    cert, report = generate_tight(model, prefix, query, spec, force=True)
    t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
    path = os.path.join(workdir, "overwhelm_real.json")
    certio.write(path, cert)
    print(format_report(report))
    print(f"generator: {t_gen:.2f} s wall, {c_gen:.2f} s CPU")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_overwhelm.py"), "--check-only",
                          path, model_path], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"checker (Arb, fresh process): {res['seconds']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU, "
          f"peak RSS {res['peak_rss_gb']:.2f} GB; verdict {res['verdict'][:300]}")
    for n, s in res["obligations"]:
        print(f"   {s:8.2f} s  {n}")
    print(f"machine load (1-min average, 2 cores): {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
