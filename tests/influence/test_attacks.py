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
from tcert.checker.kinds.influence.blocks import act_lipschitz
from tcert.checker.kinds.influence.ledger import Ledger
from tcert.checker.modelfile import load_model
from tcert.generator.certificate import format_number
from tcert.checker.obligations import Obligations
from tcert.generator.model.files import save_model
from tcert.testing.accuracy import write_certificate
from tcert.testing.overwhelm import tiny_neox1l


def _mp_ln(x, w, b, eps):
    d = len(x)
    mu = mpmath.fsum(x) / d
    z = [a - mu for a in x]
    s = mpmath.sqrt(mpmath.fsum(c * c for c in z) / d + eps)
    return [c / s * wi + bi for c, wi, bi in zip(z, w, b)]


def test_layernorm_lipschitz_constant_holds_near_zero_variance():
    """Lip(LN) <= max|w| / sqrt(eps): the supremum is approached at centred input 0, where the checker's
    constant is tight. Random pairs there (and far away) at 60 digits must never exceed it, and pairs
    at the origin must come close (so a too-small constant would be caught)."""
    rng = random.Random(7)
    with mpmath.workdps(60):
        for d, eps in ((2, mpmath.mpf(1) / 10), (5, mpmath.mpf(1) / 100000), (8, mpmath.mpf(3))):
            w = [mpmath.mpf(rng.uniform(-2, 2)) for _ in range(d)]
            b = [mpmath.mpf(rng.uniform(-1, 1)) for _ in range(d)]
            lip = max(abs(x) for x in w) / mpmath.sqrt(eps)
            best = 0
            for trial in range(400):
                scale = mpmath.mpf(10) ** rng.randint(-8, 2) * mpmath.sqrt(eps)
                x = [scale * rng.gauss(0, 1) for _ in range(d)]
                h = [scale * mpmath.mpf(10) ** -rng.randint(0, 6) * rng.gauss(0, 1) for _ in range(d)]
                y = [a + c for a, c in zip(x, h)]
                num = mpmath.norm([p - q for p, q in zip(_mp_ln(x, w, b, eps), _mp_ln(y, w, b, eps))])
                den = mpmath.norm([p - q for p, q in zip(x, y)])
                ratio = num / den
                assert ratio <= lip * (1 + mpmath.mpf(10) ** -40), (d, trial)
                best = max(best, ratio / lip)
            assert best > 0.5


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


def test_softmax_cap_kappa_is_attained_bound():
    """kappa / M bounds every softmax weight of a row of M <= n_max keys with scores in [-A, A]; the
    worst row (one score A, the rest -A) reaches kappa / n_max at M = n_max."""
    B = make_backend("flint")
    for A, n_max in ((Fraction(1, 3), 5), (Fraction(5, 2), 12), (Fraction(7), 3)):
        kappa = B.upper(n_max / (1 + (n_max - 1) * B.exp(B.num(-2 * A))))
        for M in range(1, n_max + 1):
            worst = B.exp(B.num(A)) / (B.exp(B.num(A)) + (M - 1) * B.exp(B.num(-A)))
            # at M = n_max the two are equal in exact arithmetic: only the enclosure's lower end must fit
            assert (B.lower(worst) if M == n_max else B.upper(worst)) <= kappa / M
        assert kappa / n_max - B.lower(worst) < Fraction(1, 10 ** 15)


def test_influence_on_a_position_free_model_equals_zero_learned_positions(tmp_path):
    """Finding 3 (was: INTERNAL ERROR KeyError 'pos_embed.W_pos', exit 3): influence on a NoPE model. Its
    forward pass is exactly that of the same model with learned positions W_pos = 0, so every constant the
    checker derives must equal that twin's (and embed.pos_norm is not asked for); the certificate built
    from those constants verifies through the CLI, and one constant claimed below its bound is REJECTED."""
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
    derived = {}
    for name, path in (("nope", nope_path), ("zero", zero_path)):
        ld = Recorder({}, Obligations())
        zero = [Fraction(0)] * cfg["d_model"]
        need = certified_needs(load_model(path), make_backend("flint"), ld, 8, 2, zero, zero)
        derived[name] = (ld.claimed, need)
    (c_nope, need_nope), (c_zero, need_zero) = derived["nope"], derived["zero"]
    assert c_zero.pop("embed.pos_norm") == 0 and "embed.pos_norm" not in c_nope
    assert c_nope == c_zero and need_nope == need_zero
    claim = {"n_min": 2, "n_max": 8, "rate": "harmonic",
             **{k: format_number(need_nope[k]) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}}
    evidence = {"power": 2, "embed_center": ["0"] * cfg["d_model"], "unembed_center": ["0"] * cfg["d_model"],
                "constants": {k: format_number(v) for k, v in c_nope.items()}}
    cert = write_certificate(tmp_path, "infl.json", "influence", nope_path, claim, evidence)
    assert check_main([cert, "--model", nope_path]) == 0
    evidence["constants"]["D0"] = format_number(c_nope["D0"] / 2)
    cert = write_certificate(tmp_path, "infl_low.json", "influence", nope_path, claim, evidence)
    assert check_main([cert, "--model", nope_path]) == 1
