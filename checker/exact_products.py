"""Exact products of binary-rational matrices on float64 BLAS: no operation of the layer rounds.

A stored weight (float16, bfloat16, float32, float64) is a binary rational, and so is every float64.
The layer's inputs are float64 matrices read as the exact rationals they hold (`exact_matrix`). A
product cuts each factor into `Slices`: integer digit matrices of b bits with one scale per row (left
factor) or per column (right factor),

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
scaling by a power of two that neither overflows nor leaves a bit below 2^-1074, trunc, and
y - trunc(y) (the fractional part of a float is a float); see `_cut`.

Every product here is of point matrices (`point_product`); an interval operand is multiplied by its
float64 ends, as point matrices, in `exact_backend.interval_times_point`. Results (`Exact`, and
`ExactInterval` for a pair of ends) are exact sums of integer matrices times powers of two. They leave
the layer rounded outward once, by `exact_rounding` (`split_bounds` as two float64 parts per end,
`float_bounds` as one, `to_arb_mat` / `to_mpf_rows` into the interval libraries, and `ends_from_arb` /
`ends_from_mpf` the way in); this module touches neither flint nor mpmath.
"""

from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np

SAFE = 1 << 53            # every integer of magnitude <= 2^53 is a binary64 number
ACC_LIMIT = 1 << 62       # int64 accumulators stay below this (room for one more addition)
MAX_BLOCK = 1 << 21       # the longest inner dimension of one product (b = 16)
CUT_CHUNK = 1 << 17       # entries per block when cutting (cache-sized temporaries)
MIN_EXP = -1074           # the lowest bit of a binary64 number
BAND = 20                 # digits per exponent band when cutting (see _cut)


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

def _digit_stats(d, axis: int, check: bool = False):
    """(line max, line sum) of |d| along the lines of `axis` (sums exact: integers < 2^53); with
    `check`, also that d holds integers (digits made elsewhere than by the cutter)."""
    a = np.abs(d)
    red = 1 - axis
    if check:
        _require(d.dtype == np.float64 and np.array_equal(a, np.floor(a)), "a digit is not an integer")
    return a.max(axis=red, initial=0.0), a.sum(axis=red)


def _scaled_digits(y, bits: int, axis: int, first: int):
    """[(s, lines, digit)] for a block y (|y| < 1 entrywise, every entry exact; y is this function's to
    overwrite): y <- y 2^bits (a product with the float 2^bits, exact: |y 2^bits| < 2^bits and no bit is lost),
    digit = trunc(y) (exact), y <- y - digit (exact: the fractional part of a float is a float), while a line
    has bits left; `lines` (bool, per line) marks the lines that still had bits, the others have digit 0."""
    red, s, out, scale = 1 - axis, first, [], 2.0 ** bits
    lines = y.any(axis=red)
    while lines.any():
        np.multiply(y, scale, out=y)
        d = np.trunc(y)
        np.subtract(y, d, out=y)
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
            stats = _digit_stats(d, axis)
            idx = np.flatnonzero(stats[0])     # lines whose digit s is all zero (max |d| = 0) add nothing to a product
            if len(idx) < len(lines):
                d, stats = (d[idx] if axis == 0 else d[:, idx]), (stats[0][idx], stats[1][idx])
            parts.setdefault(s, []).append((idx + start, d, stats))
    return _assemble(parts, x.shape, axis, top if scale is None else scale, bits)


def _assemble(parts, shape, axis: int, scale, bits: int) -> Slices:
    """The Slices of digit blocks {s: [(global line index, digits, stats)]}, joined along the lines."""
    depth = max(parts, default=-1) + 1
    empty = [(np.zeros(0, np.int64), np.zeros((0, shape[1])) if axis == 0 else np.zeros((shape[0], 0)),
              (np.zeros(0), np.zeros(0)))]
    got = [parts.get(s, empty) for s in range(depth)]
    def joined(arrays, along=0):     # one block: its own arrays (no copy)
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=along)
    index = [joined([i for i, _, _ in g]) for g in got]
    digits = [joined([d for _, d, _ in g], axis) for g in got]
    stats = [tuple(joined([st[c] for _, _, st in g]) for c in range(2)) for g in got]
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


