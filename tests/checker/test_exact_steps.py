"""The forward pass's steps on the exact layer (error_balls.exact_affine, exact_normalise, exact_rotate, and
head_output on centres held as float64 parts) and the exact primitives under them (exact_products.entrywise
/ row_sums, exact_rounding.split_centre / near_ball_from_arb, exact_backend.magnitude_of / times_parts):
every enclosure holds the 200-bit images of points of the input balls, every exact result equals its
Fraction, and no step's radius is wider than the entry-by-entry step it replaces."""

from fractions import Fraction
from types import SimpleNamespace

import flint
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpmath.ctx_mp import MPContext

from tcert.checker import error_balls as E
from tcert.checker import exact_backend, exact_products, exact_rounding
from tcert.checker import operator_norms as N
from tcert.checker.forward import rotary_angles, rotary_factors, rotary_pairs, rotate
from tcert.checker.interval import IMat, make_backend

REF = MPContext()
REF.prec = 200
SEEDS = st.integers(0, 2 ** 31)
EPS = st.sampled_from([Fraction(0), Fraction(1, 2 ** 40), Fraction(1, 1000)])


def mp(x: Fraction):
    return REF.mpf(x.numerator) / x.denominator


def centre(B, rows) -> list:
    """The exact centre rows of an error ball as Fractions (parts summed, or native points)."""
    parts = exact_backend.multi_point(rows.centre)
    if parts is not None:
        return [[sum((Fraction(float(p[i, j])) for p in parts), Fraction(0)) for j in range(parts[0].shape[1])]
                for i in range(parts[0].shape[0])]
    out = []
    for row in rows.centre.rows():
        assert all(B.lower(x) == B.upper(x) for x in row)
        out.append([B.lower(x) for x in row])
    return out


def inside(B, out, i, image):
    """The 200-bit image lies within row i's radius of its exact centre; returns distance / radius."""
    c = centre(B, out)[i]
    r = REF.sqrt(REF.fsum((REF.mpf(y) - mp(x)) ** 2 for x, y in zip(c, image)))
    assert r <= mp(out.eps[i]) * (1 + REF.mpf(2) ** -100) + REF.mpf(2) ** -190, (float(r), float(out.eps[i]))
    return r / mp(out.eps[i]) if out.eps[i] else 0


def point_rows(B, rng, m, d, eps, scale=1.0, parts=2):
    """m rows held as float64 parts (their sum the exact centre), each with radius eps."""
    c = rng.standard_normal((m, d)) * scale
    ps = (c,) + tuple(c * 2.0 ** (-55 * (t + 1)) * rng.standard_normal((m, d)) for t in range(parts - 1))
    return E.Rows(IMat(B, None, (m, d), (ps, ps)), [eps] * m)


def perturbed(B, X, i, eps, v):
    """Row i's exact centre moved by eps (1 - 2^-150) along v (200 bits)."""
    c = [mp(x) for x in centre(B, X)[i]]
    v = [REF.mpf(float(x)) for x in v]
    n = REF.sqrt(REF.fsum(x * x for x in v))
    return [a + x / n * mp(eps) * (1 - REF.mpf(2) ** -150) for a, x in zip(c, v)] if n else c



def tables(B, pos, theta):
    """The cos and sin matrices of `E.rotation`: a row per position p, a column per angle p t."""
    return (B.matrix([[B.cos(B.num(p * t)) for t in theta] for p in pos]),
            B.matrix([[B.sin(B.num(p * t)) for t in theta] for p in pos]))


def rotation_at(fine, pos, theta, pairs, dh, prec, rng):
    """E.rotation of rows at positions pos (angles p t), each p split at random as a + (p - a): the angles
    added on the exact layer."""
    a = [int(rng.integers(0, p + 1)) for p in pos]
    idx = np.arange(len(pos))
    return E.rotation(fine, tables(fine, a, theta), tables(fine, [p - x for p, x in zip(pos, a)], theta), (idx, idx),
                      pairs, dh, prec)

@pytest.mark.parametrize("prec", [64, 48])
@settings(max_examples=12, deadline=None)
@given(seed=SEEDS, eps=EPS, shape=st.tuples(st.integers(1, 4), st.integers(1, 9), st.integers(1, 3), st.integers(1, 4)))
def test_exact_affine_ball_holds_images_and_is_no_wider(prec, seed, eps, shape):
    """x W_h + b_h per head from centres of two parts: the images of perturbed points inside (the top
    singular direction nearly attains the bound); every radius <= linear_heads' on the same rows (at 48 bits
    the centre is the product's high word, `trimmed_centre`)."""
    m, k, heads, dh = shape
    B, rng = make_backend("flint", prec), np.random.default_rng(seed)
    W = (rng.standard_normal((k, heads * dh)) * 0.7).astype(np.float32)
    b = rng.standard_normal(heads * dh).astype(np.float32)
    X = point_rows(B, rng, m, k, eps)
    norms = [N.operator_norm(W[:, h * dh:(h + 1) * dh]) for h in range(heads)]
    with B.precision():
        out = E.exact_affine(B, X, B.array(np.vstack([W, b[None, :]]).astype(np.float64)), norms)
        old = E.linear_heads(B, E.Rows(B.matrix([[B.num(x) for x in r] for r in centre(B, X)]), X.eps),
                             B.array(W), norms, B.array(b).rows()[0])
    Wm = [[REF.mpf(float(x)) for x in row] for row in W]
    for h in range(heads):
        top = np.linalg.svd(W[:, h * dh:(h + 1) * dh].astype(np.float64))[0][:, 0]
        for i in range(m):
            assert out[h].eps[i] <= old[h].eps[i]
            ratios = []
            for v in (rng.standard_normal(k), top):
                x = perturbed(B, X, i, eps, v)
                ratios.append(inside(B, out[h], i, [REF.fsum(x[r] * Wm[r][j] for r in range(k)) + REF.mpf(float(b[j]))
                                                    for j in range(h * dh, (h + 1) * dh)]))
            assert ratios[1] > 0.9 or eps < Fraction(1, 2 ** 30)


def exact_norm_row(x, w, b, eps_ln, centred):
    d = len(x)
    mean = REF.fsum(x) / d if centred else 0
    u = [a - mean for a in x]
    s = REF.sqrt(REF.fsum(a * a for a in u) / d + mp(eps_ln))
    return [a / s * REF.mpf(float(wi)) + (REF.mpf(float(bi)) if b is not None else 0) for a, wi, bi in
            zip(u, w, b if b is not None else w)]


