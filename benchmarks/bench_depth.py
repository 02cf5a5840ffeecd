"""Benchmark: the prediction kind against depth and input length (a script that prints figures, not a test).

Models: random pre-LN models of GPT-2-small width (`tcert model random --arch preln`: d_model 768, 12 heads
of 64, d_mlp 3072, d_vocab 1000, gelu, final LN) at 1-12 layers; with --pythia also the 12-layer
Pythia-160M shape (arch neox1l: rotary, parallel residual, d_vocab 50304) at --pythia-layers. For each
model and input length a certificate is written by the generator (`prediction_certificate`, the code behind
`tcert predict`) and checked with the default command path (`verify`, flint at 64 bits; the kind raises its
precision itself). With --influence, models of --influence-layers also get the default influence
certificate (`tcert.api.influence(model)`, what `tcert influence --model M --out C.json` writes), then checked
the same way, each in its own child (rows with pass "influence": verdict, certified C in the "certified gap"
column, check time, CPU and memory; generator_s / generator_cpu_s / generator_peak_mib and C, C_abs, C_prob,
C_prob_abs in rows.json); --influence-only runs just those, at GPT-2-small width (and --pythia) shape;
--pythia-only with it: only the Pythia-160M shape.

Two passes, in one run, each in its own child process (so peak memory is per check, from wait4):

* after  -- `verify(certificate, model)`: the error-ball forward pass (checker/error_balls.py).
* before -- the per-coordinate interval forward pass the checker used before (every activation an
  interval, every product with a point matrix), built here from checker/forward.py's per-coordinate
  helpers; its certified gap is min_j lower(logit_k - logit_j) at 64 bits.

Columns: certified gap and the float64 gap; "width" = upper - lower of the decisive gap's enclosure and
"log2 ulps" = log2(width / 2^-prec) at the precision that decided (a few thousand ulps per layer is the
target: "bits lost / layer" = log2 ulps / layers <= ~12; "bits kept" = prec - log2 ulps); check seconds (wall, the check alone), the child process's CPU
seconds (model load and setup included) and its peak RSS. Also writes a table
(Markdown) and a PNG plot to --out.

    python benchmarks/bench_depth.py [--layers 1,2,4,12] [--lengths 64,256,1024] [--before-max-layers 4]
                                     [--pythia] [--pythia-layers 12] [--influence] [--influence-layers 12] [--influence-only] [--pythia-only]
                                     [--out DIR] [--append]
    (each case runs in its own child processes; run the sweep in pieces with --append)
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import numpy as np

GPT2_SMALL = dict(d_vocab=1000, d_model=768, n_heads=12, d_head=64, d_mlp=3072)
PYTHIA_160M = dict(d_vocab=50304, d_model=768, n_heads=12, d_head=64, d_mlp=3072)


# --- the per-coordinate interval pass ("before") --------------------------------------------------------

def baseline_logits(B, model, tokens):
    """Logit enclosures from the per-coordinate interval pass (every product widens by |W|'s column sums)."""
    from tcert.checker.error_balls import softmax
    from tcert.checker.forward import (Weights, attn_divisor, layer_norm, ln_names, mlp, rotary_angles,
                                       rotary_pairs, rotate)
    cfg, W, n = model.config, Weights(B, model), len(tokens)
    X = B.array(model.tensors["embed.W_E"][tokens])
    if cfg.positional_embedding_type == "standard":
        X = X + B.array(model.tensors["pos_embed.W_pos"][:n])
    angles = rotary_angles(B, cfg, range(n)) if cfg.rotary else None
    div, pairs, dh = attn_divisor(B, cfg), rotary_pairs(cfg), cfg.d_head
    for layer in range(cfg.n_layers):
        W.release(f"blocks.{layer - 1}.")       # one block's weights at a time, as the checker's pass
        p, (ln1, ln2) = f"blocks.{layer}.attn.", ln_names(cfg, layer)
        A = layer_norm(B, X, W, ln1, cfg.eps)
        Q, K, V = ((A @ W.heads_concat(p + m)).rows() for m in ("W_Q", "W_K", "W_V"))
        attn = None
        for h in range(cfg.n_heads):
            sl = slice(h * dh, (h + 1) * dh)
            q, k, v = ([[a + c for a, c in zip(r[sl], W.vec(p + b, h))] for r in M]
                       for M, b in ((Q, "b_Q"), (K, "b_K"), (V, "b_V")))
            if pairs:
                q, k = ([rotate(r, angles[i], pairs) for i, r in enumerate(M)] for M in (q, k))
            S = (B.matrix(q) @ B.matrix(k).T).rows()
            P = [softmax(B, [s / div for s in S[i][:i + 1]]) + [B.num(0)] * (n - i - 1) for i in range(n)]
            out = (B.matrix(P) @ B.matrix(v)) @ W.mat(p + "W_O", h)
            attn = out if attn is None else attn + out
        attn = attn + B.matrix([W.vec(p + "b_O")] * n)
        if cfg.parallel_attn_mlp:
            X = X + attn + mlp(B, W, cfg, layer, layer_norm(B, X, W, ln2, cfg.eps))
        else:
            X = X + attn
            X = X + mlp(B, W, cfg, layer, layer_norm(B, X, W, ln2, cfg.eps))
    x = B.matrix([X.rows()[-1]])
    if cfg.final_ln:
        x = layer_norm(B, x, W, "ln_final", cfg.eps)
    return [a + b for a, b in zip((x @ W.mat("unembed.W_U")).rows()[0], W.vec("unembed.b_U"))]


def run_before(model_path, cert_path):
    from tcert.checker.interval import make_backend
    from tcert.checker.modelfile import load_model
    from tcert.checker.numbers import parse_number
    model, claim = load_model(model_path), json.load(open(cert_path))["claim"]
    B, k, margin = make_backend("flint", 64), claim["predicted"], parse_number(claim["margin"], "claim.margin")
    from tcert.checker.errors import Rejected
    start = time.perf_counter()
    try:
        with B.precision():
            logits = baseline_logits(B, model, claim["tokens"])
            gaps = [(logits[k] - x) for j, x in enumerate(logits) if j != k]
            lows = [B.lower(g) for g in gaps]
            lower = min(lows)
            width = B.upper(gaps[lows.index(lower)]) - lower
    except Rejected as e:         # a NaN ball on the way (an endpoint read of a non-finite enclosure)
        return dict(verdict="REJECTED: " + str(e)[:120], lower=float("nan"), width=float("nan"), prec=64,
                    seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    finite = all(math.isfinite(float(B.upper(x))) and math.isfinite(float(B.lower(x))) for x in logits)
    verdict = "VERIFIED" if finite and lower >= margin else "REJECTED" + ("" if finite else " (nan)")
    return dict(verdict=verdict, lower=float(lower) if finite else float("nan"),
                width=float(width) if finite else float("nan"), prec=64, seconds=seconds)


def run_after(model_path, cert_path):
    from tcert.checker.errors import Rejected
    from tcert.checker.verify import verify
    start = time.perf_counter()
    try:
        ob = verify(cert_path, model_path)
        lower, upper, prec = ob.figure("claim.margin"), ob.figure("claim.margin.upper"), ob.figure("claim.precision")
        return dict(verdict="VERIFIED", lower=float(lower), width=float(upper - lower), prec=prec,
                    seconds=time.perf_counter() - start)
    except Rejected as e:
        return dict(verdict="REJECTED: " + str(e)[:120], lower=float("nan"), width=float("nan"), prec=0,
                    seconds=time.perf_counter() - start)


def run_influence_gen(model_path, cert_path):
    """The default influence certificate (`tcert influence --model M`, tcert.api.influence) written."""
    import tcert.api as tc
    start = time.perf_counter()
    cert = tc.influence(tc.load_model(model_path))
    cert.save(cert_path)
    f = cert.figures
    return dict(seconds=time.perf_counter() - start, **{k: float(f[k]) for k in ("C", "C_abs", "C_prob", "C_prob_abs")})


def run_influence(model_path, cert_path):
    """The influence certificate checked by verify() with the defaults (what tcert-check runs)."""
    from tcert.checker.errors import Rejected
    from tcert.checker.verify import verify
    start = time.perf_counter()
    try:
        ob = verify(cert_path, model_path)
        verdict, c, n = "VERIFIED", float(ob.figure("claim.C")), len(ob.done)
    except Rejected as e:
        verdict, c, n = "REJECTED: " + str(e)[:120], float("nan"), 0
    return dict(verdict=verdict, lower=c, width=float("nan"), prec=64, seconds=time.perf_counter() - start,
                obligations=n)


def child(pass_name, model_path, cert_path):
    """Run one check in a child process; (result dict, peak RSS in MiB)."""
    proc = subprocess.Popen([sys.executable, __file__, "--one", pass_name, model_path, cert_path],
                            stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        return dict(verdict=f"crashed (exit {proc.returncode})", lower=float("nan"), width=float("nan"), prec=0,
                    seconds=float("nan")), usage.ru_maxrss / 1024
    res = json.loads(out.strip().splitlines()[-1])
    res["cpu_s"] = usage.ru_utime + usage.ru_stime
    return res, usage.ru_maxrss / 1024


# --- the sweep ---------------------------------------------------------------------------------------------

def make_model(workdir, arch, size, layers, n_tokens, seed):
    """A random model file (`tcert model random`'s models), n_ctx max(n_tokens, 128); its path."""
    from tcert.generator.model.files import save_model
    from tcert.generator.model.random_models import random_model
    path = os.path.join(workdir, f"{arch}-{layers}-{n_tokens}.safetensors")
    tensors, config = random_model(arch, seed=seed, n_layers=layers, n_ctx=max(n_tokens, 128), **size)
    save_model(path, tensors, config)
    return path


def make_case(workdir, arch, size, layers, n_tokens, seed):
    """A random model and the generator's certificate for one random input; (paths, float gap, gen seconds)."""
    from tcert.checker.modelfile import load_model
    from tcert.generator import certificate
    from tcert.generator.prediction import prediction_certificate
    path = make_model(workdir, arch, size, layers, n_tokens, seed)
    model = load_model(path)
    tokens = np.random.default_rng(seed + 1).integers(0, size["d_vocab"], size=n_tokens).tolist()
    start = time.perf_counter()
    cert, p = prediction_certificate(model, tokens)
    gen = time.perf_counter() - start
    if cert is None:
        return None
    cpath = path.replace(".safetensors", ".json")
    certificate.write(cpath, cert)
    return path, cpath, p["gap"], gen


def row_text(r):
    ulps = math.log2(r["width"] * 2.0 ** r["prec"]) if r["width"] > 0 else float("nan")
    return (f"| {r['model']} | {r['layers']} | {r['tokens']} | {r['pass']} | {r['verdict'][:60]} | {r['float_gap']:.6g} | "
            f"{r['lower']:.10g} | {r['width']:.3g} | {r['prec']} | {ulps:.1f} | {ulps / r['layers']:.1f} | "
            f"{r['prec'] - ulps:.1f} | {r['seconds']:.1f} | {r.get('cpu_s', float('nan')):.1f} | {r['peak_mib']:.0f} |")


HEADER = ("| model | layers | tokens | pass | verdict | float gap | certified gap | width | prec | log2 ulps | "
          "bits lost / layer | bits kept | check s | child CPU s | peak MiB |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def plot(rows, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for pass_name, marker in (("after", "o"), ("before", "x")):
        pts = [(r["layers"], r["width"] * 2.0 ** r["prec"]) for r in rows if r["pass"] == pass_name
               and r["model"] == "gpt2-small-width" and r["tokens"] == min(x["tokens"] for x in rows)
               and r["width"] > 0]
        if pts:
            axes[0].semilogy(*zip(*sorted(pts)), marker=marker, label=pass_name)
        pts = [(r["tokens"], r.get("cpu_s", r["seconds"])) for r in rows if r["pass"] == pass_name
               and r["layers"] == 1 and r["model"] == "gpt2-small-width" and math.isfinite(r["seconds"])]
        if pts:
            axes[1].loglog(*zip(*sorted(pts)), marker=marker, label=pass_name)
    axes[0].set(xlabel="layers", ylabel="gap enclosure width / 2^-prec (ulps)", title="precision lost vs depth")
    axes[1].set(xlabel="input tokens", ylabel="check CPU seconds (child, 1 layer)", title="check time vs input length")
    for a in axes:
        a.legend()
        a.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def influence_cases(args):
    """(label, arch, size, layers, 0) for --influence-layers at GPT-2-small width (and Pythia-160M shape)."""
    layers = [int(x) for x in args.influence_layers.split(",")]
    cases = [] if args.pythia_only else [("gpt2-small-width", "preln", GPT2_SMALL, n, 0) for n in layers]
    return cases + ([("pythia-160m-shape", "neox1l", PYTHIA_160M, n, 0) for n in layers]
                    if args.pythia or args.pythia_only else [])


def influence_row(workdir, label, arch, size, n_layers, seed):
    """One model's influence certificate written and checked, each in its own child (times, peak memory)."""
    path = make_model(workdir, arch, size, n_layers, 0, seed)
    cpath = path.replace(".safetensors", "-influence.json")
    gen, gen_peak = child("influence-gen", path, cpath)
    if "C" not in gen:
        res, peak = gen, gen_peak
    else:
        res, peak = child("influence", path, cpath)
    r = dict(model=label, layers=n_layers, tokens=0, float_gap=float("nan"), generator_s=gen["seconds"],
             generator_cpu_s=gen.get("cpu_s"), generator_peak_mib=gen_peak, peak_mib=peak, **{"pass": "influence"},
             **{k: gen[k] for k in ("C", "C_abs", "C_prob", "C_prob_abs") if k in gen}, **res)
    print(row_text(r), flush=True)
    print(f"  influence {label} {n_layers} layers: generator {gen['seconds']:.1f} s wall, {gen.get('cpu_s', 0):.1f} s CPU, "
          f"{gen_peak:.0f} MiB; check {res['seconds']:.1f} s wall, {res.get('cpu_s', 0):.1f} s CPU, {peak:.0f} MiB; "
          f"{res['verdict'][:60]}; C {gen.get('C', float('nan')):.6g}, C_abs {gen.get('C_abs', float('nan')):.6g}, "
          f"C_prob {gen.get('C_prob', float('nan')):.4g}", flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="1,2,4,12")
    ap.add_argument("--lengths", default="64,256,1024", help="input lengths, at 1 layer")
    ap.add_argument("--before-max-layers", type=int, default=4, help="run the old pass up to this depth")
    ap.add_argument("--pythia", action="store_true", help="also the Pythia-160M shape at 64 tokens")
    ap.add_argument("--pythia-layers", default="12")
    ap.add_argument("--pythia-only", action="store_true", help="with --influence-only: only the Pythia-160M shape")
    ap.add_argument("--influence", action="store_true", help="also the default influence certificate")
    ap.add_argument("--influence-layers", default="12")
    ap.add_argument("--influence-only", action="store_true",
                    help="only the influence certificates (no prediction passes) at --influence-layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/depth")
    ap.add_argument("--append", action="store_true", help="add to the rows already in --out (runs in pieces)")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        fn = {"after": run_after, "before": run_before, "influence": run_influence,
              "influence-gen": run_influence_gen}[args.one[0]]
        print(json.dumps(fn(*args.one[1:])))
        return
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    layers, lengths = [int(x) for x in args.layers.split(",") if x], [int(x) for x in args.lengths.split(",")]
    cases = [("gpt2-small-width", "preln", GPT2_SMALL, n, lengths[0]) for n in layers]
    cases += [("gpt2-small-width", "preln", GPT2_SMALL, 1, t) for t in lengths[1:]]
    if args.pythia:
        cases += [("pythia-160m-shape", "neox1l", PYTHIA_160M, int(n), lengths[0]) for n in args.pythia_layers.split(",")]
    influence_layers = {int(x) for x in args.influence_layers.split(",")} if args.influence else set()
    os.makedirs(args.out, exist_ok=True)
    saved = os.path.join(args.out, "rows.json")
    rows = []
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="tcert-depth-") as workdir:
        if args.influence_only:
            cases = influence_cases(args)
        for label, arch, size, n_layers, n_tokens in cases if not args.influence_only else []:
            made = make_case(workdir, arch, size, n_layers, n_tokens, args.seed)
            if made is None:
                print(f"| {label} | {n_layers} | {n_tokens} | near-tie: no certificate |")
                continue
            path, cpath, float_gap, gen = made
            passes = ["after"] + (["before"] if n_layers <= args.before_max_layers else [])
            for pass_name in passes:
                res, peak = child(pass_name, path, cpath)
                r = dict(model=label, layers=n_layers, tokens=n_tokens, float_gap=float_gap, generator_s=gen,
                         peak_mib=peak, **{"pass": pass_name}, **res)
                rows.append(r)
                print(row_text(r), flush=True)
            if n_layers in influence_layers and n_tokens <= 128:   # the same model (n_ctx 128, same seed)
                rows.append(influence_row(workdir, label, arch, size, n_layers, args.seed))
        for label, arch, size, n_layers, _ in cases if args.influence_only else []:
            rows.append(influence_row(workdir, label, arch, size, n_layers, args.seed))
    old = json.load(open(saved)) if args.append and os.path.exists(saved) else []   # read now: pieces may overlap
    rows = old + rows
    rows.sort(key=lambda r: (r["model"], r["layers"], r["tokens"], r["pass"]))
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(HEADER + "\n" + "\n".join(row_text(r) for r in rows) + "\n")
    with open(os.path.join(args.out, "rows.json"), "w") as f:
        json.dump(rows, f, indent=1)
    plot(rows, os.path.join(args.out, "depth.png"))
    print(f"wrote {args.out}/table.md, rows.json, depth.png")


if __name__ == "__main__":
    main()
