"""Attacks on the accuracy checker that must fail, and the repaired holes (red-team reviews; docs/soundness-review.md).

Each test names the attack it documents and fails if the hole it guards reappears."""

from fractions import Fraction
from tcert.checker.cli import main as check_main
from tcert.checker.errors import BadInput
from tcert.checker.errors import Rejected
from tcert.checker.interval import make_backend
from tcert.checker.kinds import accuracy as acc
from tcert.checker.kinds.accuracy import brute, cubic, subcubic
from tcert.checker.kinds.accuracy import tables as mt
from tcert.checker.kinds.accuracy.distribution import parse_distribution
from tcert.checker.kinds.accuracy.tables import integer_tables, position_sums
from tcert.checker.modelfile import load_model
from tcert.checker.obligations import Obligations
from tcert.generator.model.files import save_model
import numpy as np
import pytest
import random
from tcert.testing.accuracy import (all_cases, assert_split_brackets, case_of, maxofk_instance, maxofk_model, nope_maxofk, rational_eqke, write_certificate)


MAXOFK_MODELS = [(5, 3, 1, 0.05, 15.0), (6, 2, 2, 0.1, 8.0), (4, 4, 3, 0.05, 30.0), (6, 3, 4, 0.1, 40.0),
                 (5, 3, 6, 0.08, 15.0)]


@pytest.fixture(scope="module", params=MAXOFK_MODELS, ids=lambda p: "v{}k{}s{}".format(*p[:3]))
def maxofk(request, tmp_path_factory):
    return maxofk_instance(tmp_path_factory, *request.param)


def test_brute_force_never_counts_a_wrong_input(maxofk):
    """The brute-force strategy's count is at most the number of inputs not certainly wrong."""
    model, inputs, wrong = maxofk
    assert wrong, "the model should answer some inputs wrongly (otherwise the test is vacuous)"
    T = integer_tables(make_backend("flint"), model)
    assert brute.correct_weight(T, parse_distribution({}, T["n"], T["v"]))[0] <= len(inputs) - len(wrong)


def test_every_accepted_cubic_case_covers_only_correct_inputs(maxofk):
    """Attack: list EVERY (m, q, c) case with the largest token set the checker accepts (masks an honest
    generator might never emit, e.g. mixing several non-max tokens). Each input such a case covers must
    be correct, and confirmed_count's credited count must equal the number of inputs covered."""
    model, inputs, wrong = maxofk
    n, v = model.config.n_ctx, model.config.d_vocab
    T = integer_tables(make_backend("flint"), model)
    cases = {}
    for m, q, c in all_cases(n, v):
        vals, sums = cubic.value_bounds(T, m), position_sums(T, q)
        ks = list(range(m)) if c else []
        if c and not ks:
            continue   # m = 0 has no non-max token (the checker refuses such a mask)
        ok = np.atleast_1d(cubic.numerator_bound(T, vals, sums, m, q, c, ks)) < 0
        good = [k for k, g in zip(ks, ok) if g] if c else ([] if not ok[0] else None)
        if c == 0 and ok:
            cases[(m, q, 0)] = []
        elif c and good:
            cases[(m, q, c)] = good
    covered = [tk for tk in inputs if (lambda m, q, c, ks: (m, q, c) in cases and ks <= set(cases[(m, q, c)]))(
        *case_of(tk))]
    assert not set(covered) & wrong, sorted(set(covered) & wrong)[:5]
    assert cubic.confirmed_count(T, cases, parse_distribution({}, n, v), Obligations()) == len(covered)
    assert len(covered) > 0


