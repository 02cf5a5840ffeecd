"""Per-query logit terms as int64 mantissas, for the rules that decide inputs one at a time (brute force, refine).

For query q and key token t at position i put w_i[t] = e[q,t] pw[q,i] (a positive multiple of the softmax
numerator, the same multiple for every key) and V_i[t,x] = EU[q,x] + EVOU[t,x] + PVOU[i,x]. An input
(t_0..t_{n-2}, q) with max m is correct iff, for every x != m,

    sum_i w_i[t_i] (V_i[t_i,x] - V_i[t_i,m]) < 0.

Int64 form, rounded outward and exactly (no float anywhere): every V entry in one fixed-point scale 2^-sV with
|V| < 2^VB, every w as a mantissa <= 2^WB with an exponent E[i,t] of its own per (i, t), so that
H_i[t,x] = w_i[t] V_i[t,x] lies in [Hl, Hh], int64 products below 2^(WB+VB), and a difference H[x] - H[m]
below 2^(WB+VB+1). A sum of up to n such terms, each aligned to the largest exponent among its rows (exact
floor / ceil shifts), stays below 2^62; `query_rows` asserts the magnitudes this rests on (a violation is a
checker bug: exit 3). What int64 cannot decide falls back to `exact_correct` on the integer tables.
"""

from typing import NamedTuple

import numpy as np

WB = 30                     # bits of a numerator mantissa
BIT_LENGTH = np.frompyfunc(int.bit_length, 1, 1)     # elementwise on object arrays of Python ints
CHUNK = 4096                # inputs per vectorised full test (bounds memory: CHUNK * d_vocab per array)


class Rows(NamedTuple):
    """One query's tables at exponent E[i, t] (n, v): Hl <= w_i[t] V_i[t,x] <= Hh (n, v, v), and the top-2
    bound D[i, t, m] >= max_{x != m} H_i[t,x] - H_i[t,m] (from the top two of each Hh row)."""

    Hl: np.ndarray
    Hh: np.ndarray
    E: np.ndarray
    D: np.ndarray


def value_bits(n: int) -> int:
    """VB: a sum of n terms of magnitude <= 2^(WB+VB+1) stays below 2^62."""
    return 31 - (n - 1).bit_length()


def value_tables(tables, top: int | None = None) -> dict:
    """EU, EVOU, PVOU bounds as int64 at one scale 2^-sV (floor of lo, ceil of hi), each at most 2^top in
    magnitude (default VB-2, so that a sum of the three stays below 2^VB)."""
    names = ("EU", "EVOU", "PVOU")
    bits = max(int(max(-a.min(), a.max())).bit_length() for a in (tables[f"{k}_{e}"] for k in names for e in ("lo", "hi")))
    s = bits - (value_bits(tables["n"]) - 2 if top is None else top)
    return {k: (shifted(tables[k + "_lo"], s, False), shifted(tables[k + "_hi"], s, True)) for k in names}


def shifted(a, s: int, up: bool) -> np.ndarray:
    """floor (ceil when `up`) of a * 2^-s for an object array of ints, as int64 (exact; s < 0 shifts left)."""
    if s <= 0:
        return (a * (1 << -s)).astype(np.int64)
    return (-((-a) >> s) if up else a >> s).astype(np.int64)


def query_rows(tables, values, q: int) -> Rows:
    """The int64 tables of query q."""
    return Rows(*(a[0] for a in stacked_rows(tables, values, [q])))


