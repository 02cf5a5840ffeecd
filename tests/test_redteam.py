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


# --------------------------------------------------------------------------------------------------------
# accuracy: every case an attacker may list (not only the generator's) must cover only correct inputs,
# and the count the checker credits for a case must equal the number of inputs it covers.

import itertools
import math

import numpy as np

from checker.errors import Rejected
from checker.forward import last_logits
from checker.kinds import accuracy as acc
from checker.maxofk_tables import value_tables
from checker.modelfile import load_model
from checker.verify import Obligations
from generator.modelio import save_model


def _maxofk_model(v: int, k: int, seed: int, noise: float, sharp: float):
    """A hand-built Max-of-k model (attention to the largest key token, values copied to the logits)
    plus Gaussian noise on every tensor, so that some inputs are answered wrongly."""
    rng = np.random.default_rng(seed)
    d = 2 * v + 2
    E = np.zeros((v, d))
    E[np.arange(v), np.arange(v)] = 1
    E[:, v] = np.arange(v) / (v - 1)
    P = np.zeros((k, d))
    P[:, v + 1] = 1
    WQ, WK, WO, WU = np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, v))
    WQ[v + 1, 0], WK[v, 0] = sharp, 1
    WO[np.arange(v), v + 2 + np.arange(v)] = 1
    WU[v + 2 + np.arange(v), np.arange(v)] = 3
    t = {"embed.W_E": E, "pos_embed.W_pos": P, "blocks.0.attn.W_Q": WQ[None], "blocks.0.attn.W_K": WK[None],
         "blocks.0.attn.W_V": np.eye(d)[None], "blocks.0.attn.W_O": WO[None], "unembed.W_U": WU,
         "blocks.0.attn.b_Q": np.zeros((1, d)), "blocks.0.attn.b_K": np.zeros((1, d)),
         "blocks.0.attn.b_V": np.zeros((1, d)), "blocks.0.attn.b_O": np.zeros(d), "unembed.b_U": np.zeros(v)}
    t = {n: (a + noise * rng.standard_normal(a.shape)).astype(np.float32) for n, a in t.items()}
    config = dict(n_layers=1, d_model=d, n_heads=1, d_head=d, d_vocab=v, n_ctx=k, attn_only=True,
                  normalization_type=None)
    return t, config