def test_every_accepted_subcubic_case_covers_only_correct_inputs(maxofk):
    """Attack: for every (m, q, c) try every cutoff j, for both subcubic variants, with the checker's own
    per-case rule (subcubic.certified_on on a one-case certificate). Whatever it accepts must cover only
    correct inputs, and the credited count must equal the number of covered inputs."""
    model, inputs, wrong = maxofk
    n, v = model.config.n_ctx, model.config.d_vocab
    B = make_backend("flint")
    T = integer_tables(B, model, True)
    EQKE = np.array([[float(B.upper(x)) for x in row] for row in T["intervals"]["EQKE"].rows()])
    Qm = np.array([[float(B.upper(x)) for x in row] for row in T["intervals"]["Q"].rows()])
    Km = np.array([[float(B.upper(x)) for x in row] for row in T["intervals"]["K"].rows()])
    u, _, vt = np.linalg.svd(Qm.T @ Qm @ Km.T @ Km)   # some plausible rank-1 hint; any hint must be safe
    hints = {"svd": ([float(x).hex() for x in vt[0]], [float(x).hex() for x in u[:, 0]]), "exact-eqke": None,
             "svd2": ([[float(x).hex() for x in vt[r]] for r in range(2)],
                      [[float(x).hex() for x in u[:, r]] for r in range(2)])}
    credited_any = 0
    for variant, hint in hints.items():
        for m, q, c in all_cases(n, v):
            for j in (range(m) if c else [0]):
                ev = {"strategy": "subcubic", "variant": variant, "cases": [[m, q, c, j]]}
                if hint:
                    ev["x"], ev["y"] = hint
                try:
                    count, _ = subcubic.certified_on(B, T, subcubic.parse_evidence(ev, model.config), Obligations())
                except Rejected:
                    continue
                covered = [tk for tk in inputs if case_of(tk)[:3] == (m, q, c) and
                           all(t <= j for t in case_of(tk)[3])]
                assert not set(covered) & wrong, (variant, m, q, c, j)
                assert count == len(covered), (variant, m, q, c, j, count, len(covered))
                credited_any += count
    assert credited_any > 0 and EQKE.shape == (v, v)


def test_exact_logit_ties_are_never_counted_correct(tmp_path):
    """Attack: ties. With two identical unembedding columns (and biases) for tokens v-1 and v-2, their
    logits are equal on every input, so every input whose max is v-1 or v-2 is wrong. No strategy may
    credit any of them: brute force counts at most (v-2)^K, and no cubic/subcubic case with m >= v-2
    is accepted."""
    v, k = 5, 3
    t, config = maxofk_model(v, k, 9, 0.05, 15.0)
    t["unembed.W_U"][:, v - 1] = t["unembed.W_U"][:, v - 2]
    t["unembed.b_U"][v - 1] = t["unembed.b_U"][v - 2]
    path = str(tmp_path / "tie.safetensors")
    save_model(path, t, config)
    model = load_model(path)
    B = make_backend("flint")
    T = integer_tables(B, model, True)
    assert brute.correct_weight(T, parse_distribution({}, k, v))[0] <= (v - 2) ** k
    for m, q, c in all_cases(k, v):
        if m < v - 2:
            continue
        ks = list(range(m)) if c else []
        bound = cubic.numerator_bound(T, cubic.value_bounds(T, m), position_sums(T, q), m, q, c, ks)
        assert not np.any(np.atleast_1d(bound) < 0), (m, q, c)
        for j in (range(m) if c else [0]):
            ev = {"strategy": "subcubic", "variant": "exact-eqke", "cases": [[m, q, c, j]]}
            with pytest.raises(Rejected, match="accuracy subcubic: claimed cases"):
                subcubic.certified_on(B, T, subcubic.parse_evidence(ev, model.config), Obligations())


def test_value_bounds_dominate_their_definitions():
    """Every subcubic value table is an upper bound of the maximum it stands for (docstring of
    subcubic.value_bounds), checked by brute force on random integer bound tables (lo <= hi)."""
    rng = np.random.default_rng(0)
    for trial in range(20):
        v, n = int(rng.integers(2, 6)), int(rng.integers(2, 5))

        def pair(shape):
            lo = rng.integers(-50, 50, size=shape)
            return lo.astype(object), (lo + rng.integers(0, 6, size=shape)).astype(object)
        T = {"n": n, "v": v}
        T["EU_lo"], T["EU_hi"] = pair((v, v))
        T["EVOU_lo"], T["EVOU_hi"] = pair((v, v))
        T["PVOU_lo"], T["PVOU_hi"] = pair((n, v))
        V = subcubic.value_bounds(T)
        EU_lo, EU_hi, EVOU_lo, EVOU_hi, PVOU_lo, PVOU_hi = (T[k] for k in ("EU_lo", "EU_hi", "EVOU_lo", "EVOU_hi",
                                                                             "PVOU_lo", "PVOU_hi"))
        for m in range(v):
            xs = [x for x in range(v) if x != m]
            Pn = {x: max(PVOU_hi[i, x] - PVOU_lo[i, m] for i in range(n - 1)) for x in range(v)}
            for q in range(v):
                assert V["Tm"][q, m] >= max(EU_hi[q, x] - EU_lo[q, m] + EVOU_hi[m, x] - EVOU_lo[m, m] + Pn[x]
                                            for x in xs)
                F_hi, F_lo = EU_hi[q] + EVOU_hi[q] + PVOU_hi[n - 1], EU_lo[q] + EVOU_lo[q] + PVOU_lo[n - 1]
                assert V["Tq"][q, m] >= max(F_hi[x] - F_lo[m] for x in xs)
                assert V["EUp"][q, m] >= max(EU_hi[q, x] - EU_lo[q, m] for x in xs)
            for j in range(v):
                assert V["Rpre"][m, j] >= max(max(EVOU_hi[k, x] - EVOU_lo[k, m] for x in xs)
                                              for k in range(j + 1)) + max(Pn[x] for x in xs)


