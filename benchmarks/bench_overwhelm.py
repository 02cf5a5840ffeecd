"""Benchmark: overwhelm certificates on a random paper-scale neox1l model.

    python benchmarks/bench_overwhelm.py [--case perm|any|both] [--workdir DIR] [--no-looseness] [--d-vocab N]

--d-vocab 5000 runs the same shape with a medium vocabulary (the model file is named by it). On the
shared 2-core machine run it with OPENBLAS_NUM_THREADS=1 (both sides inherit it; the value is printed):
multithreaded OpenBLAS on a loaded machine makes small products ~10x slower. The last line of a case
is the same-run ratio checker/generator (target <= 5 for perm:35 lp). The generator's time includes its
rigorous confirmation of the sample's margin (the checker's forward pass, so that it claims only what the
checker confirms): at paper scale about 12 of its 14 s, so the ratio to its float work alone is ~6x larger.

Model: tcert.generator.model.random_models.random_model("neox1l", d_vocab 30522, d_model 512, 8 heads, d_head 64,
d_mlp 2048, n_ctx 2048, seed 0). Cases (issue 3):
  perm: 35-token free multiset, n_fix 1500, --method lp   (targets: generator <= 10 s, checker <= 120 s,
        peak memory <= 6 GB)
  any:  any:16, n_fix 1000                                 (targets: generator <= 60 s, checker <= 10 min)
The prefix is one token repeated (the paper's "repeated string" setting), the token whose key the query
attends to most, which makes a dominant prefix. If the float verdict is still Inconclusive, the
certificate is written anyway (generate(force=True)) and the checker runs every obligation, rejecting
only at the last one (W < PTP/2); the timings are then still those of the full recomputation.
The checker (`tcert.checker.verify.verify`, each of --backends: default flint-exact (Arb's own
products), then flint (the default backend: the exact product layer)) runs in a fresh subprocess so that its peak RSS is its own
(`tcert.testing.bench.fresh_check`).
With looseness on, the float value of the exact d_vocab x d_vocab OV-table bound is computed (chunked
float64) and compared with the certified Cauchy-Schwarz ("norm") bound the any-case certificate uses.
"""

import argparse
import os
import resource
import tempfile
import time

import numpy as np

from tcert.testing.bench import SHAPE, dominant_prefix_token, fresh_check, paper_model


def float_table_looseness(model, report, T):
    """(W with the exact float OV table over all tokens, W with the norm bound) at the same betas."""
    from tcert.generator.overwhelm.tables import FloatModel
    fm = FloatModel(model)
    c = model.config
    total = np.zeros(c.d_vocab)
    for h, hd in enumerate(report["heads"]):
        bmin, bmax = hd["beta_min"], hd["beta_max"]
        M = (fm.WO[h] @ fm.WU).astype(np.float32)
        lo, hi = np.full(c.d_vocab, np.inf), np.full(c.d_vocab, -np.inf)
        vals = T["values"][h].astype(np.float32)
        for s in range(0, vals.shape[0], 2048):
            D = vals[s:s + 2048] @ M
            lo, hi = np.minimum(lo, D.min(axis=0)), np.maximum(hi, D.max(axis=0))
        total += np.where(hi >= 0, bmax * hi, bmin * hi) - np.where(lo <= 0, bmax * lo, bmin * lo)
    return float(total.max())


