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
times column sums of |digits|), multiplied exactly too (`_tail`). Results (`Exact`, `ExactInterval`) are exact sums of integer
matrices times powers of two. They leave the layer rounded outward once: `round_out` (any precision),
`float_bounds` (float64 bounds, fast), and `to_arb_mat` / `to_mpf_rows`, the only functions that touch
flint or mpmath (with `interval_from_arb` / `interval_from_mpf`, the way in).
"""

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

import numpy as np

SAFE = 1 << 53            # every integer of magnitude <= 2^53 is a binary64 number
ACC_LIMIT = 1 << 62       # int64 accumulators stay below this (room for one more addition)
MAX_BLOCK = 1 << 21       # the longest inner dimension of one product (b = 16)
CUT_CHUNK = 1 << 17       # entries per block when cutting (cache-sized temporaries)
CACHE_CHUNK = 1 << 15     # entries per chunk when rounding (cache-sized temporaries)
MIN_EXP = -1074           # the lowest bit of a binary64 number
BAND = 20                 # digits per exponent band when cutting (see _cut)
NARROW = 4                # radius digits up to this are bounded by an envelope, larger ones exactly


class BoundViolation(RuntimeError):
    """A bound the exactness proof needs does not hold: a checker bug (exit 3), never a result."""


def _require(holds, what: str):
    if not holds:
        raise BoundViolation(f"exact products: {what}")


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


def row_tops(x: np.ndarray) -> np.ndarray:
    """Per row the least t with |x| < 2^t on the whole row (-1075 for an all-zero row)."""
    top = np.abs(x).max(axis=1, initial=0.0)
    return np.where(top > 0, np.frexp(top)[1], MIN_EXP - 1).astype(np.int64)


# --- cutting into integer digits ----------------------------------------------------------------------

def bits_for(k: int) -> int:
    """The largest b with min(k, 2^21) * 2^(2b) <= 2^53: digits of b bits make every digit product
    of inner dimension <= 2^21 exact (module docstring)."""
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
        self.bound = tuple((int(m.max(initial=0.0)), int(t.max(initial=0.0))) for m, t in zip(self.line_max, self.line_sum))
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
        return {s: (lines, d) for s, lines, d in _scaled_digits(np.ldexp(x, -t), bits, axis, 0)}
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
    red = 1 - axis
    own = np.frexp(np.abs(x).max(axis=red, initial=0.0))[1].astype(np.int64)
    top = own if top is None else np.asarray(top, dtype=np.int64)
    _require(np.all(own <= top), "a line is not below its top")
    parts, step = {}, max(1, CUT_CHUNK // max(1, x.shape[red]))
    for start in range(0, x.shape[axis], step):
        block = x[start:start + step] if axis == 0 else x[:, start:start + step]
        for s, (lines, d) in _block_digits(block, top[start:start + step], bits, axis).items():
            idx = np.flatnonzero(lines)
            if len(idx) < len(lines):
                d = d[idx] if axis == 0 else d[:, idx]
            parts.setdefault(s, []).append((idx + start, d, _digit_stats(d, axis)))
    depth = max(parts, default=-1) + 1
    empty = [(np.zeros(0, np.int64), np.zeros((0, x.shape[1])) if axis == 0 else np.zeros((x.shape[0], 0)),
              (np.zeros(0), np.zeros(0)))]
    got = [parts.get(s, empty) for s in range(depth)]
    index = [np.concatenate([i for i, _, _ in g]) for g in got]
    digits = [np.concatenate([d for _, d, _ in g], axis=axis) for g in got]
    stats = [tuple(np.concatenate([st[c] for _, _, st in g]) for c in range(2)) for g in got]
    return Slices(digits, index, top if scale is None else scale, bits, axis, x.shape, stats)


def cut_rows(x, bits: int, top=None, scale=None) -> Slices:
    """x (exact float64) cut into digits of `bits` bits with one scale per row (a left factor).
    `top` (per row, |x| < 2^top) defaults to the least such; `scale` (default top) labels the cut:
    the matrix it stands for is 2^(scale - top) x."""
    return _cut(np.asarray(x), bits, 0, top, scale)


def cut_cols(x, bits: int) -> Slices:
    """x (exact float64) cut into digits with one scale per column (a right factor)."""
    return _cut(np.asarray(x), bits, 1)


def interval_grid(x: Interval, bits: int):
    """(mid, rad, uniform): x rounded outward to a per-row grid and written as midpoint and radius,
    both cut into S = 52 // bits digits of `bits` bits on the row scale c = t + 1 (|endpoints| < 2^t);
    `uniform`: every row's radius is at most NARROW grid units, or at most twice its smallest.

    With g = c - S bits: lo' = floor(lo 2^-g), hi' = ceil(hi 2^-g). Exact: when every g <= 0 the
    scaling only raises bits; otherwise, where |lo| < 2^g the answer (0, or -1 for lo < 0; 1 or 0 for
    hi) is taken without scaling, and elsewhere lo 2^-g is >= 1 in magnitude (no bit below 2^-52).
    Always |lo 2^-g| < 2^(t-g) = 2^(S bits - 1) <= 2^51. Then mid = floor((lo' + hi') / 2) and
    rad = hi' - mid = ceil((hi' - lo') / 2) are integers of magnitude <= 2^(S bits - 1) (exact in
    float64), and [lo, hi] lies in 2^g [mid - rad, mid + rad]: a grid of 2^-(S bits - 1) of the
    row's magnitude (2^-43 for bits = 22)."""
    _require(1 <= bits <= 26, f"digit width {bits} outside 1..26")
    slices = 52 // bits
    c = np.maximum(row_tops(x.lo), row_tops(x.hi)) + 1
    g = (c - slices * bits)[:, None]
    lo, hi = np.floor(np.ldexp(x.lo, -g)), np.ceil(np.ldexp(x.hi, -g))
    if np.any(g > 0):
        with np.errstate(over="ignore"):
            unit = np.ldexp(1.0, np.minimum(g, 2000).astype(np.int32))
        lo = np.where(np.abs(x.lo) < unit, np.where(x.lo < 0, -1.0, 0.0), lo)
        hi = np.where(np.abs(x.hi) < unit, np.where(x.hi > 0, 1.0, 0.0), hi)
    _require(np.all(lo <= hi), "an interval with its lower end above its upper end")
    mid = np.floor((lo + hi) / 2)
    rad = hi - mid
    top, least = rad.max(axis=1, initial=0.0), rad.min(axis=1, initial=0.0)
    uniform = bool(np.all((top <= NARROW) | (top <= 2 * least)))
    return _integer_cut(mid, bits, slices, c), _integer_cut(rad, bits, slices, c), uniform


