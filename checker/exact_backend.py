"""The exact layer under the Backend interface: the products and column bounds of `IMat`s that both
backends (`flint_backend`, `mpmath_backend`) route through float64 BLAS without rounding.

An `IMat` may hold its entries as `ends`: float64 arrays (lo, hi) with lo <= entry <= hi exactly (the
same array twice for a point matrix: stored weights, from `Backend.array`), besides or instead of the
backend's native matrix. A product with a point factor is computed here (`product`): the point factor
is cut into integer digits once (`cut_rows` / `cut_cols`, cached on the IMat), the other factor is a
point matrix too (an exact product) or an interval matrix (its ends, or its native entries rounded
outward to float64 by `interval_from_arb` / `interval_from_mpf`), and the exact result leaves the
layer as outward float64 bounds (`float_bounds`): a new IMat with `ends` and no native matrix until a
rule reads its entries. `column_bounds` reads per-column extremes straight from the ends (exact
Fractions of floats). Everything here is exact or rounds outward (exact_products, exact_rounding);
where it cannot apply (no point factor, an empty dimension, an entry that is not finite) it returns
None and the backend uses its library's own product, so failing closed is the library's as before.
"""

from fractions import Fraction

import numpy as np

from tcert.checker.errors import Rejected
from tcert.checker.exact_products import Exact, ExactInterval, bits_for, cut_cols, cut_rows, exact_matrix, point_product
from tcert.checker.exact_rounding import float_bounds


def point_ends(a):
    """(x, x) for a float16/32/64 matrix of stored weights (x its exact float64 copy), or None when an
    entry is not finite (the caller then builds native entries, which fail closed when read)."""
    try:
        x = exact_matrix(a)
    except ValueError:
        return None
    return x, x


def is_point(m) -> bool:
    """Whether the IMat `m` is held as a point matrix of float64 values."""
    return m.ends is not None and m.ends[0] is m.ends[1]


def _cuts(m, transposed: bool, bits: int):
    """(W+, W-) of the point IMat `m` (or of its transpose), each cut as a right factor on W's column
    scale: W = W+ + W- with W+ = max(W, 0), W- = min(W, 0). Cut once per width, cached on `m`."""
    key = (transposed, bits)
    if key not in m.cuts:
        w = m.ends[0].T if transposed else m.ends[0]
        top = np.frexp(np.abs(w).max(axis=0, initial=0.0))[1].astype(np.int64)
        m.cuts[key] = tuple(cut_cols(part, bits, top) for part in (np.maximum(w, 0.0), np.minimum(w, 0.0)))
    return m.cuts[key]


def _rows(x, rows):
    """The rows `rows` of the Exact x (the terms' bounds still hold for the slice)."""
    return Exact(tuple((o, t[rows], b, sg) for o, t, b, sg in x.terms), x.row_scale[rows], x.col_scale, x.unit)


def interval_times_point(lo, hi, pos, neg) -> ExactInterval:
    """Exact bounds of X W over every lo <= X <= hi (float64 ends), for W = W+ + W- given by the cuts
    `pos`, `neg`: entrywise X W lies in [lo W+ + hi W-, hi W+ + lo W-], since X_il W+_lj is increasing
    and X_il W-_lj decreasing in X_il. The ends are cut together on one scale per row (the larger end's)
    and multiplied exactly: two point products of the stacked [lo; hi]."""
    m = lo.shape[0]
    top = np.maximum(*(np.frexp(np.abs(e).max(axis=1, initial=0.0))[1].astype(np.int64) for e in (lo, hi)))
    ends = cut_rows(np.concatenate([lo, hi]), pos.bits, np.concatenate([top, top]))
    p, n = point_product(ends, pos), point_product(ends, neg)
    low, high = slice(0, m), slice(m, 2 * m)
    return ExactInterval(_rows(p, low) + _rows(n, high), _rows(p, high) + _rows(n, low))


def _interval(m, native_ends):
    """The float64 ends (lo, hi) holding IMat `m`: its ends, or its native entries rounded outward;
    None when an entry is not finite."""
    if m.ends is not None:
        lo, hi = m.ends
    else:
        try:
            lo, hi = native_ends(m.data)
        except ValueError:
            return None
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        return None
    return lo, hi


def product(a, b, native_ends):
    """(lo, hi) float64 bounds of the exact product a @ b of two IMats one of which is a point matrix,
    by the exact layer; None when it does not apply. `native_ends(data)` rounds the backend's native
    matrix outward to (lo, hi) float64 arrays (ValueError when an entry is not finite)."""
    (m, k), n = a.shape, b.shape[1]
    if not (m and k and n) or not (is_point(a) or is_point(b)):
        return None
    bits = bits_for(k)
    if is_point(a) and is_point(b):
        exact = point_product(cut_rows(a.ends[0], bits), sum_cut(b, bits))
    elif is_point(b):
        x = _interval(a, native_ends)
        exact = None if x is None else interval_times_point(*x, *_cuts(b, False, bits))
    else:             # (A X)^T = X^T A^T: the point factor on the right
        x = _interval(b, native_ends)
        exact = None if x is None else interval_times_point(x[0].T, x[1].T, *_cuts(a, True, bits)).T
    if exact is None:
        return None
    lo, hi = float_bounds(exact)
    return (lo, hi) if np.isfinite(lo).all() and np.isfinite(hi).all() else None


def sum_cut(m, bits: int):
    """The point IMat `m` cut whole as a right factor (cached)."""
    key = ("whole", bits)
    if key not in m.cuts:
        m.cuts[key] = cut_cols(m.ends[0], bits)
    return m.cuts[key]


def column_bounds(ends, groups: int) -> list:
    """Per row block of ends (lo, hi), per column: (exact Fraction <= every entry, one >= every entry),
    as IMat.col_bounds returns them; Rejected when an end is not finite."""
    lo, hi = ends
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise Rejected("finite enclosure", "a matrix entry is not finite")
    n, size = lo.shape[1], lo.shape[0] // groups
    low = lo.reshape(groups, size, n).min(axis=1, initial=np.inf)
    high = hi.reshape(groups, size, n).max(axis=1, initial=-np.inf)
    return [([Fraction(v) for v in ls], [Fraction(v) for v in hs]) for ls, hs in zip(low.tolist(), high.tolist())]
