"""Mutation tests (issue 8, section 1), a CI-sized sample of benchmarks/mutation_tally.py.

For small certificates of every kind, generated here on tiny models: a deterministic sample of mutants
(every numeric leaf moved by one ulp, 1e-9 and 1e-3 relative in both directions, sign flips, swaps,
truncations, dropped/duplicated/reordered evidence, other kind/version/model) is checked, with flint
and a smaller sample with mpmath. Zero accepted-and-false (claim judged by the kind's oracle on the tiny
model), zero undecided, zero internal errors; unsafe claim moves are mostly rejected; each kind's
headline number moved a hair past its certified value in the unsafe direction is always rejected.
The shipped certificates get evidence-only and envelope mutants.
"""

import pytest

import tcert.testing.mutation as M
from tcert.testing import CERTIFICATES, example_scale

FLINT_SAMPLE = example_scale(70)
MPMATH_SAMPLE = example_scale(8)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return M.tiny_cases(str(tmp_path_factory.mktemp("mutation")))


@pytest.fixture(scope="module")
def shipped():
    return M.shipped_cases(CERTIFICATES)


@pytest.fixture(scope="module")
def shas(cases, shipped):
    return M.model_shas(cases + shipped)


def assert_sound(tally, what):
    bad = [(cls, label, detail[:160]) for cls, label, detail, _ in tally.bad]
    assert not bad, f"{what}: {bad[:5]}"
    assert tally.counts["accepted-false"] == 0


def assert_case_sound(case, shas, seed, flint_sample=FLINT_SAMPLE):
    """A sample of the case's mutants with flint (some rejected) and a smaller one with mpmath: no mutant
    accepted-false, undecided or an internal error."""
    tally = M.run_case(case, shas, flint_sample, seed=seed)
    assert_sound(tally, f"{case.kind} {case.name} (flint)")
    assert tally.counts["rejected"] > 0
    tally = M.run_case(case, shas, MPMATH_SAMPLE, seed=100 + seed, backend="mpmath")
    assert_sound(tally, f"{case.kind} {case.name} (mpmath)")


def test_every_kind_has_a_case(cases):
    assert {c.kind for c in cases} == set(M.KINDS)


@pytest.mark.parametrize("i", range(10))
def test_sampled_mutants_never_accepted_false(cases, shas, i):
    case = cases[i]
    assert_case_sound(case, shas, i)


@pytest.mark.parametrize("name", ["tiny neox1l perm/tight", "tiny neox1l any/tight", "tiny nope any/naive",
                                  "tiny nope perm/tight"])
def test_tight_overwhelm_mutants_never_accepted_false(cases, shas, name):
    """The overwhelm method `tight` (lambdas per head and competitor, assignment duals) and models without
    positions (NoPE, appendix F): same standard."""
    case = next(c for c in cases if c.name == name)
    assert_case_sound(case, shas, 7)


@pytest.mark.parametrize("name", ["tiny max-of-3 v6 refine", "tiny max-of-3 v6 refine:1.1x",
                                  "tiny max-of-3 v6 refine weighted", "tiny max-of-3 v6 cubic weighted"])
def test_refine_and_weighted_accuracy_mutants_never_accepted_false(cases, shas, name):
    """Accuracy by refinement (mixed entries, pattern groups) and claims under an input distribution
    (position weights, max_at_least; judged by exhaustive weighted counts): same standard, and the certified
    weight moved past itself is rejected."""
    case = next(c for c in cases if c.name == name)
    assert_case_sound(case, shas, 13)
    for label, cert in M.headline_mutants(case):
        verdict, detail = M.run_checker(cert, case.model_path)
        assert verdict == "rejected", (case.name, label, detail)


def test_llama_influence_mutants_never_accepted_false(cases, shas):
    """Global influence constants on a Llama-family model (RMSNorm, gated MLP, grouped-query attention):
    same standard, judged by the exhaustive influence oracle."""
    case = next(c for c in cases if c.name == "tiny llama L2 gqa")
    assert_case_sound(case, shas, 17, example_scale(30))   # each check ~1 s: a smaller flint sample


@pytest.mark.parametrize("name", ["tiny local rotary parallel", "tiny local rotary sharp (exact changes)",
                                  "tiny local L2 rotary parallel (propagated)"])