@pytest.mark.parametrize("variant", ["svd", "svd2", "exact-eqke"])
def test_score_split_bounds_exact_eqke_differences(tmp_path, variant):
    """What the subcubic rule uses from the score tables: for all q, k, k',
    (ab_lo[q,k] - ab_hi[q,k'] - eps[q]) 2^-shift <= EQKE[q,k] - EQKE[q,k'] <= (ab_hi[q,k] - ab_lo[q,k']
    + eps[q]) 2^-shift, with EQKE computed in exact rationals (attn_scale 2 makes it rational) and
    arbitrary (even poor) hint vectors."""
    model, T, EQKE = rational_eqke(tmp_path)
    B, d = make_backend("flint"), model.config.d_head
    rng = random.Random(variant)
    hint = lambda: [Fraction(rng.randint(-9, 9), 4) for _ in range(d)]
    if variant == "svd":
        S = subcubic.low_rank_scores(B, T, *subcubic.rank1_projection(B, hint(), hint(), "y . x"))
    elif variant == "svd2":
        S = subcubic.low_rank_scores(B, T, *subcubic.rank2_projection(B, [hint(), hint()], [hint(), hint()]))
    else:
        S = subcubic.exact_scores(T)
    assert_split_brackets(S, EQKE)


@pytest.fixture(scope="module", params=[(5, 3, 1, 0.05, 15.0), (6, 3, 4, 0.1, 40.0)], ids=["v5k3", "v6k3"])
def maxofk2(request, tmp_path_factory):
    return maxofk_instance(tmp_path_factory, *request.param)


def _hostile_hints(d: int, rng: random.Random, model=None) -> dict:
    """svd-rec hint lists an attacker might send: random (every length 1..d), one pair repeated (the second
    deflation of the same direction leaves a_2 = 0), nearly orthogonal pairs (y.x tiny, huge 1/(y.x));
    with `model`, also the generator's own hints at rank 1, 2 and full (full: a tiny remainder, so the
    split is tight and an algebra slip shows)."""
    vec = lambda: [Fraction(rng.randint(-9, 9), rng.choice((1, 2, 4))) for _ in range(d)]
    out = {}
    if model is not None:
        from tcert.generator.accuracy.subcubic import deflation_hints
        for r in (1, 2, d):
            _, _, X, Y = deflation_hints(model, r)
            out[f"generator{r}"] = ([[Fraction(float(t)) for t in row] for row in X],
                                    [[Fraction(float(t)) for t in row] for row in Y])
    for r in (1, 3, d):
        out[f"random{r}"] = ([vec() for _ in range(r)], [vec() for _ in range(r)])
    x = vec()
    out["repeated"] = ([x, x, x], [x, x, x])
    e1, e2 = [Fraction(int(i == 0)) for i in range(d)], [Fraction(int(i == 1)) for i in range(d)]
    tiny = [a + Fraction(1, 2 ** 40) * b for a, b in zip(e2, e1)]   # y.x = 2^-40
    out["near_orthogonal"] = ([e1, vec()], [tiny, vec()])
    return out


