"""overwhelm tight's vectorised pieces: the cheap bound's free-term sums from one product
(`tight.free_sums_upper`), its exact fallback, and the final LN's centring as an exact integer point matrix
scaled once (`final_ln.centred`).

Each is compared with exact Fractions on random inputs (signs, zeros, split-form rests, both backends),
and the fallback is exercised on the shipped real-block certificate.
"""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker import exact_backend
from tcert.checker.interval import make_backend
from tcert.checker.kinds.overwhelm import final_ln, tight
from tcert.checker.modelfile import load_model
from tcert.checker.verify import verify
from tcert.testing import CERTIFICATES

BACKENDS = ("flint", "mpmath")


def split_form_upper(rng, n: int):
    """(q1, q2) float64 arrays in split_bounds' upper form (q1 the ceiling, -ulp < q2 <= 0), with zeros,
    negatives, rests that make a positive q1 stand for a smaller value, and one-part entries (q2 = 0)."""
    q1 = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    q1[rng.random(n) < 0.15] = 0.0
    step = q1 - np.nextafter(q1, -np.inf)
    q2 = -np.floor(rng.random(n) * 2.0 ** 20) * 2.0 ** -20 * step    # multiples of step / 2^20 below step
    q2[(rng.random(n) < 0.2) | (-q2 >= step)] = 0.0                   # (a subnormal step rounds)
    assert np.all((q2 <= 0) & (-q2 < step))
    return q1, q2


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), heads=st.integers(1, 4))
def test_free_sums_upper_bounds_the_exact_sum_tightly(backend, seed, heads):
    rng = np.random.default_rng(seed)
    n = 40
    beta, his = [], []
    for _ in range(heads):
        a, b = sorted(Fraction(int(x), 3 ** 7) for x in rng.integers(0, 10 ** 6, 2))
        beta.append((a, b))
        his.append(split_form_upper(rng, n))
    B = make_backend(backend, 64)
    with B.precision():
        got = tight.free_sums_upper(B, beta, his)
    for j in range(n):
        xs = [Fraction(float(q1[j])) + Fraction(float(q2[j])) for q1, q2 in his]
        want = sum((tight.top(b, x) for b, x in zip(beta, xs)), Fraction(0))
        scale = sum((max(b) * abs(x) for b, x in zip(beta, xs)), Fraction(0))
        assert got[j] >= want                                   # an upper bound (soundness)
        # and a tight one (beta_max on x > 0 only); the layer rounds within ~2^-105 of its row-column scale,
        # at least 2^0 for a column of zeros
        assert got[j] - want <= scale * Fraction(1, 2 ** 50) + max(b for _, b in beta) * Fraction(1, 2 ** 90)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_gain", [False, True])
def test_centred_encloses_the_exact_centred_rows(backend, with_gain):
    rng = np.random.default_rng(3)
    d = 12          # not a power of two: 1/d is not a binary fraction
    X = (rng.standard_normal((5, d)) * 2.0 ** rng.integers(-8, 8, (5, d))).astype(np.float32).astype(np.float64)
    X[1] = 0.0
    w = rng.standard_normal(d).astype(np.float32) if with_gain else None
    B = make_backend(backend, 64)
    with B.precision():
        rows = final_ln.centred(B, B.array(X), w).rows()
        for i in range(X.shape[0]):
            x = [Fraction(float(v)) for v in X[i]]
            mean = sum(x, Fraction(0)) / d
            for c in range(d):
                want = (x[c] - mean) * (Fraction(float(w[c])) if with_gain else 1)
                lo, hi = B.lower(rows[i][c]), B.upper(rows[i][c])
                assert lo <= want <= hi
                assert hi - lo <= (abs(want) + max(abs(v) for v in x)) * Fraction(1, 2 ** 55)


