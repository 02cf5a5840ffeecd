"""The exact layer under the Backend interface: the products and column bounds of `IMat`s that both
backends (`flint_backend`, `mpmath_backend`) route through float64 BLAS without rounding.

An `IMat` may hold its entries as `ends` (lo, hi) besides or instead of the backend's native matrix:
each end a tuple of float64 arrays whose exact sum bounds every entry (lo <= entry <= hi). Stored
weights (`Backend.array`) are one part, the same tuple twice (a point matrix); product results are
two parts per end (`split_bounds`: the float64 floor of a ~105-bit bound and its rest), so they
keep Arb's working precision. A product with a point factor is computed here (`product`): the point
factor is cut into integer digits once (`cut_rows` / `cut_cols`, cached on the IMat), the other factor
is a point matrix too (an exact product) or an interval matrix (its ends, or its native entries as
two float64 parts per end by `ends_from_arb` / `ends_from_mpf`, exact for 64-bit endpoints), and the
exact result leaves the layer rounded outward once: a new IMat with `ends` and no native
matrix until a rule reads its entries. `column_bounds` reads per-column extremes straight from the
ends (exact Fractions of floats). Everything here is exact or rounds outward (exact_products,
exact_rounding); where it cannot apply (no point factor, an empty dimension, an entry that is not
finite) it returns None and the backend uses its library's own product, so failing closed is the
library's as before.
"""

from fractions import Fraction

import numpy as np

from tcert.checker.errors import Rejected
from tcert.checker.exact_products import (Exact, ExactInterval, _require, bits_for, cut_cols, cut_rows, exact_matrix,
                                          point_product)
from tcert.checker.exact_rounding import _parts, float_bounds, split_bounds


def point_ends(a):
    """(x, x) with x = (exact float64 copy,) for a float16/32/64 matrix of stored weights, or None when
    an entry is not finite (the caller then builds native entries, which fail closed when read)."""
    try:
        x = (exact_matrix(a),)
    except ValueError:
        return None
    return x, x


def is_point(m) -> bool:
    """Whether the IMat `m` is held as a point matrix of float64 values (one part)."""
    return m.ends is not None and m.ends[0] is m.ends[1] and len(m.ends[0]) == 1


def transpose(ends):
    """The ends of the transposed matrix (a point stays a point)."""
    lo = tuple(p.T for p in ends[0])
    return lo, lo if ends[1] is ends[0] else tuple(p.T for p in ends[1])


def _cuts(m, transposed: bool, bits: int):
    """(W+, W-) of the point IMat `m` (or of its transpose), each cut as a right factor on W's column
    scale: W = W+ + W- with W+ = max(W, 0), W- = min(W, 0). Cut once per width, cached on `m`."""
    key = (transposed, bits)
    if key not in m.cuts:
        w = m.ends[0][0].T if transposed else m.ends[0][0]
        top = np.frexp(np.abs(w).max(axis=0, initial=0.0))[1].astype(np.int64)
        m.cuts[key] = tuple(cut_cols(part, bits, top) for part in (np.maximum(w, 0.0), np.minimum(w, 0.0)))
    return m.cuts[key]


def _rows(x, rows):
    """The rows `rows` of the Exact x (the terms' bounds still hold for the slice)."""
    return Exact(tuple((o, t[rows], b, sg) for o, t, b, sg in x.terms), x.row_scale[rows], x.col_scale, x.unit)


def _row_top(parts):
    """Per row the least t with |p| < 2^t for every part p (frexp of the row maxima)."""
    return np.max([np.frexp(np.abs(p).max(axis=1, initial=0.0))[1].astype(np.int64) for p in parts], axis=0)


def interval_times_point(lo, hi, pos, neg):
    """Exact bounds of X W over every lo <= X <= hi (ends: tuples of float64 parts), for W = W+ + W-
    given by the cuts `pos`, `neg`: entrywise X W lies in [lo W+ + hi W-, hi W+ + lo W-], since X_il W+_lj
    is increasing and X_il W-_lj decreasing in X_il; each end's product is the sum of its parts'.
    All parts are cut together on one scale per row (the largest part's) and multiplied exactly: two
    point products of the stacked parts. A point (lo is hi) needs its parts once: an Exact."""
    m = lo[0].shape[0]
    parts = list(lo) if lo is hi else list(lo) + list(hi)
    top = _row_top(parts)
    ends = cut_rows(np.concatenate(parts), pos.bits, np.concatenate([top] * len(parts)))
    p, n = point_product(ends, pos), point_product(ends, neg)
    blocks = [slice(i * m, (i + 1) * m) for i in range(len(parts))]

    def total(x, which):
        out = _rows(x, which[0])
        for b in which[1:]:
            out = out + _rows(x, b)
        return out

    if lo is hi:
        return total(p, blocks) + total(n, blocks)
    low, high = blocks[:len(lo)], blocks[len(lo):]
    return ExactInterval(total(p, low) + total(n, high), total(p, high) + total(n, low))