def cut_sum_rows(parts, bits: int, top):
    """The exact sum of float64 parts (m x k each, |part| < 2^top per row) cut as one left factor on the scale
    `top`, or None where its first digit would pass 2^bits. Each part is cut (`cut_rows`: digits below 2^bits),
    the digits of one index s added, then carried from the last digit up: q = trunc(d_s 2^-bits), d_s -= q 2^bits,
    d_(s-1) += q. These are float operations on integers below 2^53 with exact results (sums, power-of-two
    scalings of integers by 2^-bits, bits <= 26, trunc), and a carry keeps the value sum_s d_s 2^-(s+1)bits,
    so the digits hold the parts' exact sum, with |d_s| < 2^bits for s >= 1. |d_0| <= 2^bits is required
    (else None: the caller cuts each part): then with right digits below 2^bits every partial sum is below
    k 2^(2 bits) <= 2^53 (`bits_for`), and the measured bounds are checked before each product as always. A
    product then has one row per digit of the sum instead of one per digit of each part."""
    m, k = parts[0].shape
    full = {}
    for p in parts:
        cut = cut_rows(p, bits, top)
        for s, (idx, d) in enumerate(zip(cut.index, cut.digits)):
            if len(idx):
                full.setdefault(s, np.zeros((m, k)))[idx] += d
    for s in range(max(full, default=0), 0, -1):
        q = np.trunc(full[s] * 2.0 ** -bits) if s in full else None     # products with powers of two: exact here
        if q is not None and q.any():
            full[s] = full[s] - q * 2.0 ** bits
            full[s - 1] = full[s - 1] + q if s - 1 in full else q
    if 0 in full and np.abs(full[0]).max(initial=0.0) > 2.0 ** bits:
        return None
    out = {}
    for s, d in full.items():       # each digit compressed to the rows that have it, as `_cut` does
        i = np.flatnonzero(d.any(axis=1))
        out[s] = [(i, d[i], _digit_stats(d[i], 0))]
    return _assemble(out, (m, k), 0, np.asarray(top, dtype=np.int64), bits)


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

    def __add__(self, other):
        _require(other.unit == self.unit and np.array_equal(other.row_scale, self.row_scale)
                 and np.array_equal(other.col_scale, self.col_scale), "adding results of unequal scales")
        return Exact(self.terms + other.terms, self.row_scale, self.col_scale, self.unit)

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
    if all_cols and rows[-1] - rows[0] + 1 == len(rows):   # sorted, so a run of rows: a view, no gather
        target[rows[0]:rows[-1] + 1] += part
    elif all_rows and all_cols:
        target += part
    elif all_rows:
        target[:, cols] += part
    elif all_cols:
        target[rows] += part
    else:
        target[np.ix_(rows, cols)] += part


def _digit_products(a: Slices, b: Slices, pairs) -> Exact:
    """Exact sum over (s, t) in `pairs` of a_s @ b_t 2^-(s+t+2)bits, one term per offset. The left digits of
    one right digit t are stacked and multiplied in one BLAS call (`_stacked`): each entry of the stacked
    product is still one dot product a_s[i, :] . b_t[:, j] of the pair (s, t), so its own bound applies."""
    _require(a.axis == 0 and b.axis == 1 and a.bits == b.bits, "factors cut for the wrong sides")
    _require(a.shape[1] == b.shape[0], f"inner dimensions {a.shape[1]} and {b.shape[0]} differ")
    (m, k), n = a.shape, b.shape[1]
    groups, by_t = {}, {}
    for s, t in pairs:
        if len(a.index[s]) and len(b.index[t]):
            by_t.setdefault(t, []).append(s)
    for start in range(0, k, MAX_BLOCK):
        stop, stacks = min(k, start + MAX_BLOCK), {}
        for t, ss in by_t.items():
            for s, part in _stacked(a, ss, b.digits[t], start, stop, stacks):
                bound = _pair_bound(a, s, b, t, stop - start)
                _require_exact(bound)
                _accumulate(groups, -(s + t + 2) * a.bits, a.index[s], b.index[t], part, bound, (m, n))
    return Exact(tuple((o, *groups[o], 1) for o in sorted(groups)), a.scale, b.scale, a.bits)


