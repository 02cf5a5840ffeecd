"""Benchmark: overwhelm `--free upto:N` at paper scale, with and without the work shared across lengths.

    python benchmarks/bench_overwhelm_upto.py [--upto 16] [--baseline-upto 2] [--n-fix 1000] [--workdir DIR]
                                              [--backend flint|flint+exact] [--d-vocab N]

Model and prefix as `bench_overwhelm.py --case any` (random neox1l, d_vocab 30522, d_model 512, 8 heads,
d_head 64, d_mlp 2048, seed 0; query from rng(1); prefix = the query's most-attended token repeated
n_fix times; method naive, value bound norm, float hints). A random model is not overwhelmed, so every
length is generated with force=True and is Inconclusive: each length's evidence then fails only its
last obligation (W < PTP/2). The checker runs are `tcert.checker.verify.verify` (Arb), which stops at the
first failing obligation. The shared run verifies the upto:N certificate: it covers the length-0
prediction, the shared tables for every length and the first length's own part, then stops (a passing
upto:N certificate adds each further length's own part, about what the first one's cost; the obligations
that ran are printed).

Unshared baseline (the code before sharing): generator = generate() per length (own float tables);
checker = verify() of the length-0 prediction and of each any:L certificate in turn (own Weights and
tables per length, each run to its last obligation). It is run for lengths 1..--baseline-upto only (each
unshared length costs about one any:16 check); per-length times are reported and the generator ratio is
taken at the same N; the checker ratio is like for like only when the shared run was not stopped early
(printed with it). Every timed run is a fresh subprocess (own peak RSS).
"""

import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np

from tcert.testing.bench import dominant_prefix_token, fresh, paper_model, usage


def setup(model_path, n_fix):
    """(model, prefix, query) as in bench_overwhelm.py --case any."""
    model = paper_model(model_path)
    query = int(np.random.default_rng(1).integers(0, model.config.d_vocab))
    return model, [dominant_prefix_token(model, query)] * n_fix, query


def run_generate(model_path, n_fix, n, shared, out):
    """Subprocess: generate upto:n (shared) or n separate any:L (unshared); write the upto certificate to
    `out` and, unshared, also the length-0 prediction and each any:L certificate (out.len0.json,
    out.anyL.json) for the unshared checker run."""
    from tcert.generator import certificate
    from tcert.generator.overwhelm.naive_lp import generate
    from tcert.generator.overwhelm.upto import generate_upto
    from tcert.generator.prediction import prediction_claim
    model, prefix, query = setup(model_path, n_fix)
    c0, t0 = usage()[0], time.perf_counter()
    if shared:
        cert, report = generate_upto(model, prefix, query, n, "naive", "auto", "float", force=True)
        verdicts, parts = [r["verdict"] for r in report["lengths"]], {}
    else:
        sample, _ = prediction_claim(model, prefix + [query])
        ev, verdicts, parts = [sample], [], {}
        for L in range(1, n + 1):
            c, r = generate(model, prefix, query, ("any", L, None), "naive", "auto", "float", force=True)
            ev.append(c["evidence"])
            verdicts.append(r["verdict"])
            parts[f"{out}.any{L}.json"] = c
        parts[f"{out}.len0.json"] = certificate.envelope("prediction", model, sample, {})
        cert = dict(c, claim=dict(c["claim"], free={"kind": "upto", "length": n}), evidence={"lengths": ev})
    wall = time.perf_counter() - t0
    cpu, rss = usage()
    certificate.write(out, cert)
    for path, part in parts.items():
        certificate.write(path, part)
    print(json.dumps({"wall": wall, "cpu": cpu - c0, "peak_rss_gb": rss, "verdicts": verdicts}))


def run_check(cert_path, model_path, shared, backend="flint"):
    """Subprocess: verify() with Arb of the upto certificate (shared: stops at its first failing length) or
    of the length-0 prediction and every any:L certificate in turn (unshared: the per-length code path,
    each with its own Weights and tables)."""
    from tcert.checker.errors import Rejected
    from tcert.checker.modelfile import load_model
    from tcert.checker.obligations import Obligations
    from tcert.checker.verify import verify
    t0 = time.perf_counter()
    model, ob, verdicts = load_model(model_path), Obligations(), []
    n = len(json.load(open(cert_path))["evidence"]["lengths"]) - 1
    parts = [cert_path] if shared else [f"{cert_path}.len0.json"] + [f"{cert_path}.any{L}.json" for L in range(1, n + 1)]
    for path in parts:
        try:
            verify(path, model, backend, obligations=ob)
            verdicts.append("VERIFIED")
        except Rejected as e:
            verdicts.append(f"REJECTED: {e.obligation}")
    wall = time.perf_counter() - t0
    cpu, rss = usage()
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_rss_gb": rss, "verdicts": verdicts,
                      "obligations": [(o.name, o.seconds) for o in ob.done]}))


