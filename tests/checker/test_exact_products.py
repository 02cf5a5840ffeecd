"""Property tests of the exact linear-algebra layer (`checker/exact_products.py`, `checker/exact_rounding.py`)
and of its parts that no verdict path reaches (`tcert.testing.exact_reference`: interval x point by a
grid and envelopes, `round_out`, the float64 way in).

Every product is compared with the exact Fraction product (or, on shapes too large for Fractions,
with an independent exact computation modulo primes in int64): on matrices with subnormals, wide
exponent spreads (several exponent bands of float64), zeros, signed zeros and digits at the
magnitude bound. Interval products must enclose the exact product at every point of the intervals
(their vertices, where the extremes of a linear map lie, and interior points), and their enclosures,
leaving the layer through each exit (float64 bounds, Arb balls, mpmath intervals), must contain
200-bit reference values. A cut that would break the 2^53 bound must raise BoundViolation.
"""

import math
from fractions import Fraction

import flint
import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tcert.checker import exact_backend as xb
from tcert.checker import exact_products as ep
from tcert.checker import exact_rounding as er
from tcert.checker.errors import BadInput, Rejected
from tcert.testing import example_scale
from tcert.testing import exact_reference as xr

TWO = Fraction(2)
REF_SLACK = Fraction(1, 2 ** 180)   # the 200-bit reference's own error, relative


# --- exact references --------------------------------------------------------------------------

def fr(a) -> list:
    """Rows of exact Fractions of a float matrix."""
    return [[Fraction(float(v)) for v in row] for row in np.atleast_2d(a)]


def fr_product(a, b) -> list:
    """The exact product of two Fraction matrices."""
    cols = list(zip(*b))
    return [[sum((x * y for x, y in zip(row, col)), Fraction(0)) for col in cols] for row in a]


def exact_fractions(x) -> list:
    """Rows of the exact Fractions of an Exact result (from its exact integers)."""
    total, e = xr.exact_integers(x)
    return [[Fraction(int(v)) * TWO ** int(s) for v, s in zip(r, es)] for r, es in zip(total, e)]


def value(man, exp) -> Fraction:
    return Fraction(int(man)) * TWO ** int(exp)


def mpf_value(raw) -> Fraction:
    """The exact value of a finite raw mpmath mpf (sign, man, exp, bc)."""
    sign, man, exp, _ = raw
    return (-1 if sign else 1) * value(man, exp)


def rounded_ends(r: xr.Rounded, i, j):
    return value(r.lo_man[i, j], r.lo_exp[i, j]), value(r.hi_man[i, j], r.hi_exp[i, j])


def cut_value(sl: ep.Slices) -> list:
    """The exact matrix a cut stands for, from its digits (independent of the product code)."""
    m, n = sl.shape
    out = [[Fraction(0)] * n for _ in range(m)]
    for s, (d, idx) in enumerate(zip(sl.digits, sl.index)):
        along = d if sl.axis == 0 else d.T
        for r, line in enumerate(idx):
            weight = TWO ** (int(sl.scale[line]) - (s + 1) * sl.bits)
            for c, v in enumerate(along[r]):
                i, j = (line, c) if sl.axis == 0 else (c, line)
                out[i][j] += Fraction(float(v)) * weight
    return out


# --- inputs ---------------------------------------------------------------------------------------

WIDTH = {np.float16: 16, np.float32: 32, np.float64: 64}


def specials(dtype):
    """Zeros of both signs, the smallest subnormal and normal, the largest finite, 1 - ulp (all
    mantissa bits set: digits at their maximum), powers of two, for `dtype`."""
    f = np.finfo(dtype)
    tiny_sub = float(np.nextafter(dtype(0), dtype(1)))
    vals = [0.0, -0.0, tiny_sub, -tiny_sub, float(f.tiny), float(f.max), -float(f.max),
            float(1 - f.epsneg), -float(1 - f.epsneg), 1.0, -2.0, 0.5]
    return st.sampled_from(vals)


def entries(dtype, lo_exp=None, hi_exp=None):
    """Floats of `dtype`: specials, arbitrary finite values (subnormals included), or values with an
    exponent in [lo_exp, hi_exp] (to keep float64 spreads moderate where a test needs it)."""
    parts = [specials(dtype), st.floats(width=WIDTH[dtype], allow_nan=False, allow_infinity=False)]
    if lo_exp is not None:
        parts = [st.sampled_from([0.0, -0.0]),
                 st.builds(lambda m, e: math.ldexp(m, e), st.floats(-1, 1, width=WIDTH[dtype]),
                           st.integers(lo_exp, hi_exp))]
    return st.one_of(*parts).map(lambda v: dtype(v))


@st.composite
def matrix(draw, dtype, shape, lo_exp=None, hi_exp=None):
    return draw(hnp.arrays(dtype, shape, elements=entries(dtype, lo_exp, hi_exp)))


@st.composite
def factor_pair(draw, max_dim=5, moderate=False):
    """(A, B, dtype) with A m x k, B k x n, finite; float64 moderate: exponents within +-300."""
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    m, k, n = (draw(st.integers(1, max_dim)) for _ in range(3))
    lim = (-300, 300) if (dtype == np.float64 and moderate) else (None, None)
    a = draw(matrix(dtype, (m, k), *lim))
    b = draw(matrix(dtype, (k, n), *lim))
    return ep.exact_matrix(a), ep.exact_matrix(b), dtype


