"""Attacks on the interval backends that must fail, and the repaired holes (red-team reviews; docs/soundness-review.md).

Each test names the attack it documents and fails if the hole it guards reappears."""

from fractions import Fraction
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.kinds.overwhelm import final_ln as final_ln
from tcert.generator.model.forward import logits as float_logits
import mpmath
import numpy as np
import pytest
import random
from tcert.testing.prediction import ARCHS, build as build_arch


# Arb at 4000 bits: its balls have radius <= 2^-3900 around the true erf value (the tolerance below),
# far below the width of any enclosure the checker computes.
REF_PREC, REF_TOL = 4000, Fraction(1, 2 ** 3900)


def _erf_points(seed: int, count: int):
    rng = random.Random(seed)
    pts = [Fraction(0), Fraction(1), Fraction(-1), Fraction(1, 10 ** 30), Fraction(-3, 7), Fraction(6),
           Fraction(27), Fraction(-27), Fraction(10 ** 5), Fraction(1, 2 ** 1000)]
    pts += [Fraction(rng.randint(-2 ** 40, 2 ** 40), 2 ** rng.randint(36, 46)) for _ in range(count)]
    return pts


@pytest.mark.parametrize("prec", [30, 64, 113])
def test_mpmath_erf_is_a_rigorous_enclosure(prec):
    """Attack: the mpmath backend's erf was mpmath's unproven point erf plus a heuristic pad. It is now a
    Taylor series / erfc tail bound in interval arithmetic; on points and intervals it must contain
    Arb's (rigorous) erf at every end, at low and high precision, and be tight on points."""
    B, F = make_backend("mpmath", prec), make_backend("flint", REF_PREC)
    rng = random.Random(prec)
    for v in _erf_points(prec, 40):
        for w in (Fraction(0), Fraction(1, 2 ** rng.randint(3, 40))):
            r = B.erf(B.interval(v, v + w))
            at_lo, at_hi = F.erf(F.num(v)), F.erf(F.num(v + w))
            assert B.lower(r) <= F.lower(at_lo) + REF_TOL, (prec, v, w)
            assert F.upper(at_hi) - REF_TOL <= B.upper(r), (prec, v, w)
            if w == 0 and v.denominator.bit_length() < prec - 2 and abs(v) < 2 ** (prec // 2):
                assert B.upper(r) - B.lower(r) <= Fraction(1, 2 ** (prec - 4)), (prec, v)


def test_mpmath_erf_of_wide_interval_stays_tight():
    """Not soundness but completeness: a wide interval must not be widened to [-1, 1] (GELU checks of
    wide pre-activations would then be REJECTED where the monotone bracket verifies)."""
    B, F = make_backend("mpmath", 64), make_backend("flint", 200)
    for a, b in ((Fraction(-10 ** 6), Fraction(1, 2)), (Fraction(-3), Fraction(2)), (Fraction(1, 8), Fraction(9))):
        r = B.erf(B.interval(a, b))
        assert B.upper(r) - F.upper(F.erf(F.num(b))) < Fraction(1, 2 ** 50)
        assert F.lower(F.erf(F.num(a))) - B.lower(r) < Fraction(1, 2 ** 50)


def test_erf_point_enclosure_is_not_mpmath_point_erf():
    """The enclosure must not depend on mpmath.mp.erf: break it and erf must still be right."""
    B, F = make_backend("mpmath", 64), make_backend("flint", REF_PREC)
    original = mpmath.mp.erf
    try:
        mpmath.mp.erf = lambda x: mpmath.mpf(0)
        for v in (Fraction(1, 3), Fraction(-2), Fraction(5)):
            r, ref = B.erf(B.num(v)), F.erf(F.num(v))
            assert B.lower(r) <= F.lower(ref) + REF_TOL and F.upper(ref) - REF_TOL <= B.upper(r)
    finally:
        mpmath.mp.erf = original


def test_mpmath_point_product_is_exact_then_outward():
    """The mpmath backend's fast product with a point factor (exact integer dot products, one outward
    rounding) must enclose the exact rational product, with either factor on the left, for mixed signs,
    zeros, subnormal and huge weights, at low precision too."""
    rng = random.Random(3)
    for prec in (30, 64):
        B = make_backend("mpmath", prec)
        for _ in range(30):
            n, k, m = rng.randint(1, 4), rng.randint(1, 5), rng.randint(1, 4)
            pool = [0.0, -0.0, 5e-324, -2.5e-310, 1e300, -3.0, 0.1, 1 / 3, 2.0 ** -60]
            Wf = np.array([[rng.choice(pool + [rng.uniform(-9, 9)]) for _ in range(m)] for _ in range(k)])
            lo = [[Fraction(rng.randint(-99, 99), rng.randint(1, 7)) for _ in range(k)] for _ in range(n)]
            wid = [[Fraction(rng.randint(0, 5), 11) for _ in range(k)] for _ in range(n)]
            A = B.matrix([[B.interval(a, a + w) for a, w in zip(r1, r2)] for r1, r2 in zip(lo, wid)])
            prod, prod_t = (A @ B.array(Wf)).rows(), (B.array(Wf.T) @ A.T).rows()
            for pick in (0, 1):
                for i in range(n):
                    for j in range(m):
                        exact = sum(((lo[i][c] + pick * wid[i][c]) * Fraction(float(Wf[c, j]))
                                     for c in range(k)), Fraction(0))
                        for x in (prod[i][j], prod_t[j][i]):
                            assert B.lower(x) <= exact <= B.upper(x), (prec, i, j)


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
def test_enclosures_at_lowest_cli_precision_contain_float_logits(tmp_path, backend):
    """At --prec 30 (the CLI's minimum: weights are held exactly but every later operation rounds to
    30 bits, the mpmath point-product and erf paths included) the float64 logits of every architecture
    variant still lie inside the enclosures, up to float64 error (1e-11 of the logit scale)."""
    B = make_backend(backend, 30)
    for name in sorted(ARCHS):
        model = build_arch(str(tmp_path), name, seed=5)
        for n in (model.config.n_ctx, 2):
            tokens = [int(t) for t in np.random.default_rng(n).integers(0, model.config.d_vocab, size=n)]
            f = float_logits(model, np.asarray([tokens]))[0]
            with B.precision():     # the rules' operators at 30 bits too, as inside a check
                enc = last_logits(B, model, tokens)
            tol = 1e-11 * (1 + float(np.abs(f).max()))
            for j, x in enumerate(enc):
                assert float(B.lower(x)) - tol <= f[j] <= float(B.upper(x)) + tol, (name, j)