def _integer_cut(v, bits: int, count: int, scale) -> Slices:
    """Rows of integers |v| < 2^(count bits) (float64) cut into `count` digits on row scale `scale`:
    the matrix is 2^(scale - count bits) v. Digit s = trunc(rest 2^-(count-1-s)bits), then rest <-
    rest - digit 2^(count-1-s)bits: integers below 2^52 scaled by powers of two, truncated and
    subtracted, every result an integer below 2^52, so nothing rounds."""
    digits, index, stats, rest = [], [], [], v
    for s in range(count):
        shift = (count - 1 - s) * bits
        d = np.trunc(np.ldexp(rest, -shift)) if shift else rest
        if shift:
            rest = rest - np.ldexp(d, shift)
        lines = np.flatnonzero(d.any(axis=1))
        if len(lines) < len(d):
            d = d[lines]
        digits.append(d)
        index.append(lines)
        stats.append(_digit_stats(d, 0))
    return Slices(digits, index, scale, bits, 0, v.shape, stats)


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
        return Exact(tuple((o, m, b, -sg) for o, m, b, sg in self.terms), self.row_scale, self.col_scale, self.unit)

    def __add__(self, other):
        _require(other.unit == self.unit and np.array_equal(other.row_scale, self.row_scale)
                 and np.array_equal(other.col_scale, self.col_scale), "adding results of unequal scales")
        return Exact(self.terms + other.terms, self.row_scale, self.col_scale, self.unit)

    def __sub__(self, other):
        return self + -other

    @property
    def T(self):
        return Exact(tuple((o, m.T, b, sg) for o, m, b, sg in self.terms), self.col_scale, self.row_scale, self.unit)


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
        tail = np.stack([u for u, _ in members], axis=1) @ np.stack([v for _, v in members])
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


# --- leaving the layer: one outward rounding ---------------------------------------------------------

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


