"""Leaving the exact layer (`exact_products`): each result is rounded outward once, by exact
integer and float operations, and handed to the interval libraries; and the way in from them.

* `round_out(x, prec)`: floor and ceiling of every entry at `prec` significant bits (int64
  mantissas up to 62 bits, Python ints beyond), from the exact base-2^unit digits of the value.
* `float_bounds(x)`: float64 lower and upper bounds, in a few passes over the result; the fast way
  out for work that stays in numpy (column bounds, comparisons).
* `to_arb_mat`, `to_mpf_rows`: the endpoints enter python-flint or mpmath exactly (doubles or
  integers with a common power of two); Arb forms the ball with its own outward rounding.
* `interval_from_arb`, `interval_from_mpf`: ball or interval endpoints rounded outward to float64,
  the layer's interval operands.
These functions and the two way-in ones are the only places the layer touches flint or mpmath.
"""

import math
import sys
from dataclasses import dataclass

import numpy as np

from tcert.checker.exact_products import ACC_LIMIT, MIN_EXP, SAFE, Exact, Interval, _require, _scaled

CACHE_CHUNK = 1 << 15     # entries per chunk when rounding (cache-sized temporaries)

# --- one outward rounding -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Rounded:
    """lo_man 2^lo_exp <= value <= hi_man 2^hi_exp entrywise (int64 arrays; object arrays of Python
    ints above 62 bits)."""

    lo_man: np.ndarray
    lo_exp: np.ndarray
    hi_man: np.ndarray
    hi_exp: np.ndarray


def _bitlen(mag):
    """Bit lengths of int64 magnitudes below 2^53 (frexp of an exactly converted integer)."""
    return np.frexp(mag.astype(np.float64))[1].astype(np.int64)


def _floor_shift(v, sh):
    """floor(v 2^sh) entrywise for int64 v (|v| < 2^62) and int64 shifts of either sign; arithmetic
    right shift is floor (clipped at 63, already floor). Callers keep left-shifted results < 2^62."""
    return np.where(sh >= 0, np.left_shift(v, np.clip(sh, 0, 62)), np.right_shift(v, np.clip(-sh, 0, 63)))


def _settle(acc, bounds, q, unit):
    """Move all but the low `unit` bits of position q into position q + 1 (exact; keeps |acc| < 2^62)."""
    if bounds[q + 1] + (bounds[q] >> unit) + 1 >= ACC_LIMIT:
        _settle(acc, bounds, q + 1, unit)
    acc[q + 1] += acc[q] >> unit
    acc[q] &= (1 << unit) - 1
    bounds[q + 1] += (bounds[q] >> unit) + 1
    bounds[q] = (1 << unit) - 1


def _limbs(x: Exact, rows):
    """For rows `rows` of x: the base-2^unit digits of |value| (least significant first, each in
    [0, 2^unit)), the sign (True: negative) and the offset of digit 0. Terms are added per offset
    (settling a position before it could overflow), carries propagated with floor shifts (the last
    carry is 0 or -1), and a negative value (carry -1, two's complement) complemented."""
    u, base = x.unit, min(o for o, _, _, _ in x.terms)
    npos = (max(o for o, _, _, _ in x.terms) - base) // u + 64 // u + 3
    shape = (rows.stop - rows.start, x.shape[1])
    acc, bounds = [np.zeros(shape, dtype=np.int64) for _ in range(npos)], [0] * npos
    for o, m, b, sg in x.terms:
        q = (o - base) // u
        if bounds[q] + b >= ACC_LIMIT:
            _settle(acc, bounds, q, u)
        acc[q] += sg * m[rows].astype(np.int64)
        bounds[q] += b
    mask, carry = (1 << u) - 1, np.zeros(shape, dtype=np.int64)
    for q in range(npos):
        t = acc[q] + carry
        acc[q], carry = t & mask, t >> u
    _require(np.all((carry == 0) | (carry == -1)), "a carry did not settle")
    neg, c = carry < 0, (carry < 0).astype(np.int64)
    for q in range(npos):
        t = np.where(neg, mask - acc[q], acc[q]) + c
        acc[q], c = t & mask, t >> u
    _require(not c.any(), "a magnitude outgrew its digits")
    return acc, neg, base