def _float_gaps(model):
    """Float64 last-position gap logit[max] - max_{x != max} logit[x] for every input (own numpy forward)."""
    c, t = model.config, {n: np.asarray(a, dtype=np.float64) for n, a in model.tensors.items()}
    toks = np.array(list(itertools.product(range(c.d_vocab), repeat=c.n_ctx)))
    x = t["embed.W_E"][toks] + t["pos_embed.W_pos"][None]
    q = x[:, -1] @ t["blocks.0.attn.W_Q"][0] + t["blocks.0.attn.b_Q"][0]
    key = x @ t["blocks.0.attn.W_K"][0] + t["blocks.0.attn.b_K"][0]
    s = np.einsum("bd,bnd->bn", q, key) / np.sqrt(c.d_head)
    a = np.exp(s - s.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    val = x @ t["blocks.0.attn.W_V"][0] + t["blocks.0.attn.b_V"][0]
    z = np.einsum("bn,bnd->bd", a, val) @ t["blocks.0.attn.W_O"][0] + t["blocks.0.attn.b_O"]
    lg = (x[:, -1] + z) @ t["unembed.W_U"] + t["unembed.b_U"]
    mx = toks.max(axis=1)
    right = lg[np.arange(len(toks)), mx].copy()
    lg[np.arange(len(toks)), mx] = -np.inf
    return toks, right - lg.max(axis=1)


def _certainly_wrong(model, toks, gaps) -> set:
    """Inputs whose max token is certainly not strictly ahead: float gap < -1e-6, or near a tie and the
    rigorous forward pass shows logit[max] <= logit[x] for some x."""
    wrong = {tuple(int(v) for v in tk) for tk, g in zip(toks, gaps) if g < -1e-6}
    B = make_backend("flint")
    for tk, g in zip(toks, gaps):
        if abs(g) <= 1e-6:
            L, m = last_logits(B, model, [int(v) for v in tk]), int(max(tk))
            if any(B.upper(L[m] - L[x]) <= 0 for x in range(len(L)) if x != m):
                wrong.add(tuple(int(v) for v in tk))
    return wrong


def _case_of(tk):
    """(m, q, c, non-max tokens at non-query positions) of one input."""
    m, q = max(tk), tk[-1]
    others = [t for t in tk[:-1] if t != m]
    return m, q, len(others), set(others)


MAXOFK_MODELS = [(5, 3, 1, 0.05, 15.0), (6, 2, 2, 0.1, 8.0), (4, 4, 3, 0.05, 30.0), (6, 3, 4, 0.1, 40.0),
                 (5, 3, 6, 0.08, 15.0)]


@pytest.fixture(scope="module", params=MAXOFK_MODELS, ids=lambda p: "v{}k{}s{}".format(*p[:3]))
def maxofk(request, tmp_path_factory):
    return maxofk_instance(tmp_path_factory, *request.param)


def maxofk_instance(tmp_path_factory, v, k, seed, noise, sharp):
    """(model, every input, the inputs it certainly answers wrongly) of one _maxofk_model."""
    path = str(tmp_path_factory.mktemp("redteam_acc") / "m.safetensors")
    save_model(path, *_maxofk_model(v, k, seed, noise, sharp))
    model = load_model(path)
    toks, gaps = _float_gaps(model)
    return model, [tuple(int(v) for v in tk) for tk in toks], _certainly_wrong(model, toks, gaps)


def test_brute_force_never_counts_a_wrong_input(maxofk):
    """The brute-force strategy's count is at most the number of inputs not certainly wrong."""
    model, inputs, wrong = maxofk
    assert wrong, "the model should answer some inputs wrongly (otherwise the test is vacuous)"
    assert acc.brute_count(value_tables(make_backend("flint"), model)) <= len(inputs) - len(wrong)


def _all_cases(n, v):
    for m in range(v):
        for q in range(m + 1):
            for c in range(0, (n - 1 if q == m else n - 2) + 1):
                yield m, q, c


def test_every_accepted_cubic_case_covers_only_correct_inputs(maxofk):
    """Attack: list EVERY (m, q, c) case with the largest token set the checker accepts (masks an honest
    generator might never emit, e.g. mixing several non-max tokens). Each input such a case covers must
    be correct, and cubic_check's credited count must equal the number of inputs covered."""
    model, inputs, wrong = maxofk
    n, v = model.config.n_ctx, model.config.d_vocab
    T = value_tables(make_backend("flint"), model)
    cases = {}
    for m, q, c in _all_cases(n, v):
        vals, sums = acc.cubic_values(T, m), acc.position_sums(T, q)
        ks = list(range(m)) if c else []
        if c and not ks:
            continue   # m = 0 has no non-max token (the checker refuses such a mask)
        ok = acc.cubic_case_ok(T, vals, sums, m, q, c, ks)
        good = [k for k, g in zip(ks, np.atleast_1d(ok)) if g] if c else ([] if not ok else None)
        if c == 0 and ok:
            cases[(m, q, 0)] = []
        elif c and good:
            cases[(m, q, c)] = good
    covered = [tk for tk in inputs if (lambda m, q, c, ks: (m, q, c) in cases and ks <= set(cases[(m, q, c)]))(
        *_case_of(tk))]
    assert not set(covered) & wrong, sorted(set(covered) & wrong)[:5]
    assert acc.cubic_check(T, cases, Obligations()) == len(covered)
    assert len(covered) > 0


def test_every_accepted_subcubic_case_covers_only_correct_inputs(maxofk):
    """Attack: for every (m, q, c) try every cutoff j, for both subcubic variants, with the checker's own
    per-case rule (subcubic_check on a one-case certificate). Whatever it accepts must cover only correct
    inputs, and the credited count must equal the number of covered inputs."""
    model, inputs, wrong = maxofk
    n, v = model.config.n_ctx, model.config.d_vocab
    B = make_backend("flint")
    T = value_tables(B, model, True)
    EQKE = np.array([[float(B.upper(x)) for x in row] for row in T["intervals"]["EQKE"].rows()])
    Qm = np.array([[float(B.upper(x)) for x in row] for row in T["intervals"]["Q"].rows()])
    Km = np.array([[float(B.upper(x)) for x in row] for row in T["intervals"]["K"].rows()])
    u, _, vt = np.linalg.svd(Qm.T @ Qm @ Km.T @ Km)   # some plausible rank-1 hint; any hint must be safe
    hints = {"svd": ([float(x).hex() for x in vt[0]], [float(x).hex() for x in u[:, 0]]), "exact-eqke": None}
    if hasattr(acc, "rank2_scores"):   # the rank-2 variant, where this checker build has it
        hints["svd2"] = ([[float(x).hex() for x in vt[r]] for r in range(2)],
                         [[float(x).hex() for x in u[:, r]] for r in range(2)])
    credited_any = 0
    for variant, hint in hints.items():
        for m, q, c in _all_cases(n, v):
            for j in (range(m) if c else [0]):
                ev = {"strategy": "subcubic", "variant": variant, "cases": [[m, q, c, j]]}
                if hint:
                    ev["x"], ev["y"] = hint
                try:
                    count, _ = acc.subcubic_check(B, model, T, ev, Obligations())
                except Rejected:
                    continue
                covered = [tk for tk in inputs if _case_of(tk)[:3] == (m, q, c) and
                           all(t <= j for t in _case_of(tk)[3])]
                assert not set(covered) & wrong, (variant, m, q, c, j)
                assert count == len(covered), (variant, m, q, c, j, count, len(covered))
                credited_any += count
    assert credited_any > 0 and EQKE.shape == (v, v)


# --------------------------------------------------------------------------------------------------------
# overwhelm: the certified deviation W must bound how far every logit actually moves over the designed set
# (tested directly, so an unsound W is caught even where the final verdict would still happen to be right).

from checker import overwhelm_bounds as owb
from checker.kinds import overwhelm as ow_kind
from generator.forward import logits as float_logits
from overwhelm_helpers import tiny_neox1l


def _ow_model(tmp_path, seed, **kw):
    path = str(tmp_path / f"ow{seed}.safetensors")
    save_model(path, *tiny_neox1l(seed, **kw))
    return load_model(path)


def _certified_w(B, model, prefix, query, kind, n_free, multiset, mode, method):
    """The checker's own deviation bound W for the claim (duals: the trivial ones that add nothing)."""
    allowed = list(range(model.config.d_vocab)) if multiset is None else sorted(set(multiset))
    heads = owb.prepare(B, model, prefix, query, allowed, n_free, mode, set(multiset or ()))
    duals = None
    if method == "lp":
        duals = []
        for hd in heads:   # a feasible dual from the cost bounds: u = 0, v_c = min / max over rows
            lo, hi = owb.lp_costs(B, hd, multiset)
            duals.append({("min", "u"): [Fraction(0)] * n_free, ("max", "u"): [Fraction(0)] * n_free,
                          ("min", "v"): [min(r[c] for r in lo) for c in range(n_free)],
                          ("max", "v"): [max(r[c] for r in hi) for c in range(n_free)]})
    alphas = ow_kind.alpha_bounds(B, heads, method, duals, multiset)
    beta = [owb.betas(B, hd, *a) for hd, a in zip(heads, alphas)]
    return owb.deviation(B, model, heads, beta)


@pytest.mark.parametrize("seed", range(6))
def test_overwhelm_deviation_bounds_every_logit_spread(tmp_path, seed):
    """Attack surface: sign cases of the beta/value product, heads summed (not maxed), rotary offsets of
    prefix and free columns, the LP bound. For every free string of the set, each logit must stay within
    the certified W of its value on any other string (float64 enumeration, tolerance 1e-9)."""
    rng = random.Random(seed)
    model = _ow_model(tmp_path, seed, n_heads=3, qk_scale=1.0 + seed % 3, adjacent=bool(seed % 2),
                      rotary_dim=2 if seed % 3 == 2 else None, n_ctx=12)
    v = model.config.d_vocab
    B = make_backend("flint")
    prefix = [rng.randrange(v) for _ in range(rng.randint(0, 4))]
    query = rng.randrange(v)
    cases = [("any", 3, None, "table", "naive"), ("any", 2, None, "norm", "naive")]
    ms = [rng.randrange(v) for _ in range(4)]
    cases += [("perm", 4, ms, "table", "naive"), ("perm", 4, ms, "table", "lp")]
    for kind, n_free, multiset, mode, method in cases:
        W, per_head = _certified_w(B, model, prefix, query, kind, n_free, multiset, mode, method)
        frees = (itertools.product(range(v), repeat=n_free) if multiset is None
                 else set(itertools.permutations(multiset)))
        toks = np.array([prefix + list(t) + [query] for t in frees])
        lg = float_logits(model, toks)
        spread = float((lg.max(axis=0) - lg.min(axis=0)).max())
        assert spread <= float(W) + 1e-9, (kind, mode, method, spread, float(W))
        # heads ADD: the bound is at least the largest single-head spread (a max over heads could be smaller)
        assert float(W) >= max(float(x) for x in per_head)


# --------------------------------------------------------------------------------------------------------
# influence: the analytic constants the checker does not recompute from weights (they are proved in
# docs/influence.md); probe each at its worst case.

import mpmath

from checker.kinds import influence as infl


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
    lip = infl.act_lipschitz(B, act)
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


# --------------------------------------------------------------------------------------------------------
# kernel pieces an attacker's numbers flow through

def test_lp_bound_is_weak_duality_for_any_dual():
    """Attack: duals chosen to make the assignment bound tighter than the truth. Whatever (u, v) the
    checker accepts, sum u + sum v must be <= the minimum (>= the maximum) over all permutations of the
    cost matrix, by brute force; feasible duals near the optimum must be accepted."""
    rng = random.Random(11)
    accepted = 0
    for trial in range(300):
        n = rng.randint(1, 5)
        costs = [[Fraction(rng.randint(0, 40), rng.randint(1, 8)) for _ in range(n)] for _ in range(n)]
        perms = [sum(costs[i][p[i]] for i in range(n)) for p in itertools.permutations(range(n))]
        for sense in ("min", "max"):
            pick = min if sense == "min" else max
            u = [pick(row) + Fraction(rng.randint(-3, 3), 4) for row in costs]
            v = [pick(costs[i][c] - u[i] for i in range(n)) + Fraction(rng.randint(-1, 1), 8)
                 for c in range(n)]
            try:
                bound = owb.lp_bound(u, v, costs, sense, "redteam")
            except Rejected:
                continue
            accepted += 1
            assert (bound <= min(perms)) if sense == "min" else (bound >= max(perms)), (costs, u, v)
    assert accepted > 100


def test_betas_bound_the_free_share_at_every_corner():
    """beta_min <= a / (f + a) <= beta_max for every fixed mass f in the enclosure of alpha_fix and every
    free mass a in [amin, amax] (the share increases with a and decreases with f: corners suffice)."""
    B = make_backend("flint")
    rng = random.Random(5)

    class HD:
        pass
    for _ in range(200):
        f_lo = Fraction(rng.randint(1, 50), rng.randint(1, 9))
        f_hi = f_lo + Fraction(rng.randint(0, 9), 7)
        hd = HD()
        hd.alpha_fix = B.interval(f_lo, f_hi)
        amin = Fraction(rng.randint(0, 30), rng.randint(1, 9))
        amax = amin + Fraction(rng.randint(0, 30), 3)
        bmin, bmax = owb.betas(B, hd, amin, amax)
        for f in (f_lo, f_hi):
            for a in (amin, amax):
                assert bmin <= a / (f + a) <= bmax


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


def test_exact_logit_ties_are_never_counted_correct(tmp_path):
    """Attack: ties. With two identical unembedding columns (and biases) for tokens v-1 and v-2, their
    logits are equal on every input, so every input whose max is v-1 or v-2 is wrong. No strategy may
    credit any of them: brute force counts at most (v-2)^K, and no cubic/subcubic case with m >= v-2
    is accepted."""
    v, k = 5, 3
    t, config = _maxofk_model(v, k, 9, 0.05, 15.0)
    t["unembed.W_U"][:, v - 1] = t["unembed.W_U"][:, v - 2]
    t["unembed.b_U"][v - 1] = t["unembed.b_U"][v - 2]
    path = str(tmp_path / "tie.safetensors")
    save_model(path, t, config)
    model = load_model(path)
    B = make_backend("flint")
    T = value_tables(B, model, True)
    assert acc.brute_count(T) <= (v - 2) ** k
    for m, q, c in _all_cases(k, v):
        if m < v - 2:
            continue
        ks = list(range(m)) if c else []
        ok = acc.cubic_case_ok(T, acc.cubic_values(T, m), acc.position_sums(T, q), m, q, c, ks)
        assert not np.any(ok), (m, q, c)
        for j in (range(m) if c else [0]):
            with pytest.raises(Rejected):
                acc.subcubic_check(B, model, T, {"strategy": "subcubic", "variant": "exact-eqke",
                                                 "cases": [[m, q, c, j]]}, Obligations())


# --------------------------------------------------------------------------------------------------------
# the lowest precision the CLI accepts (--prec 30) must still give enclosures on every architecture

from test_prediction import ARCHS, build as build_arch


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
            enc = last_logits(B, model, tokens)
            tol = 1e-11 * (1 + float(np.abs(f).max()))
            for j, x in enumerate(enc):
                assert float(B.lower(x)) - tol <= f[j] <= float(B.upper(x)) + tol, (name, j)


# --------------------------------------------------------------------------------------------------------
# subcubic building blocks against exact rational arithmetic

from checker import maxofk_tables as mt


def test_value_bounds_dominate_their_definitions():
    """Every subcubic value table is an upper bound of the maximum it stands for (docstring of
    value_bounds), checked by brute force on random integer bound tables (lo <= hi)."""
    rng = np.random.default_rng(0)
    for trial in range(20):
        v, n = int(rng.integers(2, 6)), int(rng.integers(2, 5))

        def pair(shape):
            lo = rng.integers(-50, 50, size=shape)
            return lo.astype(object), (lo + rng.integers(0, 6, size=shape)).astype(object)
        T = {"n": n, "v": v}
        T["EU_lo"], T["EU_hi"] = pair((v, v))
        T["EV_lo"], T["EV_hi"] = pair((v, v))
        T["PV_lo"], T["PV_hi"] = pair((n, v))
        V = mt.value_bounds(T)
        EU_lo, EU_hi, EV_lo, EV_hi, PV_lo, PV_hi = (T[k] for k in ("EU_lo", "EU_hi", "EV_lo", "EV_hi",
                                                                     "PV_lo", "PV_hi"))
        for m in range(v):
            xs = [x for x in range(v) if x != m]
            Pn = {x: max(PV_hi[i, x] - PV_lo[i, m] for i in range(n - 1)) for x in range(v)}
            for q in range(v):
                assert V["Tm"][q, m] >= max(EU_hi[q, x] - EU_lo[q, m] + EV_hi[m, x] - EV_lo[m, m] + Pn[x]
                                            for x in xs)
                F_hi, F_lo = EU_hi[q] + EV_hi[q] + PV_hi[n - 1], EU_lo[q] + EV_lo[q] + PV_lo[n - 1]
                assert V["Tq"][q, m] >= max(F_hi[x] - F_lo[m] for x in xs)
                assert V["EUp"][q, m] >= max(EU_hi[q, x] - EU_lo[q, m] for x in xs)
            for j in range(v):
                assert V["Rpre"][m, j] >= max(max(EV_hi[k, x] - EV_lo[k, m] for x in xs)
                                              for k in range(j + 1)) + max(Pn[x] for x in xs)


@pytest.mark.parametrize("variant", ["svd", "svd2", "exact-eqke"])
def test_score_split_bounds_exact_eqke_differences(tmp_path, variant):
    """What the subcubic rule uses from the score tables: for all q, k, k',
    (ab_lo[q,k] - ab_hi[q,k'] - eps[q]) 2^-shift <= EQKE[q,k] - EQKE[q,k'] <= (ab_hi[q,k] - ab_lo[q,k']
    + eps[q]) 2^-shift, with EQKE computed in exact rationals (attn_scale 2 makes it rational) and
    arbitrary (even poor) hint vectors."""
    if variant == "svd2" and not hasattr(mt, "rank2_scores"):
        pytest.skip("this checker build has no rank-2 variant")
    model, T, EQKE = rational_eqke(tmp_path)
    B, d = make_backend("flint"), model.config.d_head
    rng = random.Random(variant)
    hint = lambda: [Fraction(rng.randint(-9, 9), 4) for _ in range(d)]
    if variant == "svd":
        S = mt.rank1_scores(B, T, hint(), hint())
    elif variant == "svd2":
        S = mt.rank2_scores(B, T, [hint(), hint()], [hint(), hint()])
    else:
        S = mt.exact_scores(T)
    assert_split_brackets(S, EQKE)


def rational_eqke(tmp_path):
    """(model, flint value tables, EQKE in exact rationals up to a per-query constant) of a noisy Max-of-3
    model with attn_scale 2 (so EQKE is rational)."""
    v, k = 5, 3
    t, config = _maxofk_model(v, k, 21, 0.2, 10.0)
    config["attn_scale"] = "2"
    path = str(tmp_path / "m.safetensors")
    save_model(path, t, config)
    model = load_model(path)
    T = value_tables(make_backend("flint"), model, True)
    fr = {name: [[Fraction(float(x)) for x in np.atleast_1d(row)] for row in np.atleast_2d(a)]
          for name, a in model.tensors.items() if a.ndim <= 2}
    Wq = [[Fraction(float(x)) for x in row] for row in model.tensors["blocks.0.attn.W_Q"][0]]
    Wk = [[Fraction(float(x)) for x in row] for row in model.tensors["blocks.0.attn.W_K"][0]]
    bq = [Fraction(float(x)) for x in model.tensors["blocks.0.attn.b_Q"][0]]
    E, P = fr["embed.W_E"], fr["pos_embed.W_pos"]
    d = len(E[0])
    X = [[E[a][i] + P[k - 1][i] for i in range(d)] for a in range(v)]
    Q = [[sum(X[a][i] * Wq[i][h] for i in range(d)) + bq[h] for h in range(d)] for a in range(v)]
    K = [[sum(E[a][i] * Wk[i][h] for i in range(d)) for h in range(d)] for a in range(v)]
    return model, T, [[sum(Q[a][h] * K[b][h] for h in range(d)) / 2 for b in range(v)] for a in range(v)]


def assert_split_brackets(S, EQKE, name=""):
    """(ab_lo[q,k] - ab_hi[q,k'] - eps[q]) 2^-shift <= EQKE[q,k] - EQKE[q,k'] <= (ab_hi[q,k] - ab_lo[q,k']
    + eps[q]) 2^-shift for all q, k, k'."""
    one, v = Fraction(1, 1 << S["shift"]), len(EQKE)
    for q in range(v):
        for a in range(v):
            for b in range(v):
                diff = EQKE[q][a] - EQKE[q][b]
                assert (S["ab_lo"][q, a] - S["ab_hi"][q, b] - S["eps"][q]) * one <= diff, name
                assert diff <= (S["ab_hi"][q, a] - S["ab_lo"][q, b] + S["eps"][q]) * one, name