def run_case(name, model, model_path, workdir, looseness, backends=("flint",)):
    from tcert.generator import certificate
    from tcert.generator.overwhelm.naive_lp import format_report, generate
    from tcert.generator.overwhelm.tables import FloatModel, float_tables
    rng = np.random.default_rng(1)
    c = model.config
    query = int(rng.integers(0, c.d_vocab))
    if name == "perm":
        n_fix, spec, method = 1500, ("perm", 35, [int(x) for x in rng.integers(0, c.d_vocab, 35)]), "lp"
    else:
        n_fix, spec, method = 1000, ("any", 16, None), "naive"
    t0 = time.perf_counter()
    dom = dominant_prefix_token(model, query)
    t_pick = time.perf_counter() - t0
    prefix = [dom] * n_fix
    t0, c0 = time.perf_counter(), time.process_time()
    cert, report = generate(model, prefix, query, spec, method, "auto", "float", force=True)
    t_gen, c_gen = time.perf_counter() - t0, time.process_time() - c0
    path = os.path.join(workdir, f"overwhelm_{name}.json")
    certificate.write(path, cert)
    print(f"\n== {name}: n_fix {n_fix}, free {spec[0]}:{spec[1]}, method {method}, prefix token {dom} x {n_fix}, "
          f"query {query}")
    print(format_report(report))
    gen_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20     # KiB -> GiB; with the model loaded
    print(f"generator: {t_gen:.2f} s wall, {c_gen:.2f} s CPU, peak RSS of this process so far {gen_rss:.2f} GB (float "
          f"verdict {report['verdict']}; choosing the prefix token took {t_pick:.2f} s, not counted)")
    for backend in backends:
        res = report_check(path, model_path, backend, t_gen, c_gen)
        print(f"checker/generator peak memory ratio: {res['peak_rss_gb'] / gen_rss:.2f}")
    if looseness and report["value_bound"] == "norm":
        T = float_tables(FloatModel(model), prefix, query, list(range(c.d_vocab)), spec[1])
        t0 = time.perf_counter()
        w_table = float_table_looseness(model, report, T)
        print(f"looseness: certified norm bound W = {report['deviation_float']:.6g}; float exact OV-table W = "
              f"{w_table:.6g} (ratio {report['deviation_float'] / w_table:.2f}x; table took "
              f"{time.perf_counter() - t0:.1f} s in float32)")
    return res


def report_check(path, model_path, backend, t_gen, c_gen):
    """Check in a fresh process with `backend`; print its figures and the same-run ratios."""
    res = fresh_check(path, model_path, backend)
    print(f"checker ({backend}, fresh process): {res['with_load']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU, incl. "
          f"{res['load_seconds']:.2f} s loading; "
          f"peak RSS {res['peak_rss_gb']:.2f} GB; verdict {res['verdict'][:160]}")
    total, work = res["with_load"], sum(s for _, s in res["obligations"])
    for n, s in res["obligations"]:
        print(f"   {100 * s / total:5.1f}%  {s:8.2f} s  {n}")
    print(f"   {100 * (total - work) / total:5.1f}%  {total - work:8.2f} s  "
          f"loading, parsing, Weights conversion outside obligations")
    print(f"generator/checker time ratio: {t_gen / total:.3f} wall")
    print(f"checker/generator time ratio: {total / t_gen:.2f} wall, {res['cpu_seconds'] / c_gen:.2f} CPU "
          f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    print(f"machine load while the case ran (1-min load average on 2 cores): {os.getloadavg()[0]:.1f}")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["perm", "any", "both"], default="both")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--no-looseness", action="store_true")
    ap.add_argument("--backends", default="flint-exact,flint",
                    help="checker backends, comma-separated (flint-exact: Arb's own products; flint: the default, exact layer)")
    ap.add_argument("--d-vocab", type=int, default=None, help="vocabulary size (default: paper scale 30522)")
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="tcert-bench-overwhelm-")
    os.makedirs(workdir, exist_ok=True)
    tag = f"_v{args.d_vocab}" if args.d_vocab else ""
    model_path = os.path.join(workdir, f"neox1l_paper_scale{tag}.safetensors")
    t0 = time.perf_counter()
    model = paper_model(model_path, d_vocab=args.d_vocab)
    print(f"model {model_path}: {dict(SHAPE, d_vocab=model.config.d_vocab)} (build/load {time.perf_counter() - t0:.1f} s)")
    for case in (["perm", "any"] if args.case == "both" else [args.case]):
        run_case(case, model, model_path, workdir, not args.no_looseness, args.backends.split(","))


if __name__ == "__main__":
    main()
