"""The rigorous forward pass's bounds against high-precision references, on both backends.

* Each step of `tcert.checker.error_balls` maps error balls to error balls: for points x inside the input
  balls -- random directions and the step's worst-case direction -- the exact image (mpmath, 200 bits)
  lies inside the output ball. The worst-case directions make the tests able to fail: each comes within
  a small factor of the bound (checked), so a bound that dropped a factor would be caught.
* `tcert.checker.operator_norms`: every bound is >= the 200-bit singular value / column norm, and close
  to it.
* The whole pass: on random tiny models of every architecture variant (tcert.testing.prediction.ARCHS),
  the logits of an independent 300-bit forward pass (tcert.testing.exact_forward) lie inside the
  enclosures (hypothesis).
"""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpmath.ctx_mp import MPContext

from tcert.checker import error_balls as E
from tcert.checker import operator_norms as N
from tcert.checker.forward import act_lipschitz, activation, last_logits
from tcert.checker.interval import make_backend
from tcert.testing.exact_forward import TOLERANCE, ExactForward, to_fraction
from tcert.testing.prediction import ARCHS, SIZE, build

BACKENDS = ("flint", "mpmath")
REF = MPContext()
REF.prec = 200
SLACK = 1 + Fraction(1, 2 ** 100)    # the references' own rounding, relative


def mp(x: Fraction):
    return REF.mpf(x.numerator) / x.denominator


def exact_ends(B, x) -> Fraction:
    """The exact value of a point (a centre entry)."""
    lo = B.lower(x)
    assert lo == B.upper(x), "a centre entry is not a point"
    return lo


def centres(B, rows) -> list:
    """The centre matrix of an error ball as Fractions."""
    return [[exact_ends(B, x) for x in row] for row in rows.centre.rows()]


def as_mp(x):
    return mp(x) if isinstance(x, Fraction) else REF.mpf(x)


def dist(a, b):
    """||a - b||_2 at 200 bits (entries mpf, floats or Fractions)."""
    return REF.sqrt(REF.fsum((as_mp(p) - as_mp(q)) ** 2 for p, q in zip(a, b)))


def direction(v, length: Fraction):
    """v (floats or mpf) scaled to l2 length `length` (1 - 2^-150 of it, so strictly inside)."""
    v = [REF.mpf(x) for x in v]
    n = REF.sqrt(REF.fsum(x * x for x in v))
    return [x / n * mp(length) * (1 - REF.mpf(2) ** -150) for x in v]


def ball_rows(B, rng, m, d, eps, scale=1.0):
    """m random rows of width d as exact points (float64 values), each with radius eps."""
    c = rng.standard_normal((m, d)) * scale
    return E.Rows(B.array(c), [eps] * m), c


def assert_inside(B, out, i, image, worst=None):
    """The exact image of a point lies in row i of the output ball; returns its distance / the radius."""
    r = dist(image, centres(B, out)[i])
    assert r <= mp(out.eps[i] * SLACK), (float(r), float(out.eps[i]))
    return r / mp(out.eps[i]) if out.eps[i] else 0


SEEDS = st.integers(0, 2 ** 31)
EPS = st.sampled_from([Fraction(1, 2 ** 40), Fraction(1, 1000), Fraction(1, 10)])


# --- the steps ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BACKENDS)
@settings(max_examples=15)
@given(seed=SEEDS, eps=EPS, shape=st.tuples(st.integers(1, 3), st.integers(1, 7), st.integers(1, 7)))
def test_linear_ball(name, seed, eps, shape):
    """x @ W + b: exact images of perturbed rows inside; along W's top right-singular vector the bound
    is nearly attained."""
    m, k, n = shape
    B, rng = make_backend(name), np.random.default_rng(seed)
    W = (rng.standard_normal((k, n)) * 0.7).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    X, c = ball_rows(B, rng, m, k, eps)
    with B.precision():
        out = E.linear(B, X, B.array(W), N.operator_norm(W), B.array(b).rows()[0])
    top = np.linalg.svd(W.astype(np.float64))[0][:, 0]
    Wm = [[REF.mpf(float(x)) for x in row] for row in W]
    for i in range(m):
        ratios = []
        for v in (rng.standard_normal(k), top):
            x = [REF.mpf(float(a)) + d for a, d in zip(c[i], direction(v, eps))]
            y = [REF.fsum(x[r] * Wm[r][j] for r in range(k)) + REF.mpf(float(b[j])) for j in range(n)]
            ratios.append(assert_inside(B, out, i, y))
        assert ratios[1] > 0.9 or eps < Fraction(1, 2 ** 30), ratios    # the worst direction nearly attains it


