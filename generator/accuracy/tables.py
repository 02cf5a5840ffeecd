"""Float64 tables of a Max-of-K model and the float helpers every strategy shares (untrusted generator side).

The model is a 1-layer attention-only transformer (one head, learned positions, no LayerNorm). With the
query at the last position n-1 and key token t at position i, everything the last logits depend on
splits into small tables (floats here; `tcert.checker.kinds.accuracy.tables` recomputes them rigorously):

    score(q; t, i) = EQKE[q, t] + EQKP[q, i]          (already divided by the attention scale)
    logits(x)      = EU[q, x] + sum_i a_i (EVOU[t_i, x] + PVOU[i, x]),  a = softmax(scores)

Every strategy decides, per case, whether logit(max) > logit(x) for all x != max, and claims only cases
whose float margin is safely negative (relative slack `SLACK`), so that the rigorous checker, whose
enclosures are far tighter than the slack, confirms them. See docs/accuracy.md for the arguments.
"""

import math

import numpy as np

SLACK = 1e-9          # relative float margin below which a case is not claimed
TINY = 1e-300


def float_tables(model) -> dict:
    """Float64 EQKE, EQKP (scores / attention scale), EU (direct path incl. constant biases), EVOU, PVOU."""
    c = model.config
    t = {k: np.asarray(v, dtype=np.float64) for k, v in model.tensors.items()}
    E, P = t["embed.W_E"], t["pos_embed.W_pos"]
    p = "blocks.0.attn."
    WQ, WK, WV, WO = t[p + "W_Q"][0], t[p + "W_K"][0], t[p + "W_V"][0], t[p + "W_O"][0]
    bQ, bK, bV, bO = t[p + "b_Q"][0], t[p + "b_K"][0], t[p + "b_V"][0], t[p + "b_O"]
    WU, bU = t["unembed.W_U"], t["unembed.b_U"]
    div = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
    n = c.n_ctx
    X = E + P[n - 1]
    Q = X @ WQ + bQ
    OU = WO @ WU
    return {
        "EQKE": Q @ (E @ WK).T / div,
        "EQKP": Q @ (P @ WK + bK).T / div,
        "EU": X @ WU + bU + (bV @ WO + bO) @ WU,
        "EVOU": E @ WV @ OU,
        "PVOU": P @ WV @ OU,
        "n": n, "v": c.d_vocab,
    }


def tables_flops(v, n, d, dh) -> int:
    """FLOPs of EQKE, EQKP, EU, EVOU, PVOU as matrix products (2 per multiply-add)."""
    return 2 * (v * d * dh * 3 + v * dh * v + v * dh * n + n * d * dh + v * d * v + d * dh * v
                + dh * d * v + v * d * dh + n * d * dh)


def max_excluding(M):
    """X[r, m] = max_{x != m} M[r, x] (float; the top two of each row)."""
    r = np.arange(M.shape[0])
    top = M.argmax(axis=1)
    rest = M.copy()
    rest[r, top] = -np.inf
    X = np.repeat(M[r, top][:, None], M.shape[1], axis=1)
    X[r, top] = rest.max(axis=1)
    return X


def attention_weights(T):
    """Per query q: e[q, t] = exp(EQKE[q, t] - max), pw[q, i] = exp(EQKP[q, i] - max), query weight."""
    EQKE, EQKP, n = T["EQKE"], T["EQKP"], T["n"]
    e = np.exp(EQKE - EQKE.max(axis=1, keepdims=True))
    pw = np.exp(EQKP - EQKP.max(axis=1, keepdims=True))
    eq = np.diag(e) * pw[:, n - 1]
    return e, pw, eq


def position_sums(pw, n):
    """smallest[q, r] / largest[q, r]: sum of the r smallest / largest non-query positional weights;
    total[q] their total."""
    srt = np.sort(pw[:, : n - 1], axis=1)
    zero = np.zeros((pw.shape[0], 1))
    smallest = np.concatenate([zero, np.cumsum(srt, axis=1)], axis=1)
    largest = np.concatenate([zero, np.cumsum(srt[:, ::-1], axis=1)], axis=1)
    return smallest, largest, srt.sum(axis=1)
