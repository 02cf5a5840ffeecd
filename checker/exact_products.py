"""Exact products of binary-rational matrices on float64 BLAS: no operation of the layer rounds.

A stored weight (float16, bfloat16, float32, float64) is a binary rational, and so is every float64.
The layer's inputs are float64 matrices read as the exact rationals they hold (`exact_matrix`), and
interval matrices with float64 endpoints (`Interval`). A product cuts each factor into `Slices`:
integer digit matrices of b bits with one scale per row (left factor) or per column (right factor),

    A[i, l] = 2^ra_i * sum_s a_s[i, l] 2^-(s+1)b,   W[l, j] = 2^cw_j * sum_t w_t[l, j] 2^-(t+1)b,
    (A W)[i, j] = 2^(ra_i + cw_j) * sum_(s,t) (a_s @ w_t)[i, j] 2^-(s+t+2)b.

Why a digit product a_s @ w_t is exact (Ozaki, Ogita, Oishi and Rump 2012). Its entries are sums of
k products of integers. Every partial sum of an entry -- over any subset of the k products, in any
order or grouping, with or without fused multiply-add -- is an integer of magnitude at most
sum_l |a_s[i, l]| |w_t[l, j]| <= B := min(k alpha beta, R beta, alpha C), with alpha, beta the largest
|digit| of a_s, w_t and R, C the largest row sum of |a_s| and column sum of |w_t| (all measured).
Every integer of magnitude <= 2^53 is a binary64 number, and an IEEE-754 addition, multiplication or
FMA whose exact result is a binary64 number returns it, in every rounding mode. So if B <= 2^53 no
operation of the product rounds. `_require_exact` checks B <= 2^53 before every product; a violation
raises `BoundViolation` (a checker bug: exit 3, never a result). The digit width makes it hold a priori:
|digits| <= 2^b - 1, so B <= k alpha beta < k 2^2b, and `bits_for(k)` is the largest b with
k 2^2b <= 2^53 (b = 22 for k = 512, 21 for 2048, 19 for 30522); an inner dimension beyond 2^21 is
cut into blocks of 2^21 (b = 16), each exact by the same argument. Products at one offset are summed
in float64 while the sum of their bounds is <= 2^53 (then every partial sum is again an integer below
2^53), else in int64 (bounds tracked below 2^62). The argument needs a classical product, each entry a
sum of the k products: numpy's matmul and dgemm of the reference BLAS, OpenBLAS, BLIS or MKL; a
Strassen-type algorithm would not do.

Cutting uses only float operations whose exact result is representable, so they cannot round:
scaling by a power of two that neither overflows nor leaves a bit below 2^-1074, trunc, floor, ceil,
and y - trunc(y) (the fractional part of a float is a float); see `_cut` and `interval_grid`.

Interval operands are rounded outward to a grid of 2^-(S b - 1) of their row's magnitude (S = 52 // b
digits: the finest grid of float64 integers) and written as midpoint and radius on that grid; for a
point W, {X W : lo <= X <= hi} lies in mid W +- rad |W| entrywise. Digit pairs with s + t < `keep`
are multiplied exactly; the others and the radius term are bounded by rank-one envelopes (row maxima
times column sums of |digits|), multiplied exactly too (`_tail`). Results (`Exact`,
`ExactInterval`) are exact sums of integer matrices times powers of two. They leave the layer
rounded outward once, by `exact_rounding`
(`round_out` at any precision, `float_bounds` as float64, `to_arb_mat` / `to_mpf_rows` into the
interval libraries, and `interval_from_arb` / `interval_from_mpf` the way in); this module touches
neither flint nor mpmath.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

SAFE = 1 << 53            # every integer of magnitude <= 2^53 is a binary64 number
ACC_LIMIT = 1 << 62       # int64 accumulators stay below this (room for one more addition)
MAX_BLOCK = 1 << 21       # the longest inner dimension of one product (b = 16)
CUT_CHUNK = 1 << 17       # entries per block when cutting (cache-sized temporaries)
MIN_EXP = -1074           # the lowest bit of a binary64 number
BAND = 20                 # digits per exponent band when cutting (see _cut)
NARROW = 4                # radius digits up to this are bounded by an envelope, larger ones exactly


class BoundViolation(RuntimeError):
    """A bound the exactness proof needs does not hold: a checker bug (exit 3), never a result."""


def _require(holds, what: str):
    if not holds:
        raise BoundViolation(f"exact products: {what}")


def _scaled(x, exps, axis: int):
    """x 2^exps with one exponent per row (axis 0) or column (axis 1), for callers whose exact
    result is representable: a multiplication by the power of two 2^exps when that is a normal
    float (the same exact result, much faster than ldexp with an exponent array), else ldexp."""
    exps = np.asarray(exps)
    shaped = exps[:, None] if axis == 0 else exps[None, :]
    if exps.size and -1022 <= exps.min() and exps.max() <= 1023:
        return x * np.ldexp(1.0, shaped.astype(np.int32))
    return np.ldexp(x, shaped)


# --- inputs: float64 matrices as the exact rationals they hold --------------------------------------

def exact_matrix(a) -> np.ndarray:
    """A float16/32/64 array (a vector becomes a row) as a float64 matrix: widening is exact, so each
    entry is the same binary rational. Signed zeros are 0. Non-finite entries are refused."""
    a = np.asarray(a)
    if a.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"stored weights must be float16/32/64, not {a.dtype}")
    if a.ndim > 2 or not np.isfinite(a).all():
        raise ValueError("weights must be a finite vector or matrix")
    return np.atleast_2d(a.astype(np.float64))


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


# --- cutting into integer digits ----------------------------------------------------------------------

def bits_for(k: int) -> int:
    """b = floor((53 - ceil(log2 kb)) / 2) for kb = min(k, 2^21), so kb 2^(2b) <= 2^53: digits of b
    bits make every digit product of inner dimension <= 2^21 exact (module docstring)."""
    kb = max(1, min(int(k), MAX_BLOCK))
    return (53 - (kb - 1).bit_length()) // 2


class Slices:
    """A point matrix cut into integer digits along rows (axis 0, a left factor) or columns (axis 1, a
    right factor): with scale c per row/column, value = 2^c * sum_s digits_s * 2^-(s+1)bits.

    `digits[s]` (float64 holding integers; rows x k for axis 0, k x columns for axis 1) covers the
    rows or columns `index[s]`; digit s is zero elsewhere. Per digit and line, `line_max` and
    `line_sum` of |digit|; `bound[s]` = (largest |digit|, largest line sum). The statistics are
    measured on the digits (here, or by the cutter while a block is in cache)."""

    def __init__(self, digits, index, scale, bits: int, axis: int, shape, stats=None):
        self.digits, self.index, self.scale = tuple(digits), tuple(index), np.asarray(scale, dtype=np.int64)
        self.bits, self.axis, self.shape = bits, axis, tuple(shape)
        if stats is None:
            stats = [_digit_stats(d, axis, check=True) for d in self.digits]
        self.line_max, self.line_sum = (tuple(col) for col in zip(*stats)) if stats else ((), ())
        self.bound = tuple((int(m.max(initial=0.0)), int(t.max(initial=0.0)))
                           for m, t in zip(self.line_max, self.line_sum))
        _require(all(b < SAFE and t < SAFE for b, t in self.bound), "a digit or a line sum reaches 2^53")

    @property
    def T(self):
        """The same cut read as the transposed matrix's (rows and columns swapped)."""
        return Slices([d.T for d in self.digits], self.index, self.scale, self.bits, 1 - self.axis,
                      self.shape[::-1], list(zip(self.line_max, self.line_sum)))

    @cached_property
    def abs_upper(self):
        """One digit u >= 0 with |value| <= 2^c u 2^-bits entrywise: u = |d_0| + [a lower digit != 0]
        (the lower digits add less than one unit of digit 0)."""
        lines, k = self.shape[self.axis], self.shape[1 - self.axis]
        up, more = np.zeros((lines, k)), np.zeros((lines, k), dtype=bool)
        for s, (d, idx) in enumerate(zip(self.digits, self.index)):
            along = d if self.axis == 0 else d.T                    # lines x k
            if s == 0:
                up[idx] = np.abs(along)
            else:
                more[idx] |= along != 0
        up += more
        keep = np.flatnonzero(up.any(axis=1))
        if len(keep) < lines:
            up = up[keep]
        return Slices([up if self.axis == 0 else up.T], [keep], self.scale, self.bits, self.axis, self.shape)