def exact_norm_row(x, w, b, eps_ln, centred):
    d = len(x)
    mean = REF.fsum(x) / d if centred else 0
    u = [a - mean for a in x]
    s = REF.sqrt(REF.fsum(a * a for a in u) / d + mp(eps_ln))
    return [a / s * REF.mpf(float(wi)) + REF.mpf(float(bi)) for a, wi, bi in zip(u, w, b)]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("centred", [True, False])
@settings(max_examples=15)
@given(seed=SEEDS, eps=EPS, d=st.integers(2, 9), spread=st.sampled_from([1e-3, 0.1, 1.0, 10.0]))
def test_normalise_ball(name, centred, seed, eps, d, spread):
    """LayerNorm (centred) and RMSNorm rows, including nearly constant rows (sigma_lo at eps): the worst
    direction (orthogonal to the centred centre, on the coordinate of the largest gain) comes near the
    bound when the ball is small against the row."""
    B, rng = make_backend(name), np.random.default_rng(seed)
    eps_ln = Fraction(1, 100000)
    w = (1 + 0.3 * rng.standard_normal(d)).astype(np.float32)
    b = (0.1 * rng.standard_normal(d)).astype(np.float32)
    X, c = ball_rows(B, rng, 2, d, eps, spread)
    with B.precision():
        out = E.normalise(B, X, B.array(w).rows()[0], B.array(b).rows()[0], eps_ln, N.max_abs(w), centred)
    for i in range(2):
        u = c[i] - (c[i].mean() if centred else 0)
        worst = np.zeros(d)
        worst[int(np.argmax(np.abs(w)))] = 1
        worst -= worst.mean() if centred else 0
        worst -= (worst @ u) / (u @ u) * u if u @ u > 0 else 0
        for v in (rng.standard_normal(d), worst if np.any(worst) else rng.standard_normal(d)):
            x = [REF.mpf(float(a)) + e for a, e in zip(c[i], direction(v, eps))]
            assert_inside(B, out, i, exact_norm_row(x, w, b, eps_ln, centred))


def exact_act(fn, x):
    if fn == "relu":
        return x if x > 0 else REF.mpf(0)
    if fn == "gelu":
        return x * (1 + REF.erf(x / REF.sqrt(2))) / 2
    if fn == "silu":
        return x / (1 + REF.exp(-x))
    return x * (1 + REF.tanh(REF.sqrt(2 / REF.pi) * (x + REF.mpf(44715) / 10 ** 6 * x ** 3))) / 2


class _Cfg:
    def __init__(self, act_fn):
        self.act_fn = act_fn


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("fn", ["relu", "gelu", "gelu_new", "silu"])
@settings(max_examples=10)
@given(seed=SEEDS, eps=EPS, d=st.integers(1, 6))
def test_nonlinear_ball(name, fn, seed, eps, d):
    """Activations with their Lipschitz constants: exact images inside (the steepest point of gelu is at
    sqrt 2, where the bound is nearly attained)."""
    B, rng = make_backend(name), np.random.default_rng(seed)
    X, c = ball_rows(B, rng, 1, d, eps, 2.0)
    with B.precision():
        out = E.nonlinear(B, X, activation(B, _Cfg(fn)), act_lipschitz(B, fn))
    for v in (rng.standard_normal(d), np.ones(d)):
        x = [REF.mpf(float(a)) + e for a, e in zip(c[0], direction(v, eps))]
        assert_inside(B, out, 0, [exact_act(fn, u) for u in x])


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("fn", ["relu", "gelu", "silu"])
@settings(max_examples=10)
@given(seed=SEEDS, eps=EPS, d=st.integers(1, 6), scale=st.sampled_from([0.3, 2.0, 10.0]))
def test_gated_ball(name, fn, seed, eps, d, scale):
    """fn(g) * u + b from balls of g and u: exact images inside, for random directions and for the
    direction that moves g and u together along their centres' signs (the bound's worst case)."""
    B, rng = make_backend(name), np.random.default_rng(seed)
    (G, cg), (U, cu) = ball_rows(B, rng, 1, d, eps, scale), ball_rows(B, rng, 1, d, eps / 3, scale)
    bias = rng.standard_normal(d)
    with B.precision():
        out = E.gated(B, G, U, activation(B, _Cfg(fn)), act_lipschitz(B, fn), B.array(bias[None, :]).rows()[0])
    for vg, vu in ((rng.standard_normal(d), rng.standard_normal(d)), (np.sign(cu[0]) + 0.5, np.sign(cg[0]) + 0.5)):
        g = [REF.mpf(float(a)) + e for a, e in zip(cg[0], direction(vg, eps))]
        u = [REF.mpf(float(a)) + e for a, e in zip(cu[0], direction(vu, eps / 3))]
        assert_inside(B, out, 0, [exact_act(fn, a) * b + REF.mpf(float(c)) for a, b, c in zip(g, u, bias)])


