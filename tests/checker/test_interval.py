"""Property tests of the interval layer (`checker/interval.py`), for both backends.

Every enclosure must contain the true value: for + - * / and matrix products the exact rational
(Fractions), for exp/log/sqrt/cos/sin/erf/tanh the value mpmath computes at 200 bits (whose own error,
~2^-200 relative, is allowed for; the enclosures under test are ~2^-60 wide, so a wrong rounding
direction or a dropped error term is still caught). Inputs are exact ints, Fractions and floats;
interval inputs are checked at their endpoints and at an interior point. `lower <= upper` always, and
non-finite enclosures raise Rejected. Stored weights (float16/32/64 arrays) convert exactly.
"""

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tcert.checker.errors import Rejected
from tcert.checker.interval import BACKENDS, make_backend
from tcert.testing import example_scale

NAMES = sorted(BACKENDS)
REF_PREC = 200
REF_SLACK = Fraction(1, 2 ** 180)  # the 200-bit reference's own error, relative (and absolute near 0)

# --- exact inputs -----------------------------------------------------------------------------

ints = st.integers(-(2 ** 90), 2 ** 90)
floats = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30)
fracs = st.fractions(min_value=-10 ** 6, max_value=10 ** 6, max_denominator=10 ** 12)
exact = st.one_of(ints, floats, fracs)


def small(bound):
    """Exact inputs (int, float or Fraction) with |x| <= bound."""
    return st.one_of(st.integers(-int(bound), int(bound)),
                     st.floats(min_value=-bound, max_value=bound, allow_nan=False),
                     st.fractions(min_value=-bound, max_value=bound, max_denominator=10 ** 9))


def positive(bound):
    """Exact inputs in (0, bound]."""
    return st.one_of(st.integers(1, int(bound)),
                     st.floats(min_value=1e-300, max_value=bound, allow_nan=False),
                     st.fractions(min_value=Fraction(1, 10 ** 9), max_value=bound, max_denominator=10 ** 9))


def F(x) -> Fraction:
    """The exact rational of an int, float or Fraction."""
    return Fraction(x)


def encloses(B, x, value: Fraction, slack: Fraction = Fraction(0)):
    """Assert lower(x) <= upper(x) and that [lower - slack*|v|, upper + slack*|v|] holds `value`."""
    lo, hi = B.lower(x), B.upper(x)
    assert lo <= hi, f"{B.name}: lower {lo} > upper {hi}"
    pad = slack * (abs(value) + 1)
    assert lo - pad <= value <= hi + pad, f"{B.name}: [{float(lo)}, {float(hi)}] misses {float(value)}"


def ref(fn_name, x: Fraction) -> Fraction:
    """fn(x) by mpmath at 200 bits, as an exact Fraction of the 200-bit result."""
    with mpmath.workprec(REF_PREC + 50):
        arg = mpmath.mpf(x.numerator) / x.denominator
    with mpmath.workprec(REF_PREC):
        return mpf_fraction(getattr(mpmath, fn_name)(arg))


def mpf_fraction(v) -> Fraction:
    """The exact rational value of an mpmath mpf."""
    sign, man, exp, _ = v._mpf_
    value = Fraction(int(man)) * Fraction(2) ** int(exp)
    return -value if sign else value


# --- construction and arithmetic -----------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@given(x=exact)
def test_num_encloses_exactly(name, x):
    """num(x) of an int, Fraction or float holds x; floats and small ints are held as points."""
    B = make_backend(name)
    v = B.num(x)
    encloses(B, v, F(x))
    if isinstance(x, float) or (isinstance(x, int) and abs(x) < 2 ** 63):
        assert B.lower(v) == B.upper(v) == F(x)


@pytest.mark.parametrize("name", NAMES)
@given(a=exact, b=exact)
def test_interval_holds_its_endpoints(name, a, b):
    """interval(lo, hi) contains [lo, hi] for exact Fraction endpoints."""
    B = make_backend(name)
    lo, hi = sorted((F(a), F(b)))
    v = B.interval(lo, hi)
    assert B.lower(v) <= lo and hi <= B.upper(v)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prec", [30, 64])