def test_cheap_bound_falls_back_to_the_exact_sum(monkeypatch):
    """A competitor whose bound from free_sums_upper is not < 0 gets the exact Fraction sum: with every
    product-based sum made useless (+10^6) the shipped real-block certificates still verify, with the
    worst cheap bound of the exact rule; with and without the leading-digit screen the figure is that
    rule's to 2^-40 (the screen sends the competitors near the worst to the full product), and the screen
    leaves some competitors to itself alone."""
    model = load_model(CERTIFICATES / "overwhelm" / "neox_real_tiny.safetensors")
    cert = CERTIFICATES / "overwhelm" / "neox_real_any2.json"
    screened = verify(cert, model)
    k, listed = cert_predicted_and_listed(cert)
    rest = model.config.d_vocab - 1 - len(listed)
    assert 0 < screened.figure("competitors by the full product") < rest
    with monkeypatch.context() as mp:
        mp.setattr(exact_backend, "leading_maxima", lambda *args: None)
        product = verify(cert, model)
    assert product.figure("competitors by the full product") == model.config.d_vocab
    real = tight.free_sums_upper
    monkeypatch.setattr(tight, "free_sums_upper", lambda B, beta, his: [s + 10 ** 6 for s in real(B, beta, his)])
    exact = verify(cert, model).figure("worst cheap bound")
    for fast in (screened.figure("worst cheap bound"), product.figure("worst cheap bound")):
        assert exact <= fast < 0
        assert fast - exact <= abs(exact) * Fraction(1, 2 ** 40)


def test_screen_sends_undecided_competitors_to_the_product(monkeypatch):
    """Competitors whose screened bound is not < 0 (here: every odd one, its slack made huge) get the full
    product over their columns (with those near the worst), and the check still verifies."""
    model = load_model(CERTIFICATES / "overwhelm" / "neox_real_tiny.safetensors")
    cert = CERTIFICATES / "overwhelm" / "neox_real_any2.json"
    real, real_product = exact_backend.leading_maxima, tight.product_bounds
    seen = []

    def widened(*args):
        P, S = real(*args)
        S = S.copy()
        S[:, 1::2] = 2.0 ** 40
        return P, S

    def product(B, model, tables, gap, k, cols, rest):
        seen.append(list(cols))
        return real_product(B, model, tables, gap, k, cols, rest)
    monkeypatch.setattr(exact_backend, "leading_maxima", widened)
    monkeypatch.setattr(tight, "product_bounds", product)
    ob = verify(cert, model)
    k, listed = cert_predicted_and_listed(cert)
    odd = {j for j in range(1, model.config.d_vocab, 2) if j != k and j not in listed}
    assert len(seen) == 1 and odd <= set(seen[0]) and odd
    assert ob.figure("competitors by the full product") == len(seen[0])


def cert_predicted_and_listed(path):
    import json
    c = json.loads(open(path).read())
    return c["claim"]["predicted"], {e["competitor"] for e in c["evidence"]["exact"]}


def ball_case(rng, m: int, k: int, n: int, parts: int, radius: float):
    """A random ball matrix (midpoint parts, radius) and a float32-valued w with zeros, signed zeros,
    subnormal-scale rows and wide exponent spreads."""
    p1 = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-30, 30, (m, k))
    p1[rng.random((m, k)) < 0.1] = 0.0
    p1[0] = -0.0
    if m > 2:
        p1[2] *= 2.0 ** -1000           # a row near the bottom of the range
    mid = (p1,) + tuple(p1 * 2.0 ** -53 * rng.standard_normal((m, k)) for _ in range(parts - 1))
    r = np.abs(rng.standard_normal((m, k))) * radius * np.abs(p1).max(axis=1, keepdims=True)
    w = (rng.standard_normal((k, n)) * 2.0 ** rng.integers(-20, 20, (k, n))).astype(np.float32).astype(np.float64)
    w[:, 0] = 0.0
    w[rng.random((k, n)) < 0.1] = 0.0
    return mid, r, w


def exact_block_maxima(mid, r, w, groups: int):
    """max over rows t of block g and over the ball of (X w)_tj, in exact Fractions: sum_l mid_tl w_lj +
    r_tl |w_lj|."""
    F = np.vectorize(lambda x: Fraction(float(x)), otypes=[object])
    M = sum(F(p) for p in mid)
    T = M.dot(F(w)) + F(r).dot(F(np.abs(w)))
    return T.reshape(groups, -1, w.shape[1]).max(axis=1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), parts=st.integers(1, 2), radius=st.sampled_from([0.0, 2.0 ** -40, 2.0 ** -3]),
       k=st.sampled_from([3, 16, 40]))
