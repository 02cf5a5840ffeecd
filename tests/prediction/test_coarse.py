"""The prediction kind's coarse first pass (`prediction.coarse_gap`, precision.COARSE_PREC = 48 bits).

Against the exhaustive oracle (the 300-bit forward pass `ExactForward`) on tiny models of several
architectures: a claim true at 64 bits but not provable at 48 is still VERIFIED, by the unchanged ladder
at 64 bits; a claim the coarse pass proves is VERIFIED at 48 with the coarse bound; a false claim is
REJECTED at both (the coarse pass declines, the ladder refutes it); and a mutant coarse pass that returns
its gap whatever the margin still cannot VERIFY a false claim (the verdict compares lower >= margin).
The coarse pass's spectral norms come from a shorter trace-power chain (COARSE_SQUARINGS): each tier's
norms are its own in the shared cache, each >= the true norm, and a claim only the full-chain norms prove
at 48 bits goes on to the ladder.
"""

from fractions import Fraction

import pytest

from tcert.checker.errors import Rejected
from tcert.checker.forward import Weights
from tcert.checker.interval import make_backend
from tcert.checker.kinds import prediction as P
from tcert.checker import operator_norms as N
from tcert.checker.kinds.prediction.precision import COARSE_PREC, COARSE_SQUARINGS
from tcert.generator.certificate import format_number
from tcert.checker.obligations import Obligations
from tcert.testing.exact_forward import TOLERANCE, ExactForward, to_fraction
from tcert.testing.prediction import build

NAMES = ["neox1l-rotate-half", "preln-gelu", "llama-gqa"]
TOKENS = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("coarse"))
    return {name: build(d, name, 0) for name in NAMES}


def oracle(model):
    """(k, the true min gap, its tolerance) from the 300-bit forward pass."""
    ref = [to_fraction(x) for x in ExactForward(model).logits(TOKENS)]
    k = max(range(len(ref)), key=ref.__getitem__)
    return k, min(ref[k] - y for j, y in enumerate(ref) if j != k), TOLERANCE * (max(abs(x) for x in ref) + 1)


def lower_at(model, k, prec, squarings=N.SQUARINGS):
    """The certified min gap at `prec` bits (one pass, no raise), norms by `squarings` (the coarse pass's at 48)."""
    B = make_backend("flint", prec)
    return P.gap_at(B, model, TOKENS, k, Weights(B, model, squarings=squarings))[0]


def claim(k, margin):
    return {"tokens": TOKENS, "predicted": k, "margin": format_number(margin)}


@pytest.mark.parametrize("name", NAMES)
def test_true_at_64_not_at_48_is_verified_by_the_ladder(tiny, name):
    """margin = the 64-bit certified gap, above the 48-bit one and at most the true gap: the coarse pass
    declines, the ladder VERIFIES at 64 bits; margin = the 48-bit gap: VERIFIED by the coarse pass at 48."""
    model = tiny[name]
    k, true_gap, tol = oracle(model)
    lo48, lo64 = lower_at(model, k, COARSE_PREC, COARSE_SQUARINGS), lower_at(model, k, 64)
    assert 0 < lo48 < lo64 <= true_gap + tol
    B = make_backend("flint")
    assert P.coarse_gap(B, model, TOKENS, k, lo64, Weights(B, model)) is None
    gap = P.certify_gap(B, model, TOKENS, k, lo64)
    assert gap.prec == 64 and gap.lower == lo64 and gap.stop == ""
    gap = P.certify_gap(B, model, TOKENS, k, lo48)
    assert gap.prec == COARSE_PREC and gap.lower == lo48 and gap.upper >= true_gap - tol
    ob = Obligations()
    assert P.check_claim(B, model, claim(k, lo48), ob) == lo48 and ob.figure("claim.precision") == COARSE_PREC