def test_every_accepted_svd_rec_eu_case_covers_only_correct_inputs(maxofk2):
    """Attack: hostile svd-rec hint lists and eu_groupings (random, all in one group, each query alone);
    for every (m, q, c) and every cutoff j, the checker's per-case rule (subcubic.confirmed_count on one
    case, with this configuration's value bounds and scores). Whatever it accepts must cover only correct
    inputs, and its credited count must equal the number of inputs covered."""
    model, inputs, wrong = maxofk2
    n, v, d = model.config.n_ctx, model.config.d_vocab, model.config.d_head
    B = make_backend("flint")
    T = integer_tables(B, model, True)
    rng = random.Random(v)
    groupings = [None, [0] * v, list(range(v)), [rng.randrange(32) for _ in range(v)]]
    hints = _hostile_hints(d, rng, model)
    configs = [("svd-rec", hints[name], None) for name in ("random1", f"random{d}", "repeated", "near_orthogonal")]
    configs += [("svd-rec", hints[f"generator{d}"], g) for g in groupings] + [("svd-rec", hints["generator2"], groupings[3])]
    configs += [("exact-eqke", None, g) for g in groupings[1:]]
    credited = 0
    for variant, hint, groups in configs:
        # the per-case rule, with this configuration's tables computed once (they depend on no case)
        V = subcubic.value_bounds(T, groups)
        S = subcubic.deflated_scores(B, T, subcubic.hint_projections(B, variant, *hint)) if hint else \
            subcubic.exact_scores(T)
        for m, q, c in all_cases(n, v):
            for j in (range(m) if c else [0]):
                try:
                    count = subcubic.confirmed_count(B, T, V, S, {(m, q, c): j}, Obligations())
                except Rejected:
                    continue
                covered = [tk for tk in inputs if case_of(tk)[:3] == (m, q, c) and all(t <= j for t in case_of(tk)[3])]
                assert not set(covered) & wrong, (variant, groups, m, q, c, j)
                assert count == len(covered), (variant, groups, m, q, c, j, count, len(covered))
                credited += count
    assert credited > 0


def test_deflated_score_split_bounds_exact_eqke_differences(tmp_path):
    """What the subcubic rule uses from subcubic.deflated_scores, for hostile hint lists (random, repeated, nearly
    orthogonal, r = d_head): for all q, k, k',
    (ab_lo[q,k] - ab_hi[q,k'] - eps[q]) 2^-shift <= EQKE[q,k] - EQKE[q,k'] <= (ab_hi[q,k] - ab_lo[q,k'] + eps[q]) 2^-shift,
    EQKE in exact rationals (attn_scale 2)."""
    model, T, EQKE = rational_eqke(tmp_path)
    B, v, d = make_backend("flint"), len(EQKE), model.config.d_head
    widths = {}
    for name, (xs, ys) in _hostile_hints(d, random.Random(7), model).items():
        S = subcubic.deflated_scores(B, T, subcubic.hint_projections(B, "svd-rec", xs, ys))
        assert_split_brackets(S, EQKE, name)
        one = Fraction(1, 1 << S["shift"])
        widths[name] = max((S["ab_hi"][q, a] - S["ab_lo"][q, a]) * one + S["eps"][q] * one
                           for q in range(v) for a in range(v))
    assert widths[f"generator{d}"] < Fraction(1, 10 ** 6), widths   # the full-rank split is tight


def test_grouped_tm_dominates_its_definition_for_any_grouping():
    """The +eu option: Tm with per-group centres (any grouping, including ids that skip values and one
    group of all queries) is still >= max_{x != m} EU_hi[q,x] - EU_lo[q,m] + EVOU_hi[m,x] - EVOU_lo[m,m] + Pn[m,x]
    (brute force on random integer tables, wide and negative entries)."""
    rng = np.random.default_rng(1)
    for trial in range(30):
        v, n = int(rng.integers(2, 7)), int(rng.integers(2, 5))

        def pair(shape):
            lo = rng.integers(-10 ** 6, 10 ** 6, size=shape)
            return lo.astype(object), (lo + rng.integers(0, 10 ** 5, size=shape)).astype(object)
        T = {"n": n, "v": v}
        T["EU_lo"], T["EU_hi"] = pair((v, v))
        T["EVOU_lo"], T["EVOU_hi"] = pair((v, v))
        T["PVOU_lo"], T["PVOU_hi"] = pair((n, v))
        groups = [int(g) for g in rng.integers(0, 32 if trial % 2 else 2, size=v)]
        V = subcubic.value_bounds(T, groups)
        EU_lo, EU_hi, EVOU_lo, EVOU_hi, PVOU_lo, PVOU_hi = (T[k] for k in ("EU_lo", "EU_hi", "EVOU_lo", "EVOU_hi",
                                                                             "PVOU_lo", "PVOU_hi"))
        for m in range(v):
            Pn = {x: max(PVOU_hi[i, x] - PVOU_lo[i, m] for i in range(n - 1)) for x in range(v)}
            for q in range(v):
                assert V["Tm"][q, m] >= max(EU_hi[q, x] - EU_lo[q, m] + EVOU_hi[m, x] - EVOU_lo[m, m] + Pn[x]
                                            for x in range(v) if x != m), (trial, groups, q, m)


