"""Parts of the exact-products layer that no verdict path reaches, kept for the tests and
benchmarks/bench_exact_products.py (import name `tcert.testing.exact_reference`).

The trusted layer (checker/exact_products.py, exact_rounding.py, exact_backend.py) multiplies point
matrices exactly and leaves by `split_bounds` / `float_bounds`; its interval operands are cut as
point matrices (`exact_backend.interval_times_point`). What lived beside that and is no longer on any
verdict path lives here, unchanged in substance, so the tests that measured it still can:

* `Interval`, `interval_grid`, `interval_product`, `point_interval_product`: interval times point by
  an outward grid (midpoint and radius) and rank-one envelopes (`_envelope`, `_tail`);
* `point_product(a, b, keep)`: the checker's exact product, or with `keep` its bounded form;
* `round_out(x, prec)` (`Rounded`) and `exact_integers(x)`: floor and ceiling at any precision, the
  exact integer value; `to_arb_mat` / `to_mpf_rows` accept a `Rounded` besides the checker's ends;
* `interval_from_arb` / `interval_from_mpf`: ball or interval endpoints rounded outward to float64;
* `bfloat16_matrix`: bfloat16 bit patterns as exact float64;
* `transposed(slices)`, `abs_upper(slices)`: a cut read as its transpose's, and an upper digit of |value|.
"""

from dataclasses import dataclass

import numpy as np

from tcert.checker import exact_rounding as _er
from tcert.checker.exact_products import (ACC_LIMIT, CUT_CHUNK, MIN_EXP, SAFE, Exact, ExactInterval, Slices, _add_block,
                                          _assemble, _digit_products, _digit_stats, _finite_float64, _require,
                                          _require_exact,
                                          _scaled, exact_matrix)
from tcert.checker.exact_products import point_product as _exact_point_product
from tcert.checker.exact_rounding import CACHE_CHUNK, _end_float, mpf_ends

NARROW = 4                # radius digits up to this are bounded by an envelope, larger ones exactly


def negate(x: Exact) -> Exact:
    """-x (the terms' signs flipped: nothing copied)."""
    return Exact(tuple((o, m, b, -sg) for o, m, b, sg in x.terms), x.row_scale, x.col_scale, x.unit)


def subtract(x: Exact, y: Exact) -> Exact:
    """x - y, exactly."""
    return x + negate(y)


def transposed(s: Slices) -> Slices:
    """The same cut read as the transposed matrix's (rows and columns swapped)."""
    return Slices([d.T for d in s.digits], s.index, s.scale, s.bits, 1 - s.axis,
                  s.shape[::-1], list(zip(s.line_max, s.line_sum)))


def abs_upper(s: Slices) -> Slices:
    """One digit u >= 0 with |value| <= 2^c u 2^-bits entrywise: u = |d_0| + [a lower digit != 0]
    (the lower digits add less than one unit of digit 0)."""
    lines, k = s.shape[s.axis], s.shape[1 - s.axis]
    up, more = np.zeros((lines, k)), np.zeros((lines, k), dtype=bool)
    for i, (d, idx) in enumerate(zip(s.digits, s.index)):
        along = d if s.axis == 0 else d.T                    # lines x k
        if i == 0:
            up[idx] = np.abs(along)
        else:
            more[idx] |= along != 0
    up += more
    keep = np.flatnonzero(up.any(axis=1))
    if len(keep) < lines:
        up = up[keep]
    return Slices([up if s.axis == 0 else up.T], [keep], s.scale, s.bits, s.axis, s.shape)


# --- inputs -------------------------------------------------------------------------------------------