def test_local_influence_mutants_never_accepted_false(cases, shas, name):
    """The local claim (one input's own attention pattern and values; R >= 2 with competitors, R = 1 with exact
    changes): same standard, judged by every single substitution and every set of <= R substitutions."""
    case = next(c for c in cases if c.name == name)
    assert_case_sound(case, shas, 19, example_scale(25) if "L2" in name else FLINT_SAMPLE)   # L2: each check ~1 s


def test_upto_overwhelm_mutants_never_accepted_false(cases, shas):
    """The overwhelm free kind upto (evidence per length, shared tables in the checker): same standard."""
    case = next(c for c in cases if c.name == "tiny neox1l upto/naive")
    assert_case_sound(case, shas, 11)


@pytest.mark.parametrize("kind", M.KINDS)
def test_unsafe_claim_moves_are_mostly_rejected(cases, shas, kind):
    """Every claim-strengthening numeric move of the kind's cases: none accepted-false, most rejected."""
    tally = M.Tally()
    for case in (c for c in cases if c.kind == kind):
        for m in M.case_mutants(case, shas):
            # the robust case's C moves need a 3^8-input sweep: benchmarks/mutation_tally.py runs them
            if M.unsafe_claim_move(kind, m) and not ("robust" in case.name and m.where[1].startswith("C")):
                tally.add(m, *M.classify(m, case.model_path, case.oracle))
    assert tally.tried > 0
    assert_sound(tally, kind)
    assert tally.counts["rejected"] > tally.tried / 2, dict(tally.counts)


@pytest.mark.parametrize("i", range(10))
def test_headline_number_past_certified_value_is_rejected(cases, i):
    """Margin + hair, W - hair, PTP + hair, count + 1, C - hair (each of C, C_prob, C_abs, C_prob_abs),
    corollary margin + hair and R + 1: REJECTED."""
    case = cases[i]
    edits = M.headline_mutants(case)
    assert edits
    for label, cert in edits:
        verdict, detail = M.run_checker(cert, case.model_path)
        assert verdict == "rejected", (case.name, label, detail)


def test_oracles_are_not_vacuous(cases):
    """Each oracle says False for a claim that is false on its model, and True for the original."""
    by_kind = {c.kind: c for c in cases}
    p = by_kind["prediction"]
    claim = dict(p.cert["claim"], predicted=(p.cert["claim"]["predicted"] + 1) % 8)
    assert p.oracle(p.cert["claim"]) is True and p.oracle(claim) is False
    o = by_kind["overwhelm"]
    assert o.oracle(o.cert["claim"]) is True
    assert o.oracle(dict(o.cert["claim"], predicted=(o.cert["claim"]["predicted"] + 1) % 6)) is False
    a = next(c for c in cases if c.name == "tiny max-of-3 v6 subcubic:svd-rec")
    n = a.cert["claim"]["correct_at_least"]
    assert a.oracle(a.cert["claim"]) is True and a.oracle(dict(a.cert["claim"], correct_at_least=216)) is False
    assert n < 216
    w = next(c for c in cases if c.name == "tiny max-of-3 v6 refine weighted")
    total = w.cert["claim"]["total_weight"]
    assert w.oracle(w.cert["claim"]) is True and w.oracle(dict(w.cert["claim"], correct_at_least=total)) is False
    f = next(c for c in cases if c.kind == "influence" and "toy L2" in c.name)
    tiny = dict(f.cert["claim"], C="1/1000000", C_abs="1/1000000")
    assert f.oracle(dict(f.cert["claim"], C="0x1p+20")) is True and f.oracle(tiny) is False


def test_shipped_evidence_mutants(shipped, shas):
    """Shipped certificates: a sample of evidence-only and envelope mutants. The Max-of-4 accuracy
    certificates take seconds per check and list ~170k mutants each: CI samples two of the cubic one
    (benchmarks/mutation_tally.py samples every one)."""
    total = M.Tally()
    for i, case in enumerate(shipped):
        if case.kind == "accuracy" and not case.name.endswith("_cubic.json"):
            continue
        n = 2 if case.kind == "accuracy" else 12
        tally = M.run_case(case, shas, n, seed=i)
        assert_sound(tally, case.name)
        total.merge(tally)
    assert total.counts["rejected"] > 0