def test_hostile_svd_rec_and_eu_group_shapes_are_refused(maxofk2):
    """Malformed hints never reach arithmetic: more than d_head deflation pairs (unbounded work), empty
    lists, x/y of different counts, a vector of the wrong length, eu_groups of the wrong length, ids out of
    [0, 32), booleans, strings or floats as ids; a pair with y.x = 0 is REJECTED (not a projection)."""
    model, _, _ = maxofk2
    d, v = model.config.d_head, model.config.d_vocab
    B = make_backend("flint")
    T = integer_tables(B, model, True)
    vec = ["1"] * d
    base = {"strategy": "subcubic", "variant": "svd-rec", "cases": [[1, 0, 0, 0]], "x": [vec], "y": [vec]}
    bad = [dict(base, x=[vec] * (d + 1), y=[vec] * (d + 1)), dict(base, x=[], y=[]), dict(base, y=[vec, vec]),
           dict(base, x=[vec[:-1]]), dict(base, x=vec, y=vec)]
    bad += [dict(base, eu_groups=g) for g in ([0] * (v - 1), [0] * (v + 1), [32] + [0] * (v - 1),
                                             [-1] + [0] * (v - 1), [True] + [0] * (v - 1), ["0"] + [0] * (v - 1),
                                             [0.0] + [0] * (v - 1), {"0": 0})]
    bad += [{"strategy": "cubic", "cases": [], "eu_groups": [0] * v}]
    claim = {"task": "max-of-k", "d_vocab": v, "n_ctx": model.config.n_ctx, "inputs": v ** model.config.n_ctx,
             "correct_at_least": 0}
    for ev in bad:
        with pytest.raises(BadInput):
            acc.check(model, claim, ev, B, Obligations())
    e1 = [str(int(i == 0)) for i in range(d)]
    e2 = [str(int(i == 1)) for i in range(d)]
    for xs, ys in (([e1], [e2]), ([vec, e1], [vec, e2])):   # y.x = 0 at the first / the last step
        with pytest.raises(Rejected, match="accuracy subcubic: deflation hints are projections"):
            subcubic.certified_on(B, T, subcubic.parse_evidence(dict(base, x=xs, y=ys), model.config), Obligations())


def test_exp_bound_stays_small_and_sound_for_hostile_arguments():
    """Finding 4: a nearly orthogonal hint pair (y.x tiny) makes score bounds huge, and exp_bound(x) then
    built exp(x) as an exact rational: x = 2^30 is a 1.5e9-bit integer (0.2 s with flint, 16 s with
    mpmath), x = 2^34 some 3 GB, larger ones OverflowError (internal error). Beyond |x| >= L = 2^12 it
    now returns 2^-L / 0 / 2^L (valid as e > 2) or refuses an upper bound; inside, Arb's value."""
    L = subcubic.EXP_ARG_LIMIT
    for backend in ("flint", "mpmath"):
        B = make_backend(backend)
        for x in (Fraction(-(2 ** 3000)), Fraction(-(2 ** 34)), Fraction(-L)):
            assert subcubic.exp_bound(B, x, True) == Fraction(1, 2 ** L) and subcubic.exp_bound(B, x, False) == 0
        for x in (Fraction(2 ** 3000), Fraction(2 ** 34), Fraction(L)):
            assert subcubic.exp_bound(B, x, False) == 2 ** L
            with pytest.raises(Rejected, match="exp range"):
                subcubic.exp_bound(B, x, True)
        ref = make_backend("flint", 200)
        for x in (Fraction(L - 1), Fraction(-(L - 1)), Fraction(1, 3)):
            lo, hi = subcubic.exp_bound(B, x, False), subcubic.exp_bound(B, x, True)
            assert lo <= ref.lower(ref.exp(ref.num(x))) and ref.upper(ref.exp(ref.num(x))) <= hi
        # the clamped values are the right side of exp at the limit: e^-L < 2^-L and e^L > 2^L
        assert ref.upper(ref.exp(ref.num(-L))) < Fraction(1, 2 ** L) and ref.lower(ref.exp(ref.num(L))) > 2 ** L