@pytest.mark.parametrize("centred,prec", [(True, 64), (False, 64), (True, 48), (False, 48)])
@settings(max_examples=12, deadline=None)
@given(seed=SEEDS, eps=EPS, d=st.integers(2, 12), spread=st.sampled_from([1e-3, 1.0, 10.0]))
def test_exact_normalise_ball_holds_images(centred, prec, seed, eps, d, spread):
    """LayerNorm / RMSNorm from centres of one or two parts (d not a power of two included): images of
    random and worst-direction points inside; at 64 bits the radius within 2^-30 of `normalise`'s plus 2^-100
    (at 48 bits the scaling enters as one part, `near_parts`: within 2x of it plus 2^-40 relative)."""
    B, rng = make_backend("flint", prec), np.random.default_rng(seed)
    eps_ln = Fraction(1, 100000)
    w = (1 + 0.3 * rng.standard_normal(d)).astype(np.float32)
    b = (0.1 * rng.standard_normal(d)).astype(np.float32) if centred else None
    X = point_rows(B, rng, 2, d, eps, spread, parts=1 + seed % 2)
    with B.precision():
        out = E.exact_normalise(B, X, w.astype(np.float64)[None, :], None if b is None else b.astype(np.float64)[None, :],
                                eps_ln, N.max_abs(w), centred)
        native = E.Rows(B.matrix([[B.num(x) for x in r] for r in centre(B, X)]), X.eps)
        old = E.normalise(B, native, B.array(w).rows()[0], None if b is None else B.array(b).rows()[0], eps_ln,
                          N.max_abs(w), centred)
    for i in range(2):
        if prec == 64:
            assert out.eps[i] <= old.eps[i] * (1 + Fraction(1, 2 ** 30)) + Fraction(1, 2 ** 100)
        else:
            assert out.eps[i] <= 2 * old.eps[i] + Fraction(1, 2 ** 40) * N.max_abs(w) * 4 * d
        c = np.asarray([float(x) for x in centre(B, X)[i]])
        u = c - (c.mean() if centred else 0)
        worst = np.zeros(d)
        worst[int(np.argmax(np.abs(w)))] = 1
        worst -= worst.mean() if centred else 0
        worst -= (worst @ u) / (u @ u) * u if u @ u > 0 else 0
        for v in (rng.standard_normal(d), worst if np.any(worst) else rng.standard_normal(d)):
            inside(B, out, i, exact_norm_row(perturbed(B, X, i, eps, v), w, b, eps_ln, centred))


@pytest.mark.parametrize("adjacent,prec", [(True, 64), (False, 64), (True, 48), (False, 48)])
@settings(max_examples=10, deadline=None)
@given(seed=SEEDS, eps=EPS, m=st.integers(1, 5), half=st.integers(1, 3), extra=st.integers(0, 2))
def test_exact_rotate_ball_holds_images_and_is_no_wider(adjacent, prec, seed, eps, m, half, extra):
    """Rotary rotations (adjacent and split pairs, columns no pair rotates) at positions up to 5000: the
    200-bit rotation of perturbed points inside; at 64 bits every radius <= rotate_rows' at the backend's
    precision (at 48 bits cos and sin enter as one part, `near_parts`: within 2x of it)."""
    B, rng = make_backend("flint", prec), np.random.default_rng(seed)
    dh = 2 * half + extra

    class Cfg:
        rotary, rotary_dim, rotary_adjacent_pairs, d_head = True, 2 * half, adjacent, dh
    pairs = rotary_pairs(Cfg)
    pos = rng.integers(0, 5000, m).tolist()
    theta = [Fraction(int(t * 2 ** 20), 2 ** 20) for t in rng.random(half)]
    X = point_rows(B, rng, m, dh, eps)
    fine = make_backend("flint", 2 * prec)
    with fine.precision():
        rot = rotation_at(fine, pos, theta, pairs, dh, prec, rng)
    assert len(rot.cos) == (1 if prec == 48 else 2)
    with B.precision():
        out = E.exact_rotate(B, X, rot)
        cs = [([B.cos(B.num(p * t)) for t in theta], [B.sin(B.num(p * t)) for t in theta]) for p in pos]
        native = E.Rows(B.matrix([[B.num(x) for x in r] for r in centre(B, X)]), X.eps)
        old = E.rotate_rows(B, native, lambda i, row: rotate(row, cs[i], pairs))
    for i in range(m):
        assert out.eps[i] <= (1 if prec == 64 else 2) * old.eps[i]
        x = perturbed(B, X, i, eps, rng.standard_normal(dh))
        y = list(x)
        for j, (i1, i2) in enumerate(pairs):
            a = mp(pos[i] * theta[j])
            y[i1] = x[i1] * REF.cos(a) - x[i2] * REF.sin(a)
            y[i2] = x[i2] * REF.cos(a) + x[i1] * REF.sin(a)
        inside(B, out, i, y)


def arb_point(x) -> Fraction:
    """An exact Arb point (fmpz mantissa and exponent) as a Fraction."""
    man, exp = x.man_exp()
    return Fraction(int(man)) * Fraction(2) ** int(exp)


@settings(max_examples=60, deadline=None)
@given(seed=SEEDS, prec=st.sampled_from([40, 48, 49, 64]))
def test_near_parts_holds_every_point(seed, prec):
    """near_parts (flint: near_ball_from_arb with one part at <= 48 bits, two above): for 96-bit balls with
    zeros, subnormals, wide exponents and wide radii, both ends mid +- rad of every ball lie within d of the
    parts' sum (Fractions); one part exactly where prec <= 48; mpmath gives none. A mutant without the
    nextafter step, or with d from the first rest while keeping two parts, fails here or in the test below."""
    rng, fine = np.random.default_rng(seed), make_backend("flint", 96)
    mids = rng.standard_normal(12) * 2.0 ** rng.integers(-1070, 20, 12)
    mids[0], mids[1] = 0.0, 5e-324
    with fine.precision():
        third = [fine.num(Fraction(int(v * 2 ** 40), 2 ** 40) if v else 0) / 3 for v in mids]
        rads = [x * fine.num(Fraction(2) ** int(-rng.integers(0, 120))) if i % 3 else 0 * x for i, x in enumerate(third)]
        balls = [t + fine.interval(-arb_point(r.mid()), arb_point(r.mid())) for t, r in zip(third, rads)]
        parts, d = E.near_parts(fine, fine.matrix([balls[:6], balls[6:]]).data, prec)
    assert len(parts) == (1 if prec <= 48 else 2)
    for i, x in enumerate(balls):
        r, c = divmod(i, 6)
        total, mid, rad = sum(Fraction(float(p[r, c])) for p in parts), arb_point(x.mid()), arb_point(x.rad())
        assert abs(mid + rad - total) <= Fraction(float(d[r, c])) and abs(mid - rad - total) <= Fraction(float(d[r, c]))
    assert E.near_parts(make_backend("mpmath", 96), make_backend("mpmath", 96).matrix([[1]]).data, prec) is None


