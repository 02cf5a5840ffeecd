"""Influence certificates: tightness (certified C r(n) / worst influence found by adversarial search) and speed.

    python benchmarks/bench_influence.py                 # tightness table + docs/influence_tightness.png
    python benchmarks/bench_influence.py --speed         # also the 4-layer d_model 512, d_vocab 30522 timing

Tightness: for the Max-of-4 anchor and random pre-LN models (tcert.generator.model.random_models, depth 1-4, causal and
bidirectional) the table gives, per input length n, the certified bound C r(n), the largest ||y - y'||
that random + greedy substitution search finds, and their ratio (>= 1 always; 1 would be tight).
"""

import argparse
import os
import tempfile
import time

from tcert.checker.verify import verify
from tcert.checker.numbers import parse_number
from tcert.checker.kinds.influence import rate
from tcert.checker.modelfile import load_model
from tcert.generator import certificate
from tcert.generator.influence import adversarial_influence, influence_certificate
from tcert.generator.model.files import save_model
from tcert.testing import ROOT

ANCHOR = os.path.join(ROOT, "certificates", "anchors", "maxofk", "maxof4_seed123.npz")


def anchor_model(tmp):
    """The Max-of-4 anchor as a model file (1 layer, attention-only, no LN, causal)."""
    from tcert.generator.model.importers import import_npz
    t, cfg = import_npz(ANCHOR, {"attention": "causal"})
    path = os.path.join(tmp, "maxof4.safetensors")
    save_model(path, t, cfg)
    return path


def random_preln(tmp, layers, attention, seed=0):
    from tcert.generator.model.random_models import random_model
    t, cfg = random_model("preln", d_vocab=64, d_model=32, n_heads=2, d_head=16, d_mlp=64, n_ctx=32,
                          n_layers=layers, seed=seed, attention=attention)
    path = os.path.join(tmp, f"preln_{layers}_{attention}.safetensors")
    save_model(path, t, cfg)
    return path


def robust(tmp, layers, attention):
    """The small-attention toy model of the corollary tests, where the C r(n) term (not C_abs) binds."""
    from tcert.generator.influence import robust_toy_model
    path = os.path.join(tmp, f"robust_{layers}_{attention}.safetensors")
    save_model(path, *robust_toy_model(layers, n_ctx=64, attention=attention))
    return path


def tightness(tmp, trials):
    """Rows (model, depth, mask, n, bound, found, ratio)."""
    rows = []
    models = [("maxof4", anchor_model(tmp))]
    for layers in (1, 2, 3, 4):
        for att in ("causal", "bidirectional"):
            models.append((f"preln-{att[:5]}", random_preln(tmp, layers, att)))
    for layers in (1, 2, 3):
        models.append(("robust-causa", robust(tmp, layers, "causal")))
    models.append(("robust-bidir", robust(tmp, 2, "bidirectional")))
    for name, path in models:
        model = load_model(path)
        cfg = model.config
        cert = influence_certificate(model)
        cpath = os.path.join(tmp, "c.json")
        certificate.write(cpath, cert)
        verify(cpath, path, "flint")
        C, C_abs = parse_number(cert["claim"]["C"], "C"), parse_number(cert["claim"]["C_abs"], "C_abs")
        for n in sorted({2, 4, 8, 16, 32, 64} & set(range(2, cfg.n_ctx + 1)) | {cfg.n_ctx}):
            rated = C * rate(cert["claim"]["rate"], n, cfg.n_layers)
            bound, binds = float(min(rated, C_abs)), ("C r(n)" if rated < C_abs else "C_abs")
            found, _ = adversarial_influence(model, n, trials=trials, greedy_rounds=1, seed=n)
            rows.append((name, cfg.n_layers, cfg.attention_dir, n, bound, found, bound / found if found else float("inf")))
            print(f"{name:14s} L={cfg.n_layers} {cfg.attention_dir:13s} n={n:3d}  bound {bound:10.4g}  found {found:9.4g}"
                  f"  ratio {rows[-1][-1]:10.4g}  ({binds})", flush=True)
    return rows


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    keys = sorted({(r[0], r[1], r[2]) for r in rows}, key=lambda k: (k[0], k[2], k[1]))
    for key in keys:
        pts = [(r[3], r[6]) for r in rows if (r[0], r[1], r[2]) == key]
        style = ("-" if key[2] == "causal" else "--") + {"maxof4": "*", "preln-causa": "o", "preln-bidir": "s"}.get(key[0], "^")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{key[0]} L={key[1]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("input length n")
    ax.set_ylabel("certified min(C r(n), C_abs) / worst found ||y - y'||")
    ax.set_title("Influence bound slack (solid: causal, dashed: bidirectional)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def speed(tmp):
    """Generator and checker (Arb) seconds on a 4-layer d_model 512, d_vocab 30522 random pre-LN model."""
    from tcert.generator.model.random_models import random_model
    t, cfg = random_model("preln", d_vocab=30522, d_model=512, n_heads=8, d_head=64, d_mlp=2048, n_ctx=512,
                          n_layers=4, seed=0)
    path = os.path.join(tmp, "big.safetensors")
    save_model(path, t, cfg)
    del t
    model = load_model(path)
    start, cpu = time.perf_counter(), time.process_time()
    cert = influence_certificate(model)
    gen, gen_cpu = time.perf_counter() - start, time.process_time() - cpu
    cpath = os.path.join(tmp, "big.json")
    certificate.write(cpath, cert)
    start, cpu = time.perf_counter(), time.process_time()
    ob = verify(cpath, path, "flint")
    chk, chk_cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"speed: 4 layers, d_model 512, d_vocab 30522, n_ctx 512: generator {gen:.1f} s wall ({gen_cpu:.1f} s CPU), "
          f"checker (Arb) {chk:.1f} s wall ({chk_cpu:.1f} s CPU); load average {os.getloadavg()[0]:.1f}")
    print(f"  {ob.summary}")
    for name, secs, _ in sorted(ob.done, key=lambda x: -x.seconds)[:6]:
        print(f"  {secs:7.1f} s  {name}")
    return gen, chk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "influence_tightness.png"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = tightness(tmp, args.trials)
        plot(rows, args.plot)
        print(f"plot: {args.plot}")
        if args.speed:
            speed(tmp)


if __name__ == "__main__":
    main()
