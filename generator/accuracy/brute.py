"""Brute-force Max-of-K certificates (float generator side): count the inputs safely answered correctly.

The certificate carries no hints (`{"strategy": "brute"}`): the checker (`tcert.checker.kinds.accuracy.
brute`) decides every input itself, so the generator only has to be fast and not over-claim. The claim is
the larger of the float count and the weight the checker's own brute-force rule certifies
(`checker_weight`): on sharp models (scores of thousands) the float test's softmax weights underflow and
it under-claims (54 of the 64 inputs the checker certifies at d_vocab 4, sharpness 5000).
"""

import functools
import math

import numpy as np

from tcert.checker.interval import make_backend
from tcert.checker.kinds.accuracy import brute as checker_brute
from tcert.checker.obligations import Obligations
from tcert.generator.accuracy.tables import SLACK, TINY, float_tables, max_excluding, tables_flops


def checker_weight(model, dist) -> int:
    """The weight (a count under uniform counting) of the inputs the checker's brute-force rule certifies
    correct, at the checker's default backend and precision: a claim of at most this verifies."""
    B = make_backend("flint", 64)
    with B.precision():
        weight, _ = checker_brute.certified(B, model, {"strategy": "brute"}, dist, Obligations())
    return weight


def brute_count(model, T=None, dist=None):
    """(claimed weight numerators, inputs that needed the full test): the inputs whose logit gap exceeds
    SLACK times the input's own scale are claimed (a count under uniform counting or `dist` None).

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
    safe = hard = 0
    inner_w = None if dist is None or dist.unit else functools.reduce(np.multiply, np.ix_(*[dist.arrays[pos] for pos in inner]))
    for q in range(v):
        s = EQKE[q][None, :] + EQKP[q][:, None]          # (n, v): position i, key token t
        w = np.exp(s - s.max())
        H = w[:, :, None] * (EU[q][None, None, :] + EVOU[None, :, :] + PVOU[:, None, :])   # (i, t, x)
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
            idx = np.nonzero(~sure)
            hard += len(idx[0])
            if len(idx[0]):
                rows = sum(H[pos][g[idx]] for pos, g in zip(inner, grids)) + base
                sure[idx] = (rows >= thr[idx][:, None]).sum(axis=-1) == 1
            if dist is not None:
                sure &= m >= dist.m0
            if inner_w is None:
                safe += int(np.count_nonzero(sure))
            else:
                fixed = math.prod(dist.a[j][t] for j, t in enumerate(pre)) * dist.a[n - 1][q]
                safe += int((inner_w[sure]).sum()) * fixed
    return safe, hard


def brute_flops(v, n, d_model, d_head) -> int:
    """Counted FLOPs of the brute-force proof: tables plus n adds and a max over d_vocab per input (every
    input evaluated in full)."""
    return tables_flops(v, n, d_model, d_head) + v * n * v * v * 3 + v ** n * v * (n + 2)


def pruned_flops(v, n, d_model, d_head, hard: int) -> int:
    """Counted FLOPs of the brute-force checker as it runs: tables, each query's int64 tables, the fixed part
    of every (query, pattern, max) group, the top-2 bound of every input (n adds and a comparison) and the full
    test of the `hard` inputs that bound leaves."""
    from tcert.generator.accuracy.refine import decide_cost, query_cost
    groups = v * v * (1 << (n - 1))
    return tables_flops(v, n, d_model, d_head) + v * query_cost(v, n) + groups * 4 * v + v ** n * (n + 1) \
        + hard * decide_cost(v, n)
