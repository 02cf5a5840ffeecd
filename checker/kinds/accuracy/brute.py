"""`accuracy` by brute force: every one of the d_vocab^n_ctx inputs is decided.

evidence {"strategy": "brute"}

For query q put H[i, t, x] = e[q, t] pw[q, i] (EU[q, x] + EVOU[t, x] + PVOU[i, x]): then sum_i H[i, t_i, x]
is a positive multiple of logit x of input (t_0..t_{n-2}, q), and the input is correct iff that sum is
larger at x = m = max(t) than at every x != m. The checker decides this for every input from exact integer
bounds of H (lower ends at m, upper ends elsewhere), so the count is of inputs certainly correct.

Obligations: "accuracy brute: rigorous tables", "accuracy brute: every input".
"""

import itertools

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.kinds.accuracy.tables import integer_tables, product_bounds

MAX_BRUTE_INPUTS = 1 << 26


def certified(B, model, evidence, ob) -> tuple:
    """(inputs certainly correct, "brute force") for a brute-force certificate."""
    fields(evidence, "evidence", {"strategy"})
    n, v = model.config.n_ctx, model.config.d_vocab
    if v ** n > MAX_BRUTE_INPUTS:
        raise BadInput(f"evidence: brute force over {v}^{n} inputs exceeds the limit {MAX_BRUTE_INPUTS}")
    with ob.step("accuracy brute: rigorous tables (EQKE, EQKP, EU, EVOU, PVOU)"):
        tables = integer_tables(B, model)
    with ob.step("accuracy brute: every input") as fig:
        count = correct_count(tables)
        fig["inputs decided"] = v ** n
        fig["inputs certainly correct"] = count
    return count, "brute force"


def logit_terms(tables, q: int):
    """Exact bounds (object ints) of H[i, t, x] = w(q, i, t) (EU[q,x] + EVOU[t,x] + PVOU[i,x]) for query q.

    w(q, i, t) = e[q, t] pw[q, i] is a positive multiple (the same for all i, t) of the softmax numerator
    of key t at position i, so sum_i H[i, t_i, x] is a positive multiple of logit x.
    """
    w_lo = tables["e_lo"][q][None, :] * tables["pw_lo"][q][:, None]            # (i, t)
    w_hi = tables["e_hi"][q][None, :] * tables["pw_hi"][q][:, None]
    value_lo = tables["EU_lo"][q][None, None, :] + tables["EVOU_lo"][None, :, :] + tables["PVOU_lo"][:, None, :]
    value_hi = tables["EU_hi"][q][None, None, :] + tables["EVOU_hi"][None, :, :] + tables["PVOU_hi"][:, None, :]
    return product_bounds(w_lo[:, :, None], w_hi[:, :, None], value_lo, value_hi)     # (i, t, x)


def row_mantissas(H_lo, H_hi, n: int):
    """Each row H[i, t, :] as int64 mantissas with one exponent: lo * 2^E <= H <= hi * 2^E (exact floor /
    ceil), |mantissas| < 2^MANT so that n + 1 aligned terms sum without overflow."""
    mant = 61 - (n + 1).bit_length()
    shape = H_lo.shape[:2]
    E = np.zeros(shape, dtype=np.int64)
    lo = np.zeros(H_lo.shape, dtype=np.int64)
    hi = np.zeros(H_lo.shape, dtype=np.int64)
    for i, t in np.ndindex(*shape):
        a, b = H_lo[i, t], H_hi[i, t]
        e = max(max(abs(x) for x in a), max(abs(x) for x in b), 1).bit_length() - mant
        E[i, t] = e
        lo[i, t] = [x >> e if e >= 0 else x << -e for x in a]
        hi[i, t] = [-((-x) >> e) if e >= 0 else x << -e for x in b]
    return lo, hi, E


def aligned(x, shift, up: bool):
    """x * 2^-shift rounded down (or up), exactly: int64 arithmetic shift (shift >= 0, capped at 63,
    which is exact because |x| < 2^62 already floors to 0 or -1 there)."""
    s = np.minimum(shift, 63)
    return -((-x) >> s) if up else x >> s


def correct_count(tables) -> int:
    """Number of inputs whose max token's logit is certainly strictly above every other logit.

    For query q, input (t_0..t_{n-2}, q) with max m is counted when sum_i lo_i[t_i, m] > sum_i hi_i[t_i, x]
    for every x != m, all terms aligned to the input's largest row exponent (exact floor / ceil), so each
    input keeps ~58 bits relative to its own dominant term. Positions other than the last two (or one)
    non-query positions are enumerated; those are broadcast.
    """
    if int(np.right_shift(np.array([-5], dtype=np.int64), 1)[0]) != -3:   # floor semantics is relied on
        raise RuntimeError("int64 >> is not an arithmetic (floor) shift on this platform")
    n, v = tables["n"], tables["v"]
    inner = list(range(max(0, n - 3), n - 1))
    outer = inner[0]
    toks = np.arange(v)
    grids = np.meshgrid(*[toks] * len(inner), indexing="ij")
    gmax = np.maximum.reduce(list(grids))
    count = 0
    for q in range(v):
        lo, hi, E = row_mantissas(*logit_terms(tables, q), n)
        for pre in itertools.product(range(v), repeat=outer):
            rows = [(n - 1, q)] + list(enumerate(pre))
            E_input = np.maximum.reduce([np.full(gmax.shape, E[i, t]) for i, t in rows]
                                        + [E[pos][g] for pos, g in zip(inner, grids)])
            m = np.maximum(gmax, max((q,) + pre))
            logit_hi = sum(aligned(hi[i, t], (E_input - E[i, t])[..., None], True) for i, t in rows)
            logit_m_lo = sum(aligned(lo[i, t][m], E_input - E[i, t], False) for i, t in rows)
            for pos, g in zip(inner, grids):
                sh = E_input - E[pos][g]
                logit_hi = logit_hi + aligned(hi[pos][g], sh[..., None], True)
                logit_m_lo = logit_m_lo + aligned(lo[pos][g, m], sh, False)
            above = (logit_hi >= logit_m_lo[..., None]).sum(axis=-1)    # x = m always counts itself
            count += int(np.count_nonzero(above == 1))
    return count