# --- conversion and cutting -------------------------------------------------------------------------

def test_exact_matrix_keeps_every_value_and_refuses_non_finite():
    for dtype in (np.float16, np.float32, np.float64):
        f = np.finfo(dtype)
        a = np.array([0.0, -0.0, f.tiny, f.max, -f.max, f.smallest_subnormal, 1 / 3], dtype=dtype)
        x = ep.exact_matrix(a)
        assert x.shape == (1, len(a)) and x.dtype == np.float64
        assert [Fraction(float(v)) for v in x[0]] == [Fraction(float(v)) for v in a]
        for bad in (np.inf, -np.inf, np.nan):
            with pytest.raises(ValueError):
                ep.exact_matrix(np.array([[1.0, bad]], dtype=dtype))
    with pytest.raises(TypeError):
        ep.exact_matrix(np.array([1, 2]))


def test_bfloat16_bits_decode_exactly():
    """Every finite bfloat16 pattern decodes to sign * 2^(e-127) * (1 + m/128) (or the subnormal
    2^-126 * m/128): an independent decoding in Fractions."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = ((bits >> 7) & 0xFF) != 0xFF
    got = xr.bfloat16_matrix(bits[finite])[0]
    for b, v in zip(bits[finite].tolist(), got.tolist()):
        sign, e, m = -1 if b >> 15 else 1, (b >> 7) & 0xFF, b & 0x7F
        want = TWO ** -126 * Fraction(m, 128) if e == 0 else TWO ** (e - 127) * (1 + Fraction(m, 128))
        assert Fraction(v) == sign * want
    with pytest.raises(ValueError):
        xr.bfloat16_matrix(bits[~finite][:3])


@settings(max_examples=example_scale(60))
@given(factor_pair(max_dim=6), st.sampled_from([None, 3, 7]))
def test_cuts_are_exact_integer_digits(pair, bits):
    """Both cuts reproduce the matrix exactly; digits are integers below 2^bits; lines outside a
    digit's index have that digit zero (so nothing is lost)."""
    a, _, _ = pair
    b = bits or ep.bits_for(a.shape[1])
    for sl in (ep.cut_rows(a, b), ep.cut_cols(a, b)):
        assert cut_value(sl) == fr(a)
        for d, m in zip(sl.digits, sl.bound):
            assert np.array_equal(d, np.trunc(d)) and np.abs(d).max(initial=0) < 2 ** b
            assert m[0] == int(np.abs(d).max(initial=0))


def test_wide_float64_spread_uses_several_bands_exactly():
    """A float64 row spanning 2^1000 to 2^-1074 (more than one exponent band) cuts and multiplies
    exactly."""
    a = np.array([[2.0 ** 1000, 3.0 * 2 ** -1074, -1.5 * 2 ** 400, 5e-300, -0.0, 1.0]])
    w = np.array([[1.0, -2.0 ** -1000], [2.0 ** 1000, 1.0], [-(2.0 ** -300), 3.0],
                  [7.0, 2.0 ** 900], [1.0, 1.0], [-1.0, 2.0 ** -1074]])
    bits = ep.bits_for(a.shape[1])
    assert cut_value(ep.cut_rows(a, bits)) == fr(a)
    c = ep.point_product(ep.cut_rows(a, bits), ep.cut_cols(w, bits))
    assert exact_fractions(c) == fr_product(fr(a), fr(w))


# --- exact point products ---------------------------------------------------------------------------

@settings(max_examples=example_scale(80))
@given(factor_pair(max_dim=5, moderate=True), st.sampled_from([None, 2, 5]))
def test_point_product_equals_the_exact_product(pair, bits):
    a, b, _ = pair
    w = bits or ep.bits_for(a.shape[1])
    c = ep.point_product(ep.cut_rows(a, w), ep.cut_cols(b, w))
    assert exact_fractions(c) == fr_product(fr(a), fr(b))
    # B^T A^T from the transposed cuts (a column cut of B read as a row cut of B^T, and back)
    ct = ep.point_product(xr.transposed(ep.cut_cols(b, w)), xr.transposed(ep.cut_rows(a, w)))
    assert exact_fractions(ct) == fr_product(fr(b.T), fr(a.T))


@settings(max_examples=example_scale(25))
@given(factor_pair(max_dim=3))
def test_point_product_exact_at_any_float_range(pair):
    """Arbitrary finite floats, float64 extremes included (products up to 2^2048, down to 2^-2148)."""
    a, b, _ = pair
    w = ep.bits_for(a.shape[1])
    c = ep.point_product(ep.cut_rows(a, w), ep.cut_cols(b, w))
    assert exact_fractions(c) == fr_product(fr(a), fr(b))


def test_digits_at_the_magnitude_bound_are_exact_in_blas():
    """Every digit at 2^b - 1 and k = 2^(53 - 2b), so k (2^b - 1)^2 is just below 2^53: the largest
    sums the bound allows, through BLAS's blocked kernels (shapes beyond a few hundred), with mixed
    signs. Checked against Python integers."""
    rng = np.random.default_rng(7)
    for k in (512, 2048):
        b = ep.bits_for(k)
        assert k * 2 ** (2 * b) <= 2 ** 53 < k * 2 ** (2 * b + 2)
        top = 1 - 2.0 ** -b                        # one digit of 2^b - 1 (all mantissa bits set)
        a = np.full((40, k), top) * rng.choice([-1.0, 1.0], size=(40, k), p=[0.02, 0.98])
        w = np.full((k, 300), top)
        c = ep.point_product(ep.cut_rows(a, b), ep.cut_cols(w, b))
        assert all(sl == 1 for sl in (len(ep.cut_rows(a, b).digits), len(ep.cut_cols(w, b).digits)))
        digit = (1 << b) - 1
        ints = (np.sign(a).astype(np.int64).sum(axis=1) * digit * digit).tolist()
        ints_c, e = xr.exact_integers(c)
        for i in range(40):
            assert all(Fraction(int(v)) * TWO ** int(s) == Fraction(ints[i]) * TWO ** (-2 * b)
                       for v, s in zip(ints_c[i], e[i]))