def exact_head(q, K, V, div, visible):
    s = [REF.fsum(a * b for a, b in zip(q, K[r])) / div for r in range(visible)]
    e = [REF.exp(x - max(s)) for x in s]
    return [REF.fsum(e[r] / REF.fsum(e) * V[r][t] for r in range(visible)) for t in range(len(V[0]))]


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 4), n=st.integers(1, 6))
def test_entrywise_sum_of_precut_and_permuted_factors_is_exact(seed, m, n):
    """exact_rotate's form, x * C + x[:, p] * S, with x cut once (`line_cut`) and its digits permuted for x[:, p]
    (`permuted`), C and S cut once on their common scale: the Fraction value of every entry, as from the raw
    parts (wide spreads, subnormals, zeros). A cut on another scale or digit width is refused (BoundViolation). A
    mutant `permuted` that leaves the columns in place fails here (for n > 1, a non-identity p)."""
    rng = np.random.default_rng(seed)
    x = (wide(rng, (m, n)), wide(rng, (m, n)) * 2.0 ** -61)
    C, S = (wide(rng, (m, n)),), (rng.standard_normal((m, n)),)
    perm = list(rng.permutation(n)) if n > 1 and seed % 4 else list(range(1, n)) + [0]
    bits = exact_products.entry_bits(2)
    top = exact_products.line_top(list(C) + list(S), 0)
    cc, cs = (exact_products.line_cut(t, 0, bits, top) for t in (C, S))
    own = exact_products.line_cut(x, 0, bits)
    got = exact_products.entrywise_sum([([own, cc], []), ([exact_products.permuted(own, perm), cs], [])])
    swapped = tuple(p[:, perm] for p in x)
    raw = exact_products.entrywise_sum([([x, C], []), ([swapped, S], [])])
    for i in range(m):
        for j in range(n):
            want = frac(x, i, j) * frac(C, i, j) + frac(swapped, i, j) * frac(S, i, j)
            assert exact_value(got, i, j) == want == exact_value(raw, i, j)
    with pytest.raises(exact_products.BoundViolation):
        exact_products.entrywise_sum([([own, cc], []), ([own, exact_products.line_cut(S, 0, bits, top + 1)], [])])
    with pytest.raises(exact_products.BoundViolation):
        exact_products.entrywise_sum([([own, exact_products.line_cut(C, 0, bits - 1, top)], [])])


@settings(max_examples=8, deadline=None)
@given(seed=SEEDS, eps=EPS, n=st.integers(1, 6), dh=st.integers(1, 4))
def test_head_output_on_centres_held_as_parts(seed, eps, n, dh):
    """One attention head whose queries, keys and values are held as two float64 parts (the scores and
    the pattern times the values by the layer's products of several parts): images of perturbed points
    inside."""
    B, rng = make_backend("flint"), np.random.default_rng(seed)
    Q, K, V = (point_rows(B, rng, n, dh, eps) for _ in range(3))
    visible = [i + 1 for i in range(n)]
    with B.precision():
        out = E.head_output(B, Q, K, V, B.num(Fraction(3, 2)), visible)
    for i in range(n):
        q = perturbed(B, Q, i, eps, rng.standard_normal(dh))
        Kp = [perturbed(B, K, r, eps, rng.standard_normal(dh)) for r in range(n)]
        Vp = [perturbed(B, V, r, eps, rng.standard_normal(dh)) for r in range(n)]
        inside(B, out, i, exact_head(q, Kp, Vp, mp(Fraction(3, 2)), visible[i]))


# --- the primitives -------------------------------------------------------------------------------------

