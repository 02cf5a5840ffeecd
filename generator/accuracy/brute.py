"""Brute-force Max-of-K certificates (float generator side): count the inputs safely answered correctly.

The certificate carries no hints (`{"strategy": "brute"}`): the checker (`tcert.checker.kinds.accuracy.
brute`) decides every input itself, so the generator only has to be fast and not over-claim.
"""

import numpy as np

from tcert.generator.accuracy.tables import SLACK, TINY, float_tables, max_excluding, tables_flops


def brute_count(model, T=None):
    """Float count of inputs whose logit gap exceeds SLACK times the input's own scale (claimed).

    Per query q: L[t_0..t_{n-2}, x] = sum_i H_i[t_i, x] with H_i[t, x] = w(q, i, t) (EU[q,x] + EVOU[t,x]
    + PVOU[i,x]) and w a positive multiple of the softmax numerator, so sign(L[m] - L[x]) is the sign
    of the logit gap. An input is claimed when L[x] < thr = L[m] - SLACK * scale for all x != m.
    Chunks: one (q, t_0) at a time, the last two non-query positions broadcast.

    Pruning (same decisions, fewer operations): per chunk, ub = max_{x != m}(H_a[t_a, x] + base[x])
    + max_{x != m} H_b[t_b, x] (top two per row, O(d_vocab^2)) is above every L[x], x != m, up to a few
    rounding units of `scale`; an input with ub + 1e-13 scale + 1e-290 < thr is therefore claimed by the
    full test too. Only the others (well under 1% on the anchors) get the full O(d_vocab) test, with the
    same float operations in the same order as before, so the count is unchanged.
    """
    T = T or float_tables(model)
    n, v = T["n"], T["v"]
    EQKE, EQKP, EU, EVOU, PVOU = T["EQKE"], T["EQKP"], T["EU"], T["EVOU"], T["PVOU"]
    toks = np.arange(v)
    outer = max(0, n - 3)
    inner = list(range(outer, n - 1))
    grids = np.meshgrid(*[toks] * len(inner), indexing="ij")
    gmax = np.maximum.reduce(list(grids))
    safe = 0
    C = [EU[q][None, None, :] + EVOU[None, :, :] + PVOU[:, None, :] for q in range(v)]   # per q: (i, t, x)
    for q in range(v):
        s = EQKE[q][None, :] + EQKP[q][:, None]          # (n, v): position i, key token t
        w = np.exp(s - s.max())
        H = w[:, :, None] * C[q]                         # (i, t, x)
        A = np.abs(H).max(axis=2)                        # (i, t): scale of each term
        rest_ub = sum((max_excluding(H[pos])[g] for pos, g in zip(inner[1:], grids[1:])), 0.0)  # (grid, m)
        inner_scale = sum(A[pos][g] for pos, g in zip(inner, grids))
        for pre in np.ndindex(*([v] * outer)):
            base = H[n - 1, q] + sum((H[j, t] for j, t in enumerate(pre)), np.zeros(v))
            scale = A[n - 1, q] + sum((A[j, t] for j, t in enumerate(pre)), 0.0)
            m = np.maximum(gmax, max((q,) + pre))
            Lm = base[m] + sum(H[pos][g, m] for pos, g in zip(inner, grids))
            scale = scale + inner_scale
            thr = Lm - SLACK * scale - TINY
            first = max_excluding(H[inner[0]] + base)[grids[0], m]
            ub = first + (np.take_along_axis(rest_ub, m[..., None], axis=-1)[..., 0] if outer < n - 2 else 0.0)
            sure = ub + (1e-13 * scale + 1e-290) < thr
            safe += int(np.count_nonzero(sure))
            idx = np.nonzero(~sure)
            if len(idx[0]):
                rows = sum(H[pos][g[idx]] for pos, g in zip(inner, grids)) + base
                ok = (rows >= thr[idx][:, None]).sum(axis=-1) == 1
                safe += int(np.count_nonzero(ok))
                rest = tuple(a[~ok] for a in idx)
                if len(rest[0]):   # sharp attention: weights relative to the query's overall max underflow
                    toks = np.stack([np.full(len(rest[0]), t) for t in pre] + [g[rest] for g in grids] +
                                    [np.full(len(rest[0]), q)], axis=1)
                    safe += renormalised_count(s, C[q], toks, m[rest])
    return safe


# The checker's numerator tables keep each weight exp(score - row max) to at least 64 bits down to
# 2^-(MAX_BITS - 128) = 2^-3968 (checker/kinds/accuracy/tables.py); an input whose largest weight lies
# below 2^-3700 is left to the checker (never claimed: it may certify fewer there).
RESOLVED = -3700 * np.log(2.0)


def renormalised_count(s, C, toks, m) -> int:
    """Inputs (rows of `toks`, max tokens `m`) claimed by the test of `brute_count` with each input's
    weights taken relative to its own largest score (sharp attention: relative to the query's overall
    max they all underflow), among inputs whose largest weight the checker resolves (RESOLVED).
    s: (n, v) scores; C[i, t, x] = EU[q,x] + EVOU[t,x] + PVOU[i,x]."""
    pos = np.arange(toks.shape[1])
    S = s[pos[None, :], toks]                                   # (rows, n) each input's scores
    top = S.max(axis=1, keepdims=True)
    w = np.exp(S - top)
    c = C[pos[None, :], toks]                                   # (rows, n, v)
    L = np.einsum("ri,rix->rx", w, c)
    scale = (w * np.abs(c).max(axis=2)).sum(axis=1)
    thr = L[np.arange(len(m)), m] - SLACK * scale - TINY
    claimed = ((L >= thr[:, None]).sum(axis=-1) == 1) & (top[:, 0] - s.max() >= RESOLVED)
    return int(np.count_nonzero(claimed))


def brute_flops(v, n, d_model, d_head) -> int:
    """Counted FLOPs of the brute-force generator: tables plus n adds and a max over d_vocab per input."""
    return tables_flops(v, n, d_model, d_head) + v * n * v * v * 3 + v ** n * v * (n + 2)
