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
    product-based sum made useless (+10^6) the shipped real-block certificates still verify, with the same
    worst cheap bound as the exact rule gives; and a rejection rests on the exact sum, not on the product."""
    model = load_model(CERTIFICATES / "overwhelm" / "neox_real_tiny.safetensors")
    cert = CERTIFICATES / "overwhelm" / "neox_real_any2.json"
    fast = verify(cert, model).figure("worst cheap bound")
    real = tight.free_sums_upper
    monkeypatch.setattr(tight, "free_sums_upper", lambda B, beta, his: [s + 10 ** 6 for s in real(B, beta, his)])
    exact = verify(cert, model).figure("worst cheap bound")
    assert exact <= fast < 0
    assert fast - exact <= abs(exact) * Fraction(1, 2 ** 40)