def wide(rng, shape):
    """float64 values with zeros, subnormals and exponent spreads up to 2^+-600."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-600, 600, (1, 1))) * np.exp2(rng.integers(-40, 40, shape))
    x[rng.random(shape) < 0.2] = 0.0
    x[rng.random(shape) < 0.05] = 5e-324 * rng.integers(1, 9)
    return x


def frac(parts, i, j):
    return sum((Fraction(float(p[i if p.shape[0] > 1 else 0, j if p.shape[1] > 1 else 0])) for p in parts), Fraction(0))


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 5), n=st.integers(1, 7))
def test_entrywise_products_and_row_sums_are_exact(seed, m, n):
    """diag(a) X diag(w) and X * Y + Z * S (parts, zeros, subnormals, spreads): split_centre's centre (~105 bits,
    or with `word` the high word, ~61 bits) within its radius of the Fraction value, the radius tight; row_sums of
    X * X the exact squared norms."""
    rng = np.random.default_rng(seed)
    X = (wide(rng, (m, n)), wide(rng, (m, n)) * 2.0 ** -60)
    a, w = (rng.standard_normal((m, 1)),), (rng.standard_normal((1, n)).astype(np.float32).astype(np.float64),)
    Y, Z, S = (rng.standard_normal((m, n)),), (wide(rng, (m, n)),), (rng.standard_normal((m, n)),)
    def peak(f, i):
        return max(abs(frac(f, i if f[0].shape[0] > 1 else 0, j)) for j in range(n))

    for got, value, scale in (
            (exact_products.entrywise([X, a], [w]), lambda i, j: frac(X, i, j) * frac(a, i, 0) * frac(w, 0, j),
             lambda i: 2 * peak(X, i) * peak(a, i) * peak(w, 0)),
            (exact_products.entrywise_sum([([X, Y], []), ([Z, S], [])]),
             lambda i, j: frac(X, i, j) * frac(Y, i, j) + frac(Z, i, j) * frac(S, i, j),
             lambda i: 2 * max(peak(X, i), peak(Z, i)) * max(peak(Y, i), peak(S, i)))):
        for word, tight in ((False, 90), (True, 50)):     # the high word alone: ~61 bits of the row's scale
            split = exact_rounding.split_centre(got, word)
            if split is None:        # a part beyond the float range: declined
                continue
            (c1, c2), sq = split
            for i in range(m):
                err = sum((value(i, j) - Fraction(float(c1[i, j])) - Fraction(float(c2[i, j]))) ** 2 for j in range(n))
                assert err <= sq[i]
                # tight to the row's scale (a zero row has no scale: its units are its chunk's, on the scale 2^0)
                assert not scale(i) or sq[i] <= max(err, (scale(i) * Fraction(1, 2 ** tight)) ** 2 * n)
    sums = exact_products.row_sums(exact_products.entrywise([X, X]))
    assert sums == [sum(frac(X, i, j) ** 2 for j in range(n)) for i in range(m)]


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, exp=st.integers(-1200, 1100))
def test_word_parts_are_the_exact_word_or_declined(seed, exp):
    """`_word_parts`: h1 + h2 = X 2^e exactly (int64 words up to 2^63, negative, zero), h1 of <= 33 and h2 of
    <= 31 significant bits, h2 >= 0; None exactly when a part would leave the float range (subnormal low
    bits or overflow); a mutant splitting at 30 bits but scaling by 2^31 would fail the sum."""
    rng = np.random.default_rng(seed)
    X = rng.integers(-2 ** 62, 2 ** 62, (3, 4), dtype=np.int64) >> rng.integers(0, 62, (3, 4))
    X[0, 0], X[0, 1], X[0, 2] = 0, -(2 ** 63) + 1, 2 ** 63 - 1
    e = np.full(X.shape, exp, np.int64) + rng.integers(0, 3, X.shape)
    got = exact_rounding._word_parts(X, e)
    fits = e.min() >= -1074 and e.max() + 63 <= 1024
    assert (got is not None) == fits
    if got is None:
        return
    h1, h2 = got
    for (i, j), x in np.ndenumerate(X):
        assert Fraction(float(h1[i, j])) + Fraction(float(h2[i, j])) == int(x) * Fraction(2) ** int(e[i, j])
        assert h2[i, j] >= 0 and Fraction(float(h2[i, j])) < Fraction(2) ** (int(e[i, j]) + 31)


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, bits=st.sampled_from([16, 19, 22]))
def test_the_magnitude_cut_is_the_cut_of_the_magnitudes(seed, bits):
    """magnitude_of(cut(W)) has exactly the digits, lines and bounds of cut(|W|) on the same scales."""
    rng = np.random.default_rng(seed)
    w = wide(rng, (int(rng.integers(1, 30)), int(rng.integers(1, 20))))
    top = np.frexp(np.abs(w).max(axis=0, initial=0.0))[1].astype(np.int64)
    got, want = exact_backend.magnitude_of(exact_products.cut_cols(w, bits, top)), exact_products.cut_cols(np.abs(w), bits, top)
    assert len(got.digits) == len(want.digits) and got.bound == want.bound
    assert all(np.array_equal(x, y) for x, y in zip(got.digits, want.digits))
    assert all(np.array_equal(x, y) for x, y in zip(got.index, want.index))


@settings(max_examples=15, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 4), k=st.integers(1, 20), n=st.integers(1, 5), ball=st.booleans())
def test_products_with_a_point_of_several_parts_enclose_200_bit_points(seed, m, k, n, ball):
    """A native ball matrix (or a point) times a point held as two parts: the result holds the exact
    product at 200-bit points of the balls (a mutant without the radius term is caught)."""
    B, rng = make_backend("flint"), np.random.default_rng(seed)
    p = (rng.standard_normal((k, n)), rng.standard_normal((k, n)) * 2.0 ** -60)
    right = IMat(B, None, (k, n), (p, p))
    mids = rng.standard_normal((m, k))
    with B.precision():
        tiny = B.num(Fraction(1, 2 ** 20)) * B.interval(Fraction(-1), Fraction(1)) if ball else B.num(0)
        left = B.matrix([[B.num(float(x)) + tiny for x in row] for row in mids])
        got = left @ right
        assert got.ends is not None
        rows = got.rows()
        for _ in range(3):
            t = [[Fraction(float(x)) + (Fraction(int(rng.integers(-2 ** 30, 2 ** 30)), 2 ** 50) if ball else 0)
                  for x in row] for row in mids]
            for i in range(m):
                for j in range(n):
                    exact = sum(t[i][l] * (Fraction(float(p[0][l, j])) + Fraction(float(p[1][l, j]))) for l in range(k))
                    assert B.lower(rows[i][j]) <= exact <= B.upper(rows[i][j])


def test_a_mutant_without_the_radius_term_is_caught(monkeypatch):
    """balls_times_points without r |W|: the test above's check fails on a ball."""
    real = exact_backend.balls_times_points
    monkeypatch.setattr(exact_backend, "balls_times_points", lambda mid, rad, wh, mg: real(mid, 0 * rad, wh, None))
    with pytest.raises(AssertionError):
        test_products_with_a_point_of_several_parts_enclose_200_bit_points.hypothesis.inner_test(
            seed=3, m=2, k=5, n=2, ball=True)


def test_near_ball_from_arb_holds_every_point():
    """p1 + p2 within d of every point of 128-bit balls (and of exact points); None for inf."""
    flint.ctx.prec = 128
    try:
        third = flint.arb(1) / 3
        m = flint.arb_mat(2, 2, [third, third * flint.arb(10) ** 30, flint.arb(2) ** -1070, flint.arb(0)])
        (p1, p2), d = exact_rounding.near_ball_from_arb(m)
        for i, x in enumerate(m.entries()):
            r, c = divmod(i, 2)
            centre = flint.arb(float(p1[r, c])) + flint.arb(float(p2[r, c]))
            assert (x - centre).abs_upper() <= flint.arb(float(d[r, c]))
        assert d[0, 0] < 2.0 ** -100 and d[1, 1] == np.nextafter(0.0, 1.0)
        (q1,), d1 = exact_rounding.near_ball_from_arb(m, 1)
        assert np.array_equal(q1, p1) and d1[0, 0] > 2.0 ** -60 and d1[1, 1] == np.nextafter(0.0, 1.0)
        for i, x in enumerate(m.entries()):
            assert (x - flint.arb(float(q1.flat[i]))).abs_upper() <= flint.arb(float(d1.flat[i]))
        assert exact_rounding.near_ball_from_arb(flint.arb_mat(1, 1, [flint.arb("inf")])) is None
    finally:
        flint.ctx.prec = 64