def stacked_rows(tables, values, qs) -> Rows:
    """`query_rows` of the queries qs at once, each table stacked along a leading axis (one per query)."""
    n = tables["n"]
    qs = list(qs)
    (EUl, EUh), (EVl, EVh), (PVl, PVh) = values["EU"], values["EVOU"], values["PVOU"]
    Vl = EUl[qs][:, None, None, :] + EVl[None, None, :, :] + PVl[None, :, None, :]
    Vh = EUh[qs][:, None, None, :] + EVh[None, None, :, :] + PVh[None, :, None, :]
    w_lo = tables["pw_lo"][qs][:, :n, None] * tables["e_lo"][qs][:, None, :]
    w_hi = tables["pw_hi"][qs][:, :n, None] * tables["e_hi"][qs][:, None, :]
    E = np.maximum(BIT_LENGTH(w_hi).astype(np.int64) - WB, 0)
    wl = shifted_each(w_lo, E, False)[..., None]
    wh = shifted_each(w_hi, E, True)[..., None]
    size = sum(max(max(int(-a.min()), int(a.max())) for a in values[k]) for k in ("EU", "EVOU", "PVOU"))
    # |Vl|, |Vh| <= size: each is a sum of one entry of each of the three tables
    if size >= 1 << value_bits(n) or int(wh.max()) > 1 << WB:
        raise RuntimeError("accuracy rows: int64 bound exceeded (checker bug)")     # module docstring
    Hh, Hl = wh * Vh, wl * Vl                   # w in [wl, wh], wl >= 0: the bounds of w V are the ends' products
    np.maximum(Hh, wl * Vh, out=Hh)
    np.minimum(Hl, wh * Vl, out=Hl)
    return Rows(Hl, Hh, E, top_two(Hh) - Hl)


def shifted_each(a, E, up: bool) -> np.ndarray:
    """floor (ceil) of a[i, t] * 2^-E[i, t], exact, as int64 (a: object ints; elementwise Python >>)."""
    s = E.astype(object)
    return (-((-a) >> s) if up else a >> s).astype(np.int64)


def top_two(M):
    """X[..., m] = max_{x != m} M[..., x] (the top two of each row: the largest, except at an entry equal to
    it, where the second largest, itself the largest when the maximum is attained twice)."""
    top = np.partition(M, -2, axis=-1)[..., -2:]
    return np.where(M == top[..., 1:], top[..., :1], top[..., 1:])


def align(x, s, up: bool):
    """x * 2^-s rounded down (up), exactly, for int64 |x| < 2^62 and shifts s >= 0 (capped at 63, where the
    result is already 0 / -1 or 1 / 0)."""
    s = np.minimum(s, 63)
    return -((-x) >> s) if up else x >> s


def decide(rows: Rows, tok, m) -> np.ndarray:
    """Per input (tok: (N, n) tokens, m: (N,) their max): 1 if certainly correct (the upper bound of every
    logit x != m is below the lower bound of logit m), -1 if certainly not (some x != m has a lower bound at
    least the upper bound of logit m), 0 if int64 cannot tell (then `exact_correct` decides). Each input's
    terms are aligned to its largest row exponent."""
    out = np.zeros(len(tok), dtype=np.int8)
    for s in range(0, len(tok), CHUNK):
        out[s:s + CHUNK] = decide_chunk(rows, tok[s:s + CHUNK], m[s:s + CHUNK])
    return out


def decide_chunk(rows: Rows, tok, m) -> np.ndarray:
    """`decide` for at most CHUNK inputs (the lower bounds of the other logits only where the upper ones fail)."""
    pos = np.arange(tok.shape[1])[None, :]
    E = rows.E[pos, tok]
    shift = E.max(axis=1, keepdims=True) - E
    at_m = (pos, tok, m[:, None])
    hi = align(rows.Hh[pos, tok], shift[:, :, None], True).sum(axis=1)        # (N, v) logit upper bounds
    hi[np.arange(len(tok)), m] = np.iinfo(np.int64).min
    out = np.where(hi.max(axis=1) < align(rows.Hl[at_m], shift, False).sum(axis=1), 1, 0).astype(np.int8)
    rest = np.nonzero(out == 0)[0]
    if len(rest):
        p, t, s, mr = pos, tok[rest], shift[rest], m[rest]
        lo = align(rows.Hl[p, t], s[:, :, None], False).sum(axis=1)
        lo[np.arange(len(rest)), mr] = np.iinfo(np.int64).min
        out[rest] = np.where(lo.max(axis=1) >= align(rows.Hh[p, t, mr[:, None]], s, True).sum(axis=1), -1, 0)
    return out


def query_view(tables, values, q: int) -> tuple:
    """(rows, Eq, Dal) for query q, what the brute-force and pattern rules read: its rows (`query_rows`), the
    common exponents Eq[m], the largest row exponent an input with max m and query q can have (its rows have
    tokens <= m), and Dal[i][t, m] = rows.D[i][t, m] aligned (upward) to Eq[m]."""
    rows, Eq, Dal = stacked_view(tables, values, [q])
    return Rows(*(a[0] for a in rows)), Eq[0], Dal[0]


