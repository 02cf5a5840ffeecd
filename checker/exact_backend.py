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
from tcert.checker.exact_products import (MAX_BLOCK, MIN_EXP, Exact, ExactInterval, Slices, _line_top, _require, _scaled, bits_for,
                                          cut_cols, cut_rows, cut_sum_rows, exact_matrix, point_product)
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
    if not (m and k and n):
        return None
    bits = bits_for(k)
    if not (is_point(a) or is_point(b)):   # a point of several parts on the right (the forward pass's centres)
        exact = times_parts(a, multi_point(b), backend) if multi_point(b) is not None else None
    elif is_point(a) and is_point(b):
        exact = point_product(cut_rows(a.ends[0][0], bits), sum_cut(b, bits))
    elif is_point(b):
        exact = _times_point(a, b, False, bits, backend)
    else:             # (A X)^T = X^T A^T: the point factor on the right
        exact = _times_point(b, a, True, bits, backend)
    return None if exact is None else leave(exact)


def leave(exact):
    """The ends (lo, hi) of an Exact(Interval), rounded outward once: two float64 parts per end
    (`split_bounds`), or one (`float_bounds`) where the parts would leave the float range; None where an
    end is not finite."""
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
        mag = [sum_cut(w, bits, transposed, True)] if rad.any() else None      # no radius: no |w| product
        out = balls_times_points(mid, rad, [sum_cut(w, bits, transposed)], mag)
    elif multi_point(x) is not None:     # a point of several parts (the forward pass's centres): W cut whole
        parts = tuple(p.T for p in x.ends[0]) if transposed else x.ends[0]
        if not all(np.isfinite(p).all() for p in parts):
            return None
        out = parts_times_point(parts, sum_cut(w, bits, transposed))
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
    return balls_times_points(mid, rad, [whole], [magnitude])


def balls_times_points(mid, rad, wholes, magnitudes):
    """`ball_times_point` for W = sum_k W_k (a point of several parts, each cut whole and as |W_k| on
    one column scale): X W lies in [mid W - r sum_k |W_k|, mid W + r sum_k |W_k|], as |W| <= sum_k |W_k|."""
    r = _ceil_bits(rad, RAD_BITS)
    if not np.isfinite(r).all():
        return None
    top = _row_top(list(mid) + [r])
    total = _summed(parts_times_point(mid, w, top) for w in wholes)
    if not r.any():      # points: the spread has no terms (magnitudes may be None)
        return ExactInterval(total, total)
    cut = cut_rows(r, wholes[0].bits, top)
    spread = _summed(point_product(cut, m) for m in magnitudes)
    low = Exact(tuple((o, t, bd, -sg) for o, t, bd, sg in spread.terms), spread.row_scale, spread.col_scale,
                spread.unit)
    return ExactInterval(total + low, total + spread)


def _summed(exacts):
    """The sum of Exacts of equal scales."""
    exacts = iter(exacts)
    total = next(exacts)
    for x in exacts:
        total = total + x
    return total


def multi_point(m):
    """The parts of an IMat held as a point of one or more parts (ends with lo is hi), else None."""
    return m.ends[0] if m.ends is not None and m.ends[0] is m.ends[1] else None


def _cut_parts(parts, bits: int) -> list:
    """Each part of a point right factor cut whole on one column scale, the largest part's."""
    top = _line_top(list(parts), 1)
    return [cut_cols(p, bits, top) for p in parts]


def times_parts(a, parts, backend):
    """The Exact(Interval) of a @ W for W the point of float64 `parts` (k x n): a a point (of any parts:
    exact) or a native ball matrix (`balls_times_points`); None where neither applies."""
    bits = bits_for(parts[0].shape[0])
    wholes = _cut_parts(parts, bits)
    left = point_parts(a, backend)
    if left is not None:
        top = _line_top(list(left), 0)
        return _summed(parts_times_point(left, w, top) for w in wholes)
    ball = backend._native_ball(a.data) if a.ends is None else None
    if ball is None:
        return None
    return balls_times_points(ball[0], ball[1], wholes, [magnitude_of(w) for w in wholes])