def load():
    """The 1-minute load average (2 cores)."""
    return os.getloadavg()[0]


def summarize(name, res):
    """Print one run's figures and its per-obligation time grouped by kind of step."""
    print(f"{name}: {res['wall']:.1f} s wall, {res['cpu']:.1f} s CPU, peak RSS {res['peak_rss_gb']:.2f} GB")
    if "obligations" in res:
        groups = {}
        for n, s in res["obligations"]:
            what = n.rsplit(": ", 1)[-1]   # "overwhelm upto: length L, <method>: <what>"
            key = ("forward pass (PTP samples)" if "prediction" in what or "sample" in what else
                   "shared tables" if "upto: lengths 1.." in n else
                   "per-length part from shared tables" if "from the shared tables" in what else
                   "per-length prepare (scores, masses, value extremes)" if what.startswith("scores,") else
                   "masses, betas, deviation")
            groups[key] = groups.get(key, 0.0) + s
        for key, s in groups.items():
            print(f"   {s:8.1f} s  {100 * s / res['wall']:5.1f}%  {key}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upto", type=int, default=16)
    ap.add_argument("--baseline-upto", type=int, default=2)
    ap.add_argument("--n-fix", type=int, default=1000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--runs", default="upto:shared,baseline:shared,baseline:unshared",
                    help="which of the three runs to make (comma-separated)")
    ap.add_argument("--gen", nargs=4, metavar=("MODEL", "NFIX", "N", "SHARED"))
    ap.add_argument("--check", nargs=3, metavar=("CERT", "MODEL", "SHARED"))
    ap.add_argument("--d-vocab", type=int, default=None, help="vocabulary size (default: paper scale 30522)")
    ap.add_argument("--backend", default="flint", help='checker backend, e.g. "flint+exact" (exact product layer)')
    args = ap.parse_args()
    if args.gen:
        return run_generate(args.gen[0], int(args.gen[1]), int(args.gen[2]), args.gen[3] == "1",
                            args.gen[0] + f".upto{args.gen[2]}_{args.gen[3]}.json")
    if args.check:
        return run_check(args.check[0], args.check[1], args.check[2] == "1", args.backend)
    workdir = args.workdir or tempfile.mkdtemp(prefix="tcert-bench-upto-")
    os.makedirs(workdir, exist_ok=True)
    tag = f"_v{args.d_vocab}" if args.d_vocab else ""
    model_path = os.path.join(workdir, f"neox1l_paper_scale{tag}.safetensors")
    paper_model(model_path, d_vocab=args.d_vocab)   # builds the model file once (later runs load it)
    print(f"model {model_path}; n_fix {args.n_fix}; upto:{args.upto}; unshared baseline upto:{args.baseline_upto}")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    res = {}
    runs = {"upto:shared": (args.upto, 1), "baseline:shared": (args.baseline_upto, 1),
            "baseline:unshared": (args.baseline_upto, 0)}
    for name in args.runs.split(","):
        n, shared = runs[name]
        if (n, shared) in res:
            continue
        l0 = load()
        g = fresh([__file__, "--gen", model_path, args.n_fix, n, shared])
        l1 = load()
        c = fresh([__file__, "--check", model_path + f".upto{n}_{shared}.json", model_path, shared,
                   "--backend", args.backend])
        res[n, shared] = (g, c)
        tag = f"upto:{n} {'shared' if shared else 'UNSHARED (per-length, old code path)'}"
        print(f"\n== {tag} (1-min load {l0:.1f} / {l1:.1f} / {load():.1f} before gen / before check / after)")
        print(f"generator verdicts: {sorted(set(g['verdicts']))} (forced); checker verdicts: "
              f"{sorted(set(c['verdicts']))}")
        summarize("generator", g)
        summarize(f"checker ({args.backend})", c)
        print(f"checker/generator: {c['wall'] / g['wall']:.2f} wall, {c['cpu'] / g['cpu']:.2f} CPU (same run; "
              f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    b = args.baseline_upto
    if (b, 1) in res and (b, 0) in res:
        (gs, cs), (gu, cu) = res[b, 1], res[b, 0]
        stopped = any(v != "VERIFIED" for v in cs["verdicts"])
        print(f"\nratio unshared/shared at upto:{b}: generator {gu['wall'] / gs['wall']:.2f}x wall, "
              f"{gu['cpu'] / gs['cpu']:.2f}x CPU; checker {cu['wall'] / cs['wall']:.2f}x wall, "
              f"{cu['cpu'] / cs['cpu']:.2f}x CPU"
              + (" (the shared check stopped at its first failing length: not like for like)" if stopped else ""))
        print(f"unshared per length (upto:{b}): generator {gu['cpu'] / b:.1f} s CPU, checker {cu['cpu'] / b:.1f} s CPU")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
