"""Attacks on the influence checker that must fail, and the repaired holes (red-team reviews; docs/soundness-review.md).

Each test names the attack it documents and fails if the hole it guards reappears."""

import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from tcert.checker.cli import main as check_main
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import certified_needs
from tcert.checker.kinds.influence.sublayers import act_lipschitz
from tcert.checker.kinds.influence.ledger import Ledger
from tcert.checker.modelfile import load_model
from tcert.generator.certificate import format_number
from tcert.checker.obligations import Obligations
from tcert.generator.model.files import save_model
from tcert.testing.accuracy import write_certificate
from tcert.testing.overwhelm import tiny_neox1l


def test_layernorm_lipschitz_constant_holds_on_a_ball_off_zero_variance():
    """On a ball of inputs z0 + ball(0, r) with |P z0| - r = s >= 0 (P the centring projection), the normalised
    output g = P x / sqrt(|P x|^2/d + eps) moves by <= |x - y| / sqrt(s^2/d + eps) (the checker's LN rule).
    Random pairs at 60 digits must never exceed it, and pairs across the ball's closest point to the centred
    zero come close (a too-small constant would be caught); s = 0 is the global constant 1/sqrt(eps)."""
    rng = random.Random(7)

    def g(x, eps):
        d = len(x)
        mu = mpmath.fsum(x) / d
        z = [a - mu for a in x]
        s = mpmath.sqrt(mpmath.fsum(c * c for c in z) / d + eps)
        return [c / s for c in z]
    with mpmath.workdps(60):
        for d, eps, gap in ((3, mpmath.mpf(1) / 10, 1), (5, mpmath.mpf(1) / 100000, 0), (8, mpmath.mpf(3), 4)):
            z0 = [mpmath.mpf(rng.gauss(0, 3)) for _ in range(d)]
            pz0 = [a - mpmath.fsum(z0) / d for a in z0]
            norm0 = mpmath.norm(pz0)
            r = norm0 - gap if gap else norm0            # gap 0: the ball reaches zero variance
            lip = 1 / mpmath.sqrt(mpmath.mpf(gap) ** 2 / d + eps)
            closest = [a * (1 - r / norm0) for a in pz0]
            best = 0
            for trial in range(400):
                if trial % 2:   # random pairs in the ball
                    x, y = ([a + r * c for a, c in zip(z0, unit_ball_point(rng, d))] for _ in range(2))
                else:           # a tiny step across the closest point, orthogonal to it and to 1
                    h = [mpmath.mpf(rng.gauss(0, 1)) for _ in range(d)]
                    h = [a - mpmath.fsum(h) / d for a in h]
                    if gap:
                        t = mpmath.fsum(a * b for a, b in zip(h, closest)) / mpmath.fsum(b * b for b in closest)
                        h = [a - t * b for a, b in zip(h, closest)]
                    step = mpmath.mpf(10) ** -20 / mpmath.norm(h)
                    x, y = closest, [a + step * c for a, c in zip(closest, h)]
                ratio = mpmath.norm([p - q for p, q in zip(g(x, eps), g(y, eps))]) / mpmath.norm(
                    [p - q for p, q in zip(x, y)])
                assert ratio <= lip * (1 + mpmath.mpf(10) ** -30), (d, trial)
                best = max(best, ratio / lip)
            assert best > 0.99


def unit_ball_point(rng, d):
    """A random point of the closed unit ball in R^d (as mpf)."""
    v = [mpmath.mpf(rng.gauss(0, 1)) for _ in range(d)]
    return [a * mpmath.mpf(rng.random()) ** (mpmath.mpf(1) / d) / mpmath.norm(v) for a in v]


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_activation_lipschitz_constants(act):
    """act_lipschitz must bound |act'| everywhere: sample the derivative densely (50 digits) on
    [-12, 12], where all extremes lie (act' -> 0 or 1 outside), and compare with the checker's value."""
    B = make_backend("mpmath")
    lip = act_lipschitz(B, act)
    k, c = mpmath.mpf(44715) / 10 ** 6, mpmath.sqrt(2 / mpmath.pi)
    fns = {"relu": lambda x: max(x, 0), "gelu": lambda x: x * (1 + mpmath.erf(x / mpmath.sqrt(2))) / 2,
           "gelu_new": lambda x: x * (1 + mpmath.tanh(c * (x + k * x ** 3))) / 2}
    with mpmath.workdps(40):
        grid = [mpmath.mpf(i) / 50 for i in range(-600, 601) if i]
        worst, at = max((abs(mpmath.diff(fns[act], x)), x) for x in grid)
        fine = [at + mpmath.mpf(i) / 5000 for i in range(-100, 101) if at + mpmath.mpf(i) / 5000 != 0]
        worst = max([worst] + [abs(mpmath.diff(fns[act], x)) for x in fine])
        lip_mp = mpmath.mpf(lip.numerator) / lip.denominator
    assert worst <= lip_mp, (act, worst, float(lip))
    if act == "gelu":   # the checker's gelu constant is the exact maximum, not a loose one
        assert lip_mp - worst < mpmath.mpf(10) ** -7


