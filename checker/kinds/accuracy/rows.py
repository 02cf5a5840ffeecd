"""Per-query logit terms as int64 mantissas, for the rules that decide inputs one at a time (brute force, refine).

For query q and key token t at position i put w_i[t] = e[q,t] pw[q,i] (a positive multiple of the softmax
numerator, the same multiple for every key) and V_i[t,x] = EU[q,x] + EVOU[t,x] + PVOU[i,x]. An input
(t_0..t_{n-2}, q) with max m is correct iff, for every x != m,

    sum_i w_i[t_i] (V_i[t_i,x] - V_i[t_i,m]) < 0.

Int64 form, rounded outward and exactly from the tables' float64 ends (`tables.float_tables`; no rounded float
operation: `scaled_ends`): every V entry in one fixed-point scale 2^k with |V| < 2^VB, every w as a mantissa
<= 2^WB with an exponent E[i,t] of its own per (i, t), so that H_i[t,x] = w_i[t] V_i[t,x] lies in [Hl, Hh],
int64 products below 2^(WB+VB), and a difference H[x] - H[m] below 2^(WB+VB+1). A sum of up to n such terms,
each aligned to the largest exponent among its rows (exact floor / ceil shifts), stays below 2^62;
`query_rows` asserts the magnitudes this rests on (a violation is a checker bug: exit 3). What int64 cannot
decide falls back to `exact_correct` on the integer tables (built then: `tables.Tables`).
"""

from typing import NamedTuple

import numpy as np

WB = 30                     # bits of a numerator mantissa
CHUNK = 4096                # inputs per vectorised full test (bounds memory: CHUNK * d_vocab per array)
ROW_BLOCK = 4               # queries per block of `stacked_rows` / `stacked_view`'s temporaries (small arrays
                            # are reused by the allocator; full-size ones cost a fresh page per 4 KB each time)


class Rows(NamedTuple):
    """One query's tables at exponent E[i, t] (n, v): Hl <= w_i[t] V_i[t,x] <= Hh (n, v, v), and the top-2
    bound D[i, t, m] >= max_{x != m} H_i[t,x] - H_i[t,m] (from the top two of each Hh row) for the non-query
    positions i < n-1 (n-1, v, v): the query position holds q in every input, it is never a free position."""

    Hl: np.ndarray
    Hh: np.ndarray
    E: np.ndarray
    D: np.ndarray


def value_bits(n: int) -> int:
    """VB: a sum of n terms of magnitude <= 2^(WB+VB+1) stays below 2^62."""
    return 31 - (n - 1).bit_length()


def value_tables(tables, top: int | None = None) -> dict:
    """EU, EVOU, PVOU bounds as int64 at one scale 2^k ("k"; floor of lo, ceil of hi, from the float64 ends of
    `tables.float_tables`), each at most 2^top in magnitude (default VB-2, so that a sum of the three stays
    below 2^VB): k = top - X with every |end| < 2^X."""
    names = ("EU", "EVOU", "PVOU")
    ends = tables["ends"]
    X = int(np.frexp(max(float(np.abs(a).max(initial=0.0)) for k in names for a in ends[k]))[1])
    k = (value_bits(tables["n"]) - 2 if top is None else top) - X
    return dict({name: scaled_ends(*ends[name], k) for name in names}, k=k)


def scaled_ends(lo, hi, k) -> tuple:
    """(floor(lo 2^k), ceil(hi 2^k)) as int64 for float64 arrays lo, hi and an int k (or int array broadcasting
    with them), exactly, for results below 2^63 in magnitude: ldexp by a power of two is exact where the result
    is a normal float or 0 from 0; a nonzero x with |x 2^k| < 2^-1000 (perhaps rounded as a subnormal) has
    floor -1 or 0 and ceiling 0 or 1 by its sign."""
    out = []
    for x, up in ((lo, False), (hi, True)):
        y = np.ldexp(x, np.asarray(k, dtype=np.int32))
        tiny = (x != 0) & (np.abs(y) < 2.0 ** -1000)
        out.append(np.where(tiny, (x > 0) if up else -(x < 0).astype(np.int64),
                            np.ceil(y) if up else np.floor(y)).astype(np.int64))
    return tuple(out)


def mantissas(lo, hi, bits: int) -> tuple:
    """(ml, mh, X): per entry of float64 ends 0 <= lo <= hi with hi > 0, int64 mantissas 0 <= ml <= mh <= 2^bits
    with ml 2^(X - bits) <= lo and hi <= mh 2^(X - bits) (X: hi < 2^X, from frexp, exact)."""
    X = np.frexp(hi)[1].astype(np.int64)
    return scaled_ends(lo, hi, bits - X) + (X,)