def near_times_parts(near, parts):
    """The ends of M W over every M within d of the point m entrywise (near = (m, d): float64 parts and
    distances, as `Backend._near_ball` gives them), for W the point of float64 `parts`: `balls_times_points`
    (midpoint-radius; |W_k| cut as the digits' magnitudes, `magnitude_of`), leaving as `product` does; None
    where a value leaves the float range."""
    wholes = _cut_parts(parts, bits_for(parts[0].shape[0]))
    out = balls_times_points(near[0], near[1], wholes, [magnitude_of(w) for w in wholes])
    return None if out is None else leave(out)


def parts_times_point(parts, whole, top=None):
    """The Exact of P W for the point P given as float64 parts (their exact sum), all cut on one scale per row
    (`top`, default the parts' own: `_line_top`) -- as one sum (`cut_sum_rows`) where it applies, else each
    part as rows of its own, the row blocks added -- and the point W cut whole."""
    m, parts = parts[0].shape[0], list(parts)
    top = _line_top(parts, 0) if top is None else top
    merged = cut_sum_rows(parts, whole.bits, top) if len(parts) > 1 else None
    if merged is not None:
        return point_product(merged, whole)
    centre = point_product(cut_rows(np.concatenate(parts), whole.bits, np.concatenate([top] * len(parts))), whole)
    total = _rows(centre, slice(0, m))
    for i in range(1, len(parts)):
        total = total + _rows(centre, slice(i * m, (i + 1) * m))
    return total


def point_parts(x, backend):
    """The IMat x as float64 parts summing exactly to its entries, when x is certainly a point matrix
    (ends with lo = hi, or a native matrix of exact points); None otherwise or when an entry is not
    finite."""
    if x.ends is None:
        if "parts" not in x.cuts:    # cached: a normalised input feeds several products
            ball = backend._native_ball(x.data)
            x.cuts["parts"] = ball[0] if ball is not None and not ball[1].any() else None
        if x.cuts["parts"] is not None:
            return x.cuts["parts"]
    ends = _interval(x, backend._native_ends)
    if ends is None:
        return None
    lo, hi = ends
    return lo if lo is hi or (len(lo) == len(hi) and all(np.array_equal(a, b) for a, b in zip(lo, hi))) else None


def affine_exact(x, wb, backend):
    """The Exact x W + b for the point IMat x (m x k) and the point IMat wb = [W; b] ((k+1) x n, the bias
    as its last row): the product [x | 1] wb, exact; None when the layer does not apply (x not a point, an
    empty dimension)."""
    parts = point_parts(x, backend) if x.shape[0] and x.shape[1] and wb.shape[1] else None
    if parts is None or not is_point(wb):
        return None
    ones = [np.full((x.shape[0], 1), 1.0 if i == 0 else 0.0) for i in range(len(parts))]
    parts = tuple(np.hstack([p, o]) for p, o in zip(parts, ones))
    return parts_times_point(parts, sum_cut(wb, bits_for(wb.shape[0])))


def sum_cut(m, bits: int, transposed: bool = False, magnitude: bool = False):
    """The point IMat `m` (or its transpose; or |m|) cut whole as a right factor on m's column scale
    (|m| shares it, so products with both add as Exacts); cached."""
    key = ("whole", bits, transposed, magnitude)
    if key not in m.cuts and magnitude:
        m.cuts[key] = magnitude_of(sum_cut(m, bits, transposed))
    if key not in m.cuts:
        w = m.ends[0][0].T if transposed else m.ends[0][0]
        top = np.frexp(np.abs(w).max(axis=0, initial=0.0))[1].astype(np.int64)
        m.cuts[key] = cut_cols(w, bits, top)
    return m.cuts[key]