def _up_reference(x: Fraction) -> Fraction:
    """error_balls.up as first written, in Fraction arithmetic."""
    if x <= 0:
        return Fraction(x)
    shift = E.BITS - (x.numerator.bit_length() - x.denominator.bit_length())
    scaled = x * (Fraction(2) ** shift)
    return Fraction(-(-scaled.numerator // scaled.denominator)) / Fraction(2) ** shift


def _sqrt_reference(x: Fraction, upward: int) -> Fraction:
    """error_balls._sqrt as first written, in Fraction arithmetic."""
    import math
    if x <= 0:
        return Fraction(0)
    k = max(0, E.BITS - (x.numerator.bit_length() - x.denominator.bit_length()) // 2)
    scaled = x * 4 ** k
    if upward:
        n = -(-scaled.numerator // scaled.denominator)
        r = math.isqrt(n)
        return Fraction(r if r * r == n else r + 1, 2 ** k)
    return Fraction(math.isqrt(scaled.numerator // scaled.denominator), 2 ** k)


RATIONALS = st.one_of(st.just(Fraction(0)),
                      st.builds(lambda n, t: Fraction(n, 2 ** t), st.integers(-2 ** 70, 2 ** 90), st.integers(0, 300)),
                      st.builds(lambda n, d, t: Fraction(n, d) * Fraction(2) ** t, st.integers(-10 ** 20, 10 ** 25),
                                st.integers(1, 10 ** 20), st.integers(-200, 200)))


@settings(max_examples=120)
@given(xs=st.lists(RATIONALS, min_size=1, max_size=4), ys=st.lists(RATIONALS, min_size=4, max_size=4),
       a=RATIONALS, c=RATIONALS)
def test_integer_radius_helpers_equal_their_fraction_forms(xs, ys, a, c):
    """up / _sqrt in integers, up_affine and sqrt_sum_up give exactly the values of the Fraction forms."""
    a, c = abs(a), abs(c)
    for x in xs + ys + [a, c]:
        assert E.up(x) == _up_reference(x)
        assert E.sqrt_up(abs(x)) == _sqrt_reference(abs(x), 1) and E.sqrt_down(abs(x)) == _sqrt_reference(abs(x), 0)
    assert E.up_affine(xs, ys, a, c) == [_up_reference(a * x + y + c) for x, y in zip(xs, ys)]
    pairs = [(abs(x), abs(y)) for x, y in zip(xs, ys)]
    assert E.sqrt_sum_up(pairs) == [_sqrt_reference(p, 1) + _sqrt_reference(q, 1) for p, q in pairs]


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 4), n=st.integers(1, 6))
def test_plus_row_is_the_exact_sum(seed, m, n):
    """exact_products.plus_row(x, b) = x + b entrywise (Fractions), b with zeros, subnormals, wide exponents."""
    rng = np.random.default_rng(seed)
    v = (rng.standard_normal((m, n)) * 2.0 ** rng.integers(-30, 30), rng.standard_normal((m, n)) * 2.0 ** -60)
    iota = (rng.random((m, 1)) + 0.5,)
    w = (rng.standard_normal((1, n)).astype(np.float32).astype(np.float64),)
    b = (rng.standard_normal((1, n)) * np.exp2(rng.integers(-12, 4, size=(1, n)))).astype(np.float32).astype(np.float64)
    b[rng.random((1, n)) < 0.3] = 0.0
    x = exact_products.entrywise([v, iota], [w])
    y = exact_products.plus_row(x, b)
    assert y is not None          # float32 biases within 2^16 of each other fit on these scales
    wide = b.copy()
    wide[0, 0] = 5e-324           # a subnormal far below the rest: too wide (None: the caller keeps b as a part)
    assert exact_products.plus_row(x, wide) is None or n == 1 or not np.any(b[0, 1:])
    value = lambda e, i, j: sum(sg * Fraction(int(M[i, j])) * Fraction(2) ** (o + int(e.row_scale[i]) + int(e.col_scale[j]))
                                for o, M, _, sg in e.terms)
    for i in range(m):
        for j in range(n):
            assert value(y, i, j) == value(x, i, j) + Fraction(float(b[0, j]))


def exact_value(e, i, j) -> Fraction:
    """Entry (i, j) of an exact_products.Exact as a Fraction."""
    return sum((sg * Fraction(int(M[i, j])) * Fraction(2) ** (o + int(e.row_scale[i]) + int(e.col_scale[j]))
                for o, M, _, sg in e.terms), Fraction(0))


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 3), n=st.integers(1, 5), bits=st.sampled_from([None, 8, 13]))
def test_entrywise_sums_of_three_and_four_factors_are_exact(seed, m, n, bits):
    """Products of 2 (a row and a column factor; a square), 3 and 4 factors of several wide parts (digits of
    one offset merged in `_partials`) equal their Fraction values exactly, at the default and narrow widths."""
    rng = np.random.default_rng(seed)
    X = (wide(rng, (m, n)), wide(rng, (m, n)) * 2.0 ** -60)
    a = (rng.standard_normal((m, 1)), rng.standard_normal((m, 1)) * 2.0 ** -55)
    w = (rng.standard_normal((1, n)).astype(np.float32).astype(np.float64),)
    Y = (wide(rng, (m, n)),)
    for rows, cols in (([X], [w]), ([X, X], []), ([X, a], [w]), ([X, a, Y], [w])):
        k = len(rows) + len(cols)
        got = exact_products.entrywise(rows, cols, None if bits is None else min(bits, 53 // k))
        for i in range(m):
            for j in range(n):
                want = Fraction(1)
                for f in rows:
                    want *= frac(f, i if f[0].shape[0] > 1 else 0, j if f[0].shape[1] > 1 else 0)
                for f in cols:
                    want *= frac(f, 0, j)
                assert exact_value(got, i, j) == want


@settings(max_examples=8, deadline=None)
@given(seed=SEEDS, eps=EPS, n=st.integers(1, 6), dh=st.integers(1, 4))
def test_head_output_at_twice_the_precision(seed, eps, n, dh):
    """The head with softmax and P V at twice the precision (`fine_heads`, an irrational divisor enclosed
    there): images of perturbed points inside, the centre two float64 parts, every radius <= the 64-bit
    route's, and without an input radius far below it (2^-20 of it) where the 64-bit route rounds."""
    B, rng = make_backend("flint"), np.random.default_rng(seed)
    Q, K, V = (point_rows(B, rng, n, dh, eps) for _ in range(3))
    visible = [i + 1 for i in range(n)]
    fine = E.fine_heads(B)
    assert fine is not None and fine.prec == 2 * B.prec
    with fine.precision():
        div = fine.sqrt(fine.num(3))
    with B.precision():
        out = E.head_output(B, Q, K, V, div, visible, fine)
        old = E.head_output(B, Q, K, V, B.sqrt(B.num(3)), visible)
    assert exact_backend.multi_point(out.centre) is not None and len(exact_backend.multi_point(out.centre)) == 2
    for i in range(n):
        assert out.eps[i] <= old.eps[i]
        assert eps or old.eps[i] == 0 or out.eps[i] * 2 ** 20 < old.eps[i]
        q = perturbed(B, Q, i, eps, rng.standard_normal(dh))
        Kp = [perturbed(B, K, r, eps, rng.standard_normal(dh)) for r in range(n)]
        Vp = [perturbed(B, V, r, eps, rng.standard_normal(dh)) for r in range(n)]
        inside(B, out, i, exact_head(q, Kp, Vp, REF.sqrt(3), visible[i]))


@settings(max_examples=8, deadline=None)
@given(seed=SEEDS, eps=EPS, heads=st.integers(1, 3), dh=st.integers(1, 3), d=st.integers(1, 5))
def test_heads_output_on_parts(seed, eps, heads, dh, d):
    """sum_h z_h W_h + b with every head's centre two float64 parts (side by side, one exact product):
    images of perturbed points inside, and no radius wider than with the heads' centres as 64-bit points."""
    B, rng = make_backend("flint"), np.random.default_rng(seed)
    W = rng.standard_normal((heads * dh, d)).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    balls = [point_rows(B, rng, 2, dh, eps * (h + 1)) for h in range(heads)]
    norms = (N.operator_norm(W), [N.operator_norm(W[h * dh:(h + 1) * dh]) for h in range(heads)])
    with B.precision():
        out = E.heads_output(B, balls, B.array(W), *norms, B.array(b).rows()[0])
        native = [E.Rows(B.matrix([[B.num(x) for x in r] for r in centre(B, h)]), h.eps) for h in balls]
        old = E.heads_output(B, native, B.array(W), *norms, B.array(b).rows()[0])
    assert exact_backend.multi_point(out.centre) is None      # the sum left the layer as Arb points
    top = np.linalg.svd(W.astype(np.float64))[0][:, 0]
    for i in range(2):
        assert out.eps[i] <= old.eps[i]
        for v in (rng.standard_normal(heads * dh), top):
            z = sum((perturbed(B, h_, i, eps * (h + 1), v[h * dh:(h + 1) * dh]) for h, h_ in enumerate(balls)), [])
            inside(B, out, i, [REF.fsum(z[r] * REF.mpf(float(W[r, j])) for r in range(heads * dh)) + REF.mpf(float(b[j]))
                               for j in range(d)])


@settings(max_examples=20, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 3), k=st.integers(1, 9), n=st.integers(1, 5))
def test_near_times_parts_holds_the_extreme_products(seed, m, k, n):
    """M W for M within d of the point p (parts) and W a point of two parts: the ends hold the exact
    products at M = p +- d with the signs of W's column (each entry's extremes), as Fractions."""
    rng = np.random.default_rng(seed)
    p = (wide(rng, (m, k)), wide(rng, (m, k)) * 2.0 ** -60)
    d = np.abs(rng.standard_normal((m, k))) * 2.0 ** -50 * (rng.random((m, k)) < 0.8)
    W = (rng.standard_normal((k, n)), rng.standard_normal((k, n)) * 2.0 ** -55)
    lo, hi = exact_backend.near_times_parts((p, d), W)
    for i in range(m):
        for j in range(n):
            w = [frac(W, l, j) for l in range(k)]
            for sign in (1, -1):
                y = sum(((frac(p, i, l) + sign * (1 if w[l] >= 0 else -1) * Fraction(float(d[i, l]))) * w[l]
                         for l in range(k)), Fraction(0))
                assert frac(lo, i, j) <= y <= frac(hi, i, j)


def test_near_times_parts_needs_its_radius():
    """p = 1, d = 2^-20, W = 1 (k = 3): the corner 3 (1 + 2^-20) is inside the ends, above those of d = 0."""
    one, W = (np.ones((1, 3)),), (np.ones((3, 1)),)
    _, hi = exact_backend.near_times_parts((one, np.full((1, 3), 2.0 ** -20)), W)
    _, hi0 = exact_backend.near_times_parts((one, np.zeros((1, 3))), W)
    assert frac(hi0, 0, 0) < 3 * (1 + Fraction(1, 2 ** 20)) <= frac(hi, 0, 0)


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 4), n=st.integers(1, 9))
def test_trimmed_keeps_the_row_top_bits_and_bounds_what_it_drops(seed, m, n):
    """`trimmed` (parts with zeros, subnormals, spreads up to 2^+-600): every kept entry is a multiple of
    2^(t_i - TRIM_BELOW) on its row (|p1| < 2^t_i) unless the row is kept whole, and the kept centre lies
    within sqrt(n) (max |p1 - p1'| + max |p2 - p2'|) of the old one in l2 (exact Fractions)."""
    rng = np.random.default_rng(seed)
    p1 = wide(rng, (m, n))
    p2 = p1 * 2.0 ** -54 * rng.standard_normal((m, n))
    sq = [Fraction(int(rng.integers(0, 5)), 2 ** 200) for _ in range(m)]
    (k1, k2), pairs = exact_rounding.trimmed((p1, p2), sq)
    for i in range(m):
        assert pairs[i][0] == sq[i]
        top = int(np.frexp(np.abs(p1[i]).max(initial=0.0))[1])
        unit = Fraction(2) ** (top - exact_rounding.TRIM_BELOW)
        whole = abs(exact_rounding.TRIM_BELOW - top) > 1000 or top == exact_rounding.TRIM_BELOW
        dist = Fraction(0)
        for j in range(n):
            kept = Fraction(float(k1[i, j])) + Fraction(float(k2[i, j]))
            assert whole or (kept / unit).denominator == 1
            dist += (Fraction(float(p1[i, j])) + Fraction(float(p2[i, j])) - kept) ** 2
        assert dist <= pairs[i][1]


def test_trimmed_drops_bits_and_counts_them():
    """A row whose second part reaches below 2^(top - TRIM_BELOW): bits are dropped, and counted."""
    p1, p2 = np.array([[1.0, 2.0 ** -40]]), np.array([[2.0 ** -60, 2.0 ** -90 + 2.0 ** -130]])
    (k1, k2), pairs = exact_rounding.trimmed((p1, p2), [Fraction(0)])
    assert k1[0, 1] == 2.0 ** -40 and k2[0, 0] == 2.0 ** -60 and k2[0, 1] == 0.0
    assert pairs[0][1] == 2 * (Fraction(2) ** -90 + Fraction(2) ** -130) ** 2     # n max^2, the top 2^1


@settings(max_examples=12, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 6), prec=st.sampled_from([48, 64]))
def test_uniform_radii_bound_every_row(seed, m, prec):
    """exact_affine / exact_rotate with `uniform` (keys and values): the same centres, one radius per head that
    is >= every row's own radius (rows with different input radii), so every row's 200-bit images stay inside;
    a mutant taking the minimum over rows instead would fail the >= (the rows' radii differ)."""
    B, rng = make_backend("flint", prec), np.random.default_rng(seed)
    k, heads, dh = 5, 2, 4
    W = (rng.standard_normal((k, heads * dh)) * 0.7).astype(np.float32)
    b = rng.standard_normal(heads * dh).astype(np.float32)
    X = point_rows(B, rng, m, k, Fraction(0), scale=float(2.0 ** rng.integers(-3, 4)))
    X = E.Rows(X.centre, [Fraction(int(rng.integers(0, 1000)), 2 ** 30) for _ in range(m)])
    norms = [N.operator_norm(W[:, h * dh:(h + 1) * dh]) for h in range(heads)]
    Wb = B.array(np.vstack([W, b[None, :]]).astype(np.float64))
    with B.precision():
        own, one = E.exact_affine(B, X, Wb, norms), E.exact_affine(B, X, Wb, norms, uniform=True)
    Wm = [[REF.mpf(float(x)) for x in row] for row in W]
    for h in range(heads):
        assert centre(B, own[h]) == centre(B, one[h]) and len(set(one[h].eps)) == 1
        assert one[h].eps[0] >= max(own[h].eps) and one[h].eps[0] <= 2 * max(own[h].eps) + Fraction(1, 2 ** 60)
        for i in range(m):
            x = perturbed(B, X, i, X.eps[i], rng.standard_normal(k))
            inside(B, one[h], i, [REF.fsum(x[r] * Wm[r][j] for r in range(k)) + REF.mpf(float(b[j]))
                                  for j in range(h * dh, (h + 1) * dh)])
    fine, theta = make_backend("flint", 2 * prec), [Fraction(int(t * 2 ** 20), 2 ** 20) for t in rng.random(dh // 2)]
    pos = rng.integers(0, 5000, m).tolist()
    with fine.precision():
        rot = rotation_at(fine, pos, theta, [(0, 2), (1, 3)], dh, prec, rng)
    with B.precision():
        r_own, r_one = E.exact_rotate(B, own[0], rot), E.exact_rotate(B, own[0], rot, uniform=True)
    assert centre(B, r_own) == centre(B, r_one) and len(set(r_one.eps)) == 1
    assert r_one.eps[0] >= max(r_own.eps)
    assert r_one.eps[0] <= max(r_own.eps) * (1 + Fraction(1, 2 ** 30)) + Fraction(1, 2 ** 40)


@pytest.mark.parametrize("prec", [48, 64])
@settings(max_examples=12, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 6), half=st.integers(1, 4))
def test_rotation_delta_bounds_every_row(prec, seed, m, half):
    """Rotation.delta (one bound for all rows) >= sqrt((cos - C)^2 + (sin - S)^2) of every row and pair, cos and
    sin at 200 bits, C and S the midpoint parts; rotation_rows keeps it. A mutant taking the smallest radii
    (or one row's) fails at 48 bits, where one part drops ~2^-53 of each value."""
    rng = np.random.default_rng(seed)
    fine = make_backend("flint", 2 * prec)
    pos, theta = rng.integers(0, 5000, m).tolist(), [Fraction(int(t * 2 ** 20), 2 ** 20) for t in rng.random(half)]
    pairs = [(2 * j, 2 * j + 1) for j in range(half)]
    with fine.precision():
        rot = rotation_at(fine, pos, theta, pairs, 2 * half, prec, rng)
    worst = REF.mpf(0)
    for i, p in enumerate(pos):
        for j, (i1, _) in enumerate(pairs):
            c, s = (sum(REF.mpf(float(part[i, i1])) for part in parts) for parts in (rot.cos, rot.sin))
            a = mp(p * theta[j])
            worst = max(worst, REF.sqrt((REF.cos(a) - c) ** 2 + (REF.sin(a) + s) ** 2))
    assert worst <= mp(rot.delta) and E.rotation_rows(rot, [m - 1]).delta == rot.delta
    assert mp(rot.delta) <= 4 * worst + REF.mpf(2) ** (-prec - 32)     # the exact sum's exit: ~2^-100


@pytest.mark.parametrize("name", ["flint", "mpmath"])
@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 40), half=st.integers(1, 4), base=st.sampled_from([10000, 7, 500000]),
       factor=st.sampled_from([Fraction(1), Fraction(4), Fraction(5, 2)]), prec=st.sampled_from([48, 64]))
