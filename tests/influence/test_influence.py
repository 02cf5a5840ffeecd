"""Influence certificates: soundness by exhaustive rigorous enumeration, per-lemma checks, adversarial
search, mutation, both backends, hostile claims, and the one-input corollary."""

import copy
import itertools
import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker.verify import verify
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.numbers import parse_number
from tcert.checker.forward import Weights, final_residual, last_logits, softmax
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.norms import max_row_dist, operator_norm
from tcert.checker.kinds.influence.rates import cap_factor, harmonic, rate
from tcert.checker.modelfile import load_model
from tcert.testing import example_scale
from tcert.generator import certificate
from tcert.generator.model.forward import residuals
from tcert.generator.influence import (adversarial_influence, corollary_certificate, influence_certificate,
                                      robust_toy_model, toy_model)
from tcert.generator.model.files import save_model

CONFIGS = {
    "L1-causal": dict(n_layers=1, attention="causal"),
    "L2-causal": dict(n_layers=2, attention="causal"),
    "L3-causal": dict(n_layers=3, attention="causal"),
    "L1-bidir": dict(n_layers=1, attention="bidirectional"),
    "L2-bidir": dict(n_layers=2, attention="bidirectional"),
    "L3-bidir": dict(n_layers=3, attention="bidirectional", parallel=True, act_fn="gelu"),
    "L2-noLN-attnonly": dict(n_layers=2, ln=False, attn_only=True),
    "L2-rotary-gelu_new": dict(n_layers=2, rotary=True, act_fn="gelu_new", d_head=4),
    "L2-causal-V6": dict(n_layers=2, attention="causal", d_vocab=6, n_ctx=3),
    "L2-bidir-n6": dict(n_layers=2, attention="bidirectional", d_vocab=2, n_ctx=6),
    "L2-causal-nope": dict(n_layers=2, attention="causal", nope=True),
}


def build(tmp_path, name="m", **kw):
    """Write a toy model and its influence certificate; return (model path, cert path, model, cert)."""
    kw = {"d_vocab": 3, "n_ctx": 5, "d_model": 6, "n_heads": 2, "d_head": 3, "d_mlp": 8, "scale": 0.3,
          "eps": "1", **kw}
    t, cfg = toy_model(**kw)
    mpath, cpath = str(tmp_path / f"{name}.safetensors"), str(tmp_path / f"{name}.json")
    save_model(mpath, t, cfg)
    model = load_model(mpath)
    cert = influence_certificate(model)
    certificate.write(cpath, cert)
    return mpath, cpath, model, cert


def consts(cert):
    """The certificate's constants as Fractions."""
    return {k: parse_number(v, k) for k, v in cert["evidence"]["constants"].items()}


def write(tmp_path, cert, name="mut.json"):
    path = str(tmp_path / name)
    certificate.write(path, cert)
    return path


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_verifies_and_backends_agree(tmp_path, name):
    mpath, cpath, model, cert = build(tmp_path, **CONFIGS[name])
    ob_f = verify(cpath, mpath, "flint")
    ob_m = verify(cpath, mpath, "mpmath")
    assert ob_f.summary == ob_m.summary
    cfg = model.config
    expected = "harmonic" if cfg.attention_dir == "causal" and cfg.n_layers > 1 else "inverse"
    assert cert["claim"]["rate"] == expected


