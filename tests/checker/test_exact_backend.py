"""The exact layer under the Backend interface (checker/exact_backend.py): products with a point factor on
float64 BLAS, for both backends, against exact Fraction products and against the libraries' own products."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker import exact_backend, interval
from tcert.checker.errors import Rejected
from tcert.checker.interval import make_backend

BACKENDS = ("flint+exact", "mpmath+exact")


def weights(rng, shape, dtype, zero_cols=()):
    """Random stored weights with subnormals, signed zeros, wide spreads and zero columns."""
    w = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 10, shape))
    w[rng.random(shape) < 0.1] = 0.0
    w[rng.random(shape) < 0.05] = -0.0
    if dtype == np.float64:
        w[rng.random(shape) < 0.03] = 5e-324 * rng.integers(1, 9)
    for c in zero_cols:
        w[:, c] = 0.0
    return w.astype(dtype)


def exact_product(a, b):
    """The exact rational product of two float arrays (Fractions)."""
    fa = [[Fraction(float(x)) for x in row] for row in np.atleast_2d(a)]
    fb = [[Fraction(float(x)) for x in row] for row in np.atleast_2d(b)]
    return [[sum((x * y for x, y in zip(r, c)), Fraction(0)) for c in zip(*fb)] for r in fa]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), m=st.integers(1, 6), k=st.integers(1, 40), n=st.integers(1, 6),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]), name=st.sampled_from(BACKENDS))
def test_point_products_enclose_the_exact_product_within_an_ulp(seed, m, k, n, dtype, name):
    """Point x point through the layer: the ends hold the exact Fraction product, within 2^-48 of the
    row-column scale of its chunk (2^-44: the float exit); zero columns included."""
    rng = np.random.default_rng(seed)
    a, b = weights(rng, (m, k), dtype), weights(rng, (k, n), dtype, zero_cols=[0])
    B = make_backend(name)
    with B.precision():
        p = B.array(a) @ B.array(b)
        assert p.ends is not None
        lo, hi = p.col_bounds(m)[0] if m == 1 else (None, None)
        rows = p.rows()
    ref, abs_ref = exact_product(a, b), exact_product(np.abs(a), np.abs(b))
    row_max, col_top = np.abs(a.astype(np.float64)).max(axis=1), np.frexp(np.abs(b.astype(np.float64)).max(axis=0))[1]
    for i in range(m):
        for j in range(n):
            low, high = B.lower(rows[i][j]), B.upper(rows[i][j])
            assert low <= ref[i][j] <= high
            # the float exit is tight to the largest row-column scale of its chunk (float_bounds' docstring)
            scale = max(abs_ref[r][c] + Fraction(float(row_max[r])) * Fraction(2) ** int(col_top[c])
                        for r in range(m) for c in range(n))
            assert high - low <= scale * Fraction(1, 2 ** 44)
    if m == 1:
        assert all(lo[j] <= ref[0][j] <= hi[j] for j in range(n))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_interval_times_point_contains_every_corner_and_matches_the_library(name, side):
    """A native interval matrix times stored weights (and weights times it): the result contains the exact
    product at random points of the box, and is within a few ulps of the library's own product."""
    rng = np.random.default_rng(7)
    B = make_backend(name)
    w = weights(rng, (9, 5), np.float32, zero_cols=[2])
    mids = rng.standard_normal((4, 9))
    with B.precision():
        third = B.num(1) / 3
        X = B.matrix([[B.num(float(v)) + third * B.num(Fraction(1, 1000)) * B.interval(Fraction(-1), Fraction(1))
                       for v in row] for row in mids])
        W = B.array(w if side == "right" else w.T)
        got = X @ W if side == "right" else W @ X.T
        assert got.ends is not None
        ref = B._native_matmul(X, B.array(w) if side == "right" else B.array(w.T)) if side == "right" \
            else B._native_matmul(B.array(w.T), X.T)
        got_rows, ref_rows = got.rows(), ref.rows()
        x_lo = np.array([[float(B.lower(v)) for v in r] for r in X.rows()])
        x_hi = np.array([[float(B.upper(v)) for v in r] for r in X.rows()])
    for _ in range(5):
        pt = x_lo + (x_hi - x_lo) * rng.integers(0, 2, x_lo.shape)     # corners: exact floats in the box
        exact = exact_product(pt, w) if side == "right" else exact_product(w.T, pt.T)
        for i, row in enumerate(exact):
            for j, v in enumerate(row):
                assert B.lower(got_rows[i][j]) <= v <= B.upper(got_rows[i][j])
    for g, r in zip(sum(got_rows, []), sum(ref_rows, [])):
        width, ref_width = B.upper(g) - B.lower(g), B.upper(r) - B.lower(r)
        assert width <= ref_width + Fraction(1, 2 ** 40) * (abs(B.upper(r)) + 1)