def test_stacked_left_digits_at_the_magnitude_bound_are_exact_in_blas():
    """Two left digits, each 2^b - 1 on every entry, stacked into one BLAS call per right digit
    (`_stacked`) at k = 2^(53 - 2b): every digit pair at the bound, each output row block checked against
    Python integers, and the stacking really used (one product per right digit)."""
    rng = np.random.default_rng(11)
    k = 512
    b = ep.bits_for(k)
    digit = (1 << b) - 1
    top = sum(digit * 2.0 ** (-(s + 1) * b) for s in range(2))     # 2 digits of 2^b - 1 (2b <= 53 bits)
    a = np.full((30, k), top) * rng.choice([-1.0, 1.0], size=(30, k), p=[0.05, 0.95])
    w = np.full((k, 200), 1 - 2.0 ** -b)
    cut_a, cut_w = ep.cut_rows(a, b), ep.cut_cols(w, b)
    assert len(cut_a.digits) == 2 and len(cut_w.digits) == 1
    calls = []
    real = ep._stacked
    ep._stacked = lambda *args: calls.append(args[1]) or real(*args)
    try:
        c = ep.point_product(cut_a, cut_w)
    finally:
        ep._stacked = real
    assert calls == [[0, 1]]
    want = np.sign(a).astype(np.int64).sum(axis=1).tolist()
    got = exact_fractions(c)
    for i in range(30):
        exact = Fraction(want[i]) * Fraction(top) * Fraction(1 - 2.0 ** -b)
        assert all(v == exact for v in got[i])


@st.composite
def summed_parts(draw, max_dim=4):
    """(parts, W): 1-3 float64 parts (m x k; the first arbitrary float64 with moderate exponents, specials
    included; the others the first's split-like rests, scaled far below, or as large as it) and a k x n W."""
    m, k, n = (draw(st.integers(1, max_dim)) for _ in range(3))
    first = ep.exact_matrix(draw(matrix(np.float64, (m, k), -300, 300)))
    parts = [first]
    for _ in range(draw(st.integers(0, 2))):
        scale = draw(st.sampled_from([2.0 ** -53, 2.0 ** -60, 2.0 ** -200, 2.0 ** -22, 2.0 ** -3, 2.0 ** -8, 1.0, 0.0]))
        parts.append(ep.exact_matrix(draw(matrix(np.float64, (m, k), -300, 300))) * scale)
    return parts, ep.exact_matrix(draw(matrix(np.float32, (k, n))))


@settings(max_examples=example_scale(80))
@given(summed_parts(), st.sampled_from([None, 3, 8]))
def test_cut_of_a_sum_of_parts_is_their_exact_sum(case, bits):
    """cut_sum_rows: the digits hold the exact sum of the parts (Fractions), |d_s| < 2^b for s >= 1 and
    |d_0| <= 2^b, or None; parts_times_point equals the exact Fraction product either way (merged or not)."""
    parts, w = case
    b = bits or ep.bits_for(parts[0].shape[1])
    top = ep._line_top(parts, 0)
    cut = ep.cut_sum_rows(parts, b, top)
    total = [[sum(Fraction(float(p[i, j])) for p in parts) for j in range(parts[0].shape[1])]
             for i in range(parts[0].shape[0])]
    if cut is not None:
        assert cut_value(cut) == total
        for s, d in enumerate(cut.digits):
            assert np.abs(d).max(initial=0) <= 2 ** b - (s > 0) and np.array_equal(d, np.trunc(d))
    whole = ep.cut_cols(w, b)
    got = exact_fractions(xb.parts_times_point(parts, whole))
    assert got == fr_product(total, fr(w))


@settings(max_examples=example_scale(80))
@given(summed_parts(max_dim=6))
def test_centred_rows_are_exact(case):
    """centred: x (d I - 11^T) for x the exact sum of 1-3 float64 parts (subnormals, specials, wide spreads,
    zeros) equals the Fraction computation d x_ij - sum_l x_il entry by entry."""
    parts, _ = case
    m, d = parts[0].shape
    total = [[sum(Fraction(float(p[i, j])) for p in parts) for j in range(d)] for i in range(m)]
    want = [[d * v - sum(row) for v in row] for row in total]
    assert exact_fractions(ep.centred(parts)) == want


def test_centred_at_the_digit_bound():
    """Every digit at 2^b - 1 with all signs alike (the row sum at its largest): d D - R stays exact."""
    d = 2048
    x = np.full((2, d), 1 - 2.0 ** -53)
    x[1] = -x[1]
    got = exact_fractions(ep.centred([x]))
    assert all(v == 0 for row in got for v in row)
    x[0, 0] = 0.5
    got = exact_fractions(ep.centred([x]))
    assert got[0][0] == d * Fraction(1, 2) - (Fraction(1, 2) + (d - 1) * Fraction(1 - 2.0 ** -53))


