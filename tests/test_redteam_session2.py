"""Red-team tests, session 2: the checker code added since commit 23509c6 (docs/soundness-review.md,
"Session 2").

Each test names the attack it documents and fails if the hole it probes appears:
- accuracy `subcubic:svd-rec` (recursive rank-1 deflation) and the `+eu` option (`eu_groups`): adversarial
  hint pairs and groupings, every case the checker accepts must cover only correct inputs; the deflated
  score split against exact rational EQKE; the grouped Tm against its definition; hostile hint shapes;
- overwhelm method tight with a final LayerNorm: the bounds the checker itself derives (sigma range,
  per-competitor linear part U_j, offsets e_j) against a 110-bit oracle over every free string, i.e. the
  smallest sigma_hi / largest sigma_lo / smallest lambdas an attacker could get accepted are still true;
- overwhelm `upto:N` shared tables: the deviation W of every length from UptoTables against the float
  spread of every logit over every free string (rotary and position-free models, offsets past the prefix);
- positional_embedding_type "none" through the kinds that assumed rotary-or-learned (accuracy, influence):
  a clean refusal or a sound check, never an internal error.
"""

import copy
import hashlib
import itertools
import json
import random
from fractions import Fraction

import numpy as np
import pytest

from checker import maxofk_tables as mt
from checker import overwhelm_bounds as owb
from checker import overwhelm_final_ln as final_ln
from checker.cli import main as check_main
from checker.errors import BadInput, Rejected
from checker.forward import Weights
from checker.interval import make_backend
from checker.kinds import accuracy as acc
from checker.kinds import overwhelm as ow_kind
from checker.modelfile import load_model
from checker.verify import Obligations
from generator.forward import logits as float_logits
from generator.modelio import save_model
from generator.overwhelm_tight import generate_tight
from overwhelm_helpers import Oracle, free_strings, model_of, tiny_neox1l, tiny_neox_real
from test_redteam import (_all_cases, _case_of, _maxofk_model, _restore_precisions, assert_split_brackets,  # noqa: F401 (autouse)
                          maxofk_instance, rational_eqke)


# --------------------------------------------------------------------------------------------------------
# accuracy: svd-rec and +eu

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
        from generator.maxofk_subcubic import deflation_hints
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


def test_every_accepted_svd_rec_eu_case_covers_only_correct_inputs(maxofk2, monkeypatch):
    """Attack: hostile svd-rec hint lists and eu_groupings (random, all in one group, each query alone);
    for every (m, q, c) and every cutoff j, the checker's per-case rule (subcubic_check on a one-case
    certificate). Whatever it accepts must cover only correct inputs, and its credited count must equal
    the number of inputs covered."""
    model, inputs, wrong = maxofk2
    n, v, d = model.config.n_ctx, model.config.d_vocab, model.config.d_head
    B = make_backend("flint")
    T = mt.value_tables(B, model, True)
    rng = random.Random(v)
    groupings = [None, [0] * v, list(range(v)), [rng.randrange(32) for _ in range(v)]]
    hints = _hostile_hints(d, rng, model)
    configs = [("svd-rec", hints[name], None) for name in ("random1", f"random{d}", "repeated", "near_orthogonal")]
    configs += [("svd-rec", hints[f"generator{d}"], g) for g in groupings] + [("svd-rec", hints["generator2"], groupings[3])]
    configs += [("exact-eqke", None, g) for g in groupings[1:]]
    credited = 0
    for variant, hint, groups in configs:
        # the per-case rule, with this configuration's tables computed once (they depend on no case)
        V = mt.value_bounds(T, groups)
        S = mt.deflated_scores(B, T, *hint) if hint else mt.exact_scores(T)
        monkeypatch.setattr(acc, "value_bounds", lambda T_, g_, V=V: V)
        monkeypatch.setattr(acc, "deflated_scores", lambda *a, S=S: S)
        monkeypatch.setattr(acc, "exact_scores", lambda *a, S=S: S)
        for m, q, c in _all_cases(n, v):
            for j in (range(m) if c else [0]):
                ev = {"strategy": "subcubic", "variant": variant, "cases": [[m, q, c, j]]}
                if hint:
                    ev["x"] = [[x.__str__() for x in vec] for vec in hint[0]]
                    ev["y"] = [[y.__str__() for y in vec] for vec in hint[1]]
                if groups is not None:
                    ev["eu_groups"] = groups
                try:
                    count, _ = acc.subcubic_check(B, model, T, ev, Obligations())
                except Rejected:
                    continue
                covered = [tk for tk in inputs if _case_of(tk)[:3] == (m, q, c) and all(t <= j for t in _case_of(tk)[3])]
                assert not set(covered) & wrong, (variant, groups, m, q, c, j)
                assert count == len(covered), (variant, groups, m, q, c, j, count, len(covered))
                credited += count
    assert credited > 0