def _stacked(a: Slices, ss: list, right, start: int, stop: int, stacks: dict):
    """[(s, a_s[:, start:stop] @ right[start:stop])] for the left digits ss, by one product of the digits
    stacked row-wise (made once per ss in `stacks`; a single digit: its own product), then cut back into
    each digit's rows."""
    if len(ss) == 1:
        return [(ss[0], a.digits[ss[0]][:, start:stop] @ right[start:stop])]
    key = tuple(ss)
    if key not in stacks:
        stacks[key] = np.vstack([a.digits[s][:, start:stop] for s in ss])
    whole = stacks[key] @ right[start:stop]
    ends = np.cumsum([0] + [a.digits[s].shape[0] for s in ss])
    return [(s, whole[lo:hi]) for s, lo, hi in zip(ss, ends[:-1], ends[1:])]


def point_product(a: Slices, b: Slices) -> Exact:
    """The exact product A B of point matrices cut by `cut_rows` (A) and `cut_cols` (B): every digit
    pair multiplied exactly (`_digit_products`)."""
    pairs = [(s, t) for s in range(len(a.digits)) for t in range(len(b.digits))]
    return _digit_products(a, b, pairs)


# --- exact entrywise products (the forward pass's LayerNorm scaling and rotations) ---------------------

def _line_top(parts, axis: int):
    """Per line (row for axis 0, column for axis 1) the least t with |part| < 2^t for every part (a part
    that is zero on a line does not count; 0 for a line that is zero in every part)."""
    red, low = 1 - axis, np.iinfo(np.int64).min
    for p in parts:
        _finite_float64(p)
    peaks = [np.abs(p).max(axis=red, initial=0.0) for p in parts]
    top = np.max([np.where(x > 0, np.frexp(x)[1].astype(np.int64), np.int64(low)) for x in peaks], axis=0)
    return np.where(top == low, 0, top)


def _line_digits(parts, top, axis: int, bits: int):
    """[(s, digit)]: the float64 parts (one matrix, or a column (axis 0) / row (axis 1) to be broadcast)
    cut on the scale `top` per line, each part into the digits of `bits` bits that are not all zero
    (`_block_digits`: exact); part p = 2^top sum_s digit_s 2^-(s+1)bits."""
    out = []
    for p in parts:
        out += [(s, d) for s, (_, d) in _block_digits(p, top, bits, axis).items() if d.any()]
    return out


def entrywise(rows, cols=(), bits: int | None = None) -> Exact:
    """The exact entrywise product of factors, each a tuple of float64 parts (its exact sum): `rows`
    factors scaled per row (m x n matrices or m x 1 columns), `cols` per column (1 x n rows), broadcast
    to m x n (`entrywise_sum` of one product)."""
    return entrywise_sum([(rows, cols)], bits)


def entrywise_sum(products, bits: int | None = None) -> Exact:
    """The exact sum of entrywise products [(rows, cols)] (as `entrywise`; every product has the same
    number of row and of column factors, and factor i of every product is cut on one scale per line,
    the largest; a factor may come already cut, a `LineCut` on that scale). Every digit product is an integer of
    magnitude < 2^(K bits) <= 2^53 for K factors
    (bits = floor(48 / K) by default), computed in float64 (exact: an integer below 2^53; the first factor's
    digit times `_partials` of the others, products of one offset summed there while exact) and summed per
    offset in float64 while the sum of their bounds is <= 2^53 (every partial sum an integer below 2^53),
    then in int64 with the bound tracked below 2^62."""
    n_rows, n_cols = len(products[0][0]), len(products[0][1])
    k = n_rows + n_cols
    bits = bits or entry_bits(k)
    _require(k * bits <= 53 and all(len(r) == n_rows and len(c) == n_cols for r, c in products),
             f"{k} factors of {bits}-bit digits could round")
    shape, tops, cuts = _factor_cuts(products, n_rows, bits)
    groups, bound = {}, {}
    for (r, c), cut in zip(products, cuts):
        square = n_rows == 2 and not n_cols and r[0] is r[1]     # x * x: each digit pair once, doubled
        rest = None if square else _partials(cut[1:], bits)     # the other factors' products: the same for every d0
        for i, (s0, d0, p0) in enumerate(cut[0]):
            pairs = [(s + 1, d * 2.0 if j else d, p * (2 if j else 1)) for j, (s, d, p) in enumerate(cut[1][i:])] \
                if square else rest
            for o, part, peak in pairs:
                off, peak = -(s0 + 1 + o) * bits, p0 * peak
                bound[off] = bound.get(off, 0) + peak
                _require(peak <= SAFE and bound[off] < ACC_LIMIT, "an entrywise product or sum could round")
                if off not in groups:
                    groups[off] = np.zeros(shape)
                if groups[off].dtype == np.float64 and bound[off] > SAFE:
                    groups[off] = groups[off].astype(np.int64)
                prod = d0 * part
                groups[off] += prod if groups[off].dtype == np.float64 else prod.astype(np.int64)
    row_scale = np.broadcast_to(sum(tops[:n_rows], np.zeros(1, np.int64)), (shape[0],)).copy()
    col_scale = np.broadcast_to(sum(tops[n_rows:], np.zeros(1, np.int64)), (shape[1],)).copy()
    return Exact(tuple((o, groups[o], bound[o], 1) for o in sorted(groups)), row_scale, col_scale, bits)