def _interval(m, native_ends):
    """The ends (lo, hi) (tuples of float64 parts) holding IMat `m`: its ends, or its native entries as
    two parts per end; None when an entry is not finite."""
    if m.ends is not None:
        lo, hi = m.ends
    else:
        try:
            lo, hi = native_ends(m.data)
        except ValueError:
            return None
    if not all(np.isfinite(p).all() for p in lo + hi):
        return None
    return lo, hi


def product(a, b, backend):
    """The ends (lo, hi) of the exact product a @ b of two IMats one of which is a point matrix, by
    the exact layer; None when it does not apply. An operand held natively enters as a ball
    (`backend._native_ball`: midpoint as float64 parts, radius; `ball_times_point`) or, where the
    backend has none, as ends (`backend._native_ends`; ValueError when an entry is not finite). The
    result leaves rounded outward once: two float64 parts per end (`split_bounds`), or one
    (`float_bounds`) where the parts would leave the float range."""
    (m, k), n = a.shape, b.shape[1]
    if not (m and k and n) or not (is_point(a) or is_point(b)):
        return None
    bits = bits_for(k)
    if is_point(a) and is_point(b):
        exact = point_product(cut_rows(a.ends[0][0], bits), sum_cut(b, bits))
    elif is_point(b):
        exact = _times_point(a, b, False, bits, backend)
    else:             # (A X)^T = X^T A^T: the point factor on the right
        exact = _times_point(b, a, True, bits, backend)
    if exact is None:
        return None
    ends = split_bounds(exact)
    if ends is None:
        lo, hi = float_bounds(exact)
        ends = ((lo,), (hi,))
    return ends if all(np.isfinite(p).all() for p in ends[0] + ends[1]) else None


def _times_point(x, w, transposed: bool, bits: int, backend):
    """The Exact(Interval) of x @ w for the point IMat w (transposed: of x^T @ w^T, i.e. (w @ x)^T)."""
    ball = backend._native_ball(x.data) if x.ends is None else None
    if ball is not None:
        mid, rad = ball
        if transposed:
            mid, rad = tuple(p.T for p in mid), rad.T
        out = ball_times_point(mid, rad, sum_cut(w, bits, transposed), sum_cut(w, bits, transposed, True))
    else:
        ends = _interval(x, backend._native_ends)
        if ends is None:
            return None
        out = interval_times_point(*(transpose(ends) if transposed else ends), *_cuts(w, transposed, bits))
    return None if out is None else (out.T if transposed else out)


RAD_BITS = 30      # a ball's radius enters rounded up to this many significant bits (as Arb's own radii)


def _ceil_bits(x, keep: int):
    """x >= 0 (float64) rounded up to `keep` significant bits, exactly: frexp, scaling by a power of two
    and ceil do not round here, since an entry below 2^-1000 is first raised to 2^-1000 (so no bit falls
    below 2^-1074); zeros stay zero; beyond the float range the result is inf (the caller declines)."""
    x = np.where(x > 0, np.maximum(x, 2.0 ** -1000), 0.0)
    frac, e = np.frexp(x)
    with np.errstate(over="ignore"):
        return np.ldexp(np.ceil(np.ldexp(frac, keep)), e - keep)


