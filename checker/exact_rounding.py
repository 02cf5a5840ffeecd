"""Leaving the exact layer (`exact_products`): each result is rounded outward once, by exact
integer and float operations, and handed to the interval libraries; and the way in from them.

* `split_bounds(x)`: each bound as two float64 parts with an exact sum, within a few units of
  2^-105 of the chunk's scale: the way out that keeps Arb's working precision (the default exit).
* `float_bounds(x)`: float64 lower and upper bounds, in a few passes over the result; the exit
  where two parts would leave the float range.
* `to_arb_mat`, `to_mpf_rows`: the endpoints enter python-flint or mpmath exactly (float64 parts,
  summed by Arb at EXACT_SUMS bits or by mpmath's exact `mpf_add`).
* `ends_from_arb`, `ends_from_mpf`: ball or interval endpoints as two float64 parts per end (the
  layer's interval operands: a 64-bit endpoint is held exactly).
These four are the only places the layer touches flint or mpmath.
"""

import math
import sys
from fractions import Fraction

import numpy as np

from tcert.checker.exact_products import ACC_LIMIT, MIN_EXP, SAFE, Exact, _require, _scaled

CACHE_CHUNK = 1 << 15     # entries per chunk when rounding (cache-sized temporaries)

# --- one outward rounding -----------------------------------------------------------------------------