def bfloat16_matrix(bits) -> np.ndarray:
    """bfloat16 values given as uint16 bit patterns (the top half of a float32), as exact float64."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise TypeError(f"bfloat16 bits must be uint16, not {b.dtype}")
    return exact_matrix((b.astype(np.uint32) << 16).view(np.float32))


@dataclass(frozen=True)
class Interval:
    """A matrix of intervals [lo, hi] with float64 endpoints, read exactly (lo <= hi entrywise)."""

    lo: np.ndarray
    hi: np.ndarray

    @property
    def shape(self):
        return self.lo.shape

    @property
    def T(self):
        return Interval(self.lo.T, self.hi.T)

# --- interval operands on an outward grid ----------------------------------------------------------

def interval_grid(x: Interval, bits: int):
    """(mid, rad, uniform): x rounded outward to a per-row grid and written as midpoint and radius,
    both cut into S = 52 // bits digits of `bits` bits on the row scale c = t + 1 (|endpoints| < 2^t);
    `uniform`: every row's radius is at most NARROW grid units, or at most twice its smallest.

    With g = c - S bits: lo' = floor(lo 2^-g), hi' = ceil(hi 2^-g). Exact: when g <= 0 the scaling
    only raises bits; otherwise, where |lo| < 2^g the answer (0, or -1 for lo < 0; 1 or 0 for hi) is
    taken without scaling, and elsewhere lo 2^-g is >= 1 in magnitude (no bit below 2^-52). Always
    |lo 2^-g| < 2^(t-g) = 2^(S bits - 1) <= 2^51. Then mid = floor((lo' + hi') / 2) and rad = hi' -
    mid = ceil((hi' - lo') / 2) are integers of magnitude <= 2^(S bits - 1) (exact in float64), and
    [lo, hi] lies in 2^g [mid - rad, mid + rad]: a grid of 2^-(S bits - 1) of the row's magnitude
    (2^-43 for bits = 22). Done by blocks of rows, so the temporaries stay in cache."""
    _require(1 <= bits <= 26, f"digit width {bits} outside 1..26")
    _finite_float64(x.lo)
    _finite_float64(x.hi)
    _require(x.lo.shape == x.hi.shape, f"interval ends of shapes {x.lo.shape} and {x.hi.shape}")
    slices = 52 // bits
    c = np.maximum(_row_tops(x.lo), _row_tops(x.hi)) + 1
    mids, rads, uniform, step = {}, {}, True, max(1, CUT_CHUNK // max(1, x.shape[1]))
    for start in range(0, x.shape[0], step):
        rows = slice(start, start + step)
        mid, rad = _grid_block(x.lo[rows], x.hi[rows], c[rows] - slices * bits)
        top, least = rad.max(axis=1, initial=0.0), rad.min(axis=1, initial=0.0)
        uniform = uniform and bool(np.all((top <= NARROW) | (top <= 2 * least)))
        for parts, v, peak in ((mids, mid, None), (rads, rad, top.max(initial=0.0))):
            for s, lines, d, stats in _integer_digits(v, bits, slices, peak):
                parts.setdefault(s, []).append((lines + start, d, stats))
    return _assemble(mids, x.shape, 0, c, bits), _assemble(rads, x.shape, 0, c, bits), uniform


def _grid_block(lo, hi, g):
    """(mid, rad) of rows of an interval matrix on the grid 2^g per row (see interval_grid)."""
    a, b = _scaled(lo, -g, 0), _scaled(hi, -g, 0)
    np.floor(a, out=a)
    np.ceil(b, out=b)
    g = g[:, None]
    if np.any(g > 0):
        with np.errstate(over="ignore"):
            unit = np.ldexp(1.0, np.minimum(g, 2000).astype(np.int32))
        a = np.where(np.abs(lo) < unit, np.where(lo < 0, -1.0, 0.0), a)
        b = np.where(np.abs(hi) < unit, np.where(hi > 0, 1.0, 0.0), b)
    _require(np.all(a <= b), "an interval with its lower end above its upper end")
    mid = a + b                     # |lo' + hi'| <= 2^(S bits) <= 2^52; halving and floor are exact
    mid *= 0.5
    np.floor(mid, out=mid)
    return mid, np.subtract(b, mid, out=b)


def _row_tops(x):
    """Per row the least t with |x| < 2^t (-1075 for an all-zero row), from row maxima and minima."""
    top = np.maximum(x.max(axis=1, initial=0.0), -x.min(axis=1, initial=0.0))
    return np.where(top > 0, np.frexp(top)[1], MIN_EXP - 1).astype(np.int64)


def _integer_digits(v, bits: int, count: int, peak=None):
    """[(s, lines, digit, stats)]: rows of integers |v| < 2^(count bits) (float64) as `count` digits,
    v = sum_s digit_s 2^(count-1-s)bits. Digit s = trunc(rest 2^-(count-1-s)bits), then rest <-
    rest - digit 2^(count-1-s)bits: integers below 2^52 scaled by powers of two, truncated and
    subtracted, every result an integer below 2^52, so nothing rounds. With `peak` >= |v|, a digit
    above it is known to be zero and is skipped; `lines` are the rows where a digit is nonzero."""
    out, rest = [], v
    for s in range(count):
        shift = (count - 1 - s) * bits
        if peak is not None and peak < 2.0 ** shift:
            continue
        d = np.trunc(np.ldexp(rest, -shift)) if shift else rest
        if shift:
            rest = rest - np.ldexp(d, shift)
        top, total = _digit_stats(d, 0)
        lines = np.flatnonzero(top > 0)
        if len(lines) < len(d):
            d, top, total = d[lines], top[lines], total[lines]
        out.append((s, lines, d, (top, total)))
    return out

# --- bounded products -----------------------------------------------------------------------------------

def _envelope(a: Slices, s: int, b: Slices, t: int):
    """(u, v, offset), u >= 0 per row and v >= 0 per column with |a_s @ b_t| <= u v^T entrywise:
    row maxima of |a_s| times column sums of |b_t| (or the transposed choice, whichever has the
    smaller product of maxima); u v <= k 2^2b <= 2^53."""
    u, v = np.zeros(a.shape[0]), np.zeros(b.shape[1])
    (alpha, rows), (beta, cols) = a.bound[s], b.bound[t]
    if alpha * cols <= rows * beta:
        u[a.index[s]], v[b.index[t]] = a.line_max[s], b.line_sum[t]
    else:
        u[a.index[s]], v[b.index[t]] = a.line_sum[s], b.line_max[t]
    return u, v, -(s + t + 2) * a.bits


def _tail(envelopes, row_scale, col_scale, unit) -> Exact:
    """Exact terms T = sum_p u_p v_p^T 2^o_p from rank-one envelopes, without rounding anything up:
    from the lowest offset upward, an envelope joins the current term at offset o_g as
    v_p 2^(o_p - o_g) (exact: an integer times a power of two >= 1) while sum max u max v <= 2^53,
    so the term [u_p] @ [v_p 2^(o_p - o_g)] is an exact product; otherwise it opens a new term at
    o_p (one envelope alone is <= k 2^2b <= 2^53)."""
    batches = []                              # [offset, [(u, scaled v)], bound]
    for u, v, o in sorted((e for e in envelopes if e[0].any() and e[1].any()), key=lambda e: e[2]):
        if batches:
            base, members, bound = batches[-1]
            extra = (int(u.max()) * int(v.max())) << (o - base)
            if bound + extra <= SAFE:
                members.append((u, np.ldexp(v, o - base)))
                batches[-1][2] = bound + extra
                continue
        batches.append([o, [(u, v)], int(u.max()) * int(v.max())])
    terms = []
    for base, members, bound in batches:
        _require_exact(bound)
        u, v = np.stack([u for u, _ in members], axis=1), np.stack([v for _, v in members])
        rows, cols = np.flatnonzero(u.any(axis=1)), np.flatnonzero(v.any(axis=0))
        if len(rows) == len(u) and len(cols) == v.shape[1]:
            tail = u @ v
        else:   # an envelope on a few rows or columns: the product of its support only
            tail = np.zeros((len(u), v.shape[1]))
            _add_block(tail, rows, cols, u[rows] @ v[:, cols])
        terms.append((base, tail, bound, 1))
    return Exact(tuple(terms), row_scale, col_scale, unit)


def point_product(a: Slices, b: Slices, keep=None):
    """The exact product A B of point matrices cut by `cut_rows` (A) and `cut_cols` (B): an Exact (the
    checker's `point_product`). With `keep` = S, only digit pairs with s + t < S are multiplied and the
    others bounded by envelopes (fewer products): an ExactInterval around A B."""
    if keep is None:
        return _exact_point_product(a, b)
    pairs = [(s, t) for s in range(len(a.digits)) for t in range(len(b.digits))]
    centre = _digit_products(a, b, [(s, t) for s, t in pairs if s + t < keep])
    tail = _tail([_envelope(a, s, b, t) for s, t in pairs if s + t >= keep], a.scale, b.scale, a.bits)
    return ExactInterval(subtract(centre, tail), centre + tail)


def interval_product(x: Interval, w: Slices, keep: int = 2) -> ExactInterval:
    """Exact bounds of X W over every point X of the interval matrix x, for a point W cut by
    `cut_cols`: x is rounded outward to a grid of 2^-(S bits - 1) of each row's magnitude
    (`interval_grid`); then mid W +- rad U with U = `abs_upper(w)` >= |W|. Digit pairs of mid W with
    s + t < keep are multiplied exactly, the others bounded by envelopes; so is rad U when the radius
    is uniform (each row's digit envelopes sum to at most max rad + 2^bits grid units, so to at most
    2 max rad when rad has two digits, and max rad <= 2 rad on a row uniform within 2x: at most 4
    times the exact term; or it is below NARROW units), else rad U is multiplied exactly. Cost: the
    pairs s + t < keep, 3 float64 products for keep = 2 (the bounded pairs then add about
    k 2^-2bits of the row-column scale to the width), 4 to 5 for keep = 3 (then the grid dominates)."""
    mid, rad, uniform = interval_grid(x, w.bits)
    pairs = [(s, t) for s in range(len(mid.digits)) for t in range(len(w.digits))]
    centre = _digit_products(mid, w, [(s, t) for s, t in pairs if s + t < keep])
    upper = abs_upper(w)
    envelopes = [_envelope(mid, s, w, t) for s, t in pairs if s + t >= keep]
    radius_pairs = [(s, 0) for s in range(len(rad.digits))] if upper.digits else []
    if uniform:
        envelopes += [_envelope(rad, s, upper, t) for s, t in radius_pairs]
        radius_pairs = []
    radius = _digit_products(rad, upper, radius_pairs) + _tail(envelopes, mid.scale, w.scale, w.bits)
    return ExactInterval(subtract(centre, radius), centre + radius)


def point_interval_product(w: Slices, x: Interval, keep: int = 2) -> ExactInterval:
    """Exact bounds of W X for a point W cut by `cut_rows` and an interval matrix x: (W X)^T = X^T W^T."""
    return interval_product(x.T, transposed(w), keep).T


# --- rounding out at any precision, and the old way in ------------------------------------------------

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
    ends = [(_end_float(ma, ea, False), _end_float(mb, eb, True)) for ma, ea, mb, eb in mpf_ends(rows)]
    pairs = np.array(ends, dtype=np.float64).reshape(len(rows), -1, 2)
    return Interval(pairs[..., 0], pairs[..., 1])


def to_arb_mat(bounds):
    """The checker's `to_arb_mat`, and for a Rounded: Python ints L, H with a common exponent E enter
    Arb exactly and the ball is lo + (hi - lo) [0, 1], formed by Arb's outward-rounded operations."""
    import flint

    if not isinstance(bounds, Rounded):
        return _er.to_arb_mat(bounds)
    (lo, lo_e), (hi, hi_e) = (bounds.lo_man, bounds.lo_exp), (bounds.hi_man, bounds.hi_exp)
    m, n = lo.shape
    base = int(min(lo_e.min(initial=0), hi_e.min(initial=0)))
    ends = [[int(v) << int(s) for v, s in zip(a.ravel().tolist(), (e - base).ravel().tolist())]
            for a, e in ((lo, lo_e), (hi, hi_e))]
    point = np.array_equal(lo, hi) and np.array_equal(lo_e, hi_e)
    if not m or not n:
        return flint.arb_mat(m, n)
    low, high = (flint.arb_mat(m, n, e) for e in ends)
    width = None if point else high - low
    if base:
        two = flint.arb(2) ** base                   # a power of two: exact
        low, width = low * two, None if point else width * two
    return low if point else low + width * flint.arb(0).union(flint.arb(1))


def to_mpf_rows(bounds) -> list:
    """The checker's `to_mpf_rows`, and for a Rounded: rows of exact (lo, hi) mpmath raw mpf pairs."""
    from mpmath import libmp

    if not isinstance(bounds, Rounded):
        return _er.to_mpf_rows(bounds)
    cols = [a.tolist() for a in (bounds.lo_man, bounds.lo_exp, bounds.hi_man, bounds.hi_exp)]
    return [[(libmp.from_man_exp(int(a), int(b)), libmp.from_man_exp(int(c), int(d)))
             for a, b, c, d in zip(*row)] for row in zip(*cols)]