def test_rotary_rotation_holds_the_200_bit_cos_and_sin(name, n, half, base, factor, prec):
    """forward.rotary_factors (p = a L + b): the factors hold the 200-bit cos and sin of a L phi_j and b phi_j,
    phi_j = base^(-2j/rotary_dim) / factor, n square or not, on both backends; and error_balls.rotation of them
    (flint; mpmath has no near balls: None) is within delta of every position's 200-bit cos and sin, delta within
    4x of one float64 rounding (48 bits: one part) or 2^-(prec + 32) (two parts). A mutant with a wrong sign in either
    identity, or the small factors read at the big ones' rows, fails."""
    cfg = SimpleNamespace(rotary=True, rotary_dim=2 * half, rotary_base=base, rotary_scaling_factor=factor)
    fine = make_backend(name, 2 * prec)
    pairs = [(2 * j, 2 * j + 1) for j in range(half)]
    with fine.precision():
        big, small, (a, b) = rotary_factors(fine, cfg, n)
        rot = E.rotation(fine, big, small, (a, b), pairs, 2 * half, prec)
    side = len(small[0].rows())

    def phi(j):
        return REF.power(base, REF.mpf(-2 * j) / (2 * half)) / mp(factor)
    assert list(a * side + b) == list(range(n))
    for tabs, steps in ((big, range(0, n, side)), (small, range(side))):
        for t, row_c, row_s in zip(steps, *(x.rows() for x in tabs)):
            for j in range(half):
                for x, want in ((row_c[j], REF.cos(t * phi(j))), (row_s[j], REF.sin(t * phi(j)))):
                    assert mp(fine.lower(x)) <= want <= mp(fine.upper(x))
    if name == "mpmath":
        assert rot is None
        return
    worst = REF.mpf(0)
    for p in range(n):
        for j, (i1, _) in enumerate(pairs):
            c, s = (sum(REF.mpf(float(part[p, i1])) for part in parts) for parts in (rot.cos, rot.sin))
            worst = max(worst, REF.sqrt((REF.cos(p * phi(j)) - c) ** 2 + (REF.sin(p * phi(j)) + s) ** 2))
    assert worst <= mp(rot.delta)
    assert mp(rot.delta) <= (4 * REF.mpf(2) ** -53 if prec == 48 else REF.mpf(2) ** (-prec - 32))