def test_leading_digit_maxima_bound_every_point_of_the_ball(seed, parts, radius, k):
    rng = np.random.default_rng(seed)
    groups, m, n = 3, 6, 7
    mid, r, w = ball_case(rng, m, k, n, parts, radius)
    out = exact_backend.leading_digit_maxima(mid, r, w, groups)
    if out is None:      # an exponent out of range (the 2^-1000 row times small columns): nothing claimed
        return
    P, S = out
    want = exact_block_maxima(mid, r, w, groups)
    for g in range(groups):
        for j in range(n):
            p, s = Fraction(float(P[g, j])), Fraction(float(S[g, j]))
            assert want[g, j] <= p + s                    # sound
            assert p - s <= want[g, j]                    # and P within S of the block's maximum
            assert s > 0


def test_leading_digit_maxima_declines_out_of_range_exponents():
    mid = (np.full((2, 4), 2.0 ** -1060),)
    w = np.full((4, 3), 2.0 ** -20)
    assert exact_backend.leading_digit_maxima(mid, np.zeros((2, 4)), w, 1) is None
    assert exact_backend.leading_digit_maxima((np.full((2, 4), 2.0 ** 1000),), np.zeros((2, 4)), np.full((4, 3), 2.0 ** 100), 2) is None


def test_leading_digit_maxima_mutants_are_caught():
    """The slack's terms are needed: without the radius (or the other parts) in mu, or with S / 4, the
    bound fails on a ball whose radius, rest and truncation all push the same way."""
    k, b = 512, 22
    a = np.full((1, k), 1.0 - 2.0 ** -30)                      # truncation error near 2^(a - b) per entry
    w = np.full((k, 1), 1.0 - 2.0 ** -23)
    r = np.full((1, k), 2.0 ** (1 - b) - 2.0 ** -40)
    P, S = exact_backend.leading_digit_maxima((a,), r, w, 1)
    want = exact_block_maxima((a,), r, w, 1)[0, 0]
    assert want <= Fraction(float(P[0, 0])) + Fraction(float(S[0, 0]))
    assert want > Fraction(float(P[0, 0])) + Fraction(float(S[0, 0])) / 4          # S / 4 would be unsound
    big = np.full((1, k), 2.0 ** -4)          # a radius far above the digit unit 2^(a - b) = 2^-22
    P, S = exact_backend.leading_digit_maxima((a,), big, w, 1)
    no_radius = Fraction(2) ** (11 - b)       # S with mu = a - b only (L = 11 for k (K + 1) = 1536, a = c = 0)
    assert exact_block_maxima((a,), big, w, 1)[0, 0] > Fraction(float(P[0, 0])) + no_radius


@pytest.mark.parametrize("backend", BACKENDS)
def test_leading_maxima_reads_native_balls(backend):
    """On Arb balls the screen bounds every point of each interval entry (exact Fractions); mpmath has no
    native ball form, so the screen declines there (the full product decides, the same verdicts)."""
    rng = np.random.default_rng(5)
    lo = [[Fraction(int(x), 3 ** 9) for x in row] for row in rng.integers(-10 ** 6, 10 ** 6, (4, 9))]
    wid = [[Fraction(int(x), 7 ** 12) for x in row] for row in rng.integers(0, 10 ** 3, (4, 9))]
    w = rng.standard_normal((9, 5)).astype(np.float32).astype(np.float64)
    B = make_backend(backend, 64)
    with B.precision():
        X = B.matrix([[B.interval(a, a + d) for a, d in zip(r, q)] for r, q in zip(lo, wid)])
        out = exact_backend.leading_maxima(X, B.array(w), B, 2)
    if backend == "mpmath":
        assert out is None
        return
    P, S = out
    W = [[Fraction(float(x)) for x in row] for row in w]
    for g in range(2):
        for j in range(5):
            want = max(sum(max(a * W[l][j], (a + d) * W[l][j]) for l, (a, d) in enumerate(zip(lo[t], wid[t])))
                       for t in (2 * g, 2 * g + 1))
            assert want <= Fraction(float(P[g, j])) + Fraction(float(S[g, j]))