def _digit_stats(d, axis: int, check: bool = False):
    """(line max, line sum) of |d| along the lines of `axis` (sums exact: integers < 2^53); with
    `check`, also that d holds integers (digits made elsewhere than by the cutter)."""
    a = np.abs(d)
    red = 1 - axis
    if check:
        _require(d.dtype == np.float64 and np.array_equal(a, np.floor(a)), "a digit is not an integer")
    return a.max(axis=red, initial=0.0), a.sum(axis=red)


def _scaled_digits(y, bits: int, axis: int, first: int):
    """[(s, lines, digit)] for a block y (|y| < 1 entrywise, every entry exact): y <- y 2^bits (exact:
    |y 2^bits| < 2^bits and no bit is lost), digit = trunc(y) (exact), y <- y - digit (exact: the
    fractional part of a float is a float), while a line has bits left; `lines` (bool, per line)
    marks the lines that still had bits, the others have digit 0."""
    red, s, out = 1 - axis, first, []
    lines = y.any(axis=red)
    while lines.any():
        y = np.ldexp(y, bits)
        d = np.trunc(y)
        y -= d
        out.append((s, lines, d))
        lines, s = y.any(axis=red), s + 1
    return out


def _block_digits(x, top, bits: int, axis: int):
    """{s: (lines, digit)} with x = 2^top sum_s digit_s 2^-(s+1)bits on each line (|x| < 2^top).

    Entries are grouped in exponent bands of BAND * bits bits below their line's top (band of x:
    (top - e) // (BAND bits), |x| < 2^e <= 2^top), band q scaled by 2^(q BAND bits - top). The scaled
    entries are below 1 (e <= top - q BAND bits) and keep every bit: the lowest bit of x is >= e - 53
    > top - (q+1) BAND bits - 53, so the scaled lowest bit is > -BAND bits - 53 >= -573 > -1074.
    Float32 and narrower weights, and realistic float64, form one band per line."""
    red, width = 1 - axis, BAND * bits
    t = top[:, None] if axis == 0 else top[None, :]
    mag = np.abs(x)
    smallest = np.min(mag, axis=red, initial=np.inf, where=mag > 0)
    low = np.where(np.isfinite(smallest), np.frexp(np.where(np.isfinite(smallest), smallest, 1.0))[1], top)
    if np.all(top - low < width):
        return {s: (lines, d) for s, lines, d in _scaled_digits(_scaled(x, -top, axis), bits, axis, 0)}
    band = np.where(x == 0, 0, (t - np.frexp(x)[1]) // width)
    out = {}
    for q in range(int(band.max()) + 1):
        y = np.ldexp(np.where(band == q, x, 0.0), q * width - t)
        for s, lines, d in _scaled_digits(y, bits, axis, q * BAND):
            if s in out:   # several bands reach digit s: their entries are disjoint
                out[s] = (out[s][0] | lines, out[s][1] + d)
            else:
                out[s] = (lines, d)
    return out


def _cut(x, bits: int, axis: int, top=None, scale=None) -> Slices:
    """x (exact float64) cut into digits of `bits` bits along `axis` (module docstring), by blocks of
    lines; each block's digits are compressed to the lines that have them and measured in cache."""
    _require(1 <= bits <= 26, f"digit width {bits} outside 1..26")
    _finite_float64(x)
    red = 1 - axis
    peak = np.abs(x).max(axis=red, initial=0.0)
    own = np.frexp(peak)[1].astype(np.int64)
    top = own if top is None else np.asarray(top, dtype=np.int64)
    _require(np.all((own <= top) | (peak == 0)), "a line is not below its top")   # a zero line has no digits
    parts, step = {}, max(1, CUT_CHUNK // max(1, x.shape[red]))
    for start in range(0, x.shape[axis], step):
        block = x[start:start + step] if axis == 0 else x[:, start:start + step]
        for s, (lines, d) in _block_digits(block, top[start:start + step], bits, axis).items():
            idx = np.flatnonzero(lines)
            if len(idx) < len(lines):
                d = d[idx] if axis == 0 else d[:, idx]
            parts.setdefault(s, []).append((idx + start, d, _digit_stats(d, axis)))
    return _assemble(parts, x.shape, axis, top if scale is None else scale, bits)


def _assemble(parts, shape, axis: int, scale, bits: int) -> Slices:
    """The Slices of digit blocks {s: [(global line index, digits, stats)]}, joined along the lines."""
    depth = max(parts, default=-1) + 1
    empty = [(np.zeros(0, np.int64), np.zeros((0, shape[1])) if axis == 0 else np.zeros((shape[0], 0)),
              (np.zeros(0), np.zeros(0)))]
    got = [parts.get(s, empty) for s in range(depth)]
    index = [np.concatenate([i for i, _, _ in g]) for g in got]
    digits = [np.concatenate([d for _, d, _ in g], axis=axis) for g in got]
    stats = [tuple(np.concatenate([st[c] for _, _, st in g]) for c in range(2)) for g in got]
    return Slices(digits, index, scale, bits, axis, shape, stats)


def _finite_float64(x):
    """The layer's contract: finite float64 matrices (a float32 array would make ldexp, trunc and
    then BLAS work in binary32, where the 2^53 argument does not apply)."""
    _require(isinstance(x, np.ndarray) and x.dtype == np.float64 and x.ndim == 2, "not a float64 matrix")
    _require(np.isfinite(x).all(), "a non-finite entry")


def cut_rows(x, bits: int, top=None, scale=None) -> Slices:
    """x (exact float64) cut into digits of `bits` bits with one scale per row (a left factor).
    `top` (per row, |x| < 2^top) defaults to the least such; `scale` (default top) labels the cut:
    the matrix it stands for is 2^(scale - top) x."""
    return _cut(np.asarray(x), bits, 0, top, scale)


def cut_cols(x, bits: int, top=None) -> Slices:
    """x (exact float64) cut into digits with one scale per column (a right factor); `top` (per
    column, |x| < 2^top) defaults to the least such."""
    return _cut(np.asarray(x), bits, 1, top)


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


# --- exact products ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Exact:
    """value[i, j] = 2^(row_scale[i] + col_scale[j]) * sum over terms (offset, M, bound, sign) of
    sign M[i, j] 2^offset; every M holds integers (float64 with |M| <= bound <= 2^53, or int64 with
    |M| <= bound < 2^62), sign is +1 or -1 (so negating copies nothing) and every offset is a
    multiple of `unit` (the digit width). Nothing was rounded."""

    terms: tuple
    row_scale: np.ndarray
    col_scale: np.ndarray
    unit: int

    @property
    def shape(self):
        return (len(self.row_scale), len(self.col_scale))

    def __neg__(self):
        terms = tuple((o, m, b, -sg) for o, m, b, sg in self.terms)
        return Exact(terms, self.row_scale, self.col_scale, self.unit)

    def __add__(self, other):
        _require(other.unit == self.unit and np.array_equal(other.row_scale, self.row_scale)
                 and np.array_equal(other.col_scale, self.col_scale), "adding results of unequal scales")
        return Exact(self.terms + other.terms, self.row_scale, self.col_scale, self.unit)

    def __sub__(self, other):
        return self + -other

    @property
    def T(self):
        terms = tuple((o, m.T, b, sg) for o, m, b, sg in self.terms)
        return Exact(terms, self.col_scale, self.row_scale, self.unit)


@dataclass(frozen=True)
class ExactInterval:
    """lo <= (the product at every point of the operands) <= hi entrywise; lo and hi exact."""

    lo: Exact
    hi: Exact

    @property
    def shape(self):
        return self.lo.shape

    @property
    def T(self):
        return ExactInterval(self.lo.T, self.hi.T)


def _require_exact(bound: int):
    """The exactness condition of one float64 product (module docstring): its bound B <= 2^53."""
    _require(bound <= SAFE, f"a digit product with partial sums up to {bound} > 2^53 could round")


def _pair_bound(a: Slices, s: int, b: Slices, t: int, kb: int) -> int:
    """B = min(kb alpha beta, R beta, alpha C) for digits a_s, b_t (module docstring)."""
    (alpha, rows), (beta, cols) = a.bound[s], b.bound[t]
    return min(kb * alpha * beta, rows * beta, alpha * cols)


def _accumulate(groups, off, rows, cols, part, bound, shape):
    """groups[off] += part (scattered to rows x cols): in float64 while the bounds sum to <= 2^53
    (every partial sum an integer below 2^53), else in int64 (bounds below 2^62)."""
    if off not in groups:
        full = part if part.shape == shape else np.zeros(shape)
        if full is not part:
            _add_block(full, rows, cols, part)
        groups[off] = [full, bound]
        return
    g = groups[off]
    g[1] += bound
    if g[0].dtype == np.float64 and g[1] > SAFE:
        g[0] = g[0].astype(np.int64)
    _require(g[1] < ACC_LIMIT, "an int64 accumulator could overflow")
    _add_block(g[0], rows, cols, part if g[0].dtype == np.float64 else part.astype(np.int64))


def _add_block(target, rows, cols, part):
    """target[rows][:, cols] += part, without fancy indexing when rows or columns are all of them."""
    all_rows, all_cols = len(rows) == target.shape[0], len(cols) == target.shape[1]
    if all_rows and all_cols:
        target += part
    elif all_rows:
        target[:, cols] += part
    elif all_cols:
        target[rows] += part
    else:
        target[np.ix_(rows, cols)] += part


def _digit_products(a: Slices, b: Slices, pairs) -> Exact:
    """Exact sum over (s, t) in `pairs` of a_s @ b_t 2^-(s+t+2)bits, one term per offset."""
    _require(a.axis == 0 and b.axis == 1 and a.bits == b.bits, "factors cut for the wrong sides")
    _require(a.shape[1] == b.shape[0], f"inner dimensions {a.shape[1]} and {b.shape[0]} differ")
    (m, k), n = a.shape, b.shape[1]
    groups = {}
    for s, t in pairs:
        rows, cols = a.index[s], b.index[t]
        if not len(rows) or not len(cols):
            continue
        for start in range(0, k, MAX_BLOCK):
            stop = min(k, start + MAX_BLOCK)
            bound = _pair_bound(a, s, b, t, stop - start)
            _require_exact(bound)
            part = a.digits[s][:, start:stop] @ b.digits[t][start:stop, :]
            _accumulate(groups, -(s + t + 2) * a.bits, rows, cols, part, bound, (m, n))
    return Exact(tuple((o, *groups[o], 1) for o in sorted(groups)), a.scale, b.scale, a.bits)


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
    """The exact product A B of point matrices cut by `cut_rows` (A) and `cut_cols` (B): an Exact.
    With `keep` = S, only digit pairs with s + t < S are multiplied and the others bounded by
    envelopes (fewer products): an ExactInterval around A B."""
    pairs = [(s, t) for s in range(len(a.digits)) for t in range(len(b.digits))]
    centre = _digit_products(a, b, [(s, t) for s, t in pairs if keep is None or s + t < keep])
    if keep is None:
        return centre
    tail = _tail([_envelope(a, s, b, t) for s, t in pairs if s + t >= keep], a.scale, b.scale, a.bits)
    return ExactInterval(centre - tail, centre + tail)


def interval_product(x: Interval, w: Slices, keep: int = 2) -> ExactInterval:
    """Exact bounds of X W over every point X of the interval matrix x, for a point W cut by
    `cut_cols`: x is rounded outward to a grid of 2^-(S bits - 1) of each row's magnitude
    (`interval_grid`); then mid W +- rad U with U = `w.abs_upper` >= |W|. Digit pairs of mid W with
    s + t < keep are multiplied exactly, the others bounded by envelopes; so is rad U when the radius
    is uniform (each row's digit envelopes sum to at most max rad + 2^bits grid units, so to at most
    2 max rad when rad has two digits, and max rad <= 2 rad on a row uniform within 2x: at most 4
    times the exact term; or it is below NARROW units), else rad U is multiplied exactly. Cost: the
    pairs s + t < keep, 3 float64 products for keep = 2 (the bounded pairs then add about
    k 2^-2bits of the row-column scale to the width), 4 to 5 for keep = 3 (then the grid dominates)."""
    mid, rad, uniform = interval_grid(x, w.bits)
    pairs = [(s, t) for s in range(len(mid.digits)) for t in range(len(w.digits))]
    centre = _digit_products(mid, w, [(s, t) for s, t in pairs if s + t < keep])
    upper = w.abs_upper
    envelopes = [_envelope(mid, s, w, t) for s, t in pairs if s + t >= keep]
    radius_pairs = [(s, 0) for s in range(len(rad.digits))] if upper.digits else []
    if uniform:
        envelopes += [_envelope(rad, s, upper, t) for s, t in radius_pairs]
        radius_pairs = []
    radius = _digit_products(rad, upper, radius_pairs) + _tail(envelopes, mid.scale, w.scale, w.bits)
    return ExactInterval(centre - radius, centre + radius)


def point_interval_product(w: Slices, x: Interval, keep: int = 2) -> ExactInterval:
    """Exact bounds of W X for a point W cut by `cut_rows` and an interval matrix x: (W X)^T = X^T W^T."""
    return interval_product(x.T, w.T, keep).T
