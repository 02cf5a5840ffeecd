"""Cubic (pure-sequence) Max-of-K certificates (float generator side): the claimed (m, q, c, mask) cases.

Per case the checker (`tcert.checker.kinds.accuracy.cubic`) bounds the numerator of max_{x != m} logit_x -
logit_m by G(u) = e[q,m] u Tm + e[q,k] (P - u) S_k + e_q Tq at both ends of u's range; the generator
evaluates the same expression in floats and claims the tokens k with a safely negative G.
"""

import math

import numpy as np

from tcert.generator.accuracy.tables import SLACK, TINY, attention_weights, float_tables, position_sums, tables_flops


def value_bounds(T, m: int):
    """For max token m (all centred at column m, maxima over x != m):

    Tm[q] = max_x EU[q,x] + EVOU[m,x] + Pn[x]      (max-token key at a non-query position)
    Tq[q] = max_x EU[q,x] + EVOU[q,x] + PVOU[n-1,x]  (the query key)
    S[q,k] = max_x EU[q,x] + max_x EVOU[k,x] + Pn[x]  (a non-max key k)
    where Pn[x] = max over non-query positions i of PVOU[i,x] (centred).
    """
    n = T["n"]
    EUc = T["EU"] - T["EU"][:, [m]]
    EVOUc = T["EVOU"] - T["EVOU"][:, [m]]
    PVOUc = T["PVOU"] - T["PVOU"][:, [m]]
    Pn = PVOUc[: n - 1].max(axis=0)
    keep = np.arange(T["v"]) != m
    EUk, EVOUk = EUc[:, keep], EVOUc[:, keep]
    Tm = (EUk + (EVOUk[m] + Pn[keep])[None, :]).max(axis=1)
    Tq = (EUk + EVOUk + PVOUc[n - 1, keep][None, :]).max(axis=1)
    S = EUk.max(axis=1)[:, None] + (EVOUk + Pn[keep][None, :]).max(axis=1)[None, :]
    return Tm, Tq, S


def cubic_cases(model, T=None):
    """The cubic proof in floats: list of (m, q, c, mask) with mask = bit k set when case (q, m, k, c)
    is safely correct (c = 0: mask 1 when the all-max filling is), and the total count they imply."""
    T = T or float_tables(model)
    n, v = T["n"], T["v"]
    e, pw, eq = attention_weights(T)
    smallest, largest, P = position_sums(pw, n)
    cases, count = [], 0
    for m in range(v):
        Tm, Tq, S = value_bounds(T, m)
        for q in range(m + 1):
            top = n - 1 if q == m else n - 2
            for c in range(0, top + 1):
                r = n - 1 - c
                if c == 0:
                    terms = [e[q, m] * P[q] * Tm[q], eq[q] * Tq[q]]
                    ok = sum(terms) < -SLACK * sum(abs(x) for x in terms) - TINY
                    if ok:
                        cases.append((m, q, 0, 1))
                        count += 1
                    continue
                good = np.ones(m, dtype=bool)
                for u in (smallest[q, r], largest[q, r]):
                    a = e[q, m] * u * Tm[q]
                    b = e[q, :m] * (P[q] - u) * S[q, :m]
                    d = eq[q] * Tq[q]
                    g = a + b + d
                    # the slack scales with e_k P |S|, not e_k (P - u) |S|: P - u cancels in floats (the
                    # checker's P - u is an interval of width ~2^-60 P, found by the large hypothesis run)
                    mag = abs(a) + e[q, :m] * P[q] * np.abs(S[q, :m]) + abs(d)
                    good &= g < -SLACK * mag - TINY
                if good.any():
                    mask = int(sum(1 << int(k) for k in np.nonzero(good)[0]))
                    cases.append((m, q, c, mask))
                    count += math.comb(n - 1, c) * int(good.sum()) ** c
    return cases, count


def cubic_flops(v, n, d, dh) -> int:
    """Counted FLOPs of the cubic strategy: tables, the per-max-token value tables (d_vocab^3 work)
    and the per-case evaluation (two endpoints, ~8 operations each, over d_vocab^3 n_ctx / 2 cases)."""
    per_m = 3 * v * v + 3 * v * v + 2 * v * v + n * v
    return tables_flops(v, n, d, dh) + v * per_m + (v ** 3 // 2) * (n - 1) * 2 * 8 + v * v * 4