@pytest.mark.parametrize("name", ["flint", "mpmath"])
@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, n=st.integers(1, 8), shift=st.sampled_from([None, Fraction(0), Fraction(-300), Fraction(77, 3), "top"]))
def test_softmax_with_any_shift_holds_the_200_bit_value(name, seed, n, shift):
    """softmax(B, scores, shift): for any rational shift (None: the largest upper end; 0; far below or above
    the scores; head_output's per-row top), every enclosure holds the 200-bit softmax of the point scores, and
    flint and mpmath agree to 2^-50. A mutant that shifts one score only, or drops the shift from the sum, fails."""
    B, rng = make_backend(name, 64), np.random.default_rng(seed)
    s = [Fraction(int(x), 2 ** 20) for x in rng.integers(-2 ** 26, 2 ** 26, n)]
    with B.precision():
        pts = [B.num(x) for x in s]
        top = B.matrix([pts]).T.col_bounds()[1][0] if shift == "top" else shift
        out = E.softmax(B, pts, top)
        other = make_backend("mpmath" if name == "flint" else "flint", 64)
        with other.precision():
            alt = E.softmax(other, [other.num(x) for x in s], top)
    e = [REF.exp(mp(x)) for x in s]
    for y, a, ex in zip(out, alt, (v / REF.fsum(e) for v in e)):
        assert mp(B.lower(y)) <= ex <= mp(B.upper(y))
        assert abs(B.upper(y) - other.upper(a)) <= Fraction(1, 2 ** 50)