@settings(max_examples=example_scale(150))
@given(a=exact, b=exact, k=st.integers(-1000, 1000))
def test_arithmetic_encloses_exact_result(name, prec, a, b, k):
    """+ - * / between intervals and with ints contain the exact rational result."""
    B = make_backend(name, prec)
    with B.precision():     # the operators below work at B's precision only inside its block
        arithmetic_encloses(B, a, b, k)


def arithmetic_encloses(B, a, b, k):
    """The + - * / enclosures of test_arithmetic_encloses_exact_result."""
    x, y, qa, qb = B.num(a), B.num(b), F(a), F(b)
    encloses(B, x + y, qa + qb)
    encloses(B, x - y, qa - qb)
    encloses(B, x * y, qa * qb)
    encloses(B, x + k, qa + k)
    encloses(B, k - x, k - qa)
    encloses(B, k * x, k * qa)
    encloses(B, -x, -qa)
    if qb != 0:
        encloses(B, x / y, qa / qb)
    if k != 0:
        encloses(B, x / k, qa / k)
    if qa != 0:
        encloses(B, k / x, k / qa)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=example_scale(50))
@given(a=small(1e6), b=small(1e6), c=small(1e6), d=small(1e6), t=st.fractions(0, 1), u=st.fractions(0, 1))
def test_arithmetic_on_intervals(name, a, b, c, d, t, u):
    """Operations on proper intervals contain the result for every pair of points (ends, interior)."""
    B = make_backend(name)
    (a, b), (c, d) = sorted((F(a), F(b))), sorted((F(c), F(d)))
    X, Y = B.interval(a, b), B.interval(c, d)
    for p in (a, b, a + t * (b - a)):
        for q in (c, d, c + u * (d - c)):
            encloses(B, X + Y, p + q)
            encloses(B, X - Y, p - q)
            encloses(B, X * Y, p * q)
            # A ball (Arb) holding a wide [c, d] may reach over 0 although c > 0: then the
            # quotient is rightly non-finite. Divide only where the backend's own Y excludes 0.
            if B.lower(Y) > 0 or B.upper(Y) < 0:
                encloses(B, X / Y, p / q)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=example_scale(50))
@given(xs=st.lists(exact, min_size=0, max_size=12))
def test_fsum_and_dot(name, xs):
    """fsum and dot contain the exact sum and inner product."""
    B = make_backend(name)
    encloses(B, B.fsum(B.num(x) for x in xs), sum(map(F, xs), Fraction(0)))
    if xs:
        ys = list(reversed(xs))
        exact_dot = sum((F(x) * F(y) for x, y in zip(xs, ys)), Fraction(0))
        encloses(B, B.dot([B.num(x) for x in xs], [B.num(y) for y in ys]), exact_dot)


# --- elementary functions -------------------------------------------------------------------------