def magnitude_of(cut: Slices) -> Slices:
    """The cut of |W| from the cut of W on the same scales: the digits' absolute values. Cutting keeps
    signs (`_scaled_digits`: trunc(y) and y - trunc(y) have the sign of y, and y 2^bits too), so every
    digit of an entry has the entry's sign, and cutting |W| yields |digit| for digit (a zero line stays
    zero; bands are chosen by exponent, the same for |W|); line maxima and sums are of |digit| already."""
    stats = list(zip(cut.line_max, cut.line_sum))
    return Slices([np.abs(d) for d in cut.digits], cut.index, cut.scale, cut.bits, cut.axis, cut.shape, stats)


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


def exact_differences(a, b, p: int) -> bool:
    """Whether every float64 a - b (b broadcast) is exact, for finite values of p-bit mantissas: with
    |x| < 2^e (frexp, exact) x is a multiple of 2^(e - p) (of 2^-1074 at least), so a - b is a multiple
    of 2^L, L = min(e_a, e_b) - p, of magnitude below 2^(max(e_a, e_b) + 1): an integer times 2^L below
    2^53 when max + 1 - L <= 53, a binary64 number, which IEEE-754 subtraction returns exactly. A zero
    operand makes the difference exact anyway."""
    ea, eb = np.frexp(a)[1], np.frexp(b)[1]
    span = np.maximum(ea, eb) + 1 - (np.minimum(ea, eb) - p)
    return bool(np.all((a == 0) | (b == 0) | (span <= 53)))


def column_differences(w, k: int):
    """w[:, k] 1^T - w as float64 for stored weights w (a float array), or None unless every difference
    is finite and exact (`exact_differences` with the stored type's mantissa width)."""
    bits = np.finfo(w.dtype).nmant + 1
    w64 = w.astype(np.float64)
    if not (np.isfinite(w64).all() and exact_differences(w64[:, k:k + 1], w64, bits)):
        return None
    return w64[:, k:k + 1] - w64


def _difference_fallback(x, w, k: int, backend, per_row: bool) -> list:
    """difference_minima by the backend's own interval arithmetic, for weights whose differences are not
    exact in float64: the difference matrix as intervals (column k left out per row), then x times it."""
    V = w.shape[1]
    rest = np.delete(w, k, axis=1) if per_row else w
    diff = backend.array(np.repeat(w[:, k:k + 1], rest.shape[1], axis=1)) - backend.array(rest)
    prod = x @ diff
    return (prod.T if per_row else prod).col_bounds()[0][: None if per_row else V]


def difference_minima(x, w, k: int, backend, rows: int = 512, per_row: bool = False) -> list:
    """Per column b of x @ w (x an IMat, w a 2-D array of stored weights): an exact Fraction <= min_r
    ((x w)[r, k] - (x w)[r, b]) (per_row: per row r, one <= min_(b != k) ((x w)[r, k] - (x w)[r, b]); w
    needs two columns or more). The difference matrix D = w[:, k] 1^T - w is exact in float64
    (`column_differences`; else `_difference_fallback`), so (x w)[r, k] - (x w)[r, b] = (x D)[r, b]: in
    blocks of `rows` rows each block's product x D is exact (`ball_times_point` / `interval_times_point`)
    and rounded outward once (`split_bounds`, else `float_bounds`); the lower end's first part is <= the
    entry (`outer_floats`), and a minimum of floats is exact: no rounded operation. Rejected when an entry is not finite."""
    w = np.asarray(w)
    if not np.isfinite(w).all():
        raise Rejected("finite enclosure", "the unembedding is not finite")
    D = column_differences(w, k)
    if D is None:
        return _difference_fallback(x, w, k, backend, per_row)
    D = backend.array(D)
    bits, m = bits_for(x.shape[1]), x.shape[0]
    ball = backend._native_ball(x.data) if x.ends is None else None
    ends = None if ball is not None else _interval(x, backend._native_ends)
    if ball is None and ends is None:
        raise Rejected("finite enclosure", "a matrix entry is not finite")
    whole = sum_cut(D, bits) if ball is not None else None          # D cut once, not once per block of rows
    best, cuts = None, (whole, magnitude_of(whole)) if ball is not None else _cuts(D, False, bits)
    for start in range(0, m, rows):
        cut = slice(start, start + rows)
        if ball is not None:
            exact = ball_times_point(tuple(p[cut] for p in ball[0]), ball[1][cut], *cuts)
        else:
            lo = tuple(p[cut] for p in ends[0])
            exact = interval_times_point(lo, lo if ends[1] is ends[0] else tuple(p[cut] for p in ends[1]), *cuts)
        if exact is None:
            raise Rejected("finite enclosure", "a matrix entry is not finite")
        diff = outer_floats(split_bounds(exact) or float_bounds(exact))[0].copy()
        if per_row:
            diff[:, k] = np.inf
            best = diff.min(axis=1) if best is None else np.concatenate([best, diff.min(axis=1)])
        else:
            best = diff.min(axis=0) if best is None else np.minimum(best, diff.min(axis=0))
    return [Fraction(v) for v in best.tolist()]


