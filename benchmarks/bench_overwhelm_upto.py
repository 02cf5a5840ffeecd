"""Benchmark: overwhelm `--free upto:N` at paper scale, with and without the work shared across lengths.

    python benchmarks/bench_overwhelm_upto.py [--upto 16] [--baseline-upto 2] [--n-fix 1000] [--workdir DIR]

Model and prefix as `bench_overwhelm.py --case any` (random neox1l, d_vocab 30522, d_model 512, 8 heads,
d_head 64, d_mlp 2048, seed 0; query from rng(1); prefix = the query's most-attended token repeated
n_fix times; method naive, value bound norm, float hints). A random model is not overwhelmed, so every
length is generated with force=True and is Inconclusive: each length's evidence then fails only its
last obligation (W < PTP/2). `check_upto` stops at the first failing length, so the timed checker runs
check_upto's own steps (length-0 prediction, shared tables, every length's check_fixed_length with the
shared tables) and records each length's verdict instead of stopping (with each length's own sample
token as k); that is exactly the work a passing upto:N certificate costs.

Unshared baseline (the code before sharing): generator = generate() per length (own float tables);
checker = check_fixed_length per length with its own Weights and prepare(). It is run for lengths
1..--baseline-upto only (each unshared length costs about one any:16 check); per-length times are
reported and the ratio is taken at the same N. Every timed run is a fresh subprocess (own peak RSS).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def usage():
    """(CPU seconds, peak RSS in GB) of this process so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_maxrss / 2 ** 20


def setup(model_path, n_fix):
    """(model, prefix, query) as in bench_overwhelm.py --case any."""
    from bench_overwhelm import build_model, dominant_prefix_token
    model = build_model(model_path)
    query = int(np.random.default_rng(1).integers(0, model.config.d_vocab))
    return model, [dominant_prefix_token(model, query, n_fix, 16)] * n_fix, query


def run_generate(model_path, n_fix, n, shared, out):
    """Subprocess: generate upto:n (shared) or n separate any:L (unshared); write the certificate."""
    from tcert.generator import certificate
    from tcert.generator.overwhelm.naive_lp import generate
    from tcert.generator.overwhelm.upto import generate_upto
    from tcert.generator.prediction import prediction_claim
    model, prefix, query = setup(model_path, n_fix)
    c0, t0 = usage()[0], time.perf_counter()
    if shared:
        cert, report = generate_upto(model, prefix, query, n, "naive", "auto", "float", force=True)
        verdicts = [r["verdict"] for r in report["lengths"]]
    else:
        sample, _ = prediction_claim(model, prefix + [query])
        ev, verdicts = [sample], []
        for L in range(1, n + 1):
            c, r = generate(model, prefix, query, ("any", L, None), "naive", "auto", "float", force=True)
            ev.append(c["evidence"])
            verdicts.append(r["verdict"])
        cert = dict(c, claim=dict(c["claim"], free={"kind": "upto", "length": n}), evidence={"lengths": ev})
    wall = time.perf_counter() - t0
    cpu, rss = usage()
    certificate.write(out, cert)
    print(json.dumps({"wall": wall, "cpu": cpu - c0, "peak_rss_gb": rss, "verdicts": verdicts}))


def run_check(cert_path, model_path, shared):
    """Subprocess: check_upto's work with Arb (shared) or the old per-length loop (unshared)."""
    from tcert.checker.envelope import load_certificate
    from tcert.checker.errors import Rejected
    from tcert.checker.forward import Weights
    from tcert.checker.interval import make_backend
    from tcert.checker.kinds import overwhelm as K
    from tcert.checker.kinds.prediction import check_claim
    from tcert.checker.modelfile import load_model
    from tcert.checker.obligations import Obligations
    t0 = time.perf_counter()
    cert = load_certificate(cert_path)
    model = load_model(model_path)
    B, ob = make_backend("flint"), Obligations()
    c, lengths = cert["claim"], cert["evidence"]["lengths"]
    prefix, query = c["prefix"], c["query"]
    W = Weights(B, model) if shared else None
    check_claim(B, model, lengths[0], ob, "evidence.lengths[0]", W)
    tables = K.shared_tables(B, model, prefix, query, lengths, W, ob) if shared else None
    verdicts = []
    for L in range(1, len(lengths)):
        k = lengths[L]["sample"]["predicted"]   # a forced length may predict another token: check all its work
        try:
            K.check_fixed_length(model, prefix, query, k, L, None, lengths[L], B, ob, W, tables)
            verdicts.append("VERIFIED")
        except Rejected as e:
            verdicts.append(f"REJECTED: {e.obligation}")
    wall = time.perf_counter() - t0
    cpu, rss = usage()
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_rss_gb": rss, "verdicts": verdicts, "obligations": [(o.name, o.seconds) for o in ob.done]}))


def sub(args):
    """Run this script in a subprocess with `args`; return its JSON line."""
    out = subprocess.run([sys.executable, __file__] + [str(a) for a in args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def load():
    """The 1-minute load average (2 cores)."""
    return os.getloadavg()[0]


def summarize(name, res):
    """Print one run's figures and its per-obligation time grouped by kind of step."""
    print(f"{name}: {res['wall']:.1f} s wall, {res['cpu']:.1f} s CPU, peak RSS {res['peak_rss_gb']:.2f} GB")
    if "obligations" in res:
        groups = {}
        for n, s in res["obligations"]:
            key = ("forward pass (PTP samples)" if "forward pass" in n else
                   "shared tables" if n.startswith("lengths 1..") else
                   "per-length part from shared tables" if "from the shared tables" in n else
                   "per-length prepare (scores, masses, value extremes)" if n.startswith("scores,") else
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
    args = ap.parse_args()
    if args.gen:
        return run_generate(args.gen[0], int(args.gen[1]), int(args.gen[2]), args.gen[3] == "1",
                            args.gen[0] + f".upto{args.gen[2]}_{args.gen[3]}.json")
    if args.check:
        return run_check(args.check[0], args.check[1], args.check[2] == "1")
    workdir = args.workdir or tempfile.mkdtemp(prefix="tcert-bench-upto-")
    os.makedirs(workdir, exist_ok=True)
    model_path = os.path.join(workdir, "neox1l_paper_scale.safetensors")
    setup(model_path, 1)   # builds the model file once
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
        g = sub(["--gen", model_path, args.n_fix, n, shared])
        l1 = load()
        c = sub(["--check", model_path + f".upto{n}_{shared}.json", model_path, shared])
        res[n, shared] = (g, c)
        tag = f"upto:{n} {'shared' if shared else 'UNSHARED (per-length, old code path)'}"
        print(f"\n== {tag} (1-min load {l0:.1f} / {l1:.1f} / {load():.1f} before gen / before check / after)")
        print(f"generator verdicts: {sorted(set(g['verdicts']))} (forced); checker verdicts: "
              f"{sorted(set(c['verdicts']))}")
        summarize("generator", g)
        summarize("checker (Arb)", c)
    b = args.baseline_upto
    if (b, 1) in res and (b, 0) in res:
        (gs, cs), (gu, cu) = res[b, 1], res[b, 0]
        print(f"\nratio unshared/shared at upto:{b}: generator {gu['wall'] / gs['wall']:.2f}x wall, "
              f"{gu['cpu'] / gs['cpu']:.2f}x CPU; checker {cu['wall'] / cs['wall']:.2f}x wall, "
              f"{cu['cpu'] / cs['cpu']:.2f}x CPU")
        print(f"unshared per length (upto:{b}): generator {gu['cpu'] / b:.1f} s CPU, checker {cu['cpu'] / b:.1f} s CPU")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