def stacked_view(tables, values, qs) -> tuple:
    """`query_view` of the queries qs at once, stacked along a leading axis (one per query)."""
    rows = stacked_rows(tables, values, qs)
    n = rows.E.shape[1]
    Eq = np.maximum(np.maximum.accumulate(rows.E[:, : n - 1].max(axis=1), axis=1),
                    rows.E[np.arange(len(qs)), n - 1, list(qs)][:, None])
    return rows, Eq, align(rows.D, Eq[:, None, None, :] - rows.E[..., None], True)


def fixed_part(rows: Rows, Eq, q: int, M, ms) -> np.ndarray:
    """A[k] >= max_{x != m} of the fixed rows' terms H[x] - H[m] (the max token m = ms[k] at the positions M,
    the query q at n-1; coupled over x), aligned to Eq[m]: the part of the logit gap shared by every input of
    a position pattern."""
    F = fixed_terms(rows, Eq, q, M, ms)
    F[np.arange(len(ms)), ms] = np.iinfo(np.int64).min
    return F.max(axis=1)


def fixed_terms(rows: Rows, Eq, q: int, M, ms) -> np.ndarray:
    """F[k, x] >= the fixed rows' terms H[x] - H[m] (`fixed_part` before the max over x != m)."""
    one = np.zeros(len(ms), dtype=np.int64)
    return stacked_fixed_terms(Rows(*(a[None] for a in rows)), Eq[None], one, one + q, M, ms)


def stacked_fixed_terms(rows: Rows, Eq, at, qs, M, ms) -> np.ndarray:
    """`fixed_terms` for groups k of several queries at once: rows and Eq stacked over queries (a leading
    axis), group k reading query qs[k] at index at[k] of the stack."""
    n = rows.E.shape[1]
    F = align(rows.Hh[at, n - 1, qs] - rows.Hl[at, n - 1, qs, ms][:, None],
              (Eq[at, ms] - rows.E[at, n - 1, qs])[:, None], True)
    for i in M:
        F = F + align(rows.Hh[at, i, ms] - rows.Hl[at, i, ms, ms][:, None], (Eq[at, ms] - rows.E[at, i, ms])[:, None],
                      True)
    return F


def coupled(rows: Rows, Eq, Dal, q: int, m: int, P, tok) -> np.ndarray:
    """Per input of tok (max m, query q, the non-max tokens at the positions P): certainly correct by the
    bound coupled over x between the fixed rows and one free position p, the others by their top-2 bound
    (`Dal`, D aligned to Eq[m]): max_{x != m} (F[x] + H_p[t_p, x] - H_p[t_p, m]) + sum_{j != p} D[j, t_j, m]
    < 0 for some p in P (each term aligned up to Eq[m]; n terms, so below 2^62 as in the module docstring)."""
    F = fixed_terms(rows, Eq, q, [i for i in range(rows.E.shape[0] - 1) if i not in P], np.array([m]))
    ok = np.zeros(len(tok), dtype=bool)
    for p in P:
        C = F + align(rows.Hh[p, :m] - rows.Hl[p, :m, m][:, None], (Eq[m] - rows.E[p, :m])[:, None], True)
        C[:, m] = np.iinfo(np.int64).min
        ok |= C.max(axis=1)[tok[:, p]] + sum((Dal[j][tok[:, j], m] for j in P if j != p), np.int64(0)) < 0
    return ok


def exact_correct(tables, q: int, tokens) -> bool:
    """Whether input (tokens..., q) is certainly correct, from the exact integer tables (Python ints; the
    fallback where int64 cannot decide)."""
    v = tables["v"]
    toks = list(tokens) + [q]
    m = max(toks)
    for x in range(v):
        if x == m:
            continue
        total = 0
        for i, t in enumerate(toks):
            d = (tables["EU_hi"][q, x] + tables["EVOU_hi"][t, x] + tables["PVOU_hi"][i, x]
                 - tables["EU_lo"][q, m] - tables["EVOU_lo"][t, m] - tables["PVOU_lo"][i, m])
            w = (tables["e_hi"][q, t] * tables["pw_hi"][q, i]) if d >= 0 else (tables["e_lo"][q, t] * tables["pw_lo"][q, i])
            total += w * d
        if not total < 0:
            return False
    return True