def _round_rows(x: Exact, rows, prec: int, min_exp):
    """(lo_man, hi_man, exp) for rows of x: floor and ceiling of |value| at `prec` bits (and no bit
    below 2^min_exp, if given), signed. Digits occupy disjoint bits, so floor(|v| / 2^s) is the sum
    of each digit's floor-shifted part, and the remainder is nonzero iff some digit has a bit below s."""
    digits, neg, base = _limbs(x, rows)
    u = x.unit
    msb = np.full(neg.shape, -1, dtype=np.int64)
    for q in range(len(digits) - 1, -1, -1):
        msb = np.where((msb < 0) & (digits[q] != 0), q * u + _bitlen(digits[q]) - 1, msb)
    scale = base + x.row_scale[rows, None] + x.col_scale[None, :]
    shift = np.maximum(msb + 1 - prec, 0)
    if min_exp is not None:
        shift = np.maximum(shift, min_exp - scale)
    floor, rest = np.zeros(neg.shape, dtype=np.int64), np.zeros(neg.shape, dtype=bool)
    for q, d in enumerate(digits):
        floor += _floor_shift(d, q * u - shift)
        rest |= (d & (np.left_shift(1, np.clip(shift - q * u, 0, u)) - 1)) != 0
    up = floor + rest
    return np.where(neg, -up, floor), np.where(neg, -floor, up), shift + scale