def _radius_200(e, r, s, dl, rd, shape):
    """exact_normalise's per-row Bound with exact square roots (200-bit mpmath; nothing rounded up)."""
    k, d, w_max, eps = shape
    e1, root = mp(e) + mp(r) / k, REF.sqrt(mp(s))
    cap = 2 * REF.sqrt(d) * mp(w_max)
    gap = max(root / k - e1, REF.mpf(0))
    lip = min(mp(w_max) * e1 / REF.sqrt(gap * gap / d + mp(eps)), cap) if e1 else REF.mpf(0)
    return lip + mp(w_max) * root * REF.mpf(dl) + mp(rd)


@settings(max_examples=60, deadline=None)
@given(seed=SEEDS, m=st.integers(1, 30), k=st.sampled_from([1, 5, 512, 768]), spread=st.integers(0, 60))
def test_normalise_radii_bound_every_row_tightly(seed, m, k, spread):
    """normalise_radii (the Bound in unreduced integers) is >= the Bound with exact square roots on every row and
    within 2^-36 of it: e' zero (no first term) and not, non-dyadic e and eps, squared norms from 0 over 60
    binades, tiny variances (the cap), zero deltas. A mutant rounding sqrt(||v^||^2) up inside the first term (a
    larger gap, a smaller term), dropping the rounding radius or taking e' without rho fails here."""
    rng = np.random.default_rng(seed)
    d = 512 if k == 1 else k
    rho = [Fraction(int(v), 2 ** 70) for v in rng.integers(0, 2 ** 20, m)]
    eps_in = [Fraction(0)] * m if seed % 3 else [Fraction(int(v), 3 * 2 ** 40) for v in rng.integers(0, 9, m)]
    sq = [Fraction(int(v) << int(rng.integers(0, spread + 1)), 2 ** 30) for v in rng.integers(0, 2 ** 40, m)]
    sq[0] = Fraction(0)
    delta = [float(x) for x in np.abs(rng.standard_normal(m)) * 2.0 ** -60]
    delta[-1] = 0.0
    rounding = [Fraction(int(v), 2 ** 80) for v in rng.integers(1, 2 ** 30, m)]
    shape = (k, d, Fraction(int(rng.integers(1, 2 ** 24)), 2 ** 23), Fraction(1, 100000) if seed % 2 else Fraction(1, 2 ** 17))
    got = E.normalise_radii(eps_in, rho, sq, delta, rounding, shape)
    for g, args in zip(got, zip(eps_in, rho, sq, delta, rounding)):
        want = _radius_200(*args, shape)
        assert mp(g) >= want and mp(g) <= want * (1 + REF.mpf(2) ** -36)
