"""The influence norms' faster routes give the same bounds as the plain ones: the trace-power bound with its
last squaring replaced by an entrywise trace (`gram_norm`), and the LayerNorm-folded wide matrix's norm from
its Gram matrix F (W W^T) F^T / d^2 (`folded_norm`), on both backends; each is >= the true spectral norm."""

import math
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.norms import centred_scaled, folded_norm, operator_norm


def spectral(W) -> Fraction:
    """A lower bound of the largest singular value (60 digits, mpmath), as a Fraction."""
    import mpmath
    with mpmath.workdps(60):
        s = mpmath.svd_r(mpmath.matrix(np.asarray(W, np.float64).tolist()), compute_uv=False)
        top = float(max(s[i] for i in range(len(s))) * (1 - mpmath.mpf(10) ** -40))
    return Fraction(math.nextafter(top, -math.inf))   # below the 60-digit value


def centred(w, W):
    """P diag(w) W in exact rationals, as mpmath can read it (float64 of a 60-digit product)."""
    d = W.shape[0]
    M = [[Fraction(float(w[i])) * Fraction(float(W[i, j])) for j in range(W.shape[1])] for i in range(d)]
    means = [sum(M[i][j] for i in range(d)) / d for j in range(W.shape[1])]
    return [[M[i][j] - means[j] for j in range(W.shape[1])] for i in range(d)]


def plain_norm(B, M, power):
    """The trace-power bound with every squaring done (the formulation gram_norm shortens)."""
    M = B.array(M) if not hasattr(M, "backend") else M
    gram = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    for _ in range(power):
        gram = gram @ gram
    rows = gram.rows()
    trace = B.upper(B.fsum(rows[i][i] for i in range(len(rows))))
    return B.upper(B.exp(B.log(B.num(trace)) / (2 ** (power + 1))))


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
def test_gram_norm_equals_all_squarings(backend):
    """Entrywise tr(Q Q) after power - 1 squarings bounds the same number as power squarings and a trace."""
    B, rng = make_backend(backend), np.random.default_rng(1)
    for shape in ((6, 4), (4, 9), (7, 7)):
        W = rng.normal(size=shape).astype(np.float32)
        for p in (0, 1, 3, 6):
            fast, plain = operator_norm(B, [W], p), plain_norm(B, W, p)
            assert spectral(W) <= fast
            assert abs(fast - plain) <= plain * Fraction(1, 10 ** 12)


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_folded_norm_matches_the_folded_matrix(backend, dtype):
    """||P diag(w) W|| by the Gram route (float16/32, m > d) or the folded matrix (otherwise): >= the true
    norm and equal to the plain bound on centred_scaled's matrix to 1e-12."""
    B, rng = make_backend(backend), np.random.default_rng(2)
    for d, m in ((5, 12), (8, 8), (9, 4)):
        w, W = (1 + rng.normal(size=d)).astype(dtype), rng.normal(size=(d, m)).astype(dtype)
        true = spectral([[float(x) for x in row] for row in centred(w, W)])
        for p in (0, 2, 6):
            fast, plain = folded_norm(B, w, W, p), plain_norm(B, centred_scaled(B, w, W), p)
            assert true <= fast
            assert abs(fast - plain) <= plain * Fraction(1, 10 ** 12)


def test_folded_norm_zero_matrix():
    """A zero reader has norm bound 0 on the Gram route."""
    B = make_backend("flint")
    assert folded_norm(B, np.ones(4, np.float32), np.zeros((4, 9), np.float32), 6) == 0


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
def test_row_squares_and_min_centred_norms(backend):
    """row_squares (exact float64 squares for float16/32, else the Gram diagonal) encloses each row's exact
    squared norm; min_centred_norms is a lower bound of the exact min_r ||P (arr[r] + c)||, and within 1e-12."""
    from tcert.checker.kinds.influence.norms import min_centred_norms, row_squares
    B, rng = make_backend(backend), np.random.default_rng(3)
    for dtype in (np.float16, np.float32, np.float64):
        arr = rng.normal(size=(9, 6)).astype(dtype)
        exact = [sum(Fraction(float(x)) ** 2 for x in row) for row in arr]
        for got, want in zip(row_squares(B, arr), exact):
            assert B.lower(got) <= want <= B.upper(got)
        c = [Fraction(float(x)) for x in rng.normal(size=6)]
        for centred_ in (True, False):
            sq = []
            for row in arr:
                z = [Fraction(float(x)) + y for x, y in zip(row, c)]
                sq.append(sum(v * v for v in z) - (sum(z) ** 2 / 6 if centred_ else 0))
            low = min_centred_norms(B, arr, [[B.num(y) for y in c]], centred_)[0]
            assert low ** 2 <= min(sq) <= low ** 2 * (1 + Fraction(1, 10 ** 12))