def float_bounds(x):
    """(lo, hi) float64 arrays with lo <= value <= hi, for x an Exact or ExactInterval, by exact
    operations only; the fast way out (a few passes over the result, in cache-sized row chunks).
    The width is a few units of 2^(o - sigma) (`_chunk_total`) plus one float64 ulp at each end."""
    ends = (x, x) if isinstance(x, Exact) else (x.lo, x.hi)
    lo, hi = np.zeros(ends[0].shape), np.zeros(ends[1].shape)
    step = max(1, CACHE_CHUNK // max(1, ends[0].shape[1]))
    for start in range(0, ends[0].shape[0], step):
        rows = slice(start, start + step)
        low = _chunk_total(ends[0], rows)
        high = low if ends[1] is ends[0] else _chunk_total(ends[1], rows)
        lo[rows] = _to_float(low[0] - low[3] if low[3] else low[0], low[1], low[2], False)
        hi[rows] = _to_float(high[0] + high[4] if high[4] else high[0], high[1], high[2], True)
    return lo, hi


def _chunk_total(x: Exact, rows):
    """(X, e_row, e_col, below, above) for rows of x: value 2^-(e_row + e_col) lies in
    [X - below, X + above] entrywise.

    With o the largest offset and sigma >= 0 chosen from the measured largest |term at o| so that X
    and X +- (below, above) stay below 2^53: X = sum of the terms at o times 2^sigma + sum over other terms of
    floor(M 2^(o_t - o + sigma)) (each adds 1 to `above`: the floor drops less than one), e_row =
    o - sigma + row scales, e_col = column scales. A term with bound * 2^(o_t - o + sigma) < 1 contributes less
    than one unit either way: it is skipped, adding 1 to `below` and to `above`. Every scaled term,
    floor and partial sum is an integer below 2^53 in float64 (int64 below 2^62 when the terms at o
    alone pass 2^53), so nothing rounds."""
    e_row, e_col = x.row_scale[rows], x.col_scale
    if not x.terms:
        return np.zeros((len(e_row), len(e_col))), e_row, e_col, 0, 0
    top = max(o for o, _, _, _ in x.terms)
    peak = sum(int(max(m[rows].max(initial=0), -m[rows].min(initial=0)))
               for o, m, _, _ in x.terms if o == top)
    lower = sum((b >> (top - o)) + 2 for o, _, b, _ in x.terms if o != top)
    _require(peak + lower < ACC_LIMIT, "a float bound's integer part could overflow")
    sigma = max(0, 52 - (peak + lower).bit_length())       # then |X| 2^sigma < 2^52
    as_float = peak + lower + len(x.terms) <= SAFE
    total = np.zeros((len(e_row), len(e_col)), dtype=np.float64 if as_float else np.int64)
    below = above = 0
    for o, m, b, sg in x.terms:
        part = m[rows] if as_float else m[rows].astype(np.int64)
        part = -part if sg < 0 else part
        if o == top:
            total += np.ldexp(part, sigma) if sigma else part
        elif b < 2 ** (top - o - sigma):
            below, above = below + 1, above + 1
        elif as_float:
            total += np.floor(np.ldexp(part, o - top + sigma))
            above += 1
        else:
            total += part >> (top - o - sigma)
            above += 1
    return total, e_row + (top - sigma), e_col, below, above


def _to_float(v, e_row, e_col, up: bool):
    """A float64 <= v 2^(e_row + e_col) (up: >=) entrywise, for integers v (float64 below 2^53 or
    int64 below 2^62): v is shifted right (floor, or ceiling) until it has <= 53 bits and its lowest
    bit is >= 2^-1074, so converting it to float64 and scaling by a power of two is exact; beyond the
    largest float the bound saturates outward. A float64 v needs no shift when every exponent sum is
    in [-1074, 970]: then v 2^e_row and v 2^e_row 2^e_col (an integer below 2^53 times powers of two,
    each product's lowest bit >= 2^-1074 and magnitude < 2^1024) are exact."""
    rows = (e_row.min(initial=0), e_row.max(initial=0))
    sums = (rows[0] + e_col.min(initial=0), rows[1] + e_col.max(initial=0))
    if v.dtype == np.float64 and MIN_EXP <= min(rows[0], sums[0]) and max(rows[1], sums[1]) <= 970:
        return _scaled(_scaled(v, e_row, 0), e_col, 1)
    e = e_row[:, None] + e_col[None, :]
    if v.dtype != np.float64 or e.min(initial=0) < MIN_EXP:
        v = v.astype(np.int64)
        bits = np.frexp(np.abs(v).astype(np.float64))[1]     # may exceed the bit length by one: safe
        sh = np.maximum(np.maximum(bits - 53, MIN_EXP - e), 0)
        cut = np.minimum(sh, 63)           # |v| < 2^62: a shift by 63 already gives floor (ceil) 0 or -1 (1)
        v, e = (-((-v) >> cut) if up else v >> cut).astype(np.float64), e + sh  # |v| <= 2^53: exact
    with np.errstate(over="ignore"):
        f = np.ldexp(v, np.minimum(e, 2000).astype(np.int32))
    if e.max(initial=0) <= 1024 - 54:
        return f
    big = np.finfo(np.float64).max
    return np.where(np.isinf(f) & ((f < 0) if up else (f > 0)), -big if up else big, f)


# --- two float64 parts per end ---------------------------------------------------------------------------

def _exact_bitlen(mag):
    """Exact bit lengths of int64 magnitudes below 2^62 (frexp of the rounded conversion, corrected)."""
    bits = np.frexp(mag.astype(np.float64))[1].astype(np.int64)      # exact, or one too many
    return np.where(mag == 0, 0, bits - ((mag >> np.clip(bits - 1, 0, 62)) == 0))


LOW_BITS = 44            # the low word of `_fine_total`: units of 2^-44 of the high word's unit
EXACT_SUMS = 128         # bits at which two-part ends (106 bits at most) are summed exactly into Arb


def split_bounds(x):
    """((lo1, lo2), (hi1, hi2)): float64 parts with lo1 + lo2 <= value <= hi1 + hi2 exactly, for x an
    Exact or ExactInterval; lo1 is the float64 floor of the lower bound and 0 <= lo2 < ulp (hi
    mirrored: `column_bounds` relies on it). Each bound is a two-word integer (`_fine_total`, within a
    few units of 2^-105 of its chunk's largest row-column scale) split by `_split_words`. None when a
    part would leave the float range (the caller then uses `float_bounds`)."""
    ends = (x, x) if isinstance(x, Exact) else (x.lo, x.hi)
    out = [[np.zeros(ends[0].shape) for _ in range(2)] for _ in range(2)]
    step = max(1, CACHE_CHUNK // max(1, ends[0].shape[1]))
    for start in range(0, ends[0].shape[0], step):
        rows = slice(start, start + step)
        low = _fine_total(ends[0], rows)
        high = low if ends[1] is ends[0] else _fine_total(ends[1], rows)
        if low is None or high is None:
            return None
        for side, (hi_word, lo_word, e_row, e_col, below, above), up in ((0, low, False), (1, high, True)):
            exp = e_row[:, None] + e_col[None, :] + np.zeros(hi_word.shape, np.int64)
            parts = _split_words(*_normalise(hi_word, lo_word + above if up else lo_word - below), exp, up)
            if parts is None:
                return None
            out[side][0][rows], out[side][1][rows] = parts
    return tuple(map(tuple, out))


def _normalise(hi_word, lo_word):
    """(X, r) with X 2^LOW_BITS + r = hi_word 2^LOW_BITS + lo_word and 0 <= r < 2^LOW_BITS (exact carries)."""
    carry = lo_word >> LOW_BITS
    return hi_word + carry, lo_word - (carry << LOW_BITS)


def _fine_total(x: Exact, rows):
    """(X, r, e_row, e_col, below, above) for rows of x: value 2^-(e_row + e_col) lies in
    [Z - below, Z + above] for Z = X 2^LOW_BITS + r (int64 words, integers) entrywise.

    The high word X counts units of 2^(top - sigma), top the largest offset and sigma = 61 - bit
    length of (largest |term at top| + the lower terms' bounds, in units of 2^top), so the high
    word's partial sums stay below 2^62; a lower term M 2^-shift (in those units) adds floor(M 2^-shift)
    (an arithmetic shift) to X and its remainder, in [0, 2^shift), to the low word in units of
    2^-LOW_BITS (exact) when shift <= LOW_BITS; a smaller term goes to the low word whole, floored
    (one unit to `above`), or is skipped when below one low unit (one unit to `below` and `above`).
    The low word's bound (terms 2^44 plus the floored terms' bounds) must stay below 2^62, else None."""
    e_row, e_col = x.row_scale[rows], x.col_scale
    shape = (len(e_row), len(e_col))
    hi_word, lo_word = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    if not x.terms:
        return hi_word, lo_word, e_row - LOW_BITS, e_col, 0, 0
    top = max(o for o, _, _, _ in x.terms)
    peak = sum(int(max(m[rows].max(initial=0), -m[rows].min(initial=0)))
               for o, m, _, _ in x.terms if o == top)
    lower = sum((b >> (top - o)) + 2 for o, _, b, _ in x.terms if o != top)
    _require(peak + lower < ACC_LIMIT and len(x.terms) < 1 << 16, "a bound's integer part could overflow")
    sigma = max(0, 61 - (peak + lower).bit_length())
    below = above = 0
    low_bound = len(x.terms) << LOW_BITS
    for o, m, b, sg in x.terms:
        shift = top - o - sigma                       # the term in units of 2^(top - sigma): M 2^-shift
        if shift > LOW_BITS and b >> (shift - LOW_BITS) == 0:     # |term| < one low unit
            below, above = below + 1, above + 1
            continue
        part = m[rows].astype(np.int64)             # |M| <= bound < 2^62: exact
        part = -part if sg < 0 else part
        if shift <= 0:
            hi_word += part << -shift
        elif shift <= LOW_BITS:
            q = part >> shift                       # floor
            hi_word += q
            lo_word += (part - (q << shift)) << (LOW_BITS - shift)    # the remainder, in [0, 2^shift)
        else:                                       # (shift - LOW_BITS <= 61: else skipped above)
            lo_word += part >> (shift - LOW_BITS)
            above += 1
            low_bound += (b >> (shift - LOW_BITS)) + 1
    if low_bound >= ACC_LIMIT:        # the low word could have overflowed: not used (float_bounds instead)
        return None
    return hi_word, lo_word, e_row + (top - sigma - LOW_BITS), e_col, below, above


def _split_words(X, r, exp, up: bool):
    """(p1, p2) float64 with p1 + p2 = Z 2^exp floored (up: ceiled) to a float64 p1 and an exact rest,
    for Z = X 2^L + r (L = LOW_BITS, |X| < 2^62, 0 <= r < 2^L): 0 <= p2 < nextafter(p1) - p1 (up:
    mirrored), or None when a part would leave the float range.

    |Z| = A 2^L + C with A >= 0, 0 <= C < 2^L (for Z < 0: A = -X - 1, C = 2^L - r when r > 0). With
    s = bitlen|Z| - 53 (> 0): q = floor(|Z| / 2^s) = A >> (s - L) when s >= L, else (A << (L - s)) +
    (C >> s) (< 2^54, no overflow), and the remainder R = |Z| - q 2^s < 2^s <= 2^53. The float64
    floor of a positive Z is q 2^s (the 53-bit grid of its binade), rest R; of a negative Z it is
    -(q + [R > 0]) 2^s, rest 2^s - R (or 0); the ceilings mirrored. For s <= 0, Z itself (< 2^53)."""
    L, neg = LOW_BITS, X < 0
    A = np.where(neg, -X - (r > 0), X)
    C = np.where(neg, ((1 << L) - r) & ((1 << L) - 1), r)
    if A.min(initial=1 << 53) >= 1 << 52:      # the usual case: bitlen A >= 53, so s - L = bitlen A - 53 >= 0
        bits = _exact_bitlen(A) + L
        s = bits - 53
        drop = s - L
        q = A >> drop
        R = ((A - (q << drop)) << L) + C
    else:
        bits = np.where(A > 0, _exact_bitlen(A) + L, _exact_bitlen(C))
        s = np.maximum(bits - 53, 0)
        wide = s >= L
        q = np.where(wide, A >> np.clip(s - L, 0, 63), (A << np.clip(L - s, 0, 63)) + (C >> np.clip(s, 0, 63)))
        R = np.where(wide, ((A - (q << np.clip(s - L, 0, 63))) << L) + C, C - ((C >> s) << s))
    more = R > 0
    away = neg != up                                   # floor of a negative, ceiling of a positive
    bump = away & more
    q1 = q + bump
    rest = np.where(bump, (1 << s) - R, R)             # R = 0 where not more
    p1_int = np.where(neg, -q1, q1)
    p2_int = np.where(neg == away, rest, -rest)        # the rest is >= 0 for floors, <= 0 for ceilings
    live = bits > 0
    if live.any() and not (exp[live].min() >= MIN_EXP and (exp + bits)[live].max() <= 1023):
        return None
    e = np.where(live, exp, 0)
    return (np.ldexp(p1_int.astype(np.float64), (e + s).astype(np.int32)),
            np.ldexp(p2_int.astype(np.float64), e.astype(np.int32)))


def _end_parts(man: int, exp: int, up: bool):
    """(f1, f2) float64 with f1 + f2 <= man 2^exp (up: >=) exactly: f1 the nearest such float
    (`_end_float`), f2 the same for the rest (exact when representable); f2 = 0 when f1 saturates."""
    s = max(abs(man).bit_length() - 53, MIN_EXP - exp, 0)
    top = -((-man) >> s) if up else man >> s
    f1 = _end_float(man, exp, up)
    if not math.isfinite(f1) or abs(f1) == sys.float_info.max:
        return f1, 0.0
    return f1, _end_float(man - (top << s), exp, up)


def ends_from_arb(mat):
    """((lo1, lo2), (hi1, hi2)), float64 parts with lo1 + lo2 <= every entry of the python-flint arb_mat
    <= hi1 + hi2, the same pair twice (lo is hi) when the matrix is certainly a point with exact
    two-part entries. Points: p1 = float(x) (nearest), the rest x - p1 by Arb and float() of it,
    and Arb's exact equality (arb_mat ==, true only for equal exact points) confirms p1 + p2 = x;
    otherwise each end as two parts rounded outward: each end is an exact Arb point (`lower()` /
    `upper()` round outward), python-flint's float() of it is Arb's correctly rounded (to nearest)
    arf_get_d, so one `nextafter` step outward (exact) bounds it; the same for its rest. An end beyond
    the float range converts to +-inf and steps to the largest float on the inner side (saturated
    outward). ValueError when an entry is not finite."""
    import flint

    m, n = mat.nrows(), mat.ncols()
    if m and n and mat == mat.mid():
        p1 = np.array([float(x) for x in mat.entries()], dtype=np.float64).reshape(m, n)
        if np.isfinite(p1).all():
            first = flint.arb_mat(m, n, p1.ravel().tolist())
            rest = mat - first
            p2 = np.array([float(x) for x in rest.entries()], dtype=np.float64).reshape(m, n)
            if rest == flint.arb_mat(m, n, p2.ravel().tolist()):
                parts = (p1, p2)
                return parts, parts
    entries = mat.entries()
    if not all(x.is_finite() for x in entries):
        raise ValueError("a ball is not finite")
    ends = []
    for which in (0, 1):
        e = [x.lower() if which == 0 else x.upper() for x in entries]
        step = -np.inf if which == 0 else np.inf
        p1 = np.nextafter(np.array([float(x) for x in e], dtype=np.float64), step).reshape(m, n)
        rest = [(x - a) for x, a in zip(e, p1.ravel().tolist())]
        p2 = np.array([float(r.lower() if which == 0 else r.upper()) for r in rest], dtype=np.float64)
        ends.append((p1, np.nextafter(p2, step).reshape(m, n)))
    return tuple(ends)


def ball_from_arb(mat):
    """((p1, p2), r): float64 arrays with p1 + p2 exactly the midpoint of each ball of the python-flint
    arb_mat and r >= its radius; None when that fails (a midpoint not two float64 parts, an entry not
    finite). p1 is float() of each ball (python-flint's float() is Arb's arf_get_d of the midpoint,
    correctly rounded to nearest), the rest mid - p1 is computed by Arb and p2 = float() of it, and Arb's
    exact equality of arb_mats (true only for equal exact points) confirms p1 + p2 = mid; r is float()
    of the radius one `nextafter` step up (exact), zero for a matrix of exact points (arb_mat ==)."""
    import flint

    m, n = mat.nrows(), mat.ncols()
    entries = mat.entries()
    p1 = np.array([float(x) for x in entries], dtype=np.float64).reshape(m, n)
    mids = mat.mid()
    if mat == mids:
        r = np.zeros((m, n))
    else:
        r = np.nextafter(np.array([float(x.rad()) for x in entries], dtype=np.float64), np.inf).reshape(m, n)
    if not (np.isfinite(p1).all() and np.isfinite(r).all()):
        return None
    rest = mids - flint.arb_mat(m, n, p1.ravel().tolist())
    p2 = np.array([float(x) for x in rest.entries()], dtype=np.float64).reshape(m, n)
    if not np.isfinite(p2).all() or not rest == flint.arb_mat(m, n, p2.ravel().tolist()):
        return None
    return (p1, p2), r


def near_ball_from_arb(mat, parts: int = 2):
    """((p1, ..), d): `parts` float64 arrays with |x - (p1 + ..)| <= d for every point x of each ball of the
    python-flint arb_mat (of any precision); None when an entry is not finite. p1 = float() of each ball,
    p2 = float() of the rest mat - p1 (Arb, at the working precision: a ball holding every x - p1), and so
    on; d = float() of an upper bound of |x - p1 - ..| (Arb's `abs_upper` of the last rest, a ball holding
    every x - p1 - ..) one `nextafter` step up (float() is Arb's correctly rounded arf_get_d)."""
    import flint

    m, n = mat.nrows(), mat.ncols()
    if not all(x.is_finite() for x in mat.entries()):
        return None
    out, rest = [], mat
    for _ in range(parts):
        out.append(np.array([float(x) for x in rest.entries()], dtype=np.float64).reshape(m, n))
        rest = rest - flint.arb_mat(m, n, out[-1].ravel().tolist())
    d = np.nextafter(np.array([float(x.abs_upper()) for x in rest.entries()], dtype=np.float64), np.inf)
    if not (all(np.isfinite(p).all() for p in out) and np.isfinite(d).all()):
        return None
    return tuple(out), d.reshape(m, n)


def mpf_ends(rows):
    """Each entry of rows of mpmath iv.mpf intervals as (lo mantissa, lo exponent, hi mantissa, hi exponent),
    exact signed ints. ValueError when an interval is not finite."""
    for row in rows:
        for x in row:
            (sa, ma, ea, _), (sb, mb, eb, _) = x._mpi_
            if (ma == 0 and ea != 0) or (mb == 0 and eb != 0):   # mpmath's nan / inf encodings
                raise ValueError("an interval is not finite")
            yield -ma if sa else ma, ea, -mb if sb else mb, eb


def ends_from_mpf(rows):
    """((lo1, lo2), (hi1, hi2)) for rows of mpmath iv.mpf intervals: each endpoint m 2^e (exact ints)
    as two outward float64 parts (`_end_parts`). ValueError when an interval is not finite."""
    ends = [_end_parts(ma, ea, False) + _end_parts(mb, eb, True) for ma, ea, mb, eb in mpf_ends(rows)]
    q = np.array(ends, dtype=np.float64).reshape(len(rows), -1, 4)
    return (q[..., 0], q[..., 1]), (q[..., 2], q[..., 3])


def _parts(end):
    """An end as a tuple of float64 arrays whose exact sum it is (a bare array is one part)."""
    return end if isinstance(end, tuple) else (end,)


# --- the way in from, and out to, the interval libraries --------------------------------------------

def _end_float(man: int, exp: int, up: bool) -> float:
    """A float64 <= man 2^exp (up: >=), the nearest such, exactly; beyond the float range it
    saturates outward (the largest float below a huge positive value, -inf below a huge negative)."""
    s = max(abs(man).bit_length() - 53, MIN_EXP - exp, 0)
    m = -((-man) >> s) if up else man >> s
    try:
        return math.ldexp(float(m), exp + s)       # m has <= 53 bits, lowest bit >= 2^-1074: exact
    except OverflowError:
        big = sys.float_info.max
        return (math.inf if m > 0 else -big) if up else (big if m > 0 else -math.inf)


def to_arb_mat(bounds):
    """A python-flint arb_mat whose balls contain [lo, hi] entrywise, for `bounds` a (lo, hi) pair of
    ends (float64 arrays, or tuples of float64 parts whose exact sums are the ends: `split_bounds`).
    The parts enter Arb exactly and are added by Arb (`_parts_to_arb`)."""
    import flint

    return _parts_to_arb(flint, *(_parts(e) for e in bounds))


def _arb_sum(flint, m: int, n: int, parts):
    """The arb_mat of the exact sums of float64 parts (each part enters exactly; Arb adds them)."""
    total = flint.arb_mat(m, n, parts[0].ravel().tolist())
    for p in parts[1:]:
        if p.any():
            total = total + flint.arb_mat(m, n, p.ravel().tolist())
    return total


def _parts_to_arb(flint, lo, hi):
    """The arb_mat of balls containing [lo, hi] (ends as tuples of float64 parts): the ends summed, and
    the ball mid + rad [-1, 1] (mid, rad = half the sum and difference of the ends) formed, at
    EXACT_SUMS bits, where the sums of two parts are exact (else Arb encloses them), then rounded once
    to the working precision by Arb (a product with the exact 1): one rounding, as Arb's own products."""
    m, n = lo[0].shape
    if not m or not n:
        return flint.arb_mat(m, n)
    point = hi is lo or (len(lo) == len(hi) and all(np.array_equal(a, b) for a, b in zip(lo, hi)))
    work = flint.ctx.prec
    flint.ctx.prec = max(work, EXACT_SUMS)
    try:
        low = _arb_sum(flint, m, n, lo)
        if point:
            ball = low
        else:
            high = _arb_sum(flint, m, n, hi)
            ball = (low + high) * flint.arb(0.5) + (high - low) * flint.arb(0.5) * flint.arb(-1).union(flint.arb(1))
    finally:
        flint.ctx.prec = work
    return ball * flint.arb(1)


def to_mpf_rows(bounds) -> list:
    """Rows of (lo, hi) mpmath raw mpf pairs, exact (`iv.make_mpf` takes them as they are), for
    `bounds` a (lo, hi) pair of ends (float64 arrays or tuples of parts: summed exactly)."""
    from mpmath import libmp

    lo, hi = (_parts(e) for e in bounds)

    def exact(parts):
        total = [libmp.from_float(v) for v in parts[0].ravel().tolist()]
        for p in parts[1:]:
            total = [libmp.mpf_add(t, libmp.from_float(v)) for t, v in zip(total, p.ravel().tolist())]
        return total      # mpf_add without a precision is exact

    n = lo[0].shape[1]
    a, b = exact(lo), exact(hi)
    return [list(zip(a[i:i + n], b[i:i + n])) for i in range(0, len(a), n)] if n else [[] for _ in lo[0]]


TRIM_BELOW = 84   # a centre keeps its bits at or above 2^(row top - TRIM_BELOW) (`trimmed`): 4 digits of 21 bits


def trimmed(parts, sq, keep: int = TRIM_BELOW, uniform: bool = False):
    """(p1', p2') and sq': the two-part centre cut to its bits at or above 2^(t_i - keep) (TRIM_BELOW unless
    given) on each row i
    (|p1| < 2^t_i on the row), so every later product needs at most ceil(TRIM_BELOW / bits) digits per row;
    each row's squared radius bound sq grown to (sqrt(sq) + sqrt(n) (max |p1 - p1'| + max |p2 - p2'|))^2
    (triangle inequality; returned as the pair (sq, n max^2) for the caller's square roots; with `uniform`,
    one pair bounding every row's: the largest sq and n (largest a + largest b)^2), where each
    dropped part is below 2^(t_i - TRIM_BELOW). The cut is exact: y = p 2^s_i (s_i = TRIM_BELOW - t_i; rows
    with |s_i| > 1000 or s_i = 0 are kept whole) is exact where it is normal (|y| < 2^TRIM_BELOW: no
    overflow), and where it is not, |y| < 2^-1022 and trunc gives 0 from y or its rounding alike; trunc(y)
    is a float holding an integer, times 2^-s_i >= 2^-1000 exactly (its lowest bit >= 1); p - p' is p's
    dropped low bits, a float, so exact."""
    p1, p2 = parts
    top = np.frexp(np.abs(p1).max(axis=1, initial=0.0))[1].astype(np.int64)
    shift = np.where(np.abs(keep - top) <= 1000, keep - top, 0)[:, None]
    up, down = np.ldexp(1.0, shift), np.ldexp(1.0, -shift)
    keep = [np.where(shift != 0, np.trunc(p * up) * down, p) for p in (p1, p2)]
    drop = [np.abs(p - k).max(axis=1, initial=0.0).tolist() for p, k in zip((p1, p2), keep)]
    n, out = p2.shape[1], []
    if uniform and sq:      # one pair for all rows: max sq and n (max a + max b)^2 bound every row's (`up` below)
        drop = [[max(d)] for d in drop]
        sq = [max({id(x): x for x in sq}.values())]
    for s, a, b in zip(sq, *drop):      # n (a + b)^2 as one Fraction: a = m1 / q1, b = m2 / q2 exactly
        (m1, q1), (m2, q2) = a.as_integer_ratio(), b.as_integer_ratio()
        out.append((s, Fraction(n * (m1 * q2 + m2 * q1) ** 2, (q1 * q2) ** 2)))
    return tuple(keep), out


def row_integers(x: Exact, row: int = 0):
    """(v, e): Python ints with x[row, j] = v_j 2^e exactly for every column j of the exact product x: each
    term's integers (|M| < 2^62, so int64 holds them) shifted onto the least offset and column scale."""
    if not x.terms:
        return [0] * x.shape[1], 0
    low, cmin = min(o for o, _, _, _ in x.terms), int(x.col_scale.min(initial=0))
    shifts = (x.col_scale - cmin).astype(np.int64)
    total = np.zeros(x.shape[1], dtype=object)
    for o, m, _, sg in x.terms:
        total += np.left_shift(m[row].astype(np.int64).astype(object) * sg, (shifts + (o - low)).astype(object))
    return total.tolist(), low + cmin + int(x.row_scale[row])


# --- a point result as a two-part centre and its rounding radius (the forward pass's way out) ----------

def split_centre(x: Exact, word: bool = False):
    """((c1, c2), sq) for the exact point product x: float64 parts with c1 + c2 = c exactly (the lower
    end of `split_bounds`; with `word`, the high word alone: `_word_parts`) and, per row i, an exact Fraction
    sq[i] >= ||x_i - c_i||_2^2; None when a part would leave the float range.

    Why. `_fine_total` gives Z with x 2^-exp in [Z - below, Z + above] (exp = e_row_i + e_col_j, one
    `below` and `above` per row chunk), and `_split_words` returns c1 + c2 = (Z - below) 2^exp exactly,
    so |x_ij - c_ij| <= (below + above) 2^(e_row_i + e_col_j) and ||x_i - c_i||^2 <= (below + above)^2
    4^e_row_i sum_j 4^e_col_j, summed over the few distinct exponents exactly. With `word`, Z = X 2^L + r
    (0 <= r < 2^L, L = LOW_BITS: `_normalise`) and c = X 2^(exp + L), so x 2^-exp - c 2^-exp = r + t with t in
    [-below, above]: the same bound with below + above + 2^L."""
    out = [np.zeros(x.shape) for _ in range(2)]
    col = Fraction(0)
    for e, count in zip(*np.unique(x.col_scale, return_counts=True)):
        col += int(count) * Fraction(4) ** int(e)
    sq = []
    step = max(1, CACHE_CHUNK // max(1, x.shape[1]))
    for start in range(0, x.shape[0], step):
        rows = slice(start, start + step)
        low = _fine_total(x, rows)
        if low is None:
            return None
        hi_word, lo_word, e_row, e_col, below, above = low
        exp = e_row[:, None] + e_col[None, :] + np.zeros(hi_word.shape, np.int64)
        if word:
            parts = _word_parts(_normalise(hi_word, lo_word)[0], exp + LOW_BITS)
        else:
            parts = _split_words(*_normalise(hi_word, lo_word - below), exp, False)
        if parts is None:
            return None
        out[0][rows], out[1][rows] = parts
        width = (below + above + (1 << LOW_BITS if word else 0)) ** 2 * col
        n, d = width.numerator, width.denominator
        made = {}     # rows of one exponent share one Fraction (made once; callers may compare by identity)
        for e in e_row.tolist():
            if e not in made:
                made[e] = Fraction(n << 2 * e, d) if e >= 0 else Fraction(n, d << -2 * e)
            sq.append(made[e])
    return tuple(out), sq


WORD_CUT = 31     # `_word_parts`: a high word X splits as (X >> 31) 2^31 + (X's low 31 bits)


def _word_parts(X, exp):
    """(h1, h2) float64 with h1 + h2 = X 2^exp exactly, for int64 X with |X| < 2^63, or None when a part would
    leave the float range. X = q 2^31 + m with q = X >> 31 (floor: |q| < 2^32) and m = X & (2^31 - 1) in
    [0, 2^31): integers of <= 32 bits, so float64 holds them, and q 2^(exp + 31), m 2^exp are float64 numbers
    (computed exactly by ldexp) when exp >= -1074 (lowest bit >= 2^-1074) and exp + 31 + 32 <= 1024 (finite)."""
    if X.size and not (exp.min() >= MIN_EXP and exp.max() + WORD_CUT + 32 <= 1024):
        return None
    q, m = X >> WORD_CUT, X & ((1 << WORD_CUT) - 1)
    e = exp.astype(np.int32)
    return np.ldexp(q.astype(np.float64), e + WORD_CUT), np.ldexp(m.astype(np.float64), e)