def entry_bits(k: int) -> int:
    """`entrywise_sum`'s default digit width for k factors: floor(48 / k) bits, so k digits multiply below 2^48."""
    return 48 // k


def line_top(parts, axis: int):
    """The scale per line that `entrywise_sum` cuts the parts of one factor on (`_line_top`)."""
    return _line_top(parts, axis)


class LineCut(NamedTuple):
    """A factor of `entrywise_sum` already cut (`line_cut`): digits [(s, digit, peak |digit|)] of `bits` bits on
    the scale 2^top per line (rows for axis 0, columns for axis 1) of float64 parts of shape `shape`."""

    top: np.ndarray
    digits: list
    bits: int
    axis: int
    shape: tuple


def line_cut(parts, axis: int, bits: int, top=None) -> LineCut:
    """The float64 parts of one factor cut as `entrywise_sum` cuts them (`_line_digits`), on the scale `top` per
    line (default the parts' own, `_line_top`): made once for a factor several products share."""
    top = _line_top(list(parts), axis) if top is None else np.asarray(top, dtype=np.int64)
    digits = [(s, d, int(np.abs(d).max())) for s, d in _line_digits(parts, top, axis, bits)]
    return LineCut(top, digits, bits, axis, np.broadcast_shapes(*(p.shape for p in parts)))


def permuted(cut: LineCut, cols) -> LineCut:
    """The `line_cut` of the parts with their columns permuted (x[:, cols]), for a cut along rows (axis 0): a
    row's top and an entry's digits depend only on the entry and its row (`_block_digits`: the row's peak and its
    smallest entry are the same after a permutation, each digit is an entrywise function of the entry and the
    row's top), so the digits permute with the columns, exactly, and keep their peaks."""
    _require(cut.axis == 0, "a column permutation of a cut along columns")
    return cut._replace(digits=[(s, d[:, cols], p) for s, d, p in cut.digits])


def _factor_cuts(products, n_rows: int, bits: int):
    """(shape, tops, cuts) for `entrywise_sum`: the broadcast shape, factor i's scale per line (the largest over
    the products' parts, `_line_top`; or the scale of its `LineCut`s, which must all be on one scale of `bits`-bit
    digits along the factor's axis) and each product's factors' digits [(s, digit, peak)]."""
    factors = [tuple(r) + tuple(c) for r, c in products]
    shape = np.broadcast_shapes(*(f.shape if isinstance(f, LineCut) else f[0].shape for fs in factors for f in fs))
    tops = []
    for i in range(len(factors[0])):
        axis, given = 0 if i < n_rows else 1, [fs[i] for fs in factors if isinstance(fs[i], LineCut)]
        if given:
            _require(len(given) == len(factors) and all(g.bits == bits and g.axis == axis and
                                                         np.array_equal(g.top, given[0].top) for g in given),
                     "cut factors on different scales, digit widths or axes")
            tops.append(given[0].top)
        else:
            tops.append(_line_top([p for fs in factors for p in fs[i]], axis))
    cuts = [[f.digits if isinstance(f, LineCut) else line_cut(f, 0 if i < n_rows else 1, bits, tops[i]).digits
             for i, f in enumerate(fs)] for fs in factors]
    return shape, tops, cuts