SQUARE_RANGE = 400    # pieces' products stay exact while every nonzero magnitude is within 2^-400 .. 2^400


def outer_floats(ends):
    """(L, U): float64 arrays with L <= lo and hi <= U for ends (lo, hi) of one part each, or two in
    split_bounds' form: there lo2 >= 0 makes lo1 <= lo and hi2 <= 0 makes hi1 >= hi (both checked)."""
    lo, hi = _parts(ends[0]), _parts(ends[1])
    _require(len(lo) <= 2 and len(hi) <= 2, "ends of more than two parts")
    _require((len(lo) < 2 or (lo[1] >= 0).all()) and (len(hi) < 2 or (hi[1] <= 0).all()),
             "two-part ends not in split_bounds' form")
    return lo[0], hi[0]


def _pieces(x):
    """x (float64, every nonzero |x| within 2^-400 .. 2^400) as three float64 arrays of <= 18 significant
    bits summing to x exactly: x = k 2^(e-53) with k = ldexp(frexp(x), 53) an integer below 2^53, cut as
    k1 2^35 + k2 2^17 + k3 by trunc and subtraction of integers below 2^53 (exact), each piece scaled back
    by a power of two (exact: its lowest bit stays >= 2^-453). The product of two pieces then has <= 36 bits
    and lies within 2^-906 .. 2^800: an exact float64 product."""
    frac, e = np.frexp(x)
    k = np.ldexp(frac, 53)
    k1 = np.trunc(np.ldexp(k, -35))
    rest = k - np.ldexp(k1, 35)
    k2 = np.trunc(np.ldexp(rest, -17))
    return np.ldexp(k1, e - 18), np.ldexp(k2, e - 36), np.ldexp(rest - np.ldexp(k2, 17), e - 53)


def _in_range(*arrays) -> bool:
    """Whether every entry is finite and every nonzero magnitude within 2^-400 .. 2^400 (`_pieces`)."""
    for a in arrays:
        m = np.abs(a)
        if not np.isfinite(a).all() or (m >= 2.0 ** SQUARE_RANGE).any() or ((m > 0) & (m < 2.0 ** -SQUARE_RANGE)).any():
            return False
    return True


def _sums(terms, up: bool):
    """float64 bounds (down, or up) of the exact sums sum_t terms[t] (equal-shape float64 arrays), by the
    exact product of the entries' terms with a column of ones, rounded outward once (`float_bounds`)."""
    shape, flat = terms[0].shape, np.stack([t.ravel() for t in terms], axis=1)
    bits = bits_for(flat.shape[1])
    total = point_product(cut_rows(flat, bits), cut_cols(np.ones((flat.shape[1], 1)), bits))
    return float_bounds(total)[1 if up else 0].reshape(shape)


