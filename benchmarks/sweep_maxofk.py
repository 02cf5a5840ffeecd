"""Seed sweep of the Max-of-K accuracy certificates: Table-1-style summary over trained seeds + anchors.

    python benchmarks/sweep_maxofk.py [--seeds 10] [--cache /work/maxofk_seeds] [--jobs 2]
        [--k 4] [--d-vocab 64] [--steps 3000] [--no-anchors] [--strategies cubic,subcubic:svd,...]
        [--check-brute] [--samples 200000]

Trains (or reuses, cached as <cache>/maxof<K>_v<V>_s<steps>_seed<S>.safetensors) seeds 0..N-1 with the
reference recipe (`generator.train.train_maxofk`, the same code as `tcert train maxofk`), adds the two
shipped Max-of-4 anchors when K = 4 and d_vocab = 64, and for every model generates each strategy's
certificate (timed) and checks it with the Arb backend (timed). The reference "true" accuracy is:
  * K = 4: the brute-force generator's count (all 64^4 inputs, float with a safety slack; its
    certificate is re-checked rigorously only with --check-brute: about 1.5-2 min per model);
  * K >= 5: brute force is out of reach, so the importance-sampled ESTIMATE of
    `generator.accuracy.estimate_accuracy` is used, printed and labelled as an estimate (never a
    certificate); bound / estimate ratios then inherit its sampling error.
Models are processed in parallel (--jobs, multiprocessing over seeds); a progress bar goes to stderr.
Wall times go to stdout only.
"""

import argparse
import glob
import os
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tcert.checker.verify import verify
from tcert.checker.modelfile import load_model
from tcert.testing import ROOT

DEFAULT_STRATEGIES = ("cubic", "subcubic:svd", "subcubic:svd2", "subcubic:svd-rec", "subcubic:exact-eqke",
                      "subcubic:svd-rec+eu", "subcubic:exact-eqke+eu")
PUBLISHED_EXACT = {"maxof4_seed123": 16_763_235, "maxof4_seed50": 16_771_350}


def model_path(cache, k, v, steps, seed):
    """Cache file name of one trained seed."""
    return os.path.join(cache, f"maxof{k}_v{v}_s{steps}_seed{seed}.safetensors")


def ensure_model(job):
    """Train (or reuse) one model; return its path. job = ("train", path, k, v, steps, seed) or
    ("anchor", path, npz)."""
    path = job[1]
    if os.path.exists(path):
        return path
    tmp = path + f".tmp{os.getpid()}"
    if job[0] == "anchor":
        from tcert.generator.model.importers import import_npz
        from tcert.generator.model.files import save_model
        save_model(tmp, *import_npz(job[2]))
    else:
        from tcert.generator.model.files import save_model
        from tcert.generator.train.maxofk import train_maxofk
        _, _, k, v, steps, seed = job
        tensors, cfg, _ = train_maxofk(k=k, seed=seed, d_vocab=v, steps=steps, progress=False)
        save_model(tmp, tensors, cfg)
    os.replace(tmp, path)
    return path


def evaluate(args):
    """All rows for one model: (name, {strategy: row}, reference dict)."""
    job, strategies, check_brute, samples = args
    from tcert.generator import certificate
    from tcert.generator.accuracy.strategies import estimate_accuracy, make_certificate
    t0 = time.perf_counter()
    path = ensure_model(job)
    train_s = time.perf_counter() - t0
    model = load_model(path)
    c = model.config
    name = os.path.basename(path)[: -len(".safetensors")]
    total = c.d_vocab ** c.n_ctx
    out, ref = {}, {"train_s": train_s, "inputs": total}
    with tempfile.TemporaryDirectory() as tmp:
        todo = list(strategies)
        if total <= 1 << 26:
            todo = ["brute"] + todo
        else:
            t0 = time.perf_counter()
            est = estimate_accuracy(model, samples, seed=0)
            ref.update(estimate=est["estimate"], stderr=est["stderr"], est_s=time.perf_counter() - t0)
        true = None
        for strategy in todo:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                cert, report = make_certificate(model, strategy, true)
            except MemoryError as e:
                out[strategy] = {"error": f"generator: {e}"}
                continue
            gen, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
            cpath = os.path.join(tmp, strategy.replace(":", "_") + ".json")
            certificate.write(cpath, cert)
            check = check_cpu = None
            if strategy != "brute" or check_brute:
                t0, c0 = time.perf_counter(), time.process_time()
                verify(cpath, path, "flint")
                check, check_cpu = time.perf_counter() - t0, time.process_time() - c0
            if strategy == "brute":
                true = report["bound"]
                ref.update(true=true, brute_checked=check is not None)
            out[strategy] = {"bound": report["bound"], "gen_s": gen, "check_s": check, "gen_cpu": gen_cpu,
                             "check_cpu": check_cpu,
                             "flops": report["flops"], "checker_flops": report.get("checker_flops")}
    return name, out, ref