def _round_rows(x: Exact, rows, prec: int):
    """(lo_man, hi_man, exp) for rows of x: floor and ceiling of |value| at `prec` bits, signed.
    Digits occupy disjoint bits, so floor(|v| / 2^s) is the sum of each digit's floor-shifted part,
    and the remainder is nonzero iff some digit has a bit below s."""
    digits, neg, base = _limbs(x, rows)
    u = x.unit
    msb = np.full(neg.shape, -1, dtype=np.int64)
    for q in range(len(digits) - 1, -1, -1):
        msb = np.where((msb < 0) & (digits[q] != 0), q * u + _bitlen(digits[q]) - 1, msb)
    scale = base + x.row_scale[rows, None] + x.col_scale[None, :]
    shift = np.maximum(msb + 1 - prec, 0)
    floor, rest = np.zeros(neg.shape, dtype=np.int64), np.zeros(neg.shape, dtype=bool)
    for q, d in enumerate(digits):
        floor += _floor_shift(d, q * u - shift)
        rest |= (d & (np.left_shift(1, np.clip(shift - q * u, 0, u)) - 1)) != 0
    up = floor + rest
    return np.where(neg, -up, floor), np.where(neg, -floor, up), shift + scale


def _round_exact(x: Exact, prec: int):
    """(lo_man, hi_man, exp): x rounded outward to `prec` <= 62 bits, in chunks of rows."""
    m, n = x.shape
    lo, hi, ex = (np.zeros((m, n), dtype=np.int64) for _ in range(3))
    if x.terms:
        step = max(1, CACHE_CHUNK // max(1, n))
        for start in range(0, m, step):
            rows = slice(start, min(m, start + step))
            lo[rows], hi[rows], ex[rows] = _round_rows(x, rows, prec)
    return lo, hi, ex


def round_out(x, prec: int) -> Rounded:
    """x (Exact or ExactInterval) rounded outward once to `prec` significant bits per entry: int64
    mantissas up to 62 bits, Python ints (from `exact_integers`) beyond."""
    _require(prec >= 2, f"rounding to {prec} bits")
    ends = (x, x) if isinstance(x, Exact) else (x.lo, x.hi)
    if prec > 62:
        low = _round_big(ends[0], prec)
        return Rounded(*low[:2], *(low if ends[1] is ends[0] else _round_big(ends[1], prec))[2:])
    lo, hi, lo_e = _round_exact(ends[0], prec)
    if ends[1] is ends[0]:
        return Rounded(lo, lo_e, hi, lo_e)
    _, hi, hi_e = _round_exact(ends[1], prec)
    return Rounded(lo, lo_e, hi, hi_e)


def _round_big(x: Exact, prec: int):
    """(lo_man, lo_exp, hi_man, hi_exp) as object arrays: floor and ceiling at `prec` bits in Python."""
    ints, exps = exact_integers(x)
    out = [np.empty(x.shape, dtype=object) for _ in range(4)]
    for (i, j), v in np.ndenumerate(ints):
        s = max(abs(v).bit_length() - prec, 0)
        e = int(exps[i, j]) + s
        out[0][i, j], out[1][i, j], out[2][i, j], out[3][i, j] = v >> s, e, -((-v) >> s), e
    return out


def exact_integers(x: Exact):
    """(N, e): an object array of Python ints and an int64 array with value = N 2^e exactly."""
    m, n = x.shape
    if not x.terms:
        return np.zeros((m, n), dtype=object), np.zeros((m, n), dtype=np.int64)
    digits, neg, base = _limbs(x, slice(0, m))
    total = np.zeros((m, n), dtype=object)
    for d in reversed(digits):
        total = (total << x.unit) + d.astype(object)
    exps = base + x.row_scale[:, None] + x.col_scale[None, :] + np.zeros((m, n), np.int64)
    return np.where(neg, -total, total), exps


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


def interval_from_arb(mat) -> Interval:
    """The endpoints of a python-flint arb_mat, rounded outward to float64. Each end is an exact Arb
    point (`lower()` / `upper()` round outward); python-flint's float() of it is Arb's correctly
    rounded (to nearest) arf_get_d, so the end lies between the floats adjacent to it, and one
    `nextafter` step outward (exact, no rounding) bounds it. An end beyond the float range converts
    to +-inf and steps to the largest float on the inner side (saturated outward)."""
    m, n = mat.nrows(), mat.ncols()
    entries = mat.entries()
    if not all(x.is_finite() for x in entries):
        raise ValueError("a ball is not finite")
    lo = np.array([float(x.lower()) for x in entries], dtype=np.float64).reshape(m, n)
    hi = np.array([float(x.upper()) for x in entries], dtype=np.float64).reshape(m, n)
    return Interval(np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf))