def _round_exact(x: Exact, prec: int, min_exp=None):
    """(lo_man, hi_man, exp): x rounded outward to `prec` <= 62 bits, in chunks of rows."""
    m, n = x.shape
    lo, hi, ex = (np.zeros((m, n), dtype=np.int64) for _ in range(3))
    if x.terms:
        step = max(1, CACHE_CHUNK // max(1, n))
        for start in range(0, m, step):
            rows = slice(start, min(m, start + step))
            lo[rows], hi[rows], ex[rows] = _round_rows(x, rows, prec, min_exp)
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
    return np.where(neg, -total, total), base + x.row_scale[:, None] + x.col_scale[None, :] + np.zeros((m, n), np.int64)


def exact_fractions(x: Exact) -> list:
    """Rows of exact Fractions (tests and audits: one Python object per entry)."""
    total, e = exact_integers(x)
    return [[Fraction(int(v)) * Fraction(2) ** int(s) for v, s in zip(r, es)] for r, es in zip(total, e)]


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
        lo[rows] = _to_float(low[0] - low[2] if low[2] else low[0], low[1], False)
        hi[rows] = _to_float(high[0] + high[3] if high[3] else high[0], high[1], True)
    return lo, hi


def _chunk_total(x: Exact, rows):
    """(X, e, below, above) for rows of x: value 2^-e lies in [X - below, X + above] entrywise.

    With o the largest offset and sigma >= 0 chosen from the measured largest |term at o| so that X
    and X +- (below, above) stay below 2^53: X = sum of the terms at o times 2^sigma + sum over other terms of
    floor(M 2^(o_t - o + sigma)) (each adds 1 to `above`: the floor drops less than one), and e =
    o - sigma + row and column scales. A term with bound * 2^(o_t - o + sigma) < 1 contributes less
    than one unit either way: it is skipped, adding 1 to `below` and to `above`. Every scaled term,
    floor and partial sum is an integer below 2^53 in float64 (int64 below 2^62 when the terms at o
    alone pass 2^53), so nothing rounds."""
    scale = x.row_scale[rows, None] + x.col_scale[None, :]
    if not x.terms:
        return np.zeros(scale.shape), scale, 0, 0
    top = max(o for o, _, _, _ in x.terms)
    peak = sum(int(max(m[rows].max(initial=0), -m[rows].min(initial=0))) for o, m, _, _ in x.terms if o == top)
    lower = sum((b >> (top - o)) + 2 for o, _, b, _ in x.terms if o != top)
    _require(peak + lower < ACC_LIMIT, "a float bound's integer part could overflow")
    sigma = max(0, 52 - (peak + lower).bit_length())       # then |X| 2^sigma < 2^52
    as_float = peak + lower + len(x.terms) <= SAFE
    total = np.zeros(scale.shape, dtype=np.float64 if as_float else np.int64)
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
    return total, scale + (top - sigma), below, above


def _to_float(v, e, up: bool):
    """A float64 <= v 2^e (up: >=) entrywise, for integers v (float64 below 2^53 or int64 below
    2^62): v is shifted right (floor, or ceiling) until it has <= 53 bits and its lowest bit is >=
    2^-1074, so converting it to float64 and scaling by a power of two is exact; beyond the largest
    float the bound saturates outward. A float64 v with every e >= -1074 needs no shift."""
    if v.dtype != np.float64 or e.min(initial=0) < MIN_EXP:
        v = v.astype(np.int64)
        bits = np.frexp(np.abs(v).astype(np.float64))[1]     # may exceed the bit length by one: safe
        sh = np.maximum(np.maximum(bits - 53, MIN_EXP - e), 0)
        cut = np.minimum(sh, 63)           # |v| < 2^62: a shift by 63 already gives floor (ceil) 0 or -1 (1)
        v, e = (-((-v) >> cut) if up else v >> cut).astype(np.float64), e + sh  # |v| <= 2^53: exact
    if e.max(initial=0) <= 1024 - 54:
        return np.ldexp(v, e.astype(np.int32))
    with np.errstate(over="ignore"):
        f = np.ldexp(v, np.minimum(e, 2000).astype(np.int32))
    big = np.finfo(np.float64).max
    return np.where(np.isinf(f) & ((f < 0) if up else (f > 0)), -big if up else big, f)


# --- the way in from, and out to, the interval libraries --------------------------------------------

def _end_float(man: int, exp: int, up: bool) -> float:
    """The float64 next below (up: above) man 2^exp, exactly; +-inf beyond the float range."""
    s = max(abs(man).bit_length() - 53, MIN_EXP - exp, 0)
    m = -((-man) >> s) if up else man >> s
    try:
        return math.ldexp(float(m), exp + s)       # m has <= 53 bits, lowest bit >= 2^-1074: exact
    except OverflowError:
        return math.inf if m > 0 else -math.inf


def interval_from_arb(mat) -> Interval:
    """The endpoints of a python-flint arb_mat, rounded outward to float64 (one step per entry)."""
    m, n = mat.nrows(), mat.ncols()
    ends = []
    for x in mat.entries():
        if not x.is_finite():
            raise ValueError("a ball is not finite")
        (lm, le), (hm, he) = x.lower().man_exp(), x.upper().man_exp()
        ends.append((_end_float(int(lm), int(le), False), _end_float(int(hm), int(he), True)))
    pairs = np.array(ends, dtype=np.float64).reshape(m, n, 2)
    return Interval(pairs[..., 0], pairs[..., 1])


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


def to_arb_mat(r: Rounded):
    """A python-flint arb_mat whose balls contain [lo, hi] entrywise: with a common exponent E, the
    endpoints are Python ints L, H (value = L 2^E); the ball is L 2^E + (H - L) 2^E [0, 1], formed by
    Arb's own outward-rounded matrix operations (at its working precision)."""
    import flint

    m, n = r.lo_man.shape
    if not m or not n:
        return flint.arb_mat(m, n)
    base = int(min(r.lo_exp.min(), r.hi_exp.min()))
    lo = [int(v) << int(s) for v, s in zip(r.lo_man.ravel().tolist(), (r.lo_exp - base).ravel().tolist())]
    two = flint.arb(1).mul_2exp(base) if hasattr(flint.arb, "mul_2exp") else flint.arb(2) ** base
    out = flint.arb_mat(m, n, lo) * two
    if np.array_equal(r.lo_man, r.hi_man) and np.array_equal(r.lo_exp, r.hi_exp):
        return out
    hi = [int(v) << int(s) for v, s in zip(r.hi_man.ravel().tolist(), (r.hi_exp - base).ravel().tolist())]
    width = flint.arb_mat(m, n, [h - lo_v for h, lo_v in zip(hi, lo)])
    return out + width * (two * flint.arb(0).union(flint.arb(1)))


def to_mpf_rows(r: Rounded) -> list:
    """Rows of (lo, hi) mpmath raw mpf pairs, exact (`iv.make_mpf` takes them as they are)."""
    from mpmath import libmp

    cols = [a.tolist() for a in (r.lo_man, r.lo_exp, r.hi_man, r.hi_exp)]
    return [[(libmp.from_man_exp(int(a), int(b)), libmp.from_man_exp(int(c), int(d)))
             for a, b, c, d in zip(*row)] for row in zip(*cols)]