@settings(max_examples=example_scale(80))
@given(summed_parts(max_dim=6))
def test_row_square_bounds_bound_and_are_tight(case):
    """row_square_bounds: sums 2^exps >= the exact ||x_i||^2 of the sum of the parts, and within the grid's
    slack of the parts' magnitudes: sqrt(bound) <= || sum_k |p_k| ||_i + sqrt(n) k 2^(t_i - g) (k parts, entries
    rounded up by < one grid unit each). The magnitudes, not |x_i|: parts of opposite signs (1 and -2^-22, found by
    the 'large' profile) are bounded by |p_1| + |p_2|; for the centres' (high, low) splits the two differ by an ulp."""
    parts, _ = case
    m, n = parts[0].shape
    sums, exps = ep.row_square_bounds(parts)
    top = ep._line_top(parts, 0)
    g = (62 - n.bit_length()) // 2 - len(parts).bit_length()
    for i in range(m):
        row = [sum(Fraction(float(p[i, j])) for p in parts) for j in range(n)]
        exact = sum(v * v for v in row)
        bound = Fraction(sums[i]) * TWO ** exps[i]
        assert bound >= exact
        magnitudes = sum(sum(abs(Fraction(float(p[i, j]))) for p in parts) ** 2 for j in range(n))
        slack = len(parts) * TWO ** (int(top[i]) - g) * math.isqrt(4 * n)
        assert math.sqrt(bound) <= math.sqrt(magnitudes) + float(slack) * (1 + 1e-9) + 1e-300


def test_row_square_bounds_of_subnormal_and_zero_rows():
    """A subnormal entry counts as one grid unit (never 0), also where its scaling underflows (a row topped by
    2^996: the grid unit is far below 2^-1074); a zero row gives 0; the all-ones row is exact."""
    x = np.zeros((4, 4))
    x[0, 1] = 5e-324
    x[2] = 1.0
    x[3, :2] = 2.0 ** 996, 5e-324
    sums, exps = ep.row_square_bounds([x])
    bounds = [Fraction(v) * TWO ** e for v, e in zip(sums, exps)]
    assert bounds[0] >= Fraction(5e-324) ** 2 and bounds[0] > 0
    assert bounds[1] == 0 and bounds[2] == 4
    assert bounds[3] > Fraction(2) ** 1992       # 2^996 is on the grid: only the subnormal's unit adds to it


def test_sum_of_parts_carries_to_a_first_digit_at_the_bound():
    """p1 = 1 - 2^-53 and p2 = p1 2^-b on every entry: every digit but the first sums to 2^(b+1) - 2 and carries,
    the first reaches exactly 2^b; with k = 2^(53 - 2b) and right digits 2^b - 1 the product is exact in BLAS
    (against Python integers), and the cut holds the exact sum."""
    k = 512
    b = ep.bits_for(k)
    one = 1 - 2.0 ** -53
    parts = [np.full((3, k), one), np.full((3, k), one * 2.0 ** -b)]
    cut = ep.cut_sum_rows(parts, b, ep._line_top(parts, 0))
    assert cut is not None and np.abs(cut.digits[0]).max() == 2 ** b
    assert cut_value(cut)[0][:3] == [Fraction(one) * (1 + Fraction(1, 2 ** b))] * 3
    w = np.full((k, 2), 1 - 2.0 ** -b)
    got = exact_fractions(xb.parts_times_point(parts, ep.cut_cols(w, b)))
    want = k * Fraction(one) * (1 + Fraction(1, 2 ** b)) * Fraction(1 - 2.0 ** -b)
    assert all(v == want for row in got for v in row)


def test_sum_of_parts_with_a_first_digit_past_the_bound_falls_back():
    """Three parts of 1 - ulp on every entry: the sum is ~3 x 2^top, so the first digit would pass 2^b:
    cut_sum_rows declines (None), and parts_times_point still gives the exact product (each part cut)."""
    k, b = 512, ep.bits_for(512)
    top_val = 1 - 2.0 ** -53
    parts = [np.full((2, k), top_val) for _ in range(3)]
    assert ep.cut_sum_rows(parts, b, ep._line_top(parts, 0)) is None
    w = np.full((k, 3), 1 - 2.0 ** -24)
    got = exact_fractions(xb.parts_times_point(parts, ep.cut_cols(w, b)))
    want = 3 * k * Fraction(top_val) * Fraction(1 - 2.0 ** -24)
    assert all(v == want for row in got for v in row)
    pair = [parts[0], parts[1] * 2.0 ** -53]     # a split-like pair: one digit row set for both parts
    two, each = ep.cut_sum_rows(pair, b, ep._line_top(pair, 0)), ep.cut_rows(np.concatenate(pair), b, np.zeros(4, np.int64))
    assert two is not None and sum(map(len, two.index)) < sum(map(len, each.index))


@settings(max_examples=example_scale(80))
@given(summed_parts(max_dim=6))
def test_row_squares_are_the_exact_squared_norms(case):
    """row_squares: ||x_i||^2 of the exact sum of 1-3 float64 parts (specials, subnormals, zeros, wide spreads,
    split-like rests) equals the Fraction sum of squares, whether the parts cut as one factor (row dots of the
    carried digits) or not (the entrywise fallback). A mutant without the doubled cross terms (s != t counted
    once) or with the row dots' shift one digit off fails here."""
    parts, _ = case
    m, n = parts[0].shape
    want = [sum(sum(Fraction(float(p[i, j])) for p in parts) ** 2 for j in range(n)) for i in range(m)]
    assert ep.row_squares(parts) == want


