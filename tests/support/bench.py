"""Helpers the benchmark scripts share (benchmarks/*.py import `tcert.*` only, no sys.path edits).

The paper-scale random models, the prefix token a query attends to most, resource figures, and one
timed check through `tcert.checker.verify.verify`, run in a fresh process so that its peak RSS is its own:

    python -m tcert.testing.bench check CERT MODEL [BACKEND]   # one JSON line (timed_check's figures)
"""

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

# The paper-scale shape of benchmarks/bench_overwhelm.py (d_vocab of BERT's vocabulary).
SHAPE = dict(d_vocab=30522, d_model=512, n_heads=8, d_head=64, d_mlp=2048, n_ctx=2048)
# A Pythia-style real block of the same shape: separate ln1/ln2, final LN, exact-erf GELU, every bias drawn,
# partial rotary (rotary_dim 16 = 25% of the head).
REAL_BLOCK = dict(shared_ln=False, final_ln=True, act_fn="gelu", rotary_dim=16, bias_std=0.1)


def usage() -> tuple:
    """(CPU seconds, peak RSS in GB) of this process so far."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_maxrss / 2 ** 20


def paper_model(path: str, real_block: bool = False, d_vocab: int | None = None):
    """The random paper-scale neox1l model (seed 0; `real_block`: the Pythia-style variant; `d_vocab`: a
    smaller vocabulary, e.g. 5000 for a medium-scale run), written to `path` unless it is there, and loaded."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.model.files import save_model
    from tcert.generator.model.random_models import random_model
    if not os.path.exists(path):
        shape = dict(SHAPE, **({"d_vocab": d_vocab} if d_vocab else {}))
        t, c = random_model("neox1l", seed=0, **shape, **(REAL_BLOCK if real_block else {}))
        save_model(path, t, c)
    return load_model(path)


def dominant_prefix_token(model, query: int) -> int:
    """The token with the largest mean attention score from the query (over heads, offsets 1..64)."""
    from tcert.generator.overwhelm.naive_lp import FloatModel, float_tables
    T = float_tables(FloatModel(model), [], query, list(range(model.config.d_vocab)), 64)
    return int(np.argmax(T["S"].mean(axis=(0, 2))))


def timed_check(cert_path: str, model_path: str, backend: str = "flint") -> dict:
    """Load the model, then verify the certificate with `backend`: the verdict (VERIFIED, or REJECTED and
    the obligation), wall seconds without and with loading, CPU seconds after loading, peak RSS (GB), and
    the seconds of every obligation that ran (also those before a rejection)."""
    from tcert.checker.errors import Rejected
    from tcert.checker.modelfile import load_model
    from tcert.checker.obligations import Obligations
    from tcert.checker.verify import verify
    t0 = time.perf_counter()
    model = load_model(model_path)
    t1, c1 = time.perf_counter(), usage()[0]
    ob = Obligations()
    try:
        verify(cert_path, model, backend, obligations=ob)
        verdict = "VERIFIED"
    except Rejected as e:
        verdict = f"REJECTED: {e}"
    t2, (c2, rss) = time.perf_counter(), usage()
    return {"verdict": verdict, "seconds": t2 - t1, "with_load": t2 - t0, "load_seconds": t1 - t0,
            "cpu_seconds": c2 - c1, "peak_rss_gb": rss, "obligations": [(o.name, o.seconds) for o in ob.done]}


def fresh(argv: list) -> dict:
    """Run `python argv...` in a fresh process and return the JSON object on its last output line."""
    out = subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def fresh_check(cert_path: str, model_path: str, backend: str = "flint") -> dict:
    """timed_check (Arb; `backend` e.g. "flint+exact") in a fresh process."""
    return fresh(["-m", "tcert.testing.bench", "check", cert_path, model_path, backend])


def timed_tight(model, n_fix: int) -> tuple:
    """(cert, report, wall s, CPU s) of `generate_tight` (timed alone, force=True) on bench_overwhelm's perm
    case: rng(1)'s query and 35-token free multiset (the same draws as bench_overwhelm.run_case("perm")),
    the dominant token repeated n_fix times as the prefix."""
    from tcert.generator.overwhelm.tight import generate_tight
    rng = np.random.default_rng(1)
    query = int(rng.integers(0, model.config.d_vocab))
    spec = ("perm", 35, [int(x) for x in rng.integers(0, model.config.d_vocab, 35)])
    prefix = [dominant_prefix_token(model, query)] * n_fix
    t0, c0 = time.perf_counter(), time.process_time()
    cert, report = generate_tight(model, prefix, query, spec, force=True)
    return cert, report, time.perf_counter() - t0, time.process_time() - c0


def tight_case(workdir: str, n_fix: int, real_block: bool = False) -> None:
    """benchmarks/bench_overwhelm_tight.py (and _real_blocks.py with `real_block`): overwhelm --method tight
    on the paper-scale model with bench_overwhelm's perm case (rng(1): query, 35-token free multiset;
    the dominant token repeated n_fix times), generated with force=True, checked with Arb in a fresh
    process; prints the figures."""
    from tcert.generator import certificate
    from tcert.generator.overwhelm.tight import format_report
    model_path = os.path.join(workdir, "neox1l_paper.safetensors")
    cert, report, t_gen, c_gen = timed_tight(paper_model(model_path, real_block), n_fix)
    path = os.path.join(workdir, "overwhelm_tight.json")
    certificate.write(path, cert)
    print(format_report(report))
    print(f"generator: {t_gen:.2f} s wall, {c_gen:.2f} s CPU")
    res = fresh_check(path, model_path)
    print(f"checker (Arb, fresh process): {res['with_load']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU, "
          f"peak RSS {res['peak_rss_gb']:.2f} GB; verdict {res['verdict'][:200]}")
    for n, s in res["obligations"]:
        print(f"   {s:8.2f} s  {n}")
    print(f"machine load (1-min average, 2 cores): {os.getloadavg()[0]:.1f}")


def machine_load() -> str:
    """`uptime`'s line (the machine is shared: every benchmark prints it)."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] != "check":
        sys.exit("usage: python -m tcert.testing.bench check CERT MODEL [BACKEND]")
    print(json.dumps(timed_check(*sys.argv[2:])))