def interval_from_mpf(rows) -> Interval:
    """The endpoints of rows of mpmath iv.mpf intervals, rounded outward to float64."""
    ends = []
    for row in rows:
        for x in row:
            (sa, ma, ea, _), (sb, mb, eb, _) = x._mpi_
            if (ma == 0 and ea != 0) or (mb == 0 and eb != 0):   # mpmath's nan / inf encodings
                raise ValueError("an interval is not finite")
            ends.append((_end_float(-ma if sa else ma, ea, False), _end_float(-mb if sb else mb, eb, True)))
    pairs = np.array(ends, dtype=np.float64).reshape(len(rows), -1, 2)
    return Interval(pairs[..., 0], pairs[..., 1])


def to_arb_mat(bounds):
    """A python-flint arb_mat whose balls contain [lo, hi] entrywise, for `bounds` a Rounded or a
    (lo, hi) pair of float64 arrays (from float_bounds). The endpoints enter Arb exactly (doubles,
    or Python ints L, H with a common exponent E for a Rounded); the ball is formed by Arb's own
    outward-rounded operations at its working precision: lo + (hi - lo) [0, 1]."""
    import flint

    if isinstance(bounds, Rounded):
        (lo, lo_e), (hi, hi_e) = (bounds.lo_man, bounds.lo_exp), (bounds.hi_man, bounds.hi_exp)
        m, n = lo.shape
        base = int(min(lo_e.min(initial=0), hi_e.min(initial=0)))
        ends = [[int(v) << int(s) for v, s in zip(a.ravel().tolist(), (e - base).ravel().tolist())]
                for a, e in ((lo, lo_e), (hi, hi_e))]
        point = np.array_equal(lo, hi) and np.array_equal(lo_e, hi_e)
    else:
        (lo, hi), base = bounds, 0
        m, n = lo.shape
        ends, point = [lo.ravel().tolist(), hi.ravel().tolist()], np.array_equal(lo, hi)
    if not m or not n:
        return flint.arb_mat(m, n)
    low = flint.arb_mat(m, n, ends[0])
    width = None if point else flint.arb_mat(m, n, ends[1]) - low
    if base:
        two = flint.arb(2) ** base                   # a power of two: exact
        low, width = low * two, None if point else width * two
    return low if point else low + width * flint.arb(0).union(flint.arb(1))


def to_mpf_rows(bounds) -> list:
    """Rows of (lo, hi) mpmath raw mpf pairs, exact (`iv.make_mpf` takes them as they are), for
    `bounds` a Rounded or a (lo, hi) pair of float64 arrays."""
    from mpmath import libmp

    if not isinstance(bounds, Rounded):
        lo, hi = bounds
        return [[(libmp.from_float(a), libmp.from_float(b)) for a, b in zip(ra, rb)]
                for ra, rb in zip(lo.tolist(), hi.tolist())]
    cols = [a.tolist() for a in (bounds.lo_man, bounds.lo_exp, bounds.hi_man, bounds.hi_exp)]
    return [[(libmp.from_man_exp(int(a), int(b)), libmp.from_man_exp(int(c), int(d)))
             for a, b, c, d in zip(*row)] for row in zip(*cols)]