def test_softmax_row_caps_are_attained_bounds():
    """row_cap and rest_cap against the attained worst rows, at 50 digits. In a row of M keys whose scores
    spread by <= width the largest weight is 1/(1 + (M-1) e^(-width)) (one score at the top, the rest at the
    bottom). kappa_row must be >= max_m m weight(m) / H_m^layer for causal rows (n_max weight(n_max)
    for bidirectional rows or block 0) and kappa >= max_{2 <= m <= n_max} m / (1 + (m-2) e^(-width)) (the
    weight of an unchanged key among the other m - 1), each with equality up to the enclosure."""
    from tcert.checker.kinds.influence.rates import rest_cap, row_cap
    B = make_backend("flint")
    with mpmath.workdps(50):
        for width, n_max in ((Fraction(1, 3), 5), (Fraction(1, 2), 9), (Fraction(5, 2), 12), (Fraction(7), 3)):
            e = mpmath.exp(-mpmath.mpf(width.numerator) / width.denominator)
            weight = {M: 1 / (1 + (M - 1) * e) for M in range(1, n_max + 1)}
            H = {m: mpmath.fsum(mpmath.mpf(1) / k for k in range(1, m + 1)) for m in weight}
            for layer in (0, 1, 2):
                for causal in (False, True):
                    c = row_cap(B, n_max, width, layer, causal)
                    got = mpmath.mpf(c.numerator) / c.denominator
                    want = (max(m * weight[m] / H[m] ** layer for m in weight) if causal and layer
                            else n_max * weight[n_max])
                    assert want <= got < want * (1 + mpmath.mpf(10) ** -12), (width, n_max, layer, causal)
            c = rest_cap(B, n_max, width)
            got = mpmath.mpf(c.numerator) / c.denominator
            want = max(m / (1 + (m - 2) * e) for m in range(2, n_max + 1))
            assert want <= got < want * (1 + mpmath.mpf(10) ** -12), (width, n_max)


def test_influence_on_a_position_free_model(tmp_path):
    """Finding 3 (was: INTERNAL ERROR KeyError 'pos_embed.W_pos', exit 3): influence on a NoPE model, and on
    its twin with learned positions W_pos = 0 (the same forward pass). NoPE asks for no position constant and
    bounds block 0's values by the finite set of token values; both certificates, built from constants
    claimed exactly at their recomputed bounds, verify through the CLI, and one constant below its bound is
    REJECTED."""
    tensors, cfg = tiny_neox1l(0, n_ctx=8)
    cfg.pop("rotary_dim")
    nope_path, zero_path = str(tmp_path / "nope.safetensors"), str(tmp_path / "zero.safetensors")
    save_model(nope_path, tensors, dict(cfg, positional_embedding_type="none"))
    save_model(zero_path, dict(tensors, **{"pos_embed.W_pos": np.zeros((8, cfg["d_model"]), np.float32)}),
               dict(cfg, positional_embedding_type="standard"))

    class Recorder(Ledger):
        """Claims every constant exactly at its recomputed bound."""
        def const(self, name, bound):
            self.claimed[name] = bound()
            return self.claimed[name]
    for name, path in (("nope", nope_path), ("zero", zero_path)):
        ld = Recorder({}, Obligations())
        need = certified_needs(load_model(path), make_backend("flint"), ld, 8, 2)
        assert ("embed.pos_norm" in ld.claimed) == (name == "zero")
        if name == "zero":
            assert ld.claimed["embed.pos_norm"] == 0 and ld.claimed["embed.pos_radius"] == 0
        claim = {"n_min": 2, "n_max": 8, "rate": "harmonic",
                 **{k: format_number(need[k]) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}}
        evidence = {"power": 2, "constants": {k: format_number(v) for k, v in ld.claimed.items()}}
        cert = write_certificate(tmp_path, f"{name}.json", "influence", path, claim, evidence)
        assert check_main([cert, "--model", path]) == 0
        evidence["constants"]["L0.h0.value_radius"] = format_number(ld.claimed["L0.h0.value_radius"] / 2)
        cert = write_certificate(tmp_path, f"{name}_low.json", "influence", path, claim, evidence)
        assert check_main([cert, "--model", path]) == 1