def ball_times_point(mid, rad, whole, magnitude):
    """Exact bounds of X W over every X with |X - mid| <= rad entrywise (mid: a tuple of float64 parts,
    rad >= 0), for the point W cut whole (`whole`) and |W| (`magnitude`) on the same column scale:
    |(X W)_ij - (mid W)_ij| <= sum_l rad_il |W_lj| (midpoint-radius, Rump 1999), so X W lies in
    [mid W - r |W|, mid W + r |W|] for r >= rad (rad rounded up to RAD_BITS bits). The parts of mid and r
    are cut on one scale per row (the largest's), so both products are Exacts of the same scales; None
    when r leaves the float range."""
    r = _ceil_bits(rad, RAD_BITS)
    if not np.isfinite(r).all():
        return None
    m, parts = mid[0].shape[0], list(mid)
    top = _row_top(parts + [r])
    centre = point_product(cut_rows(np.concatenate(parts), whole.bits, np.concatenate([top] * len(parts))), whole)
    total = _rows(centre, slice(0, m))
    for i in range(1, len(parts)):
        total = total + _rows(centre, slice(i * m, (i + 1) * m))
    spread = point_product(cut_rows(r, whole.bits, top), magnitude)
    low = Exact(tuple((o, t, bd, -sg) for o, t, bd, sg in spread.terms), spread.row_scale, spread.col_scale,
                spread.unit)
    return ExactInterval(total + low, total + spread)


def sum_cut(m, bits: int, transposed: bool = False, magnitude: bool = False):
    """The point IMat `m` (or its transpose; or |m|) cut whole as a right factor on m's column scale
    (|m| shares it, so products with both add as Exacts); cached."""
    key = ("whole", bits, transposed, magnitude)
    if key not in m.cuts:
        w = m.ends[0][0].T if transposed else m.ends[0][0]
        top = np.frexp(np.abs(w).max(axis=0, initial=0.0))[1].astype(np.int64)
        m.cuts[key] = cut_cols(np.abs(w) if magnitude else w, bits, top)
    return m.cuts[key]


def _extreme(parts, groups: int, up: bool):
    """Per row block, per column: the exact extreme (min; up: max) of the parts' sums, as two float64
    arrays (groups x columns) in split_bounds' form (a one-part end's rest is 0). One part: its extreme.
    Two parts (`split_bounds`: p1 the float64 floor of the value, 0 <= p2 < nextafter(p1) - p1;
    mirrored when up): values with a smaller p1 are smaller, so the minimum is the least p1 plus the
    least p2 among the rows holding that p1."""
    n, size = parts[0].shape[1], parts[0].shape[0] // groups
    blocks = [p.reshape(groups, size, n) for p in parts]
    pick, start = (np.max, -np.inf) if up else (np.min, np.inf)
    first = pick(blocks[0], axis=1, initial=start)
    if len(parts) == 1:
        return first, np.zeros_like(first)
    p1, p2 = parts
    step = p1 - np.nextafter(p1, -np.inf) if up else np.nextafter(p1, np.inf) - p1   # exact: adjacent floats
    inside = (p2 <= 0) & (-p2 < step) if up else (p2 >= 0) & (p2 < step)
    _require(inside.all(), "two-part ends not in split_bounds' form")
    return first, pick(np.where(blocks[0] == first[:, None, :], blocks[1], start), axis=1, initial=start)


def column_extremes(ends, groups: int) -> list:
    """Per row block of ends (lo, hi), per column: ((p1, p2), (q1, q2)), float64 arrays with p1 + p2 <=
    every entry <= q1 + q2 exactly, in split_bounds' form, so `merge_extremes` orders them exactly
    without one Python number per column; Rejected when an end is not finite."""
    lo, hi = (_parts(e) for e in ends)
    if not all(np.isfinite(p).all() for p in lo + hi):
        raise Rejected("finite enclosure", "a matrix entry is not finite")
    (a1, a2), (b1, b2) = _extreme(lo, groups, False), _extreme(hi, groups, True)
    return [((a1[g], a2[g]), (b1[g], b2[g])) for g in range(groups)]


def _better(a, b, up: bool):
    """Where the split-form value b is below a (up: above): the floors ordered first, then the rests."""
    return (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] > a[1])) if up else (b[0] < a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))


def merge_extremes(a, b):
    """The columnwise min of the lower and max of the upper ends of two `column_extremes` entries (None:
    nothing yet); when either holds Fraction lists (a native matrix's `col_bounds`), as Fractions."""
    if a is None:
        return b
    if not all(isinstance(e, tuple) for e in a + b):
        (alo, ahi), (blo, bhi) = (tuple(fractions(e) for e in x) for x in (a, b))
        return [min(u, v) for u, v in zip(alo, blo)], [max(u, v) for u, v in zip(ahi, bhi)]
    out = []
    for x, y, up in ((a[0], b[0], False), (a[1], b[1], True)):
        take = _better(x, y, up)
        out.append((np.where(take, y[0], x[0]), np.where(take, y[1], x[1])))
    return tuple(out)