def test_silu_lipschitz_bound():
    """silu's constant 5/4 bounds the slope: difference quotients on a grid stay below it (max ~1.0998)."""
    B = make_backend("flint")
    L, h = mp(act_lipschitz(B, "silu")), REF.mpf(2) ** -40
    slopes = [abs(exact_act("silu", t + h) - exact_act("silu", t)) / h for t in (REF.mpf(k) / 8 for k in range(-160, 161))]
    assert max(slopes) <= L and max(slopes) > REF.mpf("1.09")


def test_act_lipschitz_is_attained_nearly():
    """gelu's constant is max|gelu'| (at sqrt 2): a difference quotient there comes within 1e-6 of it."""
    B = make_backend("flint")
    L = act_lipschitz(B, "gelu")
    t, h = REF.sqrt(2), REF.mpf(2) ** -40
    q = (exact_act("gelu", t + h) - exact_act("gelu", t - h)) / (2 * h)
    assert q <= mp(L) <= q * (1 + REF.mpf(10) ** -6)


def exact_head(q, K, V, div, visible):
    s = [REF.fsum(a * b for a, b in zip(q, K[r])) / div for r in range(visible)]
    top = max(s)
    e = [REF.exp(x - top) for x in s]
    total = REF.fsum(e)
    return [REF.fsum(e[r] / total * V[r][t] for r in range(visible)) for t in range(len(V[0]))]


def perturb(c, eps, v):
    return [REF.mpf(float(a)) + e for a, e in zip(c, direction(v, eps))]


@pytest.mark.parametrize("name", BACKENDS)
@settings(max_examples=12)
@given(seed=SEEDS, eps=EPS, n=st.integers(1, 6), dh=st.integers(1, 4), scale=st.sampled_from([0.3, 1.0, 3.0]))
def test_head_output_ball(name, seed, eps, n, dh, scale):
    """One attention head, causal rows: queries, keys and values each perturbed within their balls, in
    random directions and in the first-order worst direction for a random output direction g (keys moved
    along +-q by the sign of g.(v_r - z), values along g)."""
    B, rng = make_backend(name), np.random.default_rng(seed)
    Q, qc = ball_rows(B, rng, n, dh, eps, scale)
    K, kc = ball_rows(B, rng, n, dh, eps, scale)
    V, vc = ball_rows(B, rng, n, dh, eps, scale)
    div = Fraction(3, 2)
    visible = [i + 1 for i in range(n)]
    with B.precision():
        out = E.head_output(B, Q, K, V, B.num(div), visible)
    for i in range(n):
        z0 = exact_head([REF.mpf(float(a)) for a in qc[i]], [[REF.mpf(float(a)) for a in r] for r in kc],
                        [[REF.mpf(float(a)) for a in r] for r in vc], mp(div), visible[i])
        g = rng.standard_normal(dh)
        zf = np.asarray([float(x) for x in z0])
        signs = [np.sign(g @ (vc[r] - zf)) or 1 for r in range(n)]
        for worst in (False, True):
            q = perturb(qc[i], eps, rng.standard_normal(dh) if not worst else kc[visible[i] - 1])
            Kp = [perturb(kc[r], eps, rng.standard_normal(dh) if not worst else signs[r] * qc[i] + 1e-300)
                  for r in range(n)]
            Vp = [perturb(vc[r], eps, rng.standard_normal(dh) if not worst else g) for r in range(n)]
            assert_inside(B, out, i, exact_head(q, Kp, Vp, mp(div), visible[i]))