@pytest.mark.parametrize("name", NAMES)
def test_false_claim_rejected_at_both_and_by_a_mutant_coarse_pass(tiny, name, monkeypatch):
    """margin above the true gap: the coarse pass declines, the ladder refutes (REJECTED); a mutant coarse
    pass that returns its gap whatever the margin still gives REJECTED (check_claim compares the bound)."""
    model = tiny[name]
    k, true_gap, tol = oracle(model)
    margin = true_gap + 2 * tol + true_gap * Fraction(1, 2 ** 20)
    B = make_backend("flint")
    assert P.coarse_gap(B, model, TOKENS, k, margin, Weights(B, model)) is None
    gap = P.certify_gap(B, model, TOKENS, k, margin)
    assert gap.lower < margin and gap.stop == "refuted" and gap.upper < margin
    with pytest.raises(Rejected, match="the claim is false"):
        P.check_claim(B, model, claim(k, margin), Obligations())
    real = P.coarse_gap

    def mutant(B, model, tokens, k, margin, W):
        C = make_backend(B.name, COARSE_PREC)
        lower, j, upper, _ = P.gap_at(C, model, tokens, k, Weights(C, model, W.norms, COARSE_SQUARINGS))
        return P.Gap(lower, j, upper, COARSE_PREC, "")

    monkeypatch.setattr(P, "coarse_gap", mutant)
    with pytest.raises(Rejected, match="at 48 bits"):
        P.check_claim(B, model, claim(k, margin), Obligations())
    monkeypatch.setattr(P, "coarse_gap", real)


@pytest.mark.parametrize("backend,prec", [("mpmath", 64), ("flint-exact", 64), ("mpmath+exact", 64), ("flint", 128),
                                          ("flint", COARSE_PREC)])
def test_no_coarse_pass_without_the_exact_layer_or_above_its_precision(tiny, backend, prec):
    """The coarse pass runs only where the exact layer is on at a precision in (COARSE_PREC, 64]; where it does
    not, certify_gap is the ladder alone. mpmath+exact at 64 bits has it, and agrees with flint's bound."""
    model = tiny["neox1l-rotate-half"]
    k, true_gap, tol = oracle(model)
    B = make_backend(backend, prec)
    coarse = P.coarse_gap(B, model, TOKENS, k, Fraction(0), Weights(B, model))
    if backend == "mpmath+exact":
        assert coarse is not None and coarse.prec == COARSE_PREC and 0 < coarse.lower <= true_gap + tol
        flint = P.coarse_gap(make_backend("flint"), model, TOKENS, k, Fraction(0), Weights(B, model))
        assert abs(flint.lower - coarse.lower) < Fraction(1, 2 ** 30) * true_gap
    else:
        assert coarse is None


@pytest.mark.parametrize("name", NAMES)
def test_coarse_norms_are_their_own_tier_and_a_claim_only_full_norms_prove_goes_on(tiny, name):
    """The coarse tier's norms (COARSE_SQUARINGS) sit in the shared cache beside the full chain's, each the
    operator_norm of its own chain length and >= it: a cache keyed without the chain length (mutant) hands one
    tier the other's bound. A margin between the coarse pass's bound and the full-chain 48-bit bound is not
    proved by the coarse pass (a mutant coarse pass with full-chain norms would prove it at 48 bits) and is
    VERIFIED by the ladder at 64 bits."""
    model = tiny[name]
    k, true_gap, tol = oracle(model)
    B = make_backend("flint")
    full = Weights(B, model)
    cheap = Weights(make_backend("flint", COARSE_PREC), model, full.norms, COARSE_SQUARINGS)
    for W in (full, cheap, full):
        for tensor in ("blocks.0.mlp.W_in", "blocks.0.mlp.W_out"):
            assert W.norm(tensor) == N.operator_norm(model.tensors[tensor], W.squarings)
    assert COARSE_SQUARINGS < N.SQUARINGS
    assert N.operator_norm(model.tensors["blocks.0.mlp.W_in"], COARSE_SQUARINGS) > full.norm("blocks.0.mlp.W_in")
    lo48, lo48_full = lower_at(model, k, COARSE_PREC, COARSE_SQUARINGS), lower_at(model, k, COARSE_PREC)
    assert 0 < lo48 < lo48_full <= true_gap + tol
    assert P.coarse_gap(B, model, TOKENS, k, lo48_full, Weights(B, model)) is None
    gap = P.certify_gap(B, model, TOKENS, k, lo48_full)
    assert gap.prec == 64 and gap.lower >= lo48_full and gap.stop == ""
