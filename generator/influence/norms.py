"""Float estimates of the matrix-derived constants, and the centre hints (untrusted: the checker
recomputes every one of them rigorously)."""

import math

import numpy as np


def operator_norm_estimate(factors, power: int) -> float:
    """Float version of `tcert.checker.kinds.influence.norms.operator_norm` (same trace-power bound), in log
    scale so that the repeated squarings cannot overflow."""
    if len(factors) == 1:
        M = np.asarray(factors[0], np.float64)
        gram = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    else:
        first, second = (np.asarray(f, np.float64) for f in factors)
        gram = (first.T @ first) @ (second @ second.T)
    log_scale = 0.0
    for _ in range(power):
        s = np.abs(gram).max()
        if s == 0:
            return 0.0
        gram = gram / s
        log_scale = 2 * (log_scale + math.log(s))
        gram = gram @ gram
    tr = float(np.trace(gram))
    if tr <= 0:
        return 0.0
    return math.exp((log_scale + math.log(tr)) / 2 ** (power + 1))


def max_row_dist_estimate(arr, center=None) -> float:
    """max_r ||arr[r] - center||_2 in float64."""
    a = np.asarray(arr, np.float64)
    if center is not None:
        a = a - np.asarray(center, np.float64)[None, :]
    return float(np.sqrt((a * a).sum(axis=1).max())) if a.size else 0.0


def estimates(model, n_max: int, power: int, embed_center, unembed_center) -> dict:
    """numpy estimates of every matrix-derived constant the checker will recompute."""
    cfg, t = model.config, model.tensors
    out = {"embed.token_norm": max_row_dist_estimate(t["embed.W_E"]),
           "D0": 2 * max_row_dist_estimate(t["embed.W_E"], embed_center),
           "unembed.radius": max_row_dist_estimate(np.asarray(t["unembed.W_U"]).T, unembed_center)}
    if cfg.positional_embedding_type == "standard":   # learned positions only (rotary and NoPE add none)
        out["embed.pos_norm"] = max_row_dist_estimate(t["pos_embed.W_pos"][:n_max])
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        for h in range(cfg.n_heads):
            q = f"L{layer}.h{h}."
            out[q + "W_Q"] = operator_norm_estimate([t[p + "attn.W_Q"][h]], power)
            out[q + "W_K"] = operator_norm_estimate([t[p + "attn.W_K"][h]], power)
            out[q + "OV"] = operator_norm_estimate([t[p + "attn.W_V"][h], t[p + "attn.W_O"][h]], power)
            if not cfg.rotary:
                out[q + "QK"] = operator_norm_estimate([t[p + "attn.W_Q"][h], np.asarray(t[p + "attn.W_K"][h]).T],
                                                       power)
        if not cfg.attn_only:
            out[f"L{layer}.mlp.W_in"] = operator_norm_estimate([t[p + "mlp.W_in"]], power)
            out[f"L{layer}.mlp.W_out"] = operator_norm_estimate([t[p + "mlp.W_out"]], power)
    return out


def centre(rows) -> np.ndarray:
    """A centre hint for a point set: the midpoint of its bounding box, refined by a few
    Badoiu-Clarkson steps towards the minimum enclosing ball (any centre is valid)."""
    a = np.asarray(rows, np.float64)
    c = (a.max(axis=0) + a.min(axis=0)) / 2
    for k in range(1, 40):
        far = a[np.argmax(((a - c) ** 2).sum(axis=1))]
        c = c + (far - c) / (k + 1)
    return c.astype(np.float32).astype(np.float64)  # short exact hex strings