def test_nearly_orthogonal_svd_hint_is_answered_quickly(maxofk2):
    """End to end: svd and svd-rec certificates whose hint pair has y.x = 2^-200 are decided (REJECTED
    or counted) without building astronomically large rationals (was: OverflowError, exit 3)."""
    model, _, _ = maxofk2
    d, v = model.config.d_head, model.config.d_vocab
    B = make_backend("flint")
    T = integer_tables(B, model, True)
    e1 = [str(int(i == 0)) for i in range(d)]
    y = ["1/" + str(2 ** 200) if i == 0 else str(int(i == 1)) for i in range(d)]
    for variant, xs, ys in (("svd", e1, y), ("svd-rec", [e1], [y])):
        for case in ([v - 1, 0, 1, 0], [v - 1, 1, 0, 0]):
            ev = {"strategy": "subcubic", "variant": variant, "cases": [case], "x": xs, "y": ys}
            try:
                subcubic.certified_on(B, T, subcubic.parse_evidence(ev, model.config), Obligations())
            except Rejected:
                pass


def test_accuracy_refuses_a_position_free_model_cleanly(tmp_path):
    """Finding 3 (was: INTERNAL ERROR KeyError 'pos_embed.W_pos', exit 3): the accuracy kind's argument
    is for learned positions; a NoPE model is refused as bad input (exit 2)."""
    model_path = nope_maxofk(tmp_path)
    cert = write_certificate(tmp_path, "acc.json", "accuracy", model_path,
                  {"task": "max-of-k", "d_vocab": 4, "n_ctx": 3, "inputs": 64, "correct_at_least": 1},
                  {"strategy": "brute"})
    assert check_main([cert, "--model", model_path]) == 2


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
def test_deep_numerators_get_the_integer_bounds_of_exp(backend):
    """Hostile weights (scores of 2^2000) made exp(d) a rational with a 2^2000-bit denominator (flint:
    OverflowError, exit 3; mpmath: memory exhausted), and Arb's exp of [-2^2000, -2^12] is not finite.
    numerator_bounds gives an entry lying entirely at or below -MAX_BITS the ends 0 and 1 without exp;
    every other entry gets the floor / ceiling of the library's exp ends at the shift it chose (the
    largest, 4032, for deep rows; from the deepest d otherwise)."""
    B = make_backend(backend)
    L = mt.MAX_BITS
    deep = ((-5000, -1), (-5000, -L), (-L - 1, -L), (-L, -L + 1), (-3, 0), (-(2 ** 14), -(2 ** 13)),
            (-(2 ** 2000), -(2 ** 1999)))
    for spans, want in ((deep, L - 64), (((-3, 0), (-40, -30)), 64 + 58)):
        spans = ((0, 0),) + spans
        mat = B.matrix([[B.interval(Fraction(a), Fraction(b)) for a, b in spans]])
        lo, hi, shift = mt.numerator_bounds(B, mat)
        c = B.num(mat.T.col_bounds()[1][0])         # the row's exact upper bound (Arb's [-3, 0] reaches above 0)
        assert shift == want
        for j, (a, b) in enumerate(spans):
            if b <= -L:
                assert (lo[0, j], hi[0, j]) == (0, 1), (a, b)
                continue
            e = B.exp(mat.rows()[0][j] - c)
            assert lo[0, j] == max(mt.fixed_point(B.lower(e), False, shift), 0), (a, b)
            assert hi[0, j] == mt.fixed_point(B.upper(e), True, shift), (a, b)