def test_both_backends_give_the_same_ends():
    """The layer does the same arithmetic for flint and mpmath: identical float64 ends."""
    rng = np.random.default_rng(3)
    a, b = weights(rng, (5, 30), np.float32), weights(rng, (30, 7), np.float32)
    ends = []
    for name in BACKENDS:
        B = make_backend(name)
        with B.precision():
            ends.append((B.array(a) @ B.array(b)).ends)
    assert np.array_equal(ends[0][0], ends[1][0]) and np.array_equal(ends[0][1], ends[1][1])


@pytest.mark.parametrize("name", BACKENDS)
def test_the_layer_declines_where_it_does_not_apply(name):
    """No point factor, precision above 64 bits, or a non-finite entry: the library's product runs, and a
    non-finite result fails closed (Rejected) when its endpoints are read."""
    B = make_backend(name)
    w = np.ones((2, 2), dtype=np.float32)
    with B.precision():
        X = B.matrix([[B.num(1), B.num(2)], [B.num(3), B.num(4)]])
        assert (X @ X).ends is None
        bad = B.matrix([[B.num(1) / B.interval(Fraction(-1), Fraction(1)), B.num(1)], [B.num(1), B.num(1)]])
        with pytest.raises(Rejected):
            [B.lower(v) for row in (bad @ B.array(w)).rows() for v in row]
    off = make_backend(name.replace("+exact", "-exact"))
    with off.precision():
        assert (off.array(w) @ off.array(w)).ends is None      # off by default: the library's product
    hi = make_backend(name, 100)
    assert hi.prec > interval.EXACT_MAX_PREC
    with hi.precision():
        assert (hi.array(w) @ hi.array(w)).ends is None
        huge = B.matrix([[B.exp(B.num(2000)), B.num(1)], [B.num(1), B.num(1)]])   # beyond float64 (within 2^16384): declined
        big = (huge @ B.array(w)).rows()[0][0]
        assert B.lower(big) > Fraction(2) ** 1024
    assert exact_backend.point_ends(np.array([[np.inf, 1.0]], dtype=np.float32)) is None


def test_column_bounds_from_ends_reject_non_finite_and_group():
    """col_bounds on ends: exact Fractions of the per-group extremes; a non-finite end is Rejected."""
    lo = np.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.0], [2.0, 1.0]])
    hi = lo + 0.25
    got = exact_backend.column_bounds((lo, hi), 2)
    assert got == [([Fraction(1, 2), Fraction(-2)], [Fraction(5, 4), Fraction(13, 4)]),
                   ([Fraction(-1), Fraction(0)], [Fraction(9, 4), Fraction(5, 4)])]
    with pytest.raises(Rejected):
        exact_backend.column_bounds((lo, np.where(lo > 2.5, np.inf, hi)), 1)


def exact_sum(parts, i, j):
    return sum((Fraction(float(p[i, j])) for p in parts), Fraction(0))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), m=st.integers(1, 5), k=st.integers(1, 30), n=st.integers(1, 5),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]))