def plus_row(x: Exact, b):
    """The Exact x + b (b a float64 1 x n row added to every row; exact float64 values), or None when b's
    integers would pass 2^62. b_j = mant_j 2^be_j (frexp: mant_j = f 2^53 an integer below 2^53), so on x's
    scales b is one term M 2^o with M_ij = mant_j 2^(be_j - o - row_i - col_j) (mant_j odd: trailing zeros moved
    into be_j), an integer when o (a multiple of the unit) is <= every be_j - row_i - col_j (b_j != 0), shifted in
    int64 (exact: bit length of mant_j plus the shift below 62)."""
    frac, ex = np.frexp(np.asarray(b, dtype=np.float64).reshape(-1))
    live = frac != 0
    if not live.any():
        return x
    mant = np.ldexp(frac, 53).astype(np.int64)
    tz = np.where(live, np.frexp((mant & -mant).astype(np.float64))[1] - 1, 0)   # trailing zeros (a power of two: exact)
    mant, be = mant >> tz, ex.astype(np.int64) - 53 + tz
    rows, cols = x.row_scale.astype(np.int64), x.col_scale.astype(np.int64)
    o = int((be - cols)[live].min()) - int(rows.max())
    o -= o % x.unit
    shift = be[None, :] - o - rows[:, None] - cols[None, :]
    width = np.array([int(v).bit_length() for v in np.abs(mant).tolist()])
    if int(np.where(live[None, :], shift + width[None, :], 0).max()) >= 62:
        return None
    M = np.where(live[None, :], mant[None, :] << np.where(live[None, :], shift, 0), 0)
    return Exact(x.terms + ((o, M, int(np.abs(M).max()), 1),), x.row_scale, x.col_scale, x.unit)


def _partials(cuts, bits: int) -> list:
    """[(o, P, bound)]: the entrywise digit products of the factors `cuts` (each [(s, digit, peak |digit|)]),
    o = sum (s + 1), those of one o summed while their bound (the sum of the peaks' products) stays <= 2^53
    over 2^bits per factor still to multiply (this list's later ones and the caller's first): then every
    product and partial sum, here and in the caller's product with one more digit, is an integer below 2^53,
    which float64 holds and computes exactly."""
    out = [(0, None, 1)]       # None: the empty product (the first factor's digits are taken as they are)
    for i, digits in enumerate(cuts):
        room, merged = SAFE >> (bits * (len(cuts) - i)), {}
        for o, a, pa in out:
            for s, d, pd in digits:
                key, v, pv = o + s + 1, d if a is None else a * d, pa * pd
                same = merged.setdefault(key, [])
                if same and same[-1][2] + pv <= room:
                    same[-1] = (key, same[-1][1] + v, same[-1][2] + pv)
                else:
                    same.append((key, v, pv))
        out = [x for same in merged.values() for x in same]
    return [(o, 1.0 if a is None else a, pa) for o, a, pa in out]


def centred(parts) -> Exact:
    """The Exact of x (d I - 11^T) = d x - (x's row sums) 1^T, for x the exact sum of float64 parts (m x d),
    without a product: each part cut on one scale per row (the largest part's: `cut_rows`, digits D_s of b =
    `bits_for(d)` bits), digit s giving the term d D_s - R_s 1^T, R_s its row sums. |D_s| <= alpha and R_s <=
    the largest row sum of |D_s| (measured, < 2^53: `Slices`), so every entry, product d D_s, row sum and partial
    sum is an integer of magnitude <= d alpha + R_s <= 2 d 2^b <= 2^53 (checked): float64 holds them exactly."""
    m, d = parts[0].shape
    top, bits, terms = _line_top(list(parts), 0), bits_for(d), []
    for p in parts:
        cut = cut_rows(p, bits, top)
        for s, (idx, digit) in enumerate(zip(cut.index, cut.digits)):
            bound = d * cut.bound[s][0] + cut.bound[s][1]
            _require(bound <= SAFE, "a centred digit could round")
            full = np.zeros((m, d))
            full[idx] = d * digit - digit.sum(axis=1, keepdims=True)
            terms.append((-(s + 1) * bits, full, bound, 1))
    return Exact(tuple(terms), top, np.zeros(d, np.int64), bits)


