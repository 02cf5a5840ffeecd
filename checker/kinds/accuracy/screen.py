"""The cubic and mixed rules' tables in int64 at reduced precision, rounded outward: a fast screen.

`cubic_sets` (cubic's rule for every case and token: cubic's screen, refine's cubic sets) and
`refine.mixed_screened` evaluate their rule's bound on these tables for every case / entry at once; whatever
the screen proves (bound < 0) holds, and whatever it cannot prove gets the exact evaluation on the integer
tables (built only then: `tables.Tables`), so the screen only saves time, never changes what can be proved
by more than its rounding.

Every table is rounded outward from the float64 ends (`tables.float_tables`; floor of lo, ceil of hi,
exactly: `rows.scaled_ends`): values at one scale, at
most 2^VALUE_BITS in magnitude (`rows.value_tables`); pw per query at most 2^W (its own scale; position
sums from the rounded pw); e per (q, m) at most 2^W (`weights`: relative to the largest e[q, t], t <= m,
the only keys an input with max m has). Positive scales (one for pw per query, one for e per (q, m))
change no sign of a bound that is a sum of (e factor)(pw factor)(value) products. A centred sum of three
values is at most 3 * 2^(VALUE_BITS+1), a product of e, a position sum and such a sum at most
3 (n-1) 2^(2W+VALUE_BITS+1); `screen_tables` asserts that FIVE_TERMS of them stay below 2^63.
"""

from typing import NamedTuple

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.kinds.accuracy.rows import align, mantissas, scaled_ends, top_two, value_tables

VALUE_BITS = 20     # value tables at most 2^20 in magnitude
FIVE_TERMS = 5      # the most products a screened bound adds (refine's corners)
SETS_CHUNK = 1 << 15    # `cubic_sets`: (m, q, k) entries per block of max tokens (bounds its int64 arrays; small
                        # blocks' temporaries are reused by the allocator instead of fresh pages per check)
MAX_SETS = 1 << 28      # `cubic_sets`: d_vocab^3 n_ctx at most (K's booleans; d_vocab 406 at n_ctx 4)


class Screen(NamedTuple):
    """W; value tables V (rows.value_tables); cubic's value bounds Tm[m, q], Tq[m, q], EUp[m, q], R[m, k]
    (`value_bounds` for every m); e as 30-bit mantissas em (lo, hi) at exponents Ee[q, t]; s (`weights`);
    pw (lo, hi) per query; small[q, r] <= the sum of the r smallest non-query pw, large[q, r] >= the sum of
    the r largest (r = 0..n-1: r = n-1 the total)."""

    W: int
    V: dict
    Tm: np.ndarray
    Tq: np.ndarray
    EUp: np.ndarray
    R: np.ndarray
    em: list
    Ee: np.ndarray
    s: np.ndarray
    pw: list
    small: np.ndarray
    large: np.ndarray


def screen_tables(tables) -> Screen:
    """The int64 tables (computed once per `tables`, kept in it under "screen"), from the float64 ends of
    `tables.float_tables`: e as 30-bit mantissas at exponents Ee = L - 30 (e_hi < 2^L: `rows.mantissas`), pw
    per query at most 2^W (`rows.scaled_ends` at 2^(W - X_q), every pw_hi[q, i] < 2^X_q)."""
    if "screen" in tables:
        return tables["screen"]
    n = tables["n"]
    W = (41 - (15 * n - 15).bit_length()) // 2
    V = value_tables(tables, VALUE_BITS)
    *em, L = mantissas(*tables["ends"]["e"], 30)
    pw_lo, pw_hi = tables["ends"]["pw"]
    pw = list(scaled_ends(pw_lo, pw_hi, W - np.frexp(pw_hi.max(axis=1))[1][:, None]))
    small = np.cumsum(np.sort(pw[0][:, : n - 1], axis=1), axis=1)
    large = np.cumsum(-np.sort(-pw[1][:, : n - 1], axis=1), axis=1)
    small, large = (np.concatenate([np.zeros((len(a), 1), np.int64), a], axis=1) for a in (small, large))
    if FIVE_TERMS * (1 << W) * max(int(large.max()), int(pw[1].max())) * (3 << (VALUE_BITS + 1)) >= 1 << 63:
        raise RuntimeError("accuracy screen: int64 bound exceeded (checker bug)")     # the module docstring
    s = np.maximum.accumulate(L, axis=1) - W
    tables["screen"] = Screen(W, V, *value_bounds(V, n), em, L - 30, s, pw, small, large)
    return tables["screen"]