def test_split_bounds_enclose_within_2_to_the_minus_98_and_keep_the_split_form(seed, m, k, n, dtype):
    """The default exit: lo1 + lo2 <= exact product <= hi1 + hi2 (Fractions), within 2^-98 of the
    largest row-column scale (split_bounds' docstring: a few units of 2^-105), lo1 the float64 floor
    (0 <= lo2 < ulp), hi mirrored; the two-part column bounds are the exact extremes of the sums."""
    from tcert.checker import exact_products as ep, exact_rounding as er
    rng = np.random.default_rng(seed)
    a, b = weights(rng, (m, k), dtype).astype(np.float64), weights(rng, (k, n), dtype).astype(np.float64)
    bits = ep.bits_for(k)
    got = er.split_bounds(ep.point_product(ep.cut_rows(a, bits), ep.cut_cols(b, bits)))
    if got is None:        # a part would leave the float range (subnormal products): the one-part exit
        return
    (lo1, lo2), (hi1, hi2) = got
    ref, abs_ref = exact_product(a, b), exact_product(np.abs(a), np.abs(b))
    row_max, col_top = np.abs(a).max(axis=1), np.frexp(np.abs(b).max(axis=0))[1]
    scale = max(abs_ref[r][c] + Fraction(float(row_max[r])) * Fraction(2) ** int(col_top[c])
                for r in range(m) for c in range(n))
    assert np.all((lo2 >= 0) & (lo2 < np.nextafter(lo1, np.inf) - lo1))
    assert np.all((hi2 <= 0) & (-hi2 < hi1 - np.nextafter(hi1, -np.inf)))
    for i in range(m):
        for j in range(n):
            low, high = exact_sum((lo1, lo2), i, j), exact_sum((hi1, hi2), i, j)
            assert low <= ref[i][j] <= high
            assert high - low <= scale * Fraction(1, 2 ** 98) + Fraction(2) ** -1070
    bounds = exact_backend.column_bounds(((lo1, lo2), (hi1, hi2)), 1)[0]
    assert bounds[0] == [min(exact_sum((lo1, lo2), i, j) for i in range(m)) for j in range(n)]
    assert bounds[1] == [max(exact_sum((hi1, hi2), i, j) for i in range(m)) for j in range(n)]


def test_split_form_is_checked_by_column_bounds():
    """Two-part ends not in split_bounds' form (a rest as large as an ulp) are a checker bug, not a bound."""
    from tcert.checker.exact_products import BoundViolation
    p1 = np.array([[1.0, 2.0]])
    with pytest.raises(BoundViolation):
        exact_backend.column_bounds(((p1, np.array([[2.0 ** -52, 0.0]])), (p1,)), 1)


