"""Attacks on the overwhelm checker that must fail, and the repaired holes (red-team reviews; docs/soundness-review.md).

Each test names the attack it documents and fails if the hole it guards reappears."""

from fractions import Fraction
from tcert.checker.assignment import assignment_bound
from tcert.checker.errors import Rejected
from tcert.checker.forward import Weights
from tcert.checker.interval import make_backend
from tcert.checker.kinds import overwhelm as ow_kind
from tcert.checker.kinds.overwhelm import final_ln as final_ln
from tcert.checker.kinds.overwhelm.naive_lp import certified_deviation, lp_costs
from tcert.checker.kinds.overwhelm.tables import beta_bounds, head_tables
from tcert.checker.kinds.overwhelm.upto import UptoTables
from tcert.checker.modelfile import load_model
from tcert.generator.certificate import format_number
from tcert.checker.obligations import Obligations
from tcert.generator.model.files import save_model
from tcert.generator.model.forward import logits as float_logits
from tcert.generator.overwhelm.tight import generate_tight
from tcert.testing.overwhelm import Oracle, exhaustive_confirms, model_of, tiny_neox1l
from tcert.testing.overwhelm import free_strings, tiny_neox_real
import copy
import itertools
import numpy as np
import pytest
import random


def _ow_model(tmp_path, seed, **kw):
    path = str(tmp_path / f"ow{seed}.safetensors")
    save_model(path, *tiny_neox1l(seed, **kw))
    return load_model(path)


def _certified_w(B, model, prefix, query, kind, n_free, multiset, mode, method):
    """The checker's own deviation bound W for the claim (duals: the trivial ones that add nothing)."""
    allowed = list(range(model.config.d_vocab)) if multiset is None else sorted(set(multiset))
    heads = head_tables(B, model, prefix, query, allowed, n_free, mode, set(multiset or ()))
    duals = None
    if method == "lp":
        duals = []
        for hd in heads:   # a feasible dual from the cost bounds: u = 0, v_c = min / max over rows
            lo, hi = lp_costs(B, hd, multiset)
            duals.append({"min": ([Fraction(0)] * n_free, [min(r[c] for r in lo) for c in range(n_free)]),
                          "max": ([Fraction(0)] * n_free, [max(r[c] for r in hi) for c in range(n_free)])})
    return certified_deviation(B, model, heads, duals, multiset, Obligations(), "attack")


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


def test_assignment_bound_is_weak_duality_for_any_dual():
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
                bound = assignment_bound(u, v, costs, sense)
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
        bmin, bmax = beta_bounds(B, hd, amin, amax)
        for f in (f_lo, f_hi):
            for a in (amin, amax):
                assert bmin <= a / (f + a) <= bmax


def _spy_tight(monkeypatch, model, cert):
    """Run the tight check; returns what it derived: the certified sigma^2 range (its figures) and the
    (U, e) of every final_ln.decide call (a spy)."""
    seen = {"decide": []}
    orig_decide = final_ln.decide

    def dec(U, e, s_lo, s_hi):
        seen["decide"].append((U, e))
        return orig_decide(U, e, s_lo, s_hi)
    monkeypatch.setattr(final_ln, "decide", dec)
    ob = Obligations()
    ow_kind.check(model, cert["claim"], cert["evidence"], make_backend("flint"), ob)
    monkeypatch.undo()
    for key, name in (("sigma^2 upper bound", "sigma_hi2"), ("sigma^2 lower bound", "sigma_lo2")):
        try:
            seen[name] = ob.figure(key)
        except KeyError:
            pass
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
    shared = UptoTables(B, model, prefix, query, N, mode, list(range(v)), Weights(B, model))
    for L in range(1, N + 1):
        W, _ = certified_deviation(B, model, shared.heads(L), None, None, Obligations(), "attack")
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
    shared = UptoTables(B, model, prefix, query, N, "table", list(range(model.config.d_vocab)), Weights(B, model))
    for L in range(1, N + 1):
        ref = _float_free_scores(model, prefix, query, L)
        for h, hd in enumerate(shared.heads(L)):
            assert len(hd.score_lo) == len(hd.score_hi) == L
            for col in range(L):
                lo, hi = ref[h, col].min(), ref[h, col].max()
                assert abs(float(hd.score_lo[col]) - lo) < 1e-9 and abs(float(hd.score_hi[col]) - hi) < 1e-9, (L, h, col)