def weights(S: Screen, Q, M, T, up: bool):
    """e[Q, T] rounded down (up) at 2^-s[Q, M], s[q, m] the exponent that puts max_{t <= m} e_hi[q, t] at
    most 2^W (elementwise over arrays Q, M, T with T <= M; from the mantissas: floor / ceil twice is still
    outward; s - Ee >= 30 - W >= 0 since Ee = L - 30, e_hi[q, t] < 2^L[q, t], and W <= 30). Read by flat
    indices q v + t (`take`: several times faster than indexing by two arrays; every index is below v)."""
    v = S.Ee.shape[1]
    qt = Q * v + T
    return align(S.em[up].take(qt), S.s.take(Q * v + M) - S.Ee.take(qt), up)


def value_bounds(V, n: int) -> tuple:
    """cubic's `value_bounds` for every max token m at once: arrays Tm[m, q], Tq[m, q], EUp[m, q], R[m, k]
    (each table centred at column m: hi[r, x] - lo[r, m], maxima over x != m; exact int64, every entry at most
    2^VALUE_BITS in magnitude, so a sum of six stays far below 2^63):

    Tm[m, q] = max_x (EUh[q,x] + EVh[m,x] + Pn[m,x]) - EUl[q,m] - EVl[m,m]    Pn[m,x] = max_{i<n-1} PVh[i,x] - PVl[i,m]
    Tq[m, q] = max_x (EUh[q,x] + EVh[q,x] + PVh[n-1,x]) - EUl[q,m] - EVl[q,m] - PVl[n-1,m]
    EUp[m, q] = max_x EUh[q,x] - EUl[q,m]          R[m, k] = max_x (EVh[k,x] + Pn[m,x]) - EVl[k,m]"""
    (EUl, EUh), (EVl, EVh), (PVl, PVh) = V["EU"], V["EVOU"], V["PVOU"]
    if len(EUh) < 2:                            # no x != m: top_two and others_max need two columns
        raise BadInput("accuracy: the cubic screen needs d_vocab >= 2")
    d = np.arange(len(EUh))
    Pn = (PVh[: n - 1, None, :] - PVl[: n - 1, :, None]).max(axis=0)
    Tm = others_max(EUh[None, :, :] + (EVh + Pn)[:, None, :]) - EUl.T - EVl[d, d][:, None]
    Tq = top_two(EUh + EVh + PVh[n - 1]).T - EUl.T - EVl.T - PVl[n - 1][:, None]
    EUp, R = top_two(EUh).T - EUl.T, others_max(EVh[None, :, :] + Pn[:, None, :]) - EVl.T
    return tuple(np.ascontiguousarray(a) for a in (Tm, Tq, EUp, R))


def others_max(A):
    """X[m, r] = max_{x != m} A[m, r, x] (int64, A overwritten at x = m)."""
    d = np.arange(A.shape[0])
    A[d, :, d] = np.iinfo(np.int64).min
    return A.max(axis=2)


def upper(lo, hi, x):
    """Upper bound of w * x over w in [lo, hi] (elementwise, int64): hi x where x >= 0, else lo x."""
    return x * np.where(x >= 0, hi, lo)


