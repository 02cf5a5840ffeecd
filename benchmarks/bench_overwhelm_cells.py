"""Benchmark: one cell of `tcert experiment overwhelm-paper` at n_fix = 1500, per method (issue 7).

    python benchmarks/bench_overwhelm_cells.py [--model PATH] [--kinds whatisit,alnum] [--free blotches]
                                               [--methods naive,lp,tight] [--workdir DIR]

Model: the paper-size text model /work/text_big/text_big.safetensors when it exists (or --model),
else a random paper-scale neox1l (d_vocab 30522, d_model 512, 8 heads, d_mlp 2048; built as
benchmarks/bench_overwhelm.py does) with a repeated token as the fixed string and 12 random tokens
as the free multiset. For each cell and method, in fresh subprocesses (so that each peak RSS is its
own: `resource.getrusage(RUSAGE_SELF).ru_maxrss`):
  generator: load the model, run generate (naive/lp) or generate_tight with force=True (the
             certificate is written even when Inconclusive, so the checker runs every obligation);
  checker:   load the model, then `tcert.checker.verify.verify` with Arb (flint) (tcert.testing.bench).
Reported: wall seconds without model loading (and with), CPU seconds, peak RSS, the bound, the
checker's verdict, and `uptime` before and after (the machine is shared).
"""

import argparse
import json
import os
import tempfile
import time

from tcert.testing.bench import dominant_prefix_token, fresh, fresh_check, machine_load, paper_model, usage

BIG = "/work/text_big/text_big.safetensors"
N_FIX = 1500


def cell_inputs(model, model_path, kind, free_name):
    """(prefix, query, free spec) of a cell: the experiment's own strings on a text model; a repeated
    dominant token and 12 random free tokens on a random model without a tokenizer."""
    if model.config.tokenizer_name:
        from tcert.generator.train import text_data
        from tcert.generator.experiments.overwhelm_paper import FREE_TEXTS, QUERY_TEXT, fixed_tokens
        tok = text_data.model_tokenizer(model_path, model.config.tokenizer_name)
        sentences = text_data.held_out_sentences("lee+enwiki") if kind == "heldout" else []
        free = text_data.encode(tok, FREE_TEXTS[free_name])
        return fixed_tokens(tok, kind, N_FIX, 0, sentences), text_data.encode(tok, QUERY_TEXT)[0], \
            ("perm", len(free), free)
    import numpy as np
    rng = np.random.default_rng(1)
    query = int(rng.integers(0, model.config.d_vocab))
    free = [int(x) for x in rng.integers(0, model.config.d_vocab, 12)]
    return [dominant_prefix_token(model, query)] * N_FIX, query, ("perm", 12, free)


def generate_only(model_path, kind, free_name, method, out):
    """Subprocess mode: generate one cell's certificate (force) and print timings as JSON."""
    from tcert.checker.modelfile import load_model
    from tcert.generator import certificate
    t0 = time.perf_counter()
    model = load_model(model_path)
    prefix, query, spec = cell_inputs(model, model_path, kind, free_name)
    t1, c1 = time.perf_counter(), usage()[0]
    if method == "tight":
        from tcert.generator.overwhelm.tight import generate_tight
        cert, r = generate_tight(model, prefix, query, spec, force=True)
        bound = f"max_j logit_j - logit_k <= {r['worst_bound']:.4g}"
    else:
        from tcert.generator.overwhelm.naive_lp import generate
        cert, r = generate(model, prefix, query, spec, method, force=True)
        bound = f"W {r['deviation']:.4g}, PTP/2 {r['ptp_float'] / 2:.4g}"
    t2, (c2, rss) = time.perf_counter(), usage()
    certificate.write(out, cert)
    print(json.dumps({"seconds": t2 - t1, "with_load": t2 - t0, "cpu": c2 - c1, "rss_gb": rss,
                      "verdict": r["verdict"], "bound": bound, "n_free": spec[1]}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--kinds", default="whatisit")
    ap.add_argument("--free", default="blotches")
    ap.add_argument("--methods", default="naive,lp,tight")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--generate-only", nargs=5, metavar=("MODEL", "KIND", "FREE", "METHOD", "OUT"))
    args = ap.parse_args()
    if args.generate_only:
        return generate_only(*args.generate_only)
    workdir = args.workdir or tempfile.mkdtemp(prefix="tcert-bench-cells-")
    os.makedirs(workdir, exist_ok=True)
    model_path = args.model or (BIG if os.path.exists(BIG) else None)
    if model_path is None:
        model_path = os.path.join(workdir, "neox1l_paper_scale.safetensors")
        paper_model(model_path)
    print(f"model {model_path}; n_fix {N_FIX}")
    print(f"uptime before: {machine_load()}")
    rows = []
    for kind in args.kinds.split(","):
        for method in args.methods.split(","):
            cert = os.path.join(workdir, f"{kind}-{args.free}-{method}.json")
            g = fresh([__file__, "--generate-only", model_path, kind, args.free, method, cert])
            c = fresh_check(cert, model_path)
            rows.append((kind, method, g, c))
            print(f"{kind:8s} {args.free} (n_free {g['n_free']}) {method:5s}: generator {g['seconds']:7.2f} s "
                  f"({g['with_load']:.1f} s with loading, {g['cpu']:.1f} s CPU, peak RSS {g['rss_gb']:.2f} GB; "
                  f"{g['verdict']}, {g['bound']}) | checker {c['seconds']:7.1f} s ({c['with_load']:.1f} s with "
                  f"loading, {c['cpu_seconds']:.1f} s CPU, peak RSS {c['peak_rss_gb']:.2f} GB; {c['verdict'][:80]}) | "
                  f"load now {os.getloadavg()[0]:.1f}", flush=True)
    print(f"uptime after: {machine_load()}")
    print("\n| fixed kind | method | generator s | generator peak RSS GB | checker s | checker peak RSS GB | verdict |")
    print("|---|---|---|---|---|---|---|")
    for kind, method, g, c in rows:
        print(f"| {kind} | {method} | {g['seconds']:.2f} | {g['rss_gb']:.2f} | {c['seconds']:.1f} | {c['peak_rss_gb']:.2f} | "
              f"{g['verdict']} / {c['verdict'][:40]} |")


if __name__ == "__main__":
    main()