def query_rows(tables, values, q: int) -> Rows:
    """The int64 tables of query q."""
    return Rows(*(a[0] for a in stacked_rows(tables, values, [q])))


def stacked_rows(tables, values, qs, tokens: int | None = None, scratch: dict | None = None) -> Rows:
    """`query_rows` of the queries qs at once, each table stacked along a leading axis (one per query), for the
    key tokens t < `tokens` only (default all: rows of other tokens are never read by a caller that passes it).
    w = e pw from WB-bit mantissas of each (`mantissas`; exact int64 products below 2^(2 WB)), cut to WB bits
    at E (floor / ceil shifts; the shift from frexp of the product's float, at least its bit length). The query
    position n-1 holds q in every input: its rows of the other tokens are the loosest bound (`loose_bounds`).
    The products and gaps are computed ROW_BLOCK queries at a time (temporaries of a block's size only); the
    tables are written into `scratch`'s buffers when given (`workspace`)."""
    n, t = tables["n"], slice(0, tokens)
    qs = list(qs)
    el, eh, Xe = mantissas(*(a[qs][:, t] for a in tables["ends"]["e"]), WB)
    pl, ph, Xp = mantissas(*(a[qs][:, :n] for a in tables["ends"]["pw"]), WB)
    w_lo, w_hi = pl[:, :, None] * el[:, None, :], ph[:, :, None] * eh[:, None, :]       # below 2^(2 WB + 1)
    cut = np.maximum(np.frexp(w_hi.astype(np.float64))[1] - WB, 0)
    E = cut + Xp[:, :, None] + Xe[:, None, :]             # w = (w_hi >> cut) 2^(E - 2 WB), rounded outward
    wl, wh = (w_lo >> cut)[..., None], (-((-w_hi) >> cut))[..., None]
    size = sum(max(max(int(-a.min()), int(a.max())) for a in values[k]) for k in ("EU", "EVOU", "PVOU"))
    # |Vl|, |Vh| <= size: each is a sum of one entry of each of the three tables
    if size >= 1 << value_bits(n) or int(wh.max()) > 1 << WB:
        raise RuntimeError("accuracy rows: int64 bound exceeded (checker bug)")     # module docstring
    (EUl, EUh), (EVl, EVh), (PVl, PVh) = values["EU"], values["EVOU"], values["PVOU"]
    shape, f = wl.shape[:3] + (len(EUl[0]),), slice(0, n - 1)          # f: the free positions
    Hl, Hh = workspace(scratch, "Hl", shape), workspace(scratch, "Hh", shape)
    D = workspace(scratch, "D", (len(qs), n - 1) + shape[2:])
    for b in range(0, len(qs), ROW_BLOCK):      # V = (EU[q] + PVOU[i]) + EVOU[t]: the small sum first
        k, qb = slice(b, b + ROW_BLOCK), qs[b:b + ROW_BLOCK]
        interval_products(wl[k, f], wh[k, f], (EUl[qb][:, None, None, :] + PVl[None, f, None]) + EVl[None, None, t],
                          (EUh[qb][:, None, None, :] + PVh[None, f, None]) + EVh[None, None, t], Hl[k, f], Hh[k, f])
        top_two_gaps(Hh[k, f], Hl[k, f], D[k])
    Hl[:, n - 1], Hh[:, n - 1] = loose_bounds(size)
    at = (np.arange(len(qs))[:, None], n - 1, np.array(qs)[:, None])      # query q's own row at n-1
    Hl[at], Hh[at] = interval_products(wl[at], wh[at], (EUl[qs] + EVl[qs] + PVl[n - 1])[:, None, :],
                                       (EUh[qs] + EVh[qs] + PVh[n - 1])[:, None, :])
    return Rows(Hl, Hh, E, D)


def workspace(scratch, key: str, shape) -> np.ndarray:
    """An uninitialised int64 array of `shape` (every entry is written before it is read): new, or with a dict
    `scratch` the front of its buffer `key`, grown when too small. A caller passing one `scratch` to several
    stacks uses each stack's arrays only before it builds the next (they share memory), largest stack first
    (no buffer grows after the first: each page is faulted in once per check, not once per stack)."""
    size = int(np.prod(shape))
    if scratch is None:
        return np.empty(shape, dtype=np.int64)
    if key not in scratch or scratch[key].size < size:
        scratch[key] = np.empty(size, dtype=np.int64)
    return scratch[key][:size].reshape(shape)