def cubic_sets(tables) -> tuple:
    """`cubic.numerator_bound` on these tables for every case and token at once: (K, all_max), K[m, q, c, k]
    (c >= 1) whether the bound is negative for non-max token k of case (m, q, c), all_max[m, q] whether it is
    for the all-max input (c = 0); False wherever no such case or token exists (q > m, c > n-2 with q < m,
    k >= m; K[..., 0, :]). Cached in `tables`, with "cubic keys" KB[m, q, c] = max over k in K[m, q, c] of
    upper(e_k, EUp[m, q] + R[m, k]) at 2^-s[q, m] (refine's beta_K; int64 min where K[m, q, c] is empty); by
    blocks of max tokens (at most SETS_CHUNK (m, q, k) each), and refused (BadInput) when K would exceed
    MAX_SETS entries.

    Per (m, q) and end u the bound is A(u) + upper(w, key) with w in [lo, hi] e_k-scaled: lo = e_k (P_lo - u)
    or eh_k (P_lo - u) as P_lo - u >= 0 or not, hi alike; upper(w, key) = x (x >= 0 ? a : b) with x = hi,
    a = eh_k key, b = e_k key for key >= 0, and x = lo, a = e_k key, b = eh_k key for key < 0 (the four sign
    cases of screen.upper and the two ends, regrouped; exact integer products)."""
    if "cubic sets" in tables:
        return tables["cubic sets"]
    S, n, v = screen_tables(tables), tables["n"], tables["v"]
    if v ** 3 * n > MAX_SETS:
        raise BadInput(f"accuracy: d_vocab^3 n_ctx = {v ** 3 * n} exceeds {MAX_SETS} (the cubic screen's sets)")
    m, q = np.nonzero(np.tri(v, dtype=bool))                    # the (m, q) with q <= m
    pair = np.zeros((v, v), dtype=np.int64)
    pair[m, q] = np.arange(len(m))
    eM, eMh, eQ, eQh = (weights(S, q, m, t, up) for t in (m, q) for up in (False, True))
    query = upper(eQ * S.pw[0][q, n - 1], eQh * S.pw[1][q, n - 1], S.Tq[m, q])
    K, step = np.zeros((v, v, n, v), dtype=bool), max(1, SETS_CHUNK // (v * v))
    KB = np.full((v, v, n), np.iinfo(np.int64).min)
    P = np.stack([S.large[:, n - 1], S.small[:, n - 1]], axis=1).ravel()     # P_hi, P_lo of query q at 2q, 2q+1
    ends = {c: [(P - np.repeat(u, 2), upper(eM * u[q], eMh * u[q], S.Tm[m, q]) + query)
                for u in (S.small[:, n - 1 - c], S.large[:, n - 1 - c])] for c in range(1, n)}
    for m0 in range(0, v, step):
        block_sets(S, pair, ends, range(m0, min(m0 + step, v)), K, KB)
    all_max = np.zeros((v, v), dtype=bool)
    all_max[m, q] = upper(eM * S.small[q, n - 1], eMh * S.large[q, n - 1], S.Tm[m, q]) + query < 0
    tables["cubic sets"], tables["cubic keys"] = (K, all_max), KB
    return K, all_max


def block_sets(S, pair, ends, block, K, KB) -> None:
    """`cubic_sets` for the max tokens m in `block` (a range): K[m, q, c, k] and KB[m, q, c] for every (m, q, k)
    with q <= m and k < m, from the (P - u, A(u)) of both ends u per c (`ends`: the same for every block). On
    the block's dense grid (m, q, k), q < top and k < top - 1 (top = the block's end): broadcasting, no index
    arrays; the (m, q, k) outside q <= m, k < m are masked (k clamped to m: every term is a real case's)."""
    n, top = K.shape[2], block.stop
    if top < 2:                                                 # max token 0 only: no k < m
        return
    M, Q, k = np.arange(block.start, top)[:, None, None], np.arange(top)[:, None], np.arange(top - 1)
    T = np.minimum(k, M)                                        # (m, 1, k)
    valid = (Q <= M) & (k < M)                                  # (m, q, k) with q <= m, k < m
    eK, eKh = (weights(S, Q, M, T, up) for up in (False, True))
    key = S.EUp[block.start:top, :top, None] + S.R[M, T]
    neg = key < 0
    a, b = key * np.where(neg, eK, eKh), key * np.where(neg, eKh, eK)
    at, d = pair[block.start:top, :top, None], (np.arange(top - block.start), M[:, 0, 0])   # d: the q = m rows
    for c in range(1, n):                                       # c = n-1 only for q = m: those rows only
        j = (slice(None),) * 2 if c < n - 1 else d
        holds = valid[j].copy()
        for P_u, A in ends[c]:                                  # query q's P_hi - u, P_lo - u at 2q, 2q + 1
            P_hi, P_lo = P_u[: 2 * top: 2, None][j[1:]], P_u[1: 2 * top: 2, None][j[1:]]
            x = np.where(neg[j], P_lo, P_hi)                    # x: hi of query q for key >= 0, else lo
            y = np.where(x >= 0, a[j], b[j])                    # A + y x < 0, y x and the sum in place
            holds &= np.add(np.multiply(y, x, out=y), A[at][j], out=y) < 0
        K[block.start:top, :top, c, : top - 1][j] = holds
        KB[block.start:top, :top, c][j] = np.where(holds, a[j], KB[0, 0, 0]).max(axis=-1)