def test_deflated_score_split_bounds_exact_eqke_differences(tmp_path):
    """What the subcubic rule uses from deflated_scores, for hostile hint lists (random, repeated, nearly
    orthogonal, r = d_head): for all q, k, k',
    (ab_lo[q,k] - ab_hi[q,k'] - eps[q]) 2^-shift <= EQKE[q,k] - EQKE[q,k'] <= (ab_hi[q,k] - ab_lo[q,k'] + eps[q]) 2^-shift,
    EQKE in exact rationals (attn_scale 2)."""
    model, T, EQKE = rational_eqke(tmp_path)
    B, v, d = make_backend("flint"), len(EQKE), model.config.d_head
    widths = {}
    for name, (xs, ys) in _hostile_hints(d, random.Random(7), model).items():
        S = mt.deflated_scores(B, T, xs, ys)
        assert_split_brackets(S, EQKE, name)
        one = Fraction(1, 1 << S["shift"])
        widths[name] = max((S["ab_hi"][q, a] - S["ab_lo"][q, a]) * one + S["eps"][q] * one
                           for q in range(v) for a in range(v))
    assert widths[f"generator{d}"] < Fraction(1, 10 ** 6), widths   # the full-rank split is tight


def test_grouped_tm_dominates_its_definition_for_any_grouping():
    """The +eu option: Tm with per-group centres (any grouping, including ids that skip values and one
    group of all queries) is still >= max_{x != m} EU_hi[q,x] - EU_lo[q,m] + EV_hi[m,x] - EV_lo[m,m] + Pn[m,x]
    (brute force on random integer tables, wide and negative entries)."""
    rng = np.random.default_rng(1)
    for trial in range(30):
        v, n = int(rng.integers(2, 7)), int(rng.integers(2, 5))

        def pair(shape):
            lo = rng.integers(-10 ** 6, 10 ** 6, size=shape)
            return lo.astype(object), (lo + rng.integers(0, 10 ** 5, size=shape)).astype(object)
        T = {"n": n, "v": v}
        T["EU_lo"], T["EU_hi"] = pair((v, v))
        T["EV_lo"], T["EV_hi"] = pair((v, v))
        T["PV_lo"], T["PV_hi"] = pair((n, v))
        groups = [int(g) for g in rng.integers(0, 32 if trial % 2 else 2, size=v)]
        V = mt.value_bounds(T, groups)
        EU_lo, EU_hi, EV_lo, EV_hi, PV_lo, PV_hi = (T[k] for k in ("EU_lo", "EU_hi", "EV_lo", "EV_hi", "PV_lo", "PV_hi"))
        for m in range(v):
            Pn = {x: max(PV_hi[i, x] - PV_lo[i, m] for i in range(n - 1)) for x in range(v)}
            for q in range(v):
                assert V["Tm"][q, m] >= max(EU_hi[q, x] - EU_lo[q, m] + EV_hi[m, x] - EV_lo[m, m] + Pn[x]
                                            for x in range(v) if x != m), (trial, groups, q, m)