def max_row_square(ends):
    """An exact Fraction >= max_r sum_j v_rj^2 over every matrix v within the ends (lo, hi); None when an
    entry is not finite or reaches 2^400. T = max(U, -L) >= |v| entrywise (`outer_floats`), raised to at
    least 2^-400 and rounded up to 52 significant bits (`_ceil_bits`, exact), is h + l with h its top 26
    bits and l the other 26 (frexp, ldexp by powers of two and floor are exact, and T - h is a float, so
    the subtraction is exact); T^2 = h^2 + 2 h l + l^2, each term an integer below 2^53 times a power of
    two >= 2^-904: exact float64 products. Each row's 3 n terms are summed by the exact product with a
    column of ones and rounded up once (two parts, `split_bounds`, where they fit)."""
    L, U = outer_floats(ends)
    T = np.maximum(np.maximum(U, -L), 2.0 ** -SQUARE_RANGE)
    if not _in_range(T):
        return None
    T = _ceil_bits(T, 52)
    frac, e = np.frexp(T)
    h = np.ldexp(np.floor(np.ldexp(frac, 26)), e - 26)
    low = T - h
    terms = np.concatenate([h * h, 2 * h * low, low * low], axis=1)
    bits = bits_for(terms.shape[1])
    total = point_product(cut_rows(terms, bits), cut_cols(np.ones((terms.shape[1], 1)), bits))
    ends = split_bounds(total)
    if ends is None:
        return Fraction(float(float_bounds(total)[1].max()))
    return fractions(column_extremes(ends, 1)[0][1])[0]


def widths(ends):
    """float64 E >= hi - lo entrywise for one- or two-part ends (`outer_floats`), by exact sums (`_sums`)."""
    L, U = outer_floats(ends)
    return _sums([U, -L], True)


def point_bounds(a, w):
    """((lo,), (hi,)): float64 ends of the exact product a @ w of two float64 arrays of exact values,
    rounded outward once to one part each (`float_bounds`: the fast way out, within about 2^-52 of each
    row's scale)."""
    bits = bits_for(a.shape[1])
    lo, hi = float_bounds(point_product(cut_rows(np.ascontiguousarray(a), bits), cut_cols(w, bits)))
    return (lo,), (hi,)


def max_quadratic(y, ends):
    """An exact Fraction >= max_r y_r Q y_r^T for a float64 matrix y of exact values and P = y Q within
    `ends` (one or two parts per end; `outer_floats`); None outside `_in_range` (`quadratic_rows`)."""
    top = quadratic_rows(y, ends)
    return None if top is None else Fraction(float(top.max()))


def quadratic_rows(y, ends):
    """float64 U with U_r >= y_r Q y_r^T per row r, for y and P = y Q within `ends` as in `max_quadratic`;
    None outside `_in_range`. Per entry y_rj P_rj <= y_rj U_rj where y_rj >= 0, else y_rj L_rj; each such
    product is the exact sum of six piece products (y as three `_pieces` of <= 18 bits, the other factor as
    its top 27 bits and the rest, <= 26 bits: each product <= 45 bits within 2^-906 .. 2^800, exact in
    float64), and each row's terms are summed by the exact product with a column of ones, rounded up once."""
    L, U = outer_floats(ends)
    v = np.where(y >= 0, U, L)
    if not _in_range(y, v):
        return None
    frac, e = np.frexp(v)
    top = np.ldexp(np.trunc(np.ldexp(frac, 27)), e - 27)
    terms = np.concatenate([a * b for a in _pieces(y) for b in (top, v - top)], axis=1)
    bits = bits_for(terms.shape[1])
    total = point_product(cut_rows(terms, bits), cut_cols(np.ones((terms.shape[1], 1)), bits))
    return float_bounds(total)[1].ravel()