def test_native_operands_enter_as_two_exact_parts():
    """ends_from_arb / ends_from_mpf: a 64-bit Arb point splits exactly (p1 + p2 == x, a point pair);
    a ball's and an mpmath interval's parts lie outward of its ends, within 2^-100 relative."""
    import flint
    import mpmath
    from tcert.checker import exact_rounding as er
    old = flint.ctx.prec
    flint.ctx.prec = 64
    try:
        third = flint.arb(1) / 3
        points = flint.arb_mat([[third.mid(), (-third * 7).mid(), flint.arb(0)], [flint.arb(2) ** -1000, (third ** 5).mid(), 1]])
        lo, hi = er.ends_from_arb(points)
        assert lo is hi
        for i in range(2):
            for j in range(3):
                man, ex = points[i, j].mid().man_exp()
                assert exact_sum(lo, i, j) == Fraction(int(man)) * Fraction(2) ** int(ex)
        balls = flint.arb_mat([[third, -third * 7, third.exp()]])
        lo, hi = er.ends_from_arb(balls)
        assert lo is not hi
        for j in range(3):
            low, high = exact_sum(lo, 0, j), exact_sum(hi, 0, j)
            man, ex = balls[0, j].lower().mid().man_exp()
            e_lo = Fraction(int(man)) * Fraction(2) ** int(ex)
            man, ex = balls[0, j].upper().mid().man_exp()
            e_hi = Fraction(int(man)) * Fraction(2) ** int(ex)
            assert low <= e_lo and e_hi <= high
            assert e_lo - low <= abs(e_lo) * Fraction(1, 2 ** 100) and high - e_hi <= abs(e_hi) * Fraction(1, 2 ** 100)
    finally:
        flint.ctx.prec = old
    ctx = mpmath.iv
    ctx.prec = 64
    x = ctx.mpf(1) / 3
    lo, hi = er.ends_from_mpf([[x, -x]])
    for j, v in enumerate([x, -x]):
        a, b = (Fraction(int(m) * (-1 if s else 1)) * Fraction(2) ** int(e) for s, m, e, _ in v._mpi_)
        assert exact_sum(lo, 0, j) <= a and b <= exact_sum(hi, 0, j)
        assert a - exact_sum(lo, 0, j) <= abs(a) * Fraction(1, 2 ** 100)


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_default_is_as_tight_as_arbs_own_products(side):
    """flint (exact layer) against flint-exact (Arb's products) on 64-bit intervals and points times
    float32 weights: every width within 3x of Arb's plus 2^-120 (measured: 1.0x on points, 1.0-1.3x on balls)."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((24, 10)).astype(np.float32)
    x = rng.standard_normal((6, 24))
    widths = {}
    for name in ("flint", "flint-exact"):
        B = make_backend(name)
        with B.precision():
            third = B.num(1) / 3
            X = B.matrix([[B.num(float(v)) * third for v in r] for r in x])     # 64-bit balls
            C = X.backend.centres(X)[0]                                          # 64-bit points
            W = B.array(w if side == "right" else w.T)
            out = [X @ W, C @ W] if side == "right" else [W @ X.T, W @ C.T]
            assert (out[0].ends is not None) == (name == "flint")
            widths[name] = [B.upper(v) - B.lower(v) for o in out for row in o.rows() for v in row]
    for ours, arb in zip(widths["flint"], widths["flint-exact"]):
        assert ours <= 3 * arb + Fraction(1, 2 ** 120)


def arb_value(x):
    """The exact rational of an exact Arb point."""
    man, ex = x.man_exp()
    return Fraction(int(man)) * Fraction(2) ** int(ex)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), m=st.integers(1, 4), k=st.integers(1, 20), n=st.integers(1, 4),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]), side=st.sampled_from(["left", "right"]),
       spread=st.sampled_from([0, 2 ** -60, 2 ** -20, 1.0, 2 ** -1060]))
def test_balls_times_weights_enclose_200_bit_points_of_the_ball(seed, m, k, n, dtype, side, spread):
    """The midpoint-radius way in (ball_from_arb, ball_times_point): 64-bit Arb balls (radii from 0 and
    subnormal to wide, some entries exact) times stored weights with subnormals, zeros and wide spreads
    (and weights times balls): every entry encloses the exact product at 200-bit points of the balls."""
    import flint
    rng = np.random.default_rng(seed)
    w = weights(rng, (k, n), dtype)
    B = make_backend("flint")
    with B.precision():
        mids = [flint.arb(float(v)) / 3 for v in rng.standard_normal(m * k) * np.exp2(rng.integers(-40, 40, m * k))]
        rads = [flint.arb(float(r)) for r in rng.random(m * k) * spread * (rng.random(m * k) < 0.7)]
        X = B._from_rows([[(a + r * flint.arb(0, 1)) for a, r in zip(mids[i * k:(i + 1) * k], rads[i * k:(i + 1) * k])]
                          for i in range(m)], (m, k))
        W = B.array(w if side == "right" else w.T)
        got = (X @ W if side == "right" else W @ X.T)
        assert got.ends is not None
        rows = got.rows() if side == "right" else got.T.rows()
        ball_rows = X.rows()
    old = flint.ctx.prec
    flint.ctx.prec = 200
    try:
        for _ in range(3):
            pts = [[x.mid() + x.rad() * flint.arb(float(rng.uniform(-1, 1))) for x in row] for row in ball_rows]
            pts = [[arb_value(p.mid()) for p in row] for row in pts]      # 200-bit points inside the balls
            wf = [[Fraction(float(v)) for v in row] for row in w]
            for i in range(m):
                for j in range(n):
                    v = sum((pts[i][l] * wf[l][j] for l in range(k)), Fraction(0))
                    assert B.lower(rows[i][j]) <= v <= B.upper(rows[i][j])
    finally:
        flint.ctx.prec = old


def test_ball_from_arb_splits_midpoints_exactly_and_bounds_radii():
    """ball_from_arb: p1 + p2 is each midpoint exactly, r >= each radius, r = 0 for a point matrix;
    None for a midpoint beyond two float64 parts (a 200-bit one) and for a non-finite entry."""
    import flint
    from tcert.checker import exact_rounding as er
    old = flint.ctx.prec
    flint.ctx.prec = 64
    try:
        third = flint.arb(1) / 3
        balls = flint.arb_mat([[third, -third * 7, third.exp()], [flint.arb(2) ** -1000 * third, flint.arb(0), flint.arb(5)]])
        (p1, p2), r = er.ball_from_arb(balls)
        for i in range(2):
            for j in range(3):
                x = balls[i, j]
                assert Fraction(float(p1[i, j])) + Fraction(float(p2[i, j])) == arb_value(x.mid())
                assert Fraction(float(r[i, j])) >= arb_value(x.rad())
        points = balls.mid()
        assert not er.ball_from_arb(points)[1].any()
        flint.ctx.prec = 200
        wide = flint.arb_mat([[flint.arb(1) / 3]]).mid()
        assert er.ball_from_arb(wide) is None
        assert er.ball_from_arb(flint.arb_mat([[flint.arb("inf")]])) is None
    finally:
        flint.ctx.prec = old


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), rows=st.integers(1, 6), n=st.integers(1, 5), groups=st.sampled_from([1, 2]),
       chunks=st.integers(1, 4))
def test_merged_column_extremes_are_the_exact_extremes(seed, rows, n, groups, chunks):
    """column_extremes + merge_extremes over several products (two-part split ends, one-part ends, and a
    native matrix's Fraction bounds mixed in) give exactly the Fractions that merging col_bounds gives."""
    from tcert.checker import exact_products as ep, exact_rounding as er
    rng = np.random.default_rng(seed)
    merged, ref = None, None
    for c in range(chunks):
        a = weights(rng, (rows * groups, 7), np.float32).astype(np.float64)
        b = weights(rng, (7, n), np.float32).astype(np.float64)
        exact = ep.point_product(ep.cut_rows(a, ep.bits_for(7)), ep.cut_cols(b, ep.bits_for(7)))
        ends = er.split_bounds(exact) if c % 2 == 0 else tuple((e,) for e in er.float_bounds(exact))
        if ends is None:
            ends = tuple((e,) for e in er.float_bounds(exact))
        ext = exact_backend.column_extremes(ends, groups)
        if c == 2:     # a native matrix's bounds: Fraction lists
            ext = exact_backend.column_bounds(ends, groups)
        new = exact_backend.column_bounds(ends, groups)
        merged = ext if merged is None else [exact_backend.merge_extremes(x, y) for x, y in zip(merged, ext)]
        ref = new if ref is None else [([min(u, v) for u, v in zip(x[0], y[0])], [max(u, v) for u, v in zip(x[1], y[1])])
                                       for x, y in zip(ref, new)]
    assert [(exact_backend.fractions(lo), exact_backend.fractions(hi)) for lo, hi in merged] == ref


SHIPPED = [("overwhelm/perm_lp.json", "overwhelm/neox1l_tiny.safetensors"),
           ("overwhelm/neox_real_perm.json", "overwhelm/neox_real_tiny.safetensors"),
           ("overwhelm/neox_real_any2.json", "overwhelm/neox_real_tiny.safetensors"),
           ("influence/robust2.influence.json", "influence/robust2.safetensors"),
           ("influence/toy2_bidir.influence.json", "influence/toy2_bidir.safetensors")]


@pytest.mark.parametrize("name", ["flint-exact", "mpmath+exact"])
@pytest.mark.parametrize("cert,model", SHIPPED)
def test_shipped_certificates_verify_with_the_layer_switched(cert, model, name):
    """The shipped certificates whose hints are the checker's own certified values verify with the layer
    switched off in flint and on in mpmath, as with the defaults (test_determinism checks flint and mpmath)."""
    from pathlib import Path

    from tcert.checker.verify import verify
    root = Path(__file__).resolve().parents[2] / "certificates"
    verify(str(root / cert), str(root / model), backend=make_backend(name))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), dtype=st.sampled_from([np.float16, np.float32, np.float64]),
       spread=st.sampled_from([4, 20, 40, 300]))
def test_exact_differences_only_claims_exact_float64_differences(seed, dtype, spread):
    """overwhelm tight's W_U[:, j] - W_U[:, k] is a point matrix only when exact_differences says every
    float64 difference is exact: then each equals the Fraction difference (random weights with zeros,
    subnormals and exponent spreads of 4..300 binades; small spreads of float32 are always exact)."""
    from tcert.checker.exact_backend import exact_differences
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):   # values beyond the dtype's range become inf, then 0 below
        a = (rng.standard_normal((6, 9)) * np.exp2(rng.integers(-spread, spread, (6, 9)).clip(-1070, 1000))).astype(dtype)
    a[(rng.random(a.shape) < 0.1) | ~np.isfinite(a)] = 0.0
    b = a[:, [int(rng.integers(0, 9))]]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ok = exact_differences(a64, b64, np.finfo(dtype).nmant + 1)
    if ok:
        d = a64 - b64
        assert all(Fraction(float(d[i, j])) == Fraction(float(a64[i, j])) - Fraction(float(b64[i, 0]))
                   for i in range(6) for j in range(9))
    if dtype == np.float32 and spread == 4:
        assert ok