def test_hostile_svd_rec_and_eu_group_shapes_are_refused(maxofk2):
    """Malformed hints never reach arithmetic: more than d_head deflation pairs (unbounded work), empty
    lists, x/y of different counts, a vector of the wrong length, eu_groups of the wrong length, ids out of
    [0, 32), booleans, strings or floats as ids; a pair with y.x = 0 is REJECTED (not a projection)."""
    model, _, _ = maxofk2
    d, v = model.config.d_head, model.config.d_vocab
    B = make_backend("flint")
    T = mt.value_tables(B, model, True)
    vec = ["1"] * d
    base = {"strategy": "subcubic", "variant": "svd-rec", "cases": [[1, 0, 0, 0]], "x": [vec], "y": [vec]}
    bad = [dict(base, x=[vec] * (d + 1), y=[vec] * (d + 1)), dict(base, x=[], y=[]), dict(base, y=[vec, vec]),
           dict(base, x=[vec[:-1]]), dict(base, x=vec, y=vec)]
    bad += [dict(base, eu_groups=g) for g in ([0] * (v - 1), [0] * (v + 1), [32] + [0] * (v - 1),
                                             [-1] + [0] * (v - 1), [True] + [0] * (v - 1), ["0"] + [0] * (v - 1),
                                             [0.0] + [0] * (v - 1), {"0": 0})]
    bad += [{"strategy": "cubic", "cases": [], "eu_groups": [0] * v}]
    for ev in bad:
        with pytest.raises(BadInput):
            if ev["strategy"] == "cubic":
                acc.check(model, {"task": "max-of-k", "d_vocab": v, "n_ctx": model.config.n_ctx,
                                  "inputs": v ** model.config.n_ctx, "correct_at_least": 0}, ev, B, Obligations())
            else:
                acc.subcubic_check(B, model, T, ev, Obligations())
    e1 = [str(int(i == 0)) for i in range(d)]
    e2 = [str(int(i == 1)) for i in range(d)]
    for xs, ys in (([e1], [e2]), ([vec, e1], [vec, e2])):   # y.x = 0 at the first / the last step
        with pytest.raises(Rejected, match="deflation hint"):
            acc.subcubic_check(B, model, T, dict(base, x=xs, y=ys), Obligations())


# --------------------------------------------------------------------------------------------------------
# overwhelm tight (final LN and plain): the checker's own derived bounds against the 110-bit oracle