def fractions(end) -> list:
    """A `column_extremes` end (two float64 arrays) as exact Fractions (a Fraction list stays as it is)."""
    if not isinstance(end, tuple):
        return end
    return [_sum_of_floats(a, b) for a, b in zip(end[0].tolist(), end[1].tolist())]


def _sum_of_floats(a: float, b: float) -> Fraction:
    """a + b exactly, with one Fraction made: both are n / 2^k (as_integer_ratio), so over the larger
    denominator the numerators add as integers."""
    (n1, d1), (n2, d2) = a.as_integer_ratio(), b.as_integer_ratio()
    if d1 < d2:
        (n1, d1), (n2, d2) = (n2, d2), (n1, d1)
    return Fraction(n1 + n2 * (d1 // d2), d1)


def column_bounds(ends, groups: int) -> list:
    """Per row block of ends (lo, hi), per column: (exact Fraction <= every entry, one >= every entry),
    as IMat.col_bounds returns them; Rejected when an end is not finite."""
    return [(fractions(lo), fractions(hi)) for lo, hi in column_extremes(ends, groups)]


def _low_difference(a, c):
    """A float64 <= a - c exactly, entrywise (a, c float64 arrays): TwoSum (Knuth) gives s + e = a - c
    exactly in round-to-nearest when nothing overflows (checked: Rejected otherwise), so s is a lower bound when e >= 0 and the
    float below s is one when e < 0 (s is a - c rounded to nearest: a - c lies above that float)."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = a - c
        back = s - a
        e = (a - (s - back)) + (-c - back)
    if not (np.isfinite(s).all() and np.isfinite(e).all()):
        raise Rejected("finite enclosure", "a difference of two product entries is not finite")
    return np.where(e < 0, np.nextafter(s, -np.inf), s)


def difference_minima(x, w, k: int, backend, rows: int = 512, per_row: bool = False) -> list:
    """Per column b of x @ w (x an IMat, w a point IMat): an exact Fraction <= min_r ((x w)[r, k] - (x w)[r, b])
    (per_row: per row r, one <= min_(b != k) ((x w)[r, k] - (x w)[r, b]); w needs two columns or more).
    In blocks of `rows` rows, each block's product is exact (`ball_times_point` / `interval_times_point`) and
    rounded outward once (`split_bounds`, else `float_bounds`); an entry of column k is then >= its lower
    end's floor part and one of column b <= its upper end's (both one part, or two in split form: lo2 >= 0,
    hi2 <= 0), so the floor of column k minus the ceiling of column b bounds the difference below
    (`_low_difference`); the minimum over rows and blocks is exact. Rejected when an entry is not finite."""
    if not is_point(w):
        raise Rejected("finite enclosure", "the unembedding is not a finite point matrix")
    bits, m = bits_for(x.shape[1]), x.shape[0]
    ball = backend._native_ball(x.data) if x.ends is None else None
    ends = None if ball is not None else _interval(x, backend._native_ends)
    if ball is None and ends is None:
        raise Rejected("finite enclosure", "a matrix entry is not finite")
    best = None
    for start in range(0, m, rows):
        cut = slice(start, start + rows)
        if ball is not None:
            exact = ball_times_point(tuple(p[cut] for p in ball[0]), ball[1][cut], sum_cut(w, bits),
                                     sum_cut(w, bits, magnitude=True))
        else:
            lo = tuple(p[cut] for p in ends[0])
            exact = interval_times_point(lo, lo if ends[1] is ends[0] else tuple(p[cut] for p in ends[1]),
                                         *_cuts(w, False, bits))
        if exact is None:
            raise Rejected("finite enclosure", "a matrix entry is not finite")
        out = split_bounds(exact) or tuple((e,) for e in float_bounds(exact))
        low, high = out
        _require(len(low) == 1 or ((low[1] >= 0).all() and (high[1] <= 0).all()), "ends not in split form")
        diff = _low_difference(low[0][:, k:k + 1], high[0])
        if per_row:
            diff[:, k] = np.inf
            best = diff.min(axis=1) if best is None else np.concatenate([best, diff.min(axis=1)])
        else:
            best = diff.min(axis=0) if best is None else np.minimum(best, diff.min(axis=0))
    return [Fraction(v) for v in best.tolist()]