def leading_maxima(x, w, backend, groups: int):
    """`leading_digit_maxima` of the IMat x held natively as a ball matrix and the point IMat w; None
    when x is no ball (mpmath has none), w no point, or the rows do not split into `groups` blocks."""
    ball = backend._native_ball(x.data) if x.ends is None and x.shape[0] % groups == 0 else None
    return None if ball is None or not is_point(w) else leading_digit_maxima(*ball, w.ends[0][0], groups)


def leading_digit_maxima(mid, r, w, groups: int):
    """Per block g of `groups` equal blocks of rows and per column j: float64 arrays (P, S) (groups x
    columns) with (X w)_tj <= P_gj + S_gj for every row t of block g and every X with |X - mid| <= r
    entrywise (mid: a tuple of float64 parts, their exact sum; r >= 0), w a float64 matrix (k x n) of
    exact values; from one exact product of leading digits, the rest bounded by magnitudes (a screen: S
    is about 2^(log2 k - b) of the rows' and columns' scales); None when an exponent leaves the range.

    With |mid[0]_tl| < 2^a_t and |w_lj| < 2^c_j (frexp of row / column maxima), u = trunc(mid[0] 2^(b - a_t))
    and v = trunc(w 2^(b - c_j)) are integers below 2^b (scaling by a power of two is exact unless the
    result is subnormal, and then below 1, so trunc gives 0 as for the exact value). With k 2^(2b) <= 2^53
    (b = bits_for(k)) every product and partial sum of Z = u @ v is an integer below 2^53: the float64
    product is exact, and u'_t . v'_j = Z_tj 2^(a_t + c_j - 2b) for u' = u 2^(a_t - b), v' = v 2^(c_j - b),
    exact in float64 when that exponent is >= -1074 and the result finite (else None). The rest, per entry:
    |X - u'| <= |mid[0] - u'| + sum_(i>0) |mid[i]| + r < K 2^mu_t (K = len(mid) + 1 terms, each below 2^mu_t,
    mu_t the largest of a_t - b and the row tops of the other parts and of r), |w - v'| < 2^(c_j - b) and
    |u'| <= |mid[0]| < 2^a_t, so |(X w)_tj - u'_t . v'_j| <= sum_l |X - u'|_tl |w_lj| + |u'_tl| |w - v'|_lj
    < k 2^c_j (K 2^mu_t + 2^(a_t - b)) <= 2^(L + mu_t + c_j) with 2^L >= k (K + 1). So P_gj = max_(t in g)
    Z_tj 2^(a_t + c_j - 2b) and S_gj = 2^(L + max_(t in g) mu_t + c_j) (raised to 2^-1074 at least)."""
    if not (mid[0].size and w.size):
        return None
    k, b = w.shape[0], bits_for(w.shape[0])
    _require(k <= MAX_BLOCK and k << 2 * b <= 1 << 53, "leading digits: k 2^(2b) > 2^53")
    a = _row_top([mid[0]])
    c = np.frexp(np.abs(w).max(axis=0, initial=0.0))[1].astype(np.int64)
    u, v = np.trunc(_scaled(mid[0], b - a, 0)), np.trunc(_scaled(w, b - c, 1))
    _require(np.abs(u).max(initial=0) < 2.0 ** b and np.abs(v).max(initial=0) < 2.0 ** b, "leading digits: a digit >= 2^b")
    mu = np.maximum(a - b, _row_top(list(mid[1:]) + [r]))
    L = (k * (len(mid) + 2) - 1).bit_length()
    e = a[:, None] + c[None, :] - 2 * b
    if e.min() < MIN_EXP or e.max() > 1023 - 53 or L + mu.max() + c.max() > 1023:
        return None
    z = np.ldexp(u @ v, e).reshape(groups, -1, w.shape[1])
    top = mu.reshape(groups, -1).max(axis=1)
    return z.max(axis=1), np.ldexp(1.0, np.maximum(L + top[:, None] + c[None, :], MIN_EXP))