@pytest.mark.parametrize("name", BACKENDS)
@settings(max_examples=10)
@given(seed=SEEDS, eps=EPS, heads=st.integers(1, 3), dh=st.integers(1, 3), d=st.integers(1, 5))
def test_heads_output_ball(name, seed, eps, heads, dh, d):
    """sum_h z_h W_h + b with per-head balls: exact images inside."""
    B, rng = make_backend(name), np.random.default_rng(seed)
    W = rng.standard_normal((heads * dh, d)).astype(np.float32)
    balls = [ball_rows(B, rng, 2, dh, eps * (h + 1)) for h in range(heads)]
    with B.precision():
        out = E.heads_output(B, [b for b, _ in balls], B.array(W), N.operator_norm(W),
                             [N.operator_norm(W[h * dh:(h + 1) * dh]) for h in range(heads)])
    top = np.linalg.svd(W.astype(np.float64))[0][:, 0]
    for i in range(2):
        for v in (rng.standard_normal(heads * dh), top):
            z = sum((perturb(c[i], eps * (h + 1), v[h * dh:(h + 1) * dh]) for h, (_, c) in enumerate(balls)), [])
            y = [REF.fsum(z[r] * REF.mpf(float(W[r, j])) for r in range(heads * dh)) for j in range(d)]
            assert_inside(B, out, i, y)


@pytest.mark.parametrize("name", BACKENDS)
def test_recentre_and_enclosures(name):
    """Re-centring keeps every point of the input enclosures (plus its l2 ball) inside; `enclosures` turns
    a ball back into entrywise enclosures holding it."""
    B = make_backend(name)
    with B.precision():
        Y = B.matrix([[B.interval(Fraction(1), Fraction(3)), B.sqrt(B.num(2))], [B.num(1) / 3, B.num(-5)]])
        R = E.recentre(B, Y, [Fraction(1, 8), Fraction(0)])
        boxes = E.enclosures(B, R)
        for row, e, box, c in zip(Y.rows(), R.eps, boxes, centres(B, R)):
            corners = [[B.lower(x) for x in row], [B.upper(x) for x in row]]
            for corner in corners:
                assert dist(corner, c) <= mp(e)
            for x, bx in zip(row, box):
                assert B.lower(bx) <= B.lower(x) and B.upper(x) <= B.upper(bx)


def test_dyadic_rounding_helpers():
    """up / sqrt_up / sqrt_down round the right way, within 2^-39 relative."""
    for x in (Fraction(1, 3), Fraction(10 ** 30, 7), Fraction(7, 2 ** 900), Fraction(2), Fraction(0)):
        u, su, sd = E.up(x), E.sqrt_up(x), E.sqrt_down(x)
        assert x <= u <= x * (1 + Fraction(1, 2 ** 39)) + (0 if x else 0)
        assert sd * sd <= x <= su * su
        assert su - sd <= su * Fraction(1, 2 ** 38)


# --- operator norms -------------------------------------------------------------------------------------

def svd_top(a) -> Fraction:
    """The largest singular value of a stored matrix at 200 bits (as a Fraction): the square root of the
    largest eigenvalue of the smaller Gram matrix (mpmath's symmetric eigensolver)."""
    a = np.atleast_2d(np.asarray(a, dtype=np.float64))
    if a.shape[0] > a.shape[1]:
        a = a.T
    M = REF.matrix([[REF.mpf(float(x)) for x in row] for row in a])
    G = M * M.T
    top = max(REF.eigsy(G, eigvals_only=True)) if G.rows > 1 else G[0, 0]
    return to_fraction(REF.sqrt(max(top, 0)))