def _spy_tight(monkeypatch, model, cert):
    """Run the tight check with spies on what it derives; returns {sigma_hi2, sigma_lo2, decide calls}."""
    seen = {"decide": []}
    orig_hi, orig_lo, orig_decide = final_ln.check_sigma_hi, final_ln.check_sigma_lo, final_ln.decide

    def hi(B, cfg, *args):
        N2 = orig_hi(B, cfg, *args)
        seen["sigma_hi2"] = N2 / cfg.d_model + cfg.eps
        return N2

    def lo(cfg, m, vv, s):
        seen["sigma_lo2"] = cfg.eps + (max(m, Fraction(0)) ** 2 / (cfg.d_model * vv) if vv > 0 else 0)
        return orig_lo(cfg, m, vv, s)

    def dec(U, e, s_lo, s_hi):
        seen["decide"].append((U, e))
        return orig_decide(U, e, s_lo, s_hi)
    monkeypatch.setattr(final_ln, "check_sigma_hi", hi)
    monkeypatch.setattr(final_ln, "check_sigma_lo", lo)
    monkeypatch.setattr(final_ln, "decide", dec)
    ow_kind.check(model, cert["claim"], cert["evidence"], make_backend("flint"), Obligations())
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("real", [True, False], ids=["final_ln", "no_final_ln"])
def test_tight_derived_bounds_hold_on_every_free_string(monkeypatch, real):
    """Attack: an adversary may lower sigma_hi to sqrt of the checker's own bound N2/d + eps, raise
    sigma_lo to its own lower bound, and lower every lambda to the smallest the Dinkelbach check accepts.
    So the derived bounds themselves must be true: over every free string (110-bit oracle)
    sigma(r)^2 <= N2/d + eps, sigma(r)^2 >= the sigma_lo bound, and for each competitor j the linear part
    (u_jk . r with the final LN; logit_j - logit_k without) <= the checker's U_j, and e_j >= its true value."""
    model = model_of(*(tiny_neox_real(3) if real else tiny_neox1l(3)))
    c = model.config
    prefix, query, spec = [1, 4, 1, 0] * 3 if real else [1] * 20, 2, ("any", 2, None)
    cert, rep = generate_tight(model, prefix, query, spec, relax=False, exact_all=True)
    assert cert is not None, rep
    seen = _spy_tight(monkeypatch, model, cert)
    k = cert["claim"]["predicted"]
    exact = sorted(e["competitor"] for e in cert["evidence"]["exact"])
    js = list(range(c.d_vocab)) + exact
    assert len(seen["decide"]) == len(js)
    orc, mp = Oracle(model), None
    mp = orc.mp
    WU, bU = orc.P["unembed.W_U"], orc.P["unembed.b_U"]
    lin_max = [None] * c.d_vocab
    s2_min = s2_max = None
    for t in free_strings(*spec, c.d_vocab):
        r = orc.residual(prefix + list(t) + [query])
        if real:
            mu = mp.fsum(r) / c.d_model
            pr = [x - mu for x in r]
            s2 = mp.fsum(x * x for x in pr) / c.d_model + mp.mpf(c.eps.numerator) / c.eps.denominator
            s2_min = s2 if s2_min is None else min(s2_min, s2)
            s2_max = s2 if s2_max is None else max(s2_max, s2)
            w = orc.P["ln_final.w"]
            lin = [mp.fsum(pr[i] * w[i] * (WU[i][j] - WU[i][k]) for i in range(c.d_model)) for j in range(c.d_vocab)]
        else:
            lg = orc.logits(prefix + list(t) + [query])
            lin = [lg[j] - lg[k] for j in range(c.d_vocab)]
        lin_max = [x if y is None else max(x, y) for x, y in zip(lin, lin_max)]
    tol = mp.mpf(2) ** -60
    for (U, e), j in zip(seen["decide"], js):
        if j == k:
            continue
        assert mp.mpf(U.numerator) / U.denominator >= lin_max[j] - tol, (j, float(U), float(lin_max[j]))
        if real:
            true_e = mp.fsum(orc.P["ln_final.b"][i] * (WU[i][j] - WU[i][k]) for i in range(c.d_model)) + bU[j] - bU[k]
            assert mp.mpf(e.numerator) / e.denominator >= true_e - tol
        else:
            assert e == 0
    if real:
        hi2, lo2 = seen["sigma_hi2"], seen["sigma_lo2"]
        assert mp.mpf(hi2.numerator) / hi2.denominator >= s2_max * (1 - tol)
        assert mp.mpf(lo2.numerator) / lo2.denominator <= s2_min * (1 + tol)
        assert lo2 > c.eps, "the variance direction should give more than sqrt(eps) (else the test is weak)"
    else:
        assert "sigma_hi2" not in seen


def test_final_ln_with_sigma_at_the_derived_edges_is_true(monkeypatch):
    """The certificate with sigma_hi / sigma_lo moved to the checker's own limits (the most an attacker
    can claim) still verifies only if the claim is true: here it verifies, and the oracle confirms it."""
    from overwhelm_helpers import exhaustive_confirms
    from checker.exact import format_number
    model = model_of(*tiny_neox_real(3))
    prefix, query, spec = [1, 4, 1, 0] * 3, 2, ("any", 2, None)
    cert, rep = generate_tight(model, prefix, query, spec, relax=False, exact_all=True)
    seen = _spy_tight(monkeypatch, model, cert)

    def sqrt_bound(q: Fraction, up: bool) -> Fraction:
        """A rational >= sqrt(q) (up) or <= sqrt(q), within 2^-60 relative."""
        s = Fraction(int(float(q) ** 0.5 * 2 ** 60), 2 ** 60) or Fraction(1, 2 ** 60)
        while (s * s < q) if up else (s * s > q):
            s = s * (1 + Fraction(1, 2 ** 58)) if up else s * (1 - Fraction(1, 2 ** 58))
        return s
    edge = copy.deepcopy(cert)
    edge["evidence"]["final_ln"]["sigma_hi"] = format_number(sqrt_bound(seen["sigma_hi2"], True))
    edge["evidence"]["final_ln"]["sigma_lo"] = format_number(sqrt_bound(seen["sigma_lo2"], False))
    ow_kind.check(model, edge["claim"], edge["evidence"], make_backend("flint"), Obligations())
    ok, gap = exhaustive_confirms(model, prefix, query, *spec, edge["claim"]["predicted"])
    assert ok and gap > 0
    too_far = copy.deepcopy(edge)   # one step past the limit: REJECTED
    too_far["evidence"]["final_ln"]["sigma_hi"] = format_number(sqrt_bound(seen["sigma_hi2"], True) * (1 - Fraction(1, 2 ** 40)))
    with pytest.raises(Rejected, match="sigma_hi"):
        ow_kind.check(model, too_far["claim"], too_far["evidence"], make_backend("flint"), Obligations())


