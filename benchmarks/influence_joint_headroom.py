"""Headroom of the influence cap C_abs in the form `spread<k>.joint` uses: the sublayer moves added as one vector.

    python benchmarks/influence_joint_headroom.py MODEL.safetensors [...]   (relu, parallel, shared-LN text models)

C_abs with the joint bound is an upper bound of max_|u|=1 sum_j support_j(u), support_j the largest u-component of
sublayer j's move when every sublayer reads its own points of its LN ball. Any sharper bound of that form is at
least this maximum, so its float64 lower estimate here (block 0's attention by its finite value sets, a head
exactly by 2R ||N_h u||, an MLP by projected ascent on max_g u.f(g) - min_g' u.f(g'), u by alternation) says how
much a sharper per-sublayer term could still remove. Printed next to the certified C_abs. Float only.
"""

import sys

import numpy as np

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import certified_needs
from tcert.checker.modelfile import load_model
from tcert.generator.influence.ledger import FillLedger


def fold(w, W):
    """P diag(w) W (the LN gain folded into a reader, centred)."""
    d = W.shape[0]
    return (np.eye(d) - 1 / d) @ (w[:, None] * W)


def mlp_extreme(M, W_out, z0, u, R, rng, sign, starts=6, steps=150):
    """max over |g| <= R of sign * u . relu(g M + z0) W_out (projected ascent, lower estimate)."""
    top, best = np.linalg.svd(M)[0][:, 0] * R, -np.inf
    for g in [top, -top] + [rng.normal(size=M.shape[0]) for _ in range(starts)]:
        g = g / np.linalg.norm(g) * R
        for _ in range(steps):
            grad = sign * M @ ((g @ M + z0 > 0) * (W_out @ u))
            g = g + 0.05 * R * grad / (np.linalg.norm(grad) + 1e-12)
            g = g / max(1.0, np.linalg.norm(g) / R)
        best = max(best, sign * np.maximum(g @ M + z0, 0) @ W_out @ u)
    return best


def headroom(path, rounds=8, starts=3):
    """(the largest support sum found, certified C_abs) for the model at `path`."""
    m = load_model(path)
    t, cfg = {k: np.asarray(v, dtype=np.float64) for k, v in m.tensors.items()}, m.config
    d, R, rng = cfg.d_model, np.sqrt(cfg.d_model), np.random.default_rng(0)
    x = t["embed.W_E"] - t["embed.W_E"].mean(1, keepdims=True)
    g0 = x / np.sqrt((x ** 2).mean(1, keepdims=True) + float(cfg.eps)) * t["blocks.0.ln1.w"] + t["blocks.0.ln1.b"]
    V0 = [g0 @ t["blocks.0.attn.W_V"][h] @ t["blocks.0.attn.W_O"][h] for h in range(cfg.n_heads)]
    blocks = []
    for k in range(1, cfg.n_layers):
        w, p = t[f"blocks.{k}.ln1.w"], f"blocks.{k}."
        blocks.append(([fold(w, t[p + "attn.W_V"][h]) @ t[p + "attn.W_O"][h] for h in range(cfg.n_heads)],
                       fold(w, t[p + "mlp.W_in"]), t[p + "mlp.W_out"], t[p + "ln1.b"] @ t[p + "mlp.W_in"] + t[p + "mlp.b_in"]))
    best = 0.0
    for _ in range(starts):
        u = rng.normal(size=d)
        for _ in range(rounds):
            u /= np.linalg.norm(u)
            value, G = sum((V @ u).max() - (V @ u).min() for V in V0), np.zeros((d, d))
            for Ns, M, W_out, z0 in blocks:
                value += sum(2 * R * np.linalg.norm(N @ u) for N in Ns)
                value += mlp_extreme(M, W_out, z0, u, R, rng, 1) + mlp_extreme(M, W_out, z0, u, R, rng, -1)
                for A in Ns + [M @ W_out, W_out]:   # next u: a power step on the terms' Gram matrices
                    G += A.T @ A / max(np.linalg.norm(A @ u), 1e-9)
            best, u = max(best, value), G @ u + 1e-3 * rng.normal(size=d)
    C_abs = certified_needs(m, make_backend("flint"), FillLedger(), cfg.n_ctx, 6)["C_abs"]
    return best, float(C_abs)


if __name__ == "__main__":
    for model_path in sys.argv[1:]:
        found, certified = headroom(model_path)
        print(f"{model_path}: certified C_abs {certified:.2f}; support sum found {found:.2f} "
              f"(no bound of the joint form goes below it: at most {1 - found / certified:.0%} lower)")