FUNCTIONS = [  # (name, input strategy)
    ("exp", small(700)),
    ("log", positive(1e30)),
    ("sqrt", st.one_of(st.just(0), positive(1e30))),
    ("cos", small(1e6)),
    ("sin", small(1e6)),
    ("erf", small(30)),
    ("tanh", small(400)),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fn,strategy", FUNCTIONS, ids=[f for f, _ in FUNCTIONS])
@settings(max_examples=example_scale(60))
@given(data=st.data())
def test_function_encloses_mpmath_200_bits(name, fn, strategy, data):
    """f(point) and f(interval) contain mpmath's 200-bit value at the points of the interval."""
    B = make_backend(name)
    a, b = F(data.draw(strategy, "a")), F(data.draw(strategy, "b"))
    t = data.draw(st.fractions(0, 1, max_denominator=1000), "t")
    f = getattr(B, fn)
    encloses(B, f(B.num(a)), ref(fn, a), REF_SLACK)
    lo, hi = sorted((a, b))
    X = B.interval(lo, hi)
    if (fn == "log" and B.lower(X) <= 0) or (fn == "sqrt" and B.lower(X) < 0):
        # The backend's box of [lo, hi] leaves the domain (an Arb ball of [0, b] may reach below
        # 0): the result must fail closed.
        with pytest.raises(Rejected):
            B.lower(f(X))
        return
    y = f(X)
    for p in (lo, hi, lo + t * (hi - lo)):
        encloses(B, y, ref(fn, p), REF_SLACK)


@pytest.mark.parametrize("name", NAMES)
def test_pi(name):
    """pi() contains pi (200 bits)."""
    B = make_backend(name)
    with mpmath.workprec(REF_PREC):
        pi = mpf_fraction(+mpmath.pi)
    encloses(B, B.pi(), pi, REF_SLACK)


# --- non-finite enclosures fail closed --------------------------------------------------------------

NON_FINITE = {
    "log(0)": lambda B: B.log(B.num(0)),
    "log(-1)": lambda B: B.log(B.num(-1)),
    "log([-1, 1])": lambda B: B.log(B.interval(Fraction(-1), Fraction(1))),
    "sqrt(-1/3)": lambda B: B.sqrt(B.num(Fraction(-1, 3))),
    "sqrt([-1, 4])": lambda B: B.sqrt(B.interval(Fraction(-1), Fraction(4))),
    "1/0": lambda B: B.num(1) / B.num(0),
    "1/int 0": lambda B: B.num(1) / 0,
    "1/[-1, 1]": lambda B: B.num(1) / B.interval(Fraction(-1), Fraction(1)),
    "num(nan)": lambda B: B.num(float("nan")),
    "num(inf)": lambda B: B.num(float("inf")),
    "num(-inf)+1": lambda B: B.num(float("-inf")) + 1,
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_non_finite_enclosures_raise_rejected(name, case):
    """An undefined or unbounded result raises Rejected (when built, or at lower/upper/abs_upper)."""
    B = make_backend(name)
    for leave in (B.lower, B.upper, B.abs_upper):
        with pytest.raises(Rejected):
            leave(NON_FINITE[case](B))


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_inside_col_bounds_and_matrix_is_rejected(name):
    """A NaN/inf entry poisons col_bounds and a matrix product: Rejected, never a finite answer."""
    B = make_backend(name)
    bad = B.num(1) / B.interval(Fraction(-1), Fraction(1))
    for groups in (None, 2):
        with pytest.raises(Rejected):
            B.matrix([[B.num(1)], [bad]]).col_bounds(groups)
    m = B.matrix([[B.num(1), bad]]) @ B.array(np.array([[1.0], [0.0]]))
    with pytest.raises(Rejected):
        B.upper(m.rows()[0][0])


@pytest.mark.parametrize("name", NAMES)
def test_fixed_ends_are_the_floor_and_ceiling_of_the_exact_ends(name):
    """fixed_ends(m, shift) is floor(2^shift lower) / ceil(2^shift upper) of every entry's exact Fraction
    ends (flint reads Arb's mantissa and exponent directly), down to the tiniest and up to the largest
    bounded magnitudes; a non-finite entry or one beyond 2^MAX_EXP is Rejected."""
    from tcert.checker.interval import MAX_EXP
    B = make_backend(name)
    xs = [B.num(0), B.num(Fraction(-7, 3)), B.interval(Fraction(-1, 10 ** 30), Fraction(5, 7)), B.exp(B.num(-40000)),
          -B.exp(B.num(-40000)), B.num(Fraction(2 ** 200 + 1, 3)), B.interval(Fraction(-(2 ** 5000)), Fraction(-(2 ** 4000)))]
    m = B.matrix([xs])
    for shift in (0, 1, 64, 199, 4032):
        lo, hi = B.fixed_ends(m, shift)
        for x, a, b in zip(xs, lo[0], hi[0]):
            want_lo, want_hi = B.lower(x) * 2 ** shift, B.upper(x) * 2 ** shift
            assert a == want_lo.__floor__() and b == want_hi.__ceil__(), (x, shift)
    for bad in (B.num(1) / B.interval(Fraction(-1), Fraction(1)), B.exp(B.num(2 ** 20))):
        with pytest.raises(Rejected):
            B.fixed_ends(B.matrix([[B.num(1), bad]]), 64)
    assert MAX_EXP < 2 ** 20 * 1.44


@pytest.mark.parametrize("name", NAMES)
def test_float_ends_bound_the_exact_ends_within_one_step(name):
    """float_ends(m): float64 lo <= every entry's exact lower end and hi >= its upper end, each at most one
    float step outside it (the nearest float, one step out), for exact points, wide intervals, the tiniest
    and the largest magnitudes (infinite beyond the float range); a non-finite entry is Rejected."""
    B = make_backend(name)
    xs = [B.num(0), B.num(Fraction(-7, 3)), B.interval(Fraction(-1, 10 ** 30), Fraction(5, 7)), B.exp(B.num(-40000)),
          -B.exp(B.num(-40000)), B.num(Fraction(2 ** 200 + 1, 3)), B.num(0.1), B.num(-(2.0 ** -1074)),
          B.interval(Fraction(-(2 ** 5000)), Fraction(-(2 ** 4000))), B.num(2 ** 1100)]
    lo, hi = B.float_ends(B.matrix([xs, xs[::-1]]))
    assert lo.shape == hi.shape == (2, len(xs)) and lo.dtype == hi.dtype == np.float64
    for row, a_row, b_row in zip([xs, xs[::-1]], lo, hi):
        for x, a, b in zip(row, a_row, b_row):
            want_lo, want_hi = B.lower(x), B.upper(x)
            assert a == -np.inf or Fraction(a) <= want_lo, x
            assert b == np.inf or want_hi <= Fraction(b), x
            big = abs(want_lo) >= 2 ** 1023 or abs(want_hi) >= 2 ** 1023
            assert big or want_lo < Fraction(np.nextafter(np.nextafter(a, np.inf), np.inf)), x     # one step out
            assert big or Fraction(np.nextafter(np.nextafter(b, -np.inf), -np.inf)) < want_hi, x
    assert lo[0, -2] == -np.inf and hi[0, -1] == np.inf and np.isfinite(lo[0, :-2]).all()
    for bad in (B.num(1) / B.interval(Fraction(-1), Fraction(1)),):
        with pytest.raises(Rejected):
            B.float_ends(B.matrix([[B.num(1), bad]]))


@pytest.mark.parametrize("name", NAMES)
def test_exp_ends_are_the_numerators_float_ends(name):
    """exp_ends(m) (flint's one pass per row) is exactly float_ends of exp(m[r, j] - c_r), c_r the row's largest
    exact upper end (as tables.numerators builds it entry by entry): the same floats, for exact points, wide and
    tiny intervals and an underflowing exp; None for a non-finite entry (NaN, an infinite radius, -inf, whose
    exp Arb makes 0); mpmath has no such pass (None). A mutant taking the
    smallest upper end, dropping the outward step or swapping the ends fails here."""
    from tcert.checker.kinds.accuracy.tables import numerators
    B = make_backend(name)
    xs = [B.num(0), B.num(Fraction(-7, 3)), B.interval(Fraction(-1, 10 ** 30), Fraction(5, 7)), B.num(-40000),
          B.interval(Fraction(-3), Fraction(2)), B.num(0.1), B.num(Fraction(2 ** 60 + 1, 3))]
    m = B.matrix([xs, xs[::-1], xs[2:] + xs[:2]])
    got = B.exp_ends(m)
    if name != "flint":
        assert got is None
        return
    want = B.float_ends(numerators(B, m)[0])
    assert all(np.array_equal(a, b) for a, b in zip(got, want)) and got[0].dtype == np.float64
    assert got[1].max() == np.nextafter(1.0, 2.0) and (got[0] <= got[1]).all()
    flint = pytest.importorskip("flint")
    for bad in (flint.arb("nan"), flint.arb(0, "inf"), flint.arb("-inf")):
        assert B.exp_ends(B.matrix([[B.num(1), bad]])) is None and B.exp_ends(B.matrix([[bad, B.num(1)]])) is None


# --- column bounds ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=example_scale(50))
@given(ends=st.lists(st.tuples(small(1e6), small(1e6)), min_size=4, max_size=4),
       picks=st.lists(st.fractions(0, 1, max_denominator=100), min_size=4, max_size=4))
def test_col_bounds_hold_every_entry(name, ends, picks):
    """col_bounds gives, per column (and per row block), exact bounds on every point of every entry."""
    B = make_backend(name)
    boxes = [tuple(sorted((F(a), F(b)))) for a, b in ends]
    m = B.matrix([[B.interval(lo, hi), B.num(-lo)] for lo, hi in boxes])     # 4 x 2
    (lo0, lo1), (hi0, hi1) = m.col_bounds()
    halves = m.col_bounds(2)
    assert len(halves) == 2
    for i, ((lo, hi), t) in enumerate(zip(boxes, picks)):
        for p in (lo, hi, lo + t * (hi - lo)):
            assert lo0 <= p <= hi0
            g_lo, g_hi = halves[i // 2]
            assert g_lo[0] <= p <= g_hi[0]
        assert lo1 <= -lo <= hi1 and halves[i // 2][0][1] <= -lo <= halves[i // 2][1][1]
    with pytest.raises(ValueError):
        m.col_bounds(3)


@pytest.mark.parametrize("name", NAMES)
@given(x=exact)
def test_abs_upper(name, x):
    """abs_upper(x) >= |x|."""
    B = make_backend(name)
    assert B.abs_upper(B.num(x)) >= abs(F(x))


# --- matrices --------------------------------------------------------------------------------------

def matrices(rows, cols, elements=st.floats(-1e6, 1e6, allow_nan=False, width=32)):
    """Numpy float64 arrays of a given shape with exactly held elements."""
    return hnp.arrays(np.float64, (rows, cols), elements=elements)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=example_scale(50))
@given(data=st.data(), n=st.integers(1, 4), k=st.integers(1, 5), m=st.integers(1, 4))
def test_matrix_ops_enclose_exact(name, data, n, k, m):
    """@, +, -, scale, T, map, rows contain the exact rational results entry by entry."""
    B = make_backend(name)
    a = data.draw(matrices(n, k), "a")
    b = data.draw(matrices(k, m), "b")
    c = data.draw(matrices(n, k), "c")
    s = F(data.draw(small(1e3), "s"))
    A, Bm, C = B.array(a), B.array(b), B.array(c)
    qa = [[F(float(v)) for v in row] for row in a]
    qb = [[F(float(v)) for v in row] for row in b]
    qc = [[F(float(v)) for v in row] for row in c]
    prod = (A @ Bm).rows()
    assert (A @ Bm).shape == (n, m)
    for i in range(n):
        for j in range(m):
            encloses(B, prod[i][j], sum((qa[i][t] * qb[t][j] for t in range(k)), Fraction(0)))
    for op, fn in (("+", lambda x, y: x + y), ("-", lambda x, y: x - y)):
        got = fn(A, C).rows()
        for i in range(n):
            for j in range(k):
                encloses(B, got[i][j], fn(qa[i][j], qc[i][j]))
    scaled, transposed = A.scale(B.num(s)).rows(), A.T.rows()
    squared = A.map(lambda x: x * x).rows()
    assert A.T.shape == (k, n)
    for i in range(n):
        for j in range(k):
            encloses(B, scaled[i][j], qa[i][j] * s)
            encloses(B, transposed[j][i], qa[i][j])
            encloses(B, squared[i][j], qa[i][j] ** 2)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=example_scale(50))
@given(data=st.data(), n=st.integers(1, 3), k=st.integers(1, 4))
def test_matrix_of_intervals_product(name, data, n, k):
    """A product of interval matrices contains the product of any point matrices inside them."""
    B = make_backend(name)
    lo = data.draw(matrices(n, k), "lo")
    width = data.draw(matrices(n, k, st.floats(0, 10, width=32)), "width")
    v = data.draw(matrices(k, 1), "v")
    rows = [[B.interval(F(float(lo[i, j])), F(float(lo[i, j])) + F(float(width[i, j]))) for j in range(k)]
            for i in range(n)]
    prod = (B.matrix(rows) @ B.array(v)).rows()
    prod_t = (B.array(v.T) @ B.matrix(rows).T).rows()  # point matrix on the left
    both = (B.matrix(rows) @ B.matrix([[x + B.interval(Fraction(0), Fraction(1, 8))] for x in B.array(v).T.rows()[0]]))
    for pick in (0, 1, Fraction(1, 3)):
        for i in range(n):
            exact_value = sum(((F(float(lo[i, j])) + pick * F(float(width[i, j]))) * F(float(v[j, 0]))
                               for j in range(k)), Fraction(0))
            encloses(B, prod[i][0], exact_value)
            encloses(B, prod_t[0][i], exact_value)
            shifted = exact_value + sum((F(float(lo[i, j])) + pick * F(float(width[i, j])) for j in range(k)),
                                        Fraction(0)) * pick / 8
            encloses(B, both.rows()[i][0], shifted)


@pytest.mark.parametrize("name", NAMES)
def test_matmul_shape_mismatch_raises(name):
    """A shape mismatch is an error, never a silently wrong product."""
    B = make_backend(name)
    with pytest.raises(ValueError):
        B.array(np.ones((2, 3))) @ B.array(np.ones((2, 3)))


# --- exact conversion of stored weights ------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@settings(max_examples=example_scale(50))
@given(data=st.data())
def test_array_conversion_is_exact(name, dtype, data):
    """Every finite float16/32/64 value (subnormals, extremes, -0.0) enters as an exact point."""
    B = make_backend(name)
    shape = data.draw(st.sampled_from([(1,), (5,), (2, 3), (4, 1)]), "shape")
    a = data.draw(hnp.arrays(dtype, shape, elements=hnp.from_dtype(np.dtype(dtype), allow_nan=False,
                                                                      allow_infinity=False)), "a")
    m = B.array(a)
    a2 = a[None, :] if a.ndim == 1 else a
    assert m.shape == a2.shape
    for row, got in zip(a2, m.rows()):
        for v, x in zip(row, got):
            assert B.lower(x) == B.upper(x) == Fraction(float(v))


@pytest.mark.parametrize("name", NAMES)
def test_array_conversion_extremes(name):
    """The largest, smallest normal and smallest subnormal values of each float width are exact."""
    B = make_backend(name)
    for dtype in (np.float16, np.float32, np.float64):
        info = np.finfo(dtype)
        vals = np.array([info.max, -info.max, info.tiny, info.smallest_subnormal, -0.0, 1], dtype=dtype)
        for v, x in zip(vals, B.array(vals).rows()[0]):
            assert B.lower(x) == B.upper(x) == Fraction(float(v))


@pytest.mark.parametrize("name", NAMES)
@given(a=hnp.arrays(np.int32, (2, 3)))
def test_integer_array_conversion_is_exact(name, a):
    """Integer arrays convert exactly."""
    B = make_backend(name)
    for row, got in zip(a, B.array(a).rows()):
        for v, x in zip(row, got):
            assert B.lower(x) == B.upper(x) == int(v)


@pytest.mark.parametrize("name", NAMES)
def test_np_floating_scalar(name):
    """num() of a numpy float32 scalar is its exact value."""
    B = make_backend(name)
    v = np.float32(0.1)
    assert B.lower(B.num(v)) == B.upper(B.num(v)) == Fraction(float(v))
    with pytest.raises(TypeError):
        B.num("0.1")


def test_backends_agree_on_a_formula():
    """Both backends enclose the same exact value of a composite formula, so their boxes overlap."""
    boxes = []
    for name in NAMES:
        B = make_backend(name)
        x = B.num(Fraction(3, 7))
        y = B.exp(x) * B.sqrt(B.num(2)) - B.log(B.num(5)) / (1 + B.tanh(x))
        boxes.append((B.lower(y), B.upper(y)))
    assert max(lo for lo, _ in boxes) <= min(hi for _, hi in boxes)


# --- the declared interface ------------------------------------------------------------------------

def test_backend_declares_every_primitive_with_its_contract():
    """Backend declares each primitive the rules use, with a docstring stating its contract; both backends
    implement every one (no abstract method left) and neither adds a public method of its own."""
    import inspect
    from tcert.checker.flint_backend import FlintBackend
    from tcert.checker.interval import MATRIX_HOOKS, PRIMITIVES, Backend, IMat
    from tcert.checker.mpmath_backend import MpmathBackend
    for name in PRIMITIVES + ("precision",):
        assert (inspect.getdoc(getattr(Backend, name)) or "").strip(), name
    for name in ("__matmul__", "__add__", "__sub__", "scale", "T", "rows", "map", "col_bounds"):
        assert hasattr(IMat, name), name
    for hook in MATRIX_HOOKS:
        assert hasattr(Backend, hook), hook
    declared = {n for n in dir(Backend) if not n.startswith("_")}
    for cls in (FlintBackend, MpmathBackend):
        assert not cls.__abstractmethods__, (cls.__name__, cls.__abstractmethods__)
        assert {n for n in dir(cls) if not n.startswith("_")} - {"iv"} == declared, cls.__name__
    with pytest.raises(TypeError):
        Backend()       # the interface itself computes nothing