def test_obligations_and_figures(tmp_path):
    """One obligation per constant ("influence: constant <name>", figure evidence.constants.<name> = the
    recomputed bound, never above the claim), then "influence: claim C", ... with the recomputed needs as
    figures claim.C, ...: exactly the needs the generator's run of the same derivation returned."""
    from tcert.generator.influence import influence_parts
    mpath, cpath, model, cert = build(tmp_path, **CONFIGS["L2-causal"])
    ob = verify(cpath, mpath, "flint")
    names = [o.name for o in ob.done]
    claimed = consts(cert)
    assert names[:len(claimed)] == [f"influence: constant {k}" for k in names_in_order(names)]
    assert set(names_in_order(names)) == set(claimed)
    for name, value in claimed.items():
        assert ob.figure(f"evidence.constants.{name}") <= value
    assert names[len(claimed):] == [f"influence: claim {k}" for k in ("C", "C_prob", "C_abs", "C_prob_abs")]
    _, _, needs = influence_parts(model)
    for key in ("C", "C_prob", "C_abs", "C_prob_abs"):
        assert ob.figure(f"claim.{key}") == needs[key] <= parse_number(cert["claim"][key], key)


def names_in_order(obligation_names) -> list:
    """The constant names of the "influence: constant <name>" obligations, in checking order."""
    prefix = "influence: constant "
    return [n[len(prefix):] for n in obligation_names if n.startswith(prefix)]