# --------------------------------------------------------------------------------------------------------
# overwhelm upto:N shared tables: every length's W against the float spread of every logit

@pytest.mark.parametrize("nope", [False, True], ids=["rotary", "nope"])
@pytest.mark.parametrize("mode", ["table", "norm"])
def test_upto_shared_deviation_bounds_every_logit_spread_at_every_length(nope, mode):
    """Attack surface of UptoTables: the free-score table's columns (offset N - i, length L takes the last
    L), prefix offsets up to n_fix + N, per-length value means and the norm identity. For every length
    L <= N, W(L) from the shared tables must bound how far every logit moves over all free strings of
    length L (float64 enumeration, tolerance 1e-9)."""
    tensors, cfg = tiny_neox1l(5, n_heads=3, qk_scale=2.0, n_ctx=16, rotary_dim=2)
    if nope:
        cfg = dict(cfg, positional_embedding_type="none")
        cfg.pop("rotary_dim")
    model = model_of(tensors, cfg)
    v, N = model.config.d_vocab, 4
    prefix, query = [3, 0, 3, 5, 1], 4
    B = make_backend("flint")
    shared = owb.UptoTables(B, model, prefix, query, N, mode, list(range(v)), Weights(B, model))
    for L in range(1, N + 1):
        heads = shared.heads(L)
        alphas = ow_kind.alpha_bounds(B, heads, "naive", None, None)
        beta = [owb.betas(B, hd, *a) for hd, a in zip(heads, alphas)]
        W, _ = owb.deviation(B, model, heads, beta)
        toks = np.array([prefix + list(t) + [query] for t in itertools.product(range(v), repeat=L)])
        lg = float_logits(model, toks)
        spread = float((lg.max(axis=0) - lg.min(axis=0)).max())
        assert spread <= float(W) + 1e-9, (L, mode, nope, spread, float(W))
        assert spread > 0


def _float_free_scores(model, prefix, query, L):
    """[head, free column c, token t] float64 score (R_P q) . (R_p k_t) / sqrt(d_head) of token t at free
    position p = n_fix + c with the query at P = n_fix + L (own numpy code: shared ln1, rotary by absolute
    positions with the (j, j + half) pairing, or no rotation for positional_embedding_type none)."""
    c, T = model.config, {n: np.asarray(a, dtype=np.float64) for n, a in model.tensors.items()}

    def ln(x):
        z = x - x.mean(axis=-1, keepdims=True)
        return z / np.sqrt((z * z).mean(axis=-1, keepdims=True) + float(c.eps)) * T["blocks.0.ln1.w"] + T["blocks.0.ln1.b"]

    def rot(x, pos):
        if not c.rotary:
            return x
        half, out = c.rotary_dim // 2, x.copy()
        for j in range(half):
            a = pos * float(c.rotary_base) ** (-2 * j / c.rotary_dim)
            out[..., j] = x[..., j] * np.cos(a) - x[..., j + half] * np.sin(a)
            out[..., j + half] = x[..., j + half] * np.cos(a) + x[..., j] * np.sin(a)
        return out
    X, n_fix = ln(T["embed.W_E"]), len(prefix)
    out = np.empty((c.n_heads, L, c.d_vocab))
    for h in range(c.n_heads):
        q = rot(X[query] @ T["blocks.0.attn.W_Q"][h] + T["blocks.0.attn.b_Q"][h], n_fix + L)
        K = X @ T["blocks.0.attn.W_K"][h] + T["blocks.0.attn.b_K"][h]
        for col in range(L):
            out[h, col] = rot(K, n_fix + col) @ q / np.sqrt(c.d_head)
    return out