def top_two_gaps(Hh, Hl, out=None):
    """top_two(Hh) - Hl (int64, entries below 2^(WB+VB) in magnitude: the difference below 2^62), written as
    the row's largest minus Hl (into `out` if given), then corrected at each row's first argmax (the largest of
    the others there)."""
    top, second, arg = row_tops(Hh)
    D = np.subtract(top[..., None], Hl, out=out)
    at = tuple(np.indices(arg.shape, sparse=True)) + (arg,)
    D[at] = second - Hl[at]
    return D


def loose_bounds(size: int) -> tuple:
    """(-2^WB size, 2^WB size): bounds of every term w V at its exponent E, as the asserted w <= 2^WB 2^(E - 2 WB)
    and |V| <= size (`stacked_rows`); the query position's rows of tokens other than q (never read) hold them."""
    big = (1 << WB) * size                      # below 2^(WB + VB): the module docstring's magnitude
    return -big, big


def interval_products(wl, wh, Vl, Vh, Hl=None, Hh=None) -> tuple:
    """(Hl, Hh) with Hl <= w V <= Hh for w in [wl, wh], wl >= 0, V in [Vl, Vh]: the ends' products (int64,
    below 2^(WB+VB) by `stacked_rows`' assertion), into the arrays Hl, Hh if given. Vl and Vh (of the products'
    shape) are overwritten."""
    Hh, Hl = np.multiply(wh, Vh, out=Hh), np.multiply(wl, Vl, out=Hl)
    np.maximum(Hh, np.multiply(wl, Vh, out=Vh), out=Hh)
    np.minimum(Hl, np.multiply(wh, Vl, out=Vl), out=Hl)
    return Hl, Hh


def top_two(M):
    """X[..., m] = max_{x != m} M[..., x] (int64, at least two columns): the row's largest, except at the first
    index of it, where the largest of the others (`row_tops`; the largest again when it is attained twice)."""
    top, second, arg = row_tops(M)
    return np.where(np.arange(M.shape[-1]) == arg[..., None], second[..., None], top[..., None])


def row_tops(M) -> tuple:
    """(top, second, arg) of each row of M (int64, last axis, at least two columns): its largest, the largest of
    the others (the largest again when it is attained twice) and the first index of the largest. The largest
    entries are set to the int64 minimum for the second's max, then restored: M is unchanged after."""
    arg = M.argmax(axis=-1)
    at = tuple(np.indices(arg.shape, sparse=True)) + (arg,)
    top = M[at]
    M[at] = np.iinfo(np.int64).min
    second = M.max(axis=-1)
    M[at] = top
    return top, second, arg


def align(x, s, up: bool):
    """x * 2^-s rounded down (up), exactly, for int64 |x| < 2^62 and shifts s >= 0 (capped at 63, where the
    result is already 0 / -1 or 1 / 0)."""
    s = np.minimum(s, 63)
    return -((-x) >> s) if up else x >> s


def align_up(x, s, out=None):
    """`align`(x, s, up=True) with s an array of the result's shape that it overwrites, into `out` if given (no
    other temporary)."""
    np.minimum(s, 63, out=s)
    y = np.negative(x, out=out)
    np.right_shift(y, s, out=y)
    return np.negative(y, out=y)


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


def stacked_view(tables, values, qs, tokens: int | None = None, scratch: dict | None = None) -> tuple:
    """`query_view` of the queries qs at once, stacked along a leading axis (one per query); `tokens` and
    `scratch` as in `stacked_rows` (every query in qs below `tokens`: Eq[m] is then for m < tokens)."""
    rows = stacked_rows(tables, values, qs, tokens, scratch)
    n = rows.E.shape[1]
    Eq = np.maximum(np.maximum.accumulate(rows.E[:, : n - 1].max(axis=1), axis=1),
                    rows.E[np.arange(len(qs)), n - 1, list(qs)][:, None])
    Dal = workspace(scratch, "Dal", rows.D.shape[:3] + Eq.shape[1:])
    for b in range(0, len(qs), ROW_BLOCK):      # by blocks of queries: small temporaries
        k = slice(b, b + ROW_BLOCK)
        align_up(rows.D[k, ..., : Eq.shape[1]], Eq[k, None, None, :] - rows.E[k, : n - 1, :, None], Dal[k])
    return rows, Eq, Dal


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
    ok, D = np.zeros(len(tok), dtype=bool), {j: Dal[j][tok[:, j], m] for j in P}
    total = sum(D.values())                      # sum_{j != p} D[j] = total - D[p], exact (terms below 2^62)
    for p in P:
        C = F + align(rows.Hh[p, :m] - rows.Hl[p, :m, m][:, None], (Eq[m] - rows.E[p, :m])[:, None], True)
        C[:, m] = np.iinfo(np.int64).min
        ok |= C.max(axis=1)[tok[:, p]] + (total - D[p]) < 0
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