def certified(cert, n, n_layers):
    """The certified (||y - y'|| bound, ||p - p'||_1 bound) at length n, as Fractions."""
    c = {k: parse_number(cert["claim"][k], k) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
    r = rate(cert["claim"]["rate"], n, n_layers)
    return min(c["C"] * r, c["C_abs"]), min(c["C_prob"] * r, c["C_prob_abs"])


def rigorous_outputs(model, n, B):
    """Enclosures (final residual at the last position, next-token distribution) for every input of length n."""
    W = Weights(B, model)
    out = {}
    for tokens in itertools.product(range(model.config.d_vocab), repeat=n):
        y = final_residual(B, model, list(tokens), W)
        out[tokens] = (y, softmax(B, last_logits(B, model, list(tokens), W)))
    return out


@pytest.mark.parametrize("name", ["L1-causal", "L2-causal", "L3-causal", "L1-bidir", "L2-bidir", "L3-bidir",
                                  "L2-causal-V6", "L2-bidir-n6", "L2-causal-nope"])
def test_exhaustive_soundness(tmp_path, name):
    """Every single non-final change at every n in range, evaluated rigorously (Arb, 100 bits):
    ||y - y'|| and ||p - p'||_1 stay within the certified C r(n), C' r(n)."""
    mpath, cpath, model, cert = build(tmp_path, **CONFIGS[name])
    verify(cpath, mpath, "flint")
    claim, cfg = cert["claim"], model.config
    B = make_backend("flint", 100)
    worst = 0.0
    for n in range(claim["n_min"], claim["n_max"] + 1):
        bound_y, bound_p = certified(cert, n, cfg.n_layers)
        outs = rigorous_outputs(model, n, B)
        for x, (y, p) in outs.items():
            for i in range(n - 1):
                for tok in range(x[i] + 1, cfg.d_vocab):
                    x2 = x[:i] + (tok,) + x[i + 1:]
                    y2, p2 = outs[x2]
                    dy = B.upper(B.sqrt(B.fsum((a - b) * (a - b) for a, b in zip(y, y2))))
                    dp = sum(B.abs_upper(a - b) for a, b in zip(p, p2))
                    assert dy <= bound_y, (n, x, x2, float(dy), float(bound_y))
                    assert dp <= bound_p, (n, x, x2, float(dp), float(bound_p))
                    worst = max(worst, float(dy / bound_y))
    assert 0 < worst <= 1


def rho(cfg, k, m, n):
    """The position weight of layer k's E_k: H_m^(k-1)/m (causal) or 1/n (bidirectional); m is 1-based."""
    if cfg.attention_dir == "causal":
        return float(harmonic(m)) ** (k - 1) / m
    return 1.0 / n


@pytest.mark.parametrize("name", ["L2-causal", "L3-causal", "L2-bidir", "L3-bidir", "L2-noLN-attnonly"])
def test_layerwise_lemmas(tmp_path, name):
    """The induction hypotheses themselves, layer by layer, on all inputs and single changes: residual
    norms <= B_k, every LayerNorm's 1/sigma(x) <= its Lipschitz constant (the variance lower bound over the
    reachable residuals), position m != i moves <= E_k rho_k(m) and <= spread_k. (float64 residuals with a
    1e-9 relative allowance; the headline bound is checked rigorously above.)"""
    mpath, cpath, model, cert = build(tmp_path, **CONFIGS[name])
    cfg, k_ = model.config, consts(cert)
    tol = 1 + 1e-9
    for n in range(2, cfg.n_ctx + 1):
        xs = np.array(list(itertools.product(range(cfg.d_vocab), repeat=n)))
        res = residuals(model, xs)
        index = {tuple(x): j for j, x in enumerate(xs)}
        for k in range(cfg.n_layers + 1):
            assert np.linalg.norm(res[k], axis=-1).max() <= float(k_[f"B{k}"]) * tol
            ln = f"L{k}.ln1.lip" if k < cfg.n_layers else "ln_final.lip"
            if ln in k_:
                centred = res[k] - res[k].mean(axis=-1, keepdims=True)
                sigma = np.sqrt((centred ** 2).mean(axis=-1) + float(cfg.eps))
                assert (1 / sigma).max() <= float(k_[ln]) * tol
        for j, x in enumerate(xs):
            for i in range(n - 1):
                for tok in range(x[i] + 1, cfg.d_vocab):
                    x2 = x.copy()
                    x2[i] = tok
                    j2 = index[tuple(x2)]
                    for k in range(1, cfg.n_layers + 1):
                        d = np.linalg.norm(res[k][j] - res[k][j2], axis=-1)
                        for m in range(n):
                            if m != i:
                                assert d[m] <= float(k_[f"spread{k}"]) * tol + 1e-12
                                assert d[m] <= float(k_[f"E{k}"]) * rho(cfg, k, m + 1, n) * tol + 1e-12, (k, m)
                            if cfg.attention_dir == "causal" and m < i:
                                assert d[m] < 1e-9


@settings(max_examples=example_scale(6), deadline=None)
@given(seed=st.integers(0, 10 ** 6), layers=st.integers(1, 4), causal=st.booleans(), n=st.integers(2, 8))
def test_adversarial_search_never_exceeds(tmp_path_factory, seed, layers, causal, n):
    """Random + greedy substitution search on random models stays within the certified bounds."""
    tmp = tmp_path_factory.mktemp("adv")
    t, cfg = toy_model(layers, 6, 8, 2, 4, 16, 8, "causal" if causal else "bidirectional", scale=0.4,
                       eps="1/10", seed=seed)
    mpath = str(tmp / "m.safetensors")
    save_model(mpath, t, cfg)
    model = load_model(mpath)
    cert = influence_certificate(model)
    cpath = write(tmp, cert, "c.json")
    verify(cpath, mpath, "flint")
    dy, dp = adversarial_influence(model, n, trials=6, greedy_rounds=1, seed=seed)
    bound_y, bound_p = certified(cert, n, layers)
    assert dy <= float(bound_y) and dp <= float(bound_p)


def test_mutation_every_constant_down_rejected(tmp_path):
    """Every constant, C and C_prob moved down by 2^-20 relative (more than the generator's slack) -> REJECTED,
    by both backends."""
    mpath, cpath, model, cert = build(tmp_path, **CONFIGS["L2-causal"])
    shrink = 1 - Fraction(1, 2 ** 20)
    names = sorted(cert["evidence"]["constants"])
    assert len(names) > 30
    for idx, name in enumerate(names):
        bad = copy.deepcopy(cert)
        bad["evidence"]["constants"][name] = certificate.num(parse_number(bad["evidence"]["constants"][name], name) * shrink)
        path = write(tmp_path, bad)
        for backend in (("flint", "mpmath") if idx % 6 == 0 else ("flint",)):
            with pytest.raises(Rejected, match=name.replace(".", r"\.")):
                verify(path, mpath, backend)
    for key in ("C", "C_prob", "C_abs", "C_prob_abs"):
        bad = copy.deepcopy(cert)
        bad["claim"][key] = certificate.num(parse_number(bad["claim"][key], key) * shrink)
        with pytest.raises(Rejected, match=f"influence: claim {key}:"):
            verify(write(tmp_path, bad), mpath, "flint")


def test_claim_and_model_edits_rejected(tmp_path):
    mpath, cpath, model, cert = build(tmp_path, **CONFIGS["L2-causal"])
    bad = copy.deepcopy(cert)
    bad["claim"]["n_max"] = 6  # > n_ctx
    with pytest.raises(BadInput):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    bad["claim"]["rate"] = "inverse"  # the 1/n rate is not what we prove for causal L >= 2
    with pytest.raises(BadInput, match="harmonic"):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    del bad["evidence"]["constants"]["B1"]
    with pytest.raises(BadInput, match="missing"):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    bad["evidence"]["constants"]["junk"] = "1"
    with pytest.raises(BadInput, match="unused"):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    bad["evidence"]["constants"]["B1"] = "abc"
    with pytest.raises(BadInput):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    bad["claim"]["C"] = "-1"
    with pytest.raises(Rejected, match="claim C"):
        verify(write(tmp_path, bad), mpath)
    for key, value in (("power", 99), ("embed_center", ["0"] * 6)):
        bad = copy.deepcopy(cert)
        bad["evidence"][key] = value
        with pytest.raises(BadInput):
            verify(write(tmp_path, bad), mpath)
    other, _, _, _ = build(tmp_path, "other", **dict(CONFIGS["L2-causal"], seed=1))
    with pytest.raises(Rejected, match="model binding"):
        verify(cpath, other)
    # a certificate for a shorter range does not cover a longer one: n_max up means bigger constants
    mpath2, _, model2, cert2 = build(tmp_path, "short", **dict(CONFIGS["L2-bidir"], n_ctx=5))
    short = influence_certificate(model2, 2, 3)
    short["claim"]["n_max"] = 5
    with pytest.raises(Rejected):
        verify(write(tmp_path, short), mpath2)


def spectral(W) -> float:
    """Largest singular value at 60 digits (mpmath), rounded down to a float."""
    import mpmath
    with mpmath.workdps(60):
        s = mpmath.svd_r(mpmath.matrix(np.asarray(W, np.float64).tolist()), compute_uv=False)
        top = max(s[i] for i in range(len(s)))
        return float(mpmath.mpf(top) * (1 - mpmath.mpf(10) ** -40))


def test_operator_norm_and_row_norm_bounds():
    """The trace-power operator-norm bound is above the true spectral norm and within ~10% at p = 6;
    the centred row-distance bound is above the float value."""
    rng = np.random.default_rng(0)
    B = make_backend("flint")
    for shape in ((7, 5), (5, 9), (16, 16)):
        W = rng.normal(size=shape).astype(np.float32)
        true = spectral(W)
        for p in (0, 3, 6):
            bound = float(operator_norm(B, [W], p))
            assert true <= bound
        assert bound <= 1.12 * true
        V, O = rng.normal(size=(shape[0], 3)).astype(np.float32), rng.normal(size=(3, shape[0])).astype(np.float32)
        true_ov = spectral(V.astype(np.float64) @ O.astype(np.float64))
        assert true_ov <= float(operator_norm(B, [V, O], 6)) <= 1.12 * true_ov
        c = rng.normal(size=shape[1])
        exact_sq = max(sum((Fraction(float(w)) - Fraction(float(x))) ** 2 for w, x in zip(row, c)) for row in W)
        got = max_row_dist(B, W, [Fraction(float(x)) for x in c])
        assert exact_sq <= got ** 2 <= exact_sq * (1 + Fraction(1, 10 ** 12))


def robust(tmp_path, layers=2, n_ctx=16, attention="causal"):
    t, cfg = robust_toy_model(layers, n_ctx=n_ctx, attention=attention)
    mpath = str(tmp_path / "robust.safetensors")
    save_model(mpath, t, cfg)
    return mpath, load_model(mpath)


def test_corollary_verifies_and_holds(tmp_path):
    """The corollary verifies; random substitutions of up to R non-final tokens never change the answer;
    R beyond what the bound allows, a smaller gap_lipschitz or a larger margin -> REJECTED."""
    mpath, model = robust(tmp_path)
    tokens = [1, 2, 3, 4, 5, 6, 7, 0] * 2
    cert, info = corollary_certificate(model, tokens)
    assert cert is not None and info["R"] >= 1
    path = write(tmp_path, cert, "cor.json")
    for backend in ("flint", "mpmath"):
        ob = verify(path, mpath, backend)
        assert "survives ANY change" in ob.summary
        margin = parse_number(cert["claim"]["corollary"]["prediction"]["margin"], "margin")
        assert ob.figure("claim.corollary.prediction.margin") >= margin
        assert ob.figure("claim.corollary.movement") < margin
        assert [o.name for o in ob.done][-3:] == ["influence corollary: prediction logit gap",
                                                  "influence corollary: gap_lipschitz",
                                                  "influence corollary: R changes cannot close the gap"]
    from tcert.generator.model.forward import predictions
    rng = np.random.default_rng(0)
    R, k = info["R"], info["predicted"]
    batch = np.repeat(np.array([tokens]), 400, axis=0)
    for row in batch:
        pos = rng.choice(len(tokens) - 1, size=R, replace=False)
        row[pos] = rng.integers(0, model.config.d_vocab, R)
    assert (predictions(model, batch) == k).all()
    bad = copy.deepcopy(cert)
    bad["claim"]["corollary"]["substitutions"] = info["max_R"] + 1
    with pytest.raises(Rejected, match="cannot close the gap"):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    g = parse_number(bad["claim"]["corollary"]["gap_lipschitz"], "g")
    bad["claim"]["corollary"]["gap_lipschitz"] = certificate.num(g * (1 - Fraction(1, 2 ** 20)))
    with pytest.raises(Rejected, match="gap_lipschitz"):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    bad["claim"]["corollary"]["prediction"]["margin"] = "1000"
    with pytest.raises(Rejected, match="logit gap"):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    bad["claim"]["corollary"]["substitutions"] = 0
    with pytest.raises(BadInput, match="substitutions"):
        verify(write(tmp_path, bad), mpath)
    bad = copy.deepcopy(cert)
    bad["claim"]["n_max"] = 8
    with pytest.raises(BadInput, match="outside"):
        verify(write(tmp_path, bad), mpath)


def test_corollary_refuses_when_bound_too_weak(tmp_path):
    """On a model where one token can flip the answer the generator must not emit a corollary."""
    mpath, _, model, _ = build(tmp_path, **CONFIGS["L2-causal"])
    cert, info = corollary_certificate(model, [0, 1, 2, 1])
    assert cert is None and info["max_R"] == 0


def test_cli_round_trip(tmp_path, capsys):
    from tcert.checker.cli import main as check_main
    from tcert.generator.cli import main as tcert_main
    mpath, model = robust(tmp_path, layers=2, n_ctx=16, attention="bidirectional")
    out = str(tmp_path / "c.json")
    assert tcert_main(["influence", "--model", mpath, "--n-min", "3", "--out", out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["figures"]
    assert summary["rate"] == "inverse" and summary["n_min"] == 3
    assert check_main([out, "--model", mpath]) == 0
    out2 = str(tmp_path / "c2.json")
    assert tcert_main(["influence", "--model", mpath, "--tokens", "1,2,3,4,5,6,7,0", "--substitutions", "1",
                       "--out", out2]) == 0
    assert check_main([out2, "--model", mpath, "--backend", "mpmath"]) == 0
    assert "survives ANY change of <= 1" in capsys.readouterr().out


@pytest.mark.parametrize("arch,overrides", [
    ("neox1l", {}),                                                    # shared LN, parallel, rotary
    ("preln", {"attention": "bidirectional", "attn_scale": "4", "bias_std": 0.3}),
    ("attn-only", {"attention": "causal", "bias_std": 0.3}),
])
def test_randmodel_families(tmp_path, arch, overrides):
    """The other engineers' random-model families (2 layers): verifies with both backends and the
    adversarial search stays within the bound."""
    from tcert.generator.model.random_models import random_model
    t, cfg = random_model(arch, d_vocab=6, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=6, n_layers=2,
                          seed=5, **overrides)
    mpath = str(tmp_path / "m.safetensors")
    save_model(mpath, t, cfg)
    model = load_model(mpath)
    cert = influence_certificate(model)
    cpath = write(tmp_path, cert, "c.json")
    assert verify(cpath, mpath, "flint").summary == verify(cpath, mpath, "mpmath").summary
    for n in (2, 4, 6):
        dy, dp = adversarial_influence(model, n, trials=4, greedy_rounds=1, seed=n)
        bound_y, bound_p = certified(cert, n, 2)
        assert dy <= float(bound_y) and dp <= float(bound_p)


def test_cap_factor_and_rate():
    """cap_k >= m / H_m^(k-1) for every m <= n_max (exact rationals), n_max in the bidirectional case."""
    B = make_backend("mpmath")
    for n_max in (2, 7, 40):
        for k in (1, 2, 3, 5):
            cap = cap_factor(B, n_max, k, True)
            exact = max(Fraction(m) / harmonic(m) ** (k - 1) for m in range(1, n_max + 1))
            assert exact <= cap <= exact * (1 + Fraction(1, 10 ** 12))
            assert cap_factor(B, n_max, k, False) == n_max
    assert rate("harmonic", 4, 3) == harmonic(4) ** 2 / 4 and rate("inverse", 4, 3) == Fraction(1, 4)


def uniform_two_layer(tmp_path, attention, n_ctx=64):
    """2 layers, attention-only, zero Q/K (uniform attention), identity OV: the harmonic sum in action."""
    t, cfg = toy_model(2, 2, 4, 1, 4, None, n_ctx, attention, ln=False, attn_only=True, scale=0.0)
    t["embed.W_E"] = np.array([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]])
    t["unembed.W_U"] = np.eye(4)[:, :2].copy()
    for i in range(2):
        t[f"blocks.{i}.attn.W_V"] = np.eye(4)[None]
        t[f"blocks.{i}.attn.W_O"] = np.eye(4)[None]
    path = str(tmp_path / f"uniform_{attention}.safetensors")
    save_model(path, t, cfg)
    return path, load_model(path)


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_causal_needs_the_harmonic_factor(tmp_path, attention):
    """Changing the first token of a 2-layer causal model with uniform attention moves the last position by
    ~2 H_n / n: n * influence grows without bound, so no C/n bound exists (the source proof's gap); the
    bidirectional twin stays at exactly 6/n. Both stay within their certified bounds."""
    path, model = uniform_two_layer(tmp_path, attention)
    cert = influence_certificate(model)
    verify(write(tmp_path, cert, "u.json"), path)
    scaled = []
    for n in (4, 16, 64):
        x = np.zeros((2, n), dtype=np.int64)
        x[1, 0] = 1
        y = residuals(model, x)[-1][:, -1]
        dy = float(np.linalg.norm(y[0] - y[1]))
        assert dy <= float(certified(cert, n, 2)[0])
        scaled.append(n * dy)
    if attention == "causal":
        assert scaled[0] < scaled[1] - 2 < scaled[2] - 4        # grows like 2 ln n
        assert cert["claim"]["rate"] == "harmonic"
    else:
        assert max(scaled) - min(scaled) < 1e-9 and abs(scaled[0] - 6) < 1e-9