@pytest.mark.parametrize("nope", [False, True], ids=["rotary", "nope"])
def test_upto_shared_score_columns_are_the_free_positions_of_each_length(nope):
    """The shared score table's column for free position c of length L must hold the extreme scores at
    that position (offset L - c), for every L <= N: compared with an own float64 rotary computation (the
    bounds are tight enclosures of min_t / max_t, so a column taken for the wrong offset shows)."""
    tensors, cfg = tiny_neox1l(6, n_heads=2, qk_scale=2.0, n_ctx=16)
    if nope:
        cfg = dict(cfg, positional_embedding_type="none")
        cfg.pop("rotary_dim")
    model = model_of(tensors, cfg)
    prefix, query, N = [2, 2, 5], 1, 5
    B = make_backend("flint")
    shared = owb.UptoTables(B, model, prefix, query, N, "table", list(range(model.config.d_vocab)), Weights(B, model))
    for L in range(1, N + 1):
        ref = _float_free_scores(model, prefix, query, L)
        for h, hd in enumerate(shared.heads(L)):
            assert len(hd.score_lo) == len(hd.score_hi) == L
            for col in range(L):
                lo, hi = ref[h, col].min(), ref[h, col].max()
                assert abs(float(hd.score_lo[col]) - lo) < 1e-9 and abs(float(hd.score_hi[col]) - hi) < 1e-9, (L, h, col)


def test_exp_bound_stays_small_and_sound_for_hostile_arguments():
    """Finding 4: a nearly orthogonal hint pair (y.x tiny) makes score bounds huge, and exp_bound(x) then
    built exp(x) as an exact rational: x = 2^30 is a 1.5e9-bit integer (0.2 s with flint, 16 s with
    mpmath), x = 2^34 some 3 GB, larger ones OverflowError (internal error). Beyond |x| >= L = 2^12 it
    now returns 2^-L / 0 / 2^L (valid as e > 2) or refuses an upper bound; inside, Arb's value."""
    L = acc.EXP_ARG_LIMIT
    for backend in ("flint", "mpmath"):
        B = make_backend(backend)
        for x in (Fraction(-(2 ** 3000)), Fraction(-(2 ** 34)), Fraction(-L)):
            assert acc.exp_bound(B, x, True) == Fraction(1, 2 ** L) and acc.exp_bound(B, x, False) == 0
        for x in (Fraction(2 ** 3000), Fraction(2 ** 34), Fraction(L)):
            assert acc.exp_bound(B, x, False) == 2 ** L
            with pytest.raises(Rejected, match="exp range"):
                acc.exp_bound(B, x, True)
        ref = make_backend("flint", 200)
        for x in (Fraction(L - 1), Fraction(-(L - 1)), Fraction(1, 3)):
            lo, hi = acc.exp_bound(B, x, False), acc.exp_bound(B, x, True)
            assert lo <= ref.lower(ref.exp(ref.num(x))) and ref.upper(ref.exp(ref.num(x))) <= hi
        # the clamped values are the right side of exp at the limit: e^-L < 2^-L and e^L > 2^L
        assert ref.upper(ref.exp(ref.num(-L))) < Fraction(1, 2 ** L) and ref.lower(ref.exp(ref.num(L))) > 2 ** L


def test_nearly_orthogonal_svd_hint_is_answered_quickly(maxofk2):
    """End to end: svd and svd-rec certificates whose hint pair has y.x = 2^-200 are decided (REJECTED
    or counted) without building astronomically large rationals (was: OverflowError, exit 3)."""
    model, _, _ = maxofk2
    d, v = model.config.d_head, model.config.d_vocab
    B = make_backend("flint")
    T = mt.value_tables(B, model, True)
    e1 = [str(int(i == 0)) for i in range(d)]
    y = ["1/" + str(2 ** 200) if i == 0 else str(int(i == 1)) for i in range(d)]
    for variant, xs, ys in (("svd", e1, y), ("svd-rec", [e1], [y])):
        for case in ([v - 1, 0, 1, 0], [v - 1, 1, 0, 0]):
            ev = {"strategy": "subcubic", "variant": variant, "cases": [case], "x": xs, "y": ys}
            try:
                acc.subcubic_check(B, model, T, ev, Obligations())
            except Rejected:
                pass