def test_row_squares_at_the_digit_bound_and_past_it():
    """Digits at the bound: p1 = 1 - 2^-53 and p2 = p1 2^-b carry to a first digit of exactly 2^b with every
    digit at its largest, so the first row dot's bound n 2^2b is 2^53 (k = 512, b = 22): exact in float64. Three
    parts of 1 - ulp: their sum does not cut as one factor (cut_sum_rows declines) and the fallback is exact; a
    wide row of 2^21 + 1 entries (beyond one product block) takes the fallback too."""
    k = 512
    b = ep.bits_for(k)
    one = 1 - 2.0 ** -53
    parts = [np.full((2, k), one), np.full((2, k), one * 2.0 ** -b)]
    parts[1][1] = -parts[1][1]
    rows = [Fraction(one) * (1 + Fraction(1, 2 ** b)), Fraction(one) * (1 - Fraction(1, 2 ** b))]
    assert ep.row_squares(parts) == [k * r * r for r in rows]
    three = [np.full((2, k), one) for _ in range(3)]
    assert ep.cut_sum_rows(three, b, ep._line_top(three, 0)) is None
    assert ep.row_squares(three) == [k * (3 * Fraction(one)) ** 2] * 2
    wide = np.zeros((1, ep.MAX_BLOCK + 1))
    wide[0, ::1024] = 0.5
    assert ep.row_squares([wide]) == [Fraction(wide.shape[1] // 1024 + 1, 4)]


def test_large_float32_product_matches_modular_arithmetic():
    """A 48 x 512 by 512 x 700 float32 product with wide exponents and subnormals (BLAS in its real
    regime): its exact integers agree with an independent int64 computation modulo two primes."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((48, 512)) * 2.0 ** rng.integers(-40, 10, (48, 512))).astype(np.float32)
    w = (rng.standard_normal((512, 300)) * 2.0 ** rng.integers(-150, 5, (512, 300))).astype(np.float32)
    a[rng.random(a.shape) < 0.05] = 0
    b = ep.bits_for(512)
    c = ep.point_product(ep.cut_rows(ep.exact_matrix(a), b), ep.cut_cols(ep.exact_matrix(w), b))
    ints, e = xr.exact_integers(c)
    a_int = [[int(v) for v in row] for row in np.ldexp(a.astype(np.float64), 149).tolist()]  # exact
    w_int = [[int(v) for v in row] for row in np.ldexp(w.astype(np.float64), 149).tolist()]
    for p in (33554393, 67108859):  # primes below 2^26: k p^2 < 2^63
        am = np.array([[v % p for v in row] for row in a_int], dtype=np.int64)
        wm = np.array([[v % p for v in row] for row in w_int], dtype=np.int64)
        want = (am @ wm) % p                     # exact: entries < p, sums < 512 p^2 < 2^63
        got = np.array([[int(v) * pow(2, int(s) + 298, p) % p for v, s in zip(r, es)]
                        for r, es in zip(ints, e)], dtype=np.int64)
        assert np.array_equal(got, want)


def test_inner_dimension_beyond_two_to_the_21_is_blocked():
    """k = 2^21 + 3 (beyond one block): digits of 16 bits, blocks summed exactly in int64."""
    k = (1 << 21) + 3
    assert ep.bits_for(k) == 16
    rng = np.random.default_rng(5)
    a = rng.integers(-(1 << 15), 1 << 15, size=(1, k)).astype(np.float64)
    w = rng.integers(-(1 << 15), 1 << 15, size=(k, 2)).astype(np.float64)
    c = ep.point_product(ep.cut_rows(a, 16), ep.cut_cols(w, 16))
    ints, e = xr.exact_integers(c)
    want = (a.astype(np.int64) @ w.astype(np.int64))[0].tolist()   # |sum| < 2^52: exact in int64
    assert [Fraction(int(v)) * TWO ** int(s) for v, s in zip(ints[0], e[0])] == want


def test_empty_and_zero_matrices():
    for m, k, n in ((0, 3, 2), (2, 0, 3), (2, 3, 0), (1, 1, 1)):
        a, w = np.zeros((m, k)), np.zeros((k, n))
        b = ep.bits_for(k)
        c = ep.point_product(ep.cut_rows(a, b), ep.cut_cols(w, b))
        assert c.shape == (m, n) and all(v == 0 for row in exact_fractions(c) for v in row)
        lo, hi = er.float_bounds(c)
        assert lo.shape == (m, n) and not lo.any() and not hi.any()
        r = xr.round_out(c, 53)
        assert not r.lo_man.any() and not r.hi_man.any()


# --- leaving the layer ------------------------------------------------------------------------------

@settings(max_examples=example_scale(60))
@given(factor_pair(max_dim=4, moderate=True), st.sampled_from([2, 24, 53, 62, 100]))
def test_round_out_encloses_within_one_unit(pair, prec):
    a, b, _ = pair
    w = ep.bits_for(a.shape[1])
    c = ep.point_product(ep.cut_rows(a, w), ep.cut_cols(b, w))
    exact, r = fr_product(fr(a), fr(b)), xr.round_out(c, prec)
    for i, row in enumerate(exact):
        for j, v in enumerate(row):
            lo, hi = rounded_ends(r, i, j)
            assert lo <= v <= hi
            assert hi - lo <= abs(v) * TWO ** (2 - prec)   # at most one unit in the last place
            assert (lo == hi) == (lo == v == hi)


@settings(max_examples=example_scale(60))
@given(st.one_of(factor_pair(max_dim=4, moderate=True), factor_pair(max_dim=2)))
def test_float_bounds_enclose_and_are_tight(pair):
    """float64 bounds contain the exact product; the width is at most two units of the largest
    term's offset per term (a floored term adds one above, a skipped negligible one adds one on each
    side) plus two float64 ulps (the 2^-1074 grid below the normal range)."""
    a, b, _ = pair
    w = ep.bits_for(a.shape[1])
    c = ep.point_product(ep.cut_rows(a, w), ep.cut_cols(b, w))
    lo, hi = er.float_bounds(c)
    top = max((o for o, _, _, _ in c.terms), default=0)
    big = Fraction(np.finfo(np.float64).max)
    for i, row in enumerate(fr_product(fr(a), fr(b))):
        for j, v in enumerate(row):
            lo_v = Fraction(float(lo[i, j])) if np.isfinite(lo[i, j]) else -big * 2 ** 2000
            hi_v = Fraction(float(hi[i, j])) if np.isfinite(hi[i, j]) else big * 2 ** 2000
            assert lo_v <= v <= hi_v
            unit = TWO ** (top + int(c.row_scale[i]) + int(c.col_scale[j]))
            allowed = 2 * len(c.terms) * unit + abs(v) * TWO ** -51 + TWO ** -1073
            if abs(v) + allowed < big / 4:       # else a bound may saturate to +-inf / +-max
                assert hi_v - lo_v <= allowed


def test_float_bounds_below_the_smallest_subnormal_round_outward():
    """Products below 2^-1074 (of either sign) get bounds 0 and +-2^-1074, never 0 on the far side
    (the float exit once clipped a shift and lost the exponent: upper bound 0 for a positive value)."""
    tiny = 2.0 ** -1074
    for sign in (1.0, -1.0):
        a = np.array([[sign * 2.0 ** -60, 0.0], [sign * 3.0 * 2 ** -70, sign * 2.0 ** -71]])
        w = np.array([[2.0 ** -1020], [2.0 ** -1021]])
        for bits in (ep.bits_for(2), 5):
            lo, hi = er.float_bounds(ep.point_product(ep.cut_rows(a, bits), ep.cut_cols(w, bits)))
            exact = fr_product(fr(a), fr(w))
            for i in range(2):
                assert 0 < abs(exact[i][0]) < TWO ** -1074
                assert (lo[i, 0], hi[i, 0]) == ((0.0, tiny) if exact[i][0] > 0 else (-tiny, 0.0))


def test_float_bounds_saturate_outward_beyond_the_float_range():
    a = np.array([[np.finfo(np.float64).max, np.finfo(np.float64).max]])
    w = np.array([[4.0, -4.0], [4.0, -4.0]])
    c = ep.point_product(ep.cut_rows(a, 20), ep.cut_cols(w, 20))
    lo, hi = er.float_bounds(c)
    assert lo[0, 0] == np.finfo(np.float64).max and hi[0, 0] == np.inf
    assert lo[0, 1] == -np.inf and hi[0, 1] == -np.finfo(np.float64).max


def test_arb_and_mpmath_exits_take_results_in_exactly():
    """Rounded results enter Arb and mpmath as exactly the rounded endpoints (no second rounding at
    the library's precision when it is >= the rounding's)."""
    rng = np.random.default_rng(11)
    a = (rng.standard_normal((5, 40)) * 2.0 ** rng.integers(-30, 30, (5, 40))).astype(np.float32)
    w = (rng.standard_normal((40, 6)) * 2.0 ** rng.integers(-140, 0, (40, 6))).astype(np.float32)
    a, w = ep.exact_matrix(a), ep.exact_matrix(w)
    b = ep.bits_for(40)
    c = ep.point_product(ep.cut_rows(a, b), ep.cut_cols(w, b))
    exact = fr_product(fr(a), fr(w))
    old = flint.ctx.prec
    try:
        flint.ctx.prec = 64
        for x in (c, xr.interval_product(xr.Interval(a - 2.0 ** -20, a + 2.0 ** -20), ep.cut_cols(w, b))):
            r, (flo, fhi) = xr.round_out(x, 62), er.float_bounds(x)
            for bounds in (r, (flo, fhi)):
                balls, rows = xr.to_arb_mat(bounds), xr.to_mpf_rows(bounds)
                for i in range(5):
                    for j in range(6):
                        if bounds is r:
                            lo, hi = rounded_ends(r, i, j)
                        else:
                            lo, hi = Fraction(float(flo[i, j])), Fraction(float(fhi[i, j]))
                        assert lo <= exact[i][j] <= hi
                        ball = balls[i, j]
                        assert value(*ball.lower().man_exp()) <= lo and hi <= value(*ball.upper().man_exp())
                        if lo == hi:
                            assert ball.rad() == 0 and value(*ball.mid().man_exp()) == lo
                        pa, pb = rows[i][j]
                        assert mpf_value(pa) == lo and mpf_value(pb) == hi
    finally:
        flint.ctx.prec = old


# --- interval operands ----------------------------------------------------------------------------

@st.composite
def interval_case(draw, max_dim=4):
    """(lo, hi, W): an interval matrix (point entries, ulp-wide, relative and very wide intervals,
    zeros, subnormal ends) and a point matrix, float32 or moderate float64."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    m, k, n = (draw(st.integers(1, max_dim)) for _ in range(3))
    lim = (-300, 300) if dtype == np.float64 else (None, None)
    lo = ep.exact_matrix(draw(matrix(dtype, (m, k), *lim)))
    assume(np.all(np.abs(lo) < 1e300))
    kind = draw(hnp.arrays(np.int8, (m, k), elements=st.integers(0, 3)))
    rel = draw(hnp.arrays(np.float64, (m, k), elements=st.floats(0, 1)))
    width = np.select([kind == 0, kind == 1, kind == 2, kind == 3],
                      [0.0, np.spacing(np.abs(lo)) * 3, np.abs(lo) * rel * 1e-6, (np.abs(lo) + 1) * rel])
    hi = lo + width                                        # hi >= lo: rounding is monotone
    w = ep.exact_matrix(draw(matrix(dtype, (k, n), *lim)))
    return lo, hi, w


def box_range(lo, hi, w):
    """The exact range of X W over lo <= X <= hi: per entry sum_l min / max of lo w and hi w."""
    L, H, W = fr(lo), fr(hi), fr(w)
    low = [[sum((min(a * W[l][j], b * W[l][j]) for l, (a, b) in enumerate(zip(ra, rb))), Fraction(0))
            for j in range(len(W[0]))] for ra, rb in zip(L, H)]
    high = [[sum((max(a * W[l][j], b * W[l][j]) for l, (a, b) in enumerate(zip(ra, rb))), Fraction(0))
             for j in range(len(W[0]))] for ra, rb in zip(L, H)]
    return low, high


@settings(max_examples=example_scale(100))
@given(interval_case(), st.sampled_from([1, 2, 3]))
def test_interval_product_encloses_every_point_and_is_tight(case, keep):
    """[lo, hi] of the result contains the exact range of X W over the box (so the product at every
    point of the intervals). Its width is at most twice the exact range's (the radius envelope of a
    uniform row), plus a few grid units of each row's magnitude (rounding to the grid and the digit
    pairs below it), plus the radius times one unit of |W|'s upper digit (2^(c_j - bits) <= 2 max
    |W_j| 2^-bits) per entry: so point and narrow intervals stay tight."""
    lo, hi, w = case
    b = ep.bits_for(lo.shape[1])
    r = xr.interval_product(xr.Interval(lo, hi), ep.cut_cols(w, b), keep)
    got_lo, got_hi = exact_fractions(r.lo), exact_fractions(r.hi)
    want_lo, want_hi = box_range(lo, hi, w)
    k = lo.shape[1]
    for i in range(lo.shape[0]):
        t = max(max(abs(Fraction(float(v))) for v in lo[i]), max(abs(Fraction(float(v))) for v in hi[i]))
        for j in range(w.shape[1]):
            assert got_lo[i][j] <= want_lo[i][j] and want_hi[i][j] <= got_hi[i][j]
            wmax = max(abs(Fraction(float(v))) for v in w[:, j])
            widest = max(Fraction(float(h)) - Fraction(float(v)) for h, v in zip(hi[i], lo[i]))
            slack = TWO ** (12 - min(keep, 52 // b) * b) * k * t * wmax + widest * k * wmax * TWO ** (2 - b)
            assert got_hi[i][j] - got_lo[i][j] <= 2 * (want_hi[i][j] - want_lo[i][j]) + slack


@settings(max_examples=example_scale(40))
@given(interval_case())
def test_point_times_interval_and_dropped_pairs_enclose(case):
    """W X for a point W on the left (transposed cut), and a point product with low digit pairs
    bounded (keep), enclose the exact values."""
    lo, hi, w = case
    b = ep.bits_for(lo.shape[1])
    r = xr.point_interval_product(ep.cut_rows(w.T, b), xr.Interval(lo.T, hi.T))
    want_lo, want_hi = box_range(lo, hi, w)
    got_lo, got_hi = exact_fractions(r.lo), exact_fractions(r.hi)
    for i in range(lo.shape[0]):
        for j in range(w.shape[1]):
            assert got_lo[j][i] <= want_lo[i][j] and want_hi[i][j] <= got_hi[j][i]
    for keep in (1, 2):
        c = xr.point_product(ep.cut_rows(lo, b), ep.cut_cols(w, b), keep=keep)
        exact = fr_product(fr(lo), fr(w))
        clo, chi = exact_fractions(c.lo), exact_fractions(c.hi)
        assert all(clo[i][j] <= exact[i][j] <= chi[i][j] for i in range(len(exact)) for j in range(len(exact[0])))


@settings(max_examples=example_scale(30))
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from(["mpmath", "flint"]))
def test_enclosures_contain_200_bit_reference_values(seed, source):
    """X = exp(r) for random rationals r, enclosed at 64 bits by mpmath or Arb, enters the layer
    (outward to float64), is multiplied by float32 weights, and leaves through every exit (float64
    bounds, Arb balls, mpmath intervals); each contains sum_l exp(r_il) W_lj computed at 200 bits."""
    rng = np.random.default_rng(seed)
    m, k, n = 3, int(rng.integers(1, 60)), 4
    r = rng.integers(-3000, 3000, (m, k)) / 1024
    w = ep.exact_matrix((rng.standard_normal((k, n)) * 2.0 ** rng.integers(-20, 3, (k, n))).astype(np.float32))
    old_iv, old_flint = mpmath.iv.prec, flint.ctx.prec
    try:
        mpmath.iv.prec, flint.ctx.prec = 64, 64
        if source == "mpmath":
            x = xr.interval_from_mpf([[mpmath.iv.exp(mpmath.iv.mpf(float(v))) for v in row] for row in r])
        else:
            x = xr.interval_from_arb(flint.arb_mat([[flint.arb(float(v)).exp() for v in row] for row in r]))
        res = xr.interval_product(x, ep.cut_cols(w, ep.bits_for(k)))
        lo, hi = er.float_bounds(res)
        rounded = xr.round_out(res, 62)
        balls, rows = xr.to_arb_mat(rounded), xr.to_mpf_rows(rounded)
    finally:
        mpmath.iv.prec, flint.ctx.prec = old_iv, old_flint
    with mpmath.workprec(200):
        for i in range(m):
            for j in range(n):
                ref = mpf_value(mpmath.fsum(mpmath.exp(mpmath.mpf(float(r[i, l]))) * mpmath.mpf(float(w[l, j]))
                                            for l in range(k))._mpf_)
                pad = REF_SLACK * (abs(ref) + 1)
                ends = [(Fraction(float(lo[i, j])), Fraction(float(hi[i, j]))),
                        (value(*balls[i, j].lower().man_exp()), value(*balls[i, j].upper().man_exp())),
                        tuple(mpf_value(e) for e in rows[i][j])]
                for a, b in ends:
                    assert a - pad <= ref <= b + pad
                scale = Fraction(float(np.abs(x.hi[i]).max())) * Fraction(float(np.abs(w[:, j]).max()))
                assert ends[0][1] - ends[0][0] <= TWO ** (10 - 2 * ep.bits_for(k)) * k * scale


def test_interval_entry_rounds_outward_and_refuses_non_finite():
    old = flint.ctx.prec
    try:
        flint.ctx.prec = 80
        third = flint.arb(1) / 3
        x = xr.interval_from_arb(flint.arb_mat([[third, -third, flint.arb(2) ** -1080]]))
        for v, (lo, hi) in zip((Fraction(1, 3), Fraction(-1, 3), TWO ** -1080), zip(x.lo[0], x.hi[0])):
            assert Fraction(float(lo)) <= v <= Fraction(float(hi)) and lo < hi
        huge = xr.interval_from_arb(flint.arb_mat([[flint.arb(2) ** 2000, -flint.arb(2) ** 2000]]))
        assert huge.lo[0, 0] == np.finfo(np.float64).max and huge.hi[0, 0] == np.inf   # saturated outward
        assert huge.lo[0, 1] == -np.inf and huge.hi[0, 1] == -np.finfo(np.float64).max
        with pytest.raises(ValueError):
            xr.interval_from_arb(flint.arb_mat([[flint.arb("nan")]]))
    finally:
        flint.ctx.prec = old
    with pytest.raises(ValueError):
        xr.interval_from_mpf([[mpmath.iv.mpf([1, mpmath.inf])]])


# --- the bound is asserted ---------------------------------------------------------------------------

def test_a_cut_too_wide_for_its_inner_dimension_raises_bound_violation():
    """Digits of 26 bits for k = 512 (bits_for gives 22): 512 (2^26 - 1)^2 > 2^53, so the product
    must refuse to run; the same matrices cut at bits_for(k) multiply exactly."""
    k = 512
    a = np.full((2, k), 1 - 2.0 ** -26)
    w = np.full((k, 3), 1 - 2.0 ** -26)
    with pytest.raises(ep.BoundViolation):
        ep.point_product(ep.cut_rows(a, 26), ep.cut_cols(w, 26))
    b = ep.bits_for(k)
    c = ep.point_product(ep.cut_rows(a, b), ep.cut_cols(w, b))
    assert exact_fractions(c)[0][0] == k * (1 - TWO ** -26) ** 2
    with pytest.raises(ep.BoundViolation):   # a hand-made cut: non-integer or oversized digits
        ep.Slices([np.array([[0.5]])], [np.array([0])], [0], 8, 0, (1, 1))
    with pytest.raises(ep.BoundViolation):
        ep.Slices([np.array([[2.0 ** 53]])], [np.array([0])], [0], 8, 0, (1, 1))
    with pytest.raises(ep.BoundViolation):   # an interval upside down
        xr.interval_product(xr.Interval(np.ones((1, 2)), np.zeros((1, 2))), ep.cut_cols(np.ones((2, 1)), 20))
    with pytest.raises(ep.BoundViolation):
        ep.cut_rows(np.ones((1, 1)), 27)
    with pytest.raises(ep.BoundViolation):   # binary32 digits would multiply in sgemm: refused
        ep.cut_cols(np.ones((2, 2), dtype=np.float32), 20)
    with pytest.raises(ep.BoundViolation):
        ep.cut_rows(np.array([[1.0, np.inf]]), 20)
    with pytest.raises(ep.BoundViolation):
        xr.interval_product(xr.Interval(np.zeros((2, 2)), np.ones((1, 2))), ep.cut_cols(np.ones((2, 1)), 20))


def test_bound_violation_is_an_internal_error_not_a_verdict():
    """The CLI maps exceptions other than Rejected / BadInput to exit 3 (INTERNAL ERROR)."""
    assert not issubclass(ep.BoundViolation, (Rejected, BadInput))