def row_square_bounds(parts) -> tuple:
    """(sums, exps): Python ints with sums_i 2^exps_i >= ||x_i||_2^2 for every row i of x, the exact sum of
    float64 parts (m x n): each |part|
    rounded up onto the grid of 2^(t_i - g) (t_i the row's top over all parts: |part| < 2^t_i; g = (62 - bit
    length of n) // 2 - bit length of the part count), q = ceil(|p| 2^(g - t_i)), at least 1 where p != 0. Then
    |x_ij| <= sum_p q_pij 2^(t_i - g) with integers Q = sum_p q_p <= k 2^g, so Q^2 n < 2^62: int64 squares and
    row sums are exact. The scaling by a power of two is exact where the result is normal; a subnormal result is
    below 1, and its ceiling, raised to 1, is still >= the exact value. Looser than exact sums of squares by
    about sqrt(n) 2^-g of the row's top: for bounds whose slack is harmless (`error_balls.row_sq_uppers`)."""
    m, n = parts[0].shape
    top = _line_top(list(parts), 0)
    g = (62 - n.bit_length()) // 2 - len(parts).bit_length()
    _require(g >= 1, "a row too long for int64 square sums")
    total = np.zeros((m, n), dtype=np.int64)
    for p in parts:
        q = np.ceil(_scaled(np.abs(p), g - top, 0))
        total += np.where(p != 0, np.maximum(q, 1.0), 0.0).astype(np.int64)     # <= 2^g each: exact
    _require(int(total.max(initial=0)) <= len(parts) << g, "a rounded magnitude above its grid's bound")
    return (total * total).sum(axis=1).tolist(), (2 * (top - g)).tolist()


def row_squares(parts) -> list:
    """Per row, ||x_i||_2^2 as an exact Fraction for x the exact sum of float64 parts (m x n), without an m x n
    product per digit pair: x cut as one left factor (`cut_sum_rows`: digits D_s of b = `bits_for(n)` bits on the
    row scale 2^t_i, |D_s| <= 2^b; `cut_rows` for one part), then ||x_i||^2 = 4^t_i sum_(s,t) (D_s[i] . D_t[i])
    2^-(s+t+2)b. A row dot D_s[i] . D_t[i] is a dot product as in `point_product`: its bound min(n alpha_s alpha_t,
    R_s alpha_t, alpha_s R_t) is checked <= 2^53 (`_require_exact`), so it is exact in float64 (einsum: any order,
    FMA or not); the dots are then summed as Python ints. Where the parts' sum does not cut as one factor, the
    squares as entrywise products (`row_sums` of `entrywise`)."""
    m, n = parts[0].shape
    top, bits = _line_top(list(parts), 0), bits_for(n)
    cut = cut_sum_rows(list(parts), bits, top) if len(parts) > 1 else cut_rows(parts[0], bits, top)
    if cut is None or n > MAX_BLOCK:
        return row_sums(entrywise([parts, parts]))
    full = [d if len(idx) == m else np.zeros((m, n)) for idx, d in zip(cut.index, cut.digits)]   # all rows: d itself
    for f, idx, d in zip(full, cut.index, cut.digits):
        if f is not d:
            f[idx] = d
    depth, total = len(full), [0] * m
    for s in range(depth):
        for t in range(s, depth):
            _require_exact(_pair_bound(cut, s, cut, t, n))
            dots, shift = np.einsum("ij,ij->i", full[s], full[t]).astype(np.int64).tolist(), (2 * depth - 2 - s - t) * bits
            total = [a + ((v << shift) << (s != t)) for a, v in zip(total, dots)]     # s != t: both orders
    return [dyadic(v, 2 * e - 2 * depth * bits) for v, e in zip(total, top.tolist())]


def dyadic(v: int, e: int) -> Fraction:
    """The Fraction v 2^e, exactly."""
    return Fraction(v << e) if e >= 0 else Fraction(v, 1 << -e)


def row_sums(x: Exact) -> list:
    """Per row, the exact sum of x's entries as a Fraction, for x with one column scale (the entrywise
    products of row-scaled factors): int64 row sums while their bound stays below 2^62, else Python
    ints; then Python ints (no rounding)."""
    _require(not x.shape[1] or bool(np.all(x.col_scale == x.col_scale[0])), "row sums over unequal column scales")
    low = min((o for o, _, _, _ in x.terms), default=0)
    out = [0] * x.shape[0]
    for o, m, b, sg in x.terms:
        m = m.astype(np.int64)
        sums = m.sum(axis=1).tolist() if b * x.shape[1] < ACC_LIMIT else [sum(r) for r in m.tolist()]
        out = [t + sg * (v << (o - low)) for t, v in zip(out, sums)]
    base = low + (int(x.col_scale[0]) if x.shape[1] else 0)
    return [dyadic(t, e + base) for t, e in zip(out, x.row_scale.tolist())]