# --------------------------------------------------------------------------------------------------------
# positional_embedding_type "none" through the other kinds

def _nope_maxofk(tmp_path):
    t, cfg = _maxofk_model(4, 3, 0, 0.05, 15.0)
    t.pop("pos_embed.W_pos")
    cfg["positional_embedding_type"] = "none"
    path = str(tmp_path / "acc_nope.safetensors")
    save_model(path, t, cfg)
    return path


def _write(tmp_path, name, kind, model_path, claim, evidence):
    cert = {"format": "tcert-certificate", "version": 1, "kind": kind,
            "model_sha256": hashlib.sha256(open(model_path, "rb").read()).hexdigest(),
            "claim": claim, "evidence": evidence}
    path = str(tmp_path / name)
    with open(path, "w") as f:
        json.dump(cert, f)
    return path


def test_accuracy_refuses_a_position_free_model_cleanly(tmp_path):
    """Finding 3 (was: INTERNAL ERROR KeyError 'pos_embed.W_pos', exit 3): the accuracy kind's argument
    is for learned positions; a NoPE model is refused as bad input (exit 2)."""
    model_path = _nope_maxofk(tmp_path)
    cert = _write(tmp_path, "acc.json", "accuracy", model_path,
                  {"task": "max-of-k", "d_vocab": 4, "n_ctx": 3, "inputs": 64, "correct_at_least": 1},
                  {"strategy": "brute"})
    assert check_main([cert, "--model", model_path]) == 2


def test_influence_on_a_position_free_model_equals_zero_learned_positions(tmp_path):
    """Finding 3 (was: INTERNAL ERROR KeyError 'pos_embed.W_pos', exit 3): influence on a NoPE model. Its
    forward pass is exactly that of the same model with learned positions W_pos = 0, so every constant the
    checker derives must equal that twin's (and embed.pos_norm is not asked for); the certificate built
    from those constants verifies through the CLI, and one constant claimed below its bound is REJECTED."""
    from checker.kinds import influence as infl
    tensors, cfg = tiny_neox1l(0, n_ctx=8)
    cfg.pop("rotary_dim")
    nope_path, zero_path = str(tmp_path / "nope.safetensors"), str(tmp_path / "zero.safetensors")
    save_model(nope_path, tensors, dict(cfg, positional_embedding_type="none"))
    save_model(zero_path, dict(tensors, **{"pos_embed.W_pos": np.zeros((8, cfg["d_model"]), np.float32)}),
               dict(cfg, positional_embedding_type="standard"))

    class Recorder(infl.Ledger):
        """Claims every constant exactly at its recomputed bound."""
        def const(self, name, bound):
            self.claimed[name] = bound()
            return self.claimed[name]
    derived = {}
    for name, path in (("nope", nope_path), ("zero", zero_path)):
        ld = Recorder({}, Obligations())
        zero = [Fraction(0)] * cfg["d_model"]
        need = infl.derive(load_model(path), make_backend("flint"), ld, 8, 2, zero, zero, Obligations())
        derived[name] = (ld.claimed, need)
    (c_nope, need_nope), (c_zero, need_zero) = derived["nope"], derived["zero"]
    assert c_zero.pop("embed.pos_norm") == 0 and "embed.pos_norm" not in c_nope
    assert c_nope == c_zero and need_nope == need_zero
    from checker.exact import format_number
    claim = {"n_min": 2, "n_max": 8, "rate": "harmonic",
             **{k: format_number(need_nope[k]) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}}
    evidence = {"power": 2, "embed_center": ["0"] * cfg["d_model"], "unembed_center": ["0"] * cfg["d_model"],
                "constants": {k: format_number(v) for k, v in c_nope.items()}}
    cert = _write(tmp_path, "infl.json", "influence", nope_path, claim, evidence)
    assert check_main([cert, "--model", nope_path]) == 0
    evidence["constants"]["D0"] = format_number(c_nope["D0"] / 2)
    cert = _write(tmp_path, "infl_low.json", "influence", nope_path, claim, evidence)
    assert check_main([cert, "--model", nope_path]) == 1
