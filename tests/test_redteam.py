"""Red-team tests of the checker's soundness: attacks that must fail, and the repaired holes.

Each test names the attack it documents. A test here fails if the hole it guards reappears.
"""

import random
from fractions import Fraction

import pytest

from checker.interval import make_backend

# Arb at 4000 bits: its balls have radius <= 2^-3900 around the true erf value (the tolerance below),
# far below the width of any enclosure the checker computes.
REF_PREC, REF_TOL = 4000, Fraction(1, 2 ** 3900)


@pytest.fixture(autouse=True)
def _restore_precisions():
    """Backends share mpmath's iv context and flint's ctx: put the default precisions back."""
    yield
    make_backend("mpmath")
    make_backend("flint")


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


def test_erf_point_enclosure_is_not_mpmath_point_erf():
    """The enclosure must not depend on mpmath.mp.erf: break it and erf must still be right."""
    import mpmath
    B, F = make_backend("mpmath", 64), make_backend("flint", REF_PREC)
    original = mpmath.mp.erf
    try:
        mpmath.mp.erf = lambda x: mpmath.mpf(0)
        for v in (Fraction(1, 3), Fraction(-2), Fraction(5)):
            r, ref = B.erf(B.num(v)), F.erf(F.num(v))
            assert B.lower(r) <= F.lower(ref) + REF_TOL and F.upper(ref) - REF_TOL <= B.upper(r)
    finally:
        mpmath.mp.erf = original