def mean_sd(xs):
    """(mean, sample standard deviation) of a non-empty list."""
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return m, sd


def summarise(results, strategies):
    """Print the per-model rows and the Table-1-style summary."""
    results = sorted(results, key=lambda r: r[0])
    print("\nper model: bound / reference (reference = brute-force count where brute force is in range, "
          "else the ESTIMATE)")
    for name, out, ref in results:
        if "true" in ref:
            base, label = ref["true"], f"brute {ref['true']} ({ref['true'] / ref['inputs']:.5f})"
            if name.endswith(tuple(PUBLISHED_EXACT)) and PUBLISHED_EXACT.get(name.split("anchor_")[-1]):
                label += " = published" if PUBLISHED_EXACT[name.split("anchor_")[-1]] == base else " != published!"
        else:
            base = ref["estimate"] * ref["inputs"]
            label = f"ESTIMATE (not a certificate) {ref['estimate']:.6f} +- {ref['stderr']:.6f}"
        cells = []
        for s in ["brute"] * ("true" in ref) + list(strategies):
            row = out.get(s)
            cells.append(f"{s} " + ("error" if row is None or "error" in row else f"{row['bound'] / base:.4f}"))
        print(f"  {name:34s} {label:48s} " + "  ".join(cells))
    print("\nTable 1: per strategy, mean +- sd over models of bound / reference accuracy; mean wall [CPU] "
          "seconds")
    print(f"  {'strategy':22s} {'models':>6s} {'bound/reference':>20s} {'bound/inputs':>18s} "
          f"{'generator':>16s} {'checker(Arb)':>16s}")
    for s in ["brute"] + list(strategies):
        rows = [(out[s], ref) for _, out, ref in results if s in out and "error" not in out[s]]
        if not rows:
            continue
        ratio = [r["bound"] / (ref["true"] if "true" in ref else ref["estimate"] * ref["inputs"]) for r, ref in rows]
        frac = [r["bound"] / ref["inputs"] for r, ref in rows]
        gen = "%.2f [%.2f]" % (sum(r["gen_s"] for r, _ in rows) / len(rows),
                               sum(r["gen_cpu"] for r, _ in rows) / len(rows))
        checks = [(r["check_s"], r["check_cpu"]) for r, _ in rows if r["check_s"] is not None]
        chk = "%.2f [%.2f]" % (sum(c[0] for c in checks) / len(checks), sum(c[1] for c in checks) / len(checks)) \
            if checks else "(not run)"
        print(f"  {s:22s} {len(rows):6d} {'%.4f +- %.4f' % mean_sd(ratio):>20s} {'%.4f +- %.4f' % mean_sd(frac):>18s} "
              f"{gen:>16s} {chk:>16s}")
    ests = [ref for _, _, ref in results if "estimate" in ref]
    if ests:
        m, sd = mean_sd([r["estimate"] for r in ests])
        print(f"  {'ESTIMATE (no cert.)':22s} {len(ests):6d} {'':>20s} {'%.6f +- %.6f' % (m, sd):>18s} "
              f"{sum(r['est_s'] for r in ests) / len(ests):16.2f} {'-':>16s}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="train seeds 0..N-1")
    parser.add_argument("--cache", default="/work/maxofk_seeds", help="folder of trained models (reused)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (one model each)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--d-vocab", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--no-anchors", action="store_true")
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    parser.add_argument("--check-brute", action="store_true", help="also run the rigorous brute-force check")
    parser.add_argument("--samples", type=int, default=200_000, help="estimate samples (K >= 5)")
    args = parser.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    os.makedirs(args.cache, exist_ok=True)
    jobs = [("train", model_path(args.cache, args.k, args.d_vocab, args.steps, s), args.k, args.d_vocab,
             args.steps, s) for s in range(args.seeds)]
    if not args.no_anchors and args.k == 4 and args.d_vocab == 64:
        for npz in sorted(glob.glob(os.path.join(ROOT, "certificates", "anchors", "maxofk", "*.npz"))):
            name = os.path.basename(npz)[:-4]
            jobs.append(("anchor", os.path.join(args.cache, f"anchor_{name}.safetensors"), npz))
    work = [(job, strategies, args.check_brute, args.samples) for job in jobs]
    start = time.perf_counter()
    results = []
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    bar = tqdm(total=len(work), desc="models", file=sys.stderr) if tqdm else None
    if args.jobs > 1:
        import multiprocessing
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            for r in pool.imap_unordered(evaluate, work):
                results.append(r)
                if bar:
                    bar.update(1)
    else:
        for w in work:
            results.append(evaluate(w))
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    print(f"Max-of-{args.k}, d_vocab {args.d_vocab}, {args.steps} training steps: {len(results)} models, "
          f"{args.jobs} jobs, {time.perf_counter() - start:.0f} s wall")
    summarise(results, strategies)


if __name__ == "__main__":
    main()