MATRICES = st.tuples(st.integers(1, 7), st.integers(1, 7), SEEDS, st.sampled_from(["float16", "float32", "float64"]),
                     st.sampled_from([1e-30, 1e-3, 1.0, 1e6]))


@settings(max_examples=40)
@given(spec=MATRICES)
def test_operator_norm_bounds_the_top_singular_value(spec):
    """operator_norm >= the 200-bit top singular value, and within 4% of it (n^(1/64) for n <= 7; or of its floor
    2^-e sqrt(mn)/2 from the grid) on random matrices of every dtype and scale."""
    m, n, seed, dtype, scale = spec
    a = np.clip(np.random.default_rng(seed).standard_normal((m, n)) * scale, -6e4, 6e4).astype(dtype)
    true = svd_top(a)
    bound = N.operator_norm(a)
    assert true <= bound
    assert bound <= true * Fraction(104, 100) + Fraction(float(np.max(np.abs(a)))) * m * n / 2 ** 14
    coarse = N.operator_norm(a, 0)     # the prediction kind's coarse tier: tr(G^2)^(1/4) <= rank^(1/4) ||a||_2
    assert true <= coarse and coarse ** 4 <= (true * Fraction(104, 100) + Fraction(float(np.max(np.abs(a)))) * m * n / 2 ** 14) ** 4 * min(m, n)


def test_operator_norm_special_matrices():
    """Zero, rank one, a single entry, a huge dynamic range, float16 extremes."""
    assert N.operator_norm(np.zeros((3, 4), np.float32)) == 0
    for a in (np.ones((5, 7), np.float32), np.eye(4, dtype=np.float64) * 1e300, np.array([[3.0]]),
              np.array([[1e-300, 1.0], [2.0, 1e300]]), np.array([[65504, -65504], [6e-8, 1]], np.float16)):
        true = svd_top(a)
        assert true <= N.operator_norm(a) <= true * Fraction(104, 100)


@settings(max_examples=30)
@given(spec=MATRICES)
def test_column_norms(spec):
    """column_norms >= each column's 200-bit l2 norm, and within 2^-10 of it relative to the column max."""
    m, n, seed, dtype, scale = spec
    a = np.clip(np.random.default_rng(seed).standard_normal((m, n)) * scale, -6e4, 6e4).astype(dtype)
    for j, bound in enumerate(N.column_norms(a)):
        true = REF.sqrt(REF.fsum(REF.mpf(float(x)) ** 2 for x in a[:, j]))
        assert true <= mp(bound) <= true + mp(Fraction(float(np.max(np.abs(a))))) * m / 2 ** 10


def test_gram_bound_psd_integer():
    """gram_lambda_bound >= lambda_max of exact integer Gram matrices, tight for k = 4 squarings."""
    rng = np.random.default_rng(5)
    for n, k in ((3, 5), (40, 60), (8, 2)):
        q = np.rint(rng.standard_normal((n, k)) * 2 ** 12)
        g = q @ q.T
        lam = max(np.linalg.eigvalsh(g))
        u = N.gram_lambda_bound(g)
        assert lam * (1 - 1e-9) <= u <= lam * 1.2


# --- the whole pass against an independent 300-bit forward pass -----------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("exact"))
    return {(name, seed): build(d, name, seed) for name in ARCHS for seed in (0, 1)}


@pytest.mark.parametrize("name", sorted(ARCHS))
@settings(max_examples=3)
@given(seed=st.integers(0, 1), tokens=st.lists(st.integers(0, SIZE["d_vocab"] - 1), min_size=1, max_size=5),
       backend=st.sampled_from(BACKENDS))
def test_exact_logits_inside_enclosures(tiny, name, seed, tokens, backend):
    """Every architecture variant: the 300-bit logits lie inside the checker's enclosures at 64 bits."""
    model = tiny[name, seed]
    ref = ExactForward(model).logits(tokens)
    B = make_backend(backend)
    with B.precision():
        enc = last_logits(B, model, tokens)
    scale = max(abs(to_fraction(x)) for x in ref) + 1
    for x, r in zip(enc, ref):
        value = to_fraction(r)
        assert B.lower(x) - TOLERANCE * scale <= value <= B.upper(x) + TOLERANCE * scale
