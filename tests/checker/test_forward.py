"""Tests of the generator's float64 forward pass, random models and the Max-of-4 anchors.

The forward pass is checked three ways: against a deliberately naive pure-Python transcription of
the model-semantics contract (scalar loops, `math` functions; independent of numpy broadcasting),
against itself (table fast path vs general path), and against the published brute-force counts of
the two Max-of-4 anchor models.
"""

import math
import time

import numpy as np
import pytest

from tcert.testing import CERTIFICATES
from tcert.checker.modelfile import load_model
from tcert.generator.model import forward as F
from tcert.generator.model.importers import import_npz
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import ARCHS, random_model

ANCHORS = CERTIFICATES / "anchors" / "maxofk"


# ----------------------------------------------------------------------------- naive reference

def _vec(row):
    return [float(x) for x in row]


def _naive_ln(v, w, b, eps):
    n = len(v)
    mu = sum(v) / n
    c = [x - mu for x in v]
    var = sum(x * x for x in c) / n
    s = math.sqrt(var + eps)
    return [c[i] / s * float(w[i]) + float(b[i]) for i in range(n)]


def _naive_act(x, name):
    if name == "relu":
        return max(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))
    if name == "silu":
        return x / (1 + math.exp(-x))
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _matvec(v, m):
    """v @ m for a list v and a 2-D array m."""
    return [sum(v[i] * float(m[i][j]) for i in range(len(v))) for j in range(m.shape[1])]


def _naive_rms(v, w, eps):
    s = math.sqrt(sum(x * x for x in v) / len(v) + eps)
    return [v[i] / s * float(w[i]) for i in range(len(v))]


def _naive_rotate(x, p, rd, base, adjacent, factor=1):
    """Rotate list x (one head's q or k) at position p, component pairs spelled out one by one."""
    out = list(x)
    for j in range(rd // 2):
        theta = float(base) ** (-2.0 * j / rd) / float(factor)
        a, b = (2 * j, 2 * j + 1) if adjacent else (j, j + rd // 2)
        c, s = math.cos(p * theta), math.sin(p * theta)
        out[a] = x[a] * c - x[b] * s
        out[b] = x[b] * c + x[a] * s
    return out


def naive_all_logits(model, tokens):
    """Logits at every position by a scalar transcription of the contract (slow; tiny models only)."""
    c, t = model.config, model.tensors
    n, eps = len(tokens), float(c.eps)
    scale = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
    resid = [_vec(t["embed.W_E"][x]) for x in tokens]
    if not c.rotary:
        resid = [[a + float(b) for a, b in zip(resid[p], t["pos_embed.W_pos"][p])] for p in range(n)]

    def ln(v, name):
        if c.normalization_type == "RMS":
            return _naive_rms(v, t[name + ".w"], eps)
        return _naive_ln(v, t[name + ".w"], t[name + ".b"], eps) if c.has_ln else list(v)

    for i in range(c.n_layers):
        pre = f"blocks.{i}."
        a = [ln(r, pre + "ln1") for r in resid]
        attn = [[float(x) for x in t[pre + "attn.b_O"]] for _ in range(n)]
        for h in range(c.n_heads):
            def proj(m, p):
                if m != "Q" and c.n_key_value_heads:   # grouped: query head h reads key/value head h // group
                    g = h // (c.n_heads // c.n_key_value_heads)
                    w, b = t[pre + f"attn._W_{m}"][g], t[pre + f"attn._b_{m}"][g]
                else:
                    w, b = t[pre + f"attn.W_{m}"][h], t[pre + f"attn.b_{m}"][h]
                return [x + float(y) for x, y in zip(_matvec(a[p], w), b)]
            q = [proj("Q", p) for p in range(n)]
            k = [proj("K", p) for p in range(n)]
            v = [proj("V", p) for p in range(n)]
            if c.rotary:
                rot = (c.rotary_dim, c.rotary_base, c.rotary_adjacent_pairs, c.rotary_scaling_factor)
                q = [_naive_rotate(q[p], p, *rot) for p in range(n)]
                k = [_naive_rotate(k[p], p, *rot) for p in range(n)]
            for p in range(n):
                keys = range(p + 1) if c.attention_dir == "causal" else range(n)
                sc = {r: sum(x * y for x, y in zip(q[p], k[r])) / scale for r in keys}
                mx = max(sc.values())
                e = {r: math.exp(s - mx) for r, s in sc.items()}
                tot = sum(e.values())
                z = [sum(e[r] / tot * v[r][d] for r in keys) for d in range(c.d_head)]
                attn[p] = [x + y for x, y in zip(attn[p], _matvec(z, t[pre + "attn.W_O"][h]))]
        if c.attn_only:
            resid = [[x + y for x, y in zip(resid[p], attn[p])] for p in range(n)]
            continue

        def mlp(m):
            if c.gated_mlp:
                gate = [_naive_act(x, c.act_fn) for x in _matvec(m, t[pre + "mlp.W_gate"])]
                hid = [g * x + float(b) for g, x, b in zip(gate, _matvec(m, t[pre + "mlp.W_in"]), t[pre + "mlp.b_in"])]
            else:
                hid = [_naive_act(x + float(b), c.act_fn) for x, b in zip(_matvec(m, t[pre + "mlp.W_in"]), t[pre + "mlp.b_in"])]
            return [x + float(b) for x, b in zip(_matvec(hid, t[pre + "mlp.W_out"]), t[pre + "mlp.b_out"])]

        ln2 = pre + ("ln1" if c.shared_ln else "ln2")
        if c.parallel_attn_mlp:
            resid = [[x + y + z for x, y, z in zip(resid[p], attn[p], mlp(ln(resid[p], ln2)))] for p in range(n)]
        else:
            mid = [[x + y for x, y in zip(resid[p], attn[p])] for p in range(n)]
            resid = [[x + y for x, y in zip(mid[p], mlp(ln(mid[p], ln2)))] for p in range(n)]
    if c.final_ln:
        resid = [ln(r, "ln_final") for r in resid]
    return np.array([[x + float(b) for x, b in zip(_matvec(r, t["unembed.W_U"]), t["unembed.b_U"])] for r in resid])


# ----------------------------------------------------------------------------- model zoo

SMALL = dict(d_vocab=7, d_model=8, n_heads=2, d_head=4, d_mlp=12, n_ctx=6)

VARIANTS = [
    ("neox1l", 1, {}),
    ("neox1l", 1, dict(bias_std=0.3, rotary_dim=2)),
    ("neox1l", 2, dict(rotary_adjacent_pairs=True, bias_std=0.2)),
    ("attn-only", 1, {}),
    ("attn-only", 1, dict(bias_std=0.5, attn_scale="3/2")),
    ("attn-only", 2, dict(positional_embedding_type="rotary", rotary_dim=2, attention="bidirectional")),
    ("attn-only", 1, dict(normalization_type="LN", bias_std=0.2)),
    ("preln", 2, dict(bias_std=0.2)),
    ("preln", 2, dict(act_fn="gelu_new", attention="bidirectional", bias_std=0.1)),
    ("preln", 3, dict(positional_embedding_type="rotary", rotary_adjacent_pairs=True, act_fn="relu",
                      eps="1/10", rotary_base=100)),
    ("preln", 1, dict(parallel_attn_mlp=True, shared_ln=True, final_ln=False, act_fn="gelu")),
    ("llama", 2, dict(n_key_value_heads=1)),
    ("llama", 1, dict(bias_std=0.3, rotary_scaling_factor="5/2", rotary_base=50)),
    ("llama", 1, dict(gated_mlp=False, act_fn="gelu", use_attn_scale=False, n_key_value_heads=2)),
    ("preln", 2, dict(normalization_type="RMS", act_fn="silu", parallel_attn_mlp=True, shared_ln=True, bias_std=0.2)),
]


def _ids(v):
    return f"{v[0]}-L{v[1]}-" + "-".join(f"{k}={val}" for k, val in v[2].items())


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Every variant, written with save_model and read back with the checker's reader."""
    out = {}
    d = tmp_path_factory.mktemp("zoo")
    for j, (arch, layers, over) in enumerate(VARIANTS):
        tensors, cfg = random_model(arch, n_layers=layers, seed=100 + j, **SMALL, **over)
        path = d / f"m{j}.safetensors"
        save_model(str(path), tensors, cfg)
        out[_ids(VARIANTS[j])] = (tensors, cfg, load_model(str(path)))
    return out


@pytest.mark.parametrize("variant", VARIANTS, ids=_ids)
def test_round_trip_and_naive_agreement(zoo, variant):
    tensors, cfg, model = zoo[_ids(variant)]
    assert set(model.tensors) == set(tensors)
    for k, v in tensors.items():
        assert np.array_equal(model.tensors[k], v), k  # float32 in, float32 out: bit-identical
    toks = np.random.default_rng(7).integers(0, SMALL["d_vocab"], (3, SMALL["n_ctx"]))
    for row in toks:
        ref = naive_all_logits(model, row.tolist())
        got = F.all_logits(model, row)
        assert got.shape == (SMALL["n_ctx"], SMALL["d_vocab"])
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
        # last-position logits of every prefix length agree with all_logits (causal) or a fresh run
        for n in range(1, SMALL["n_ctx"] + 1):
            np.testing.assert_allclose(F.logits(model, row[None, :n])[0],
                                       naive_all_logits(model, row[:n].tolist())[-1], rtol=1e-10, atol=1e-10)
    lg = F.logits(model, toks)
    np.testing.assert_allclose(lg, [F.all_logits(model, r)[-1] for r in toks], rtol=1e-12, atol=1e-12)
    res = F.residuals(model, toks[0])
    assert len(res) == model.config.n_layers + 1 and all(r.shape == (SMALL["n_ctx"], 8) for r in res)
    np.testing.assert_array_equal(F.residuals(model, toks)[-1][0], res[-1])
    np.testing.assert_array_equal(F.predictions(model, toks), lg.argmax(axis=1))


def test_random_model_is_deterministic_and_arch_checked():
    for arch in ARCHS:
        a, ca = random_model(arch, seed=3, bias_std=0.1)
        b, cb = random_model(arch, seed=3, bias_std=0.1)
        c, _ = random_model(arch, seed=4, bias_std=0.1)
        assert ca == cb and all(np.array_equal(a[k], b[k]) for k in a)
        assert any(not np.array_equal(a[k], c[k]) for k in a if a[k].any())
        assert all(v.dtype == np.float32 for v in a.values())
    t, cfg = random_model("neox1l", seed=0)
    assert cfg["shared_ln"] and cfg["parallel_attn_mlp"] and cfg["rotary_dim"] == cfg["d_head"]
    assert not any(t[k].any() for k in t if k.rsplit(".", 1)[1].startswith("b"))  # biases zero by default
    assert all(abs(float(x) - 1) < 0.6 for x in t["blocks.0.ln1.w"])
    with pytest.raises(ValueError):
        random_model("gpt2")


def test_random_model_paper_size_is_fast():
    t0 = time.perf_counter()
    tensors, cfg = random_model("neox1l", 30522, 512, 8, 64, 2048, 1024, 1, seed=0)
    elapsed = time.perf_counter() - t0
    assert tensors["embed.W_E"].shape == (30522, 512) and tensors["blocks.0.mlp.W_in"].shape == (512, 2048)
    assert elapsed < 20  # about 1.5 s here; generous for loaded CI machines
    # std 1/sqrt(fan_in): W_Q entries ~ 1/sqrt(512)
    assert abs(float(tensors["blocks.0.attn.W_Q"].std()) * math.sqrt(512) - 1) < 0.02


def test_paper_size_forward_runs():
    tensors, cfg = random_model("neox1l", 30522, 512, 8, 64, 2048, 1024, 1, seed=1)
    model = F.as_model(tensors, cfg)
    toks = np.random.default_rng(0).integers(0, 30522, (2, 64))
    lg = F.logits(model, toks)
    assert lg.shape == (2, 30522) and np.isfinite(lg).all()
    np.testing.assert_allclose(lg[1], F.all_logits(model, toks[1])[-1], rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------- rotary by hand

@pytest.mark.parametrize("adjacent", [False, True])
def test_rotary_against_hand_computation(adjacent):
    """One head, d_head 6, rotary_dim 4, base 100: rotate q/k at positions 2 and 5 by hand."""
    x = np.arange(1.0, 7.0)  # (1, 2, 3, 4, 5, 6)
    rd = 4
    th = [1.0, 100.0 ** -0.5]  # theta_j = base^(-2j/rd) with base 100: 1, 0.1
    for p in (0, 2, 5):
        cos, sin = F.rotary_cos_sin(np.array(th), [p])
        got = F.apply_rotary(x[None, None, :], cos, sin, rd, adjacent)[0, 0]
        a0, a1 = p * th[0], p * th[1]
        if adjacent:  # pairs (0,1) angle a0, (2,3) angle a1
            want = [1 * math.cos(a0) - 2 * math.sin(a0), 2 * math.cos(a0) + 1 * math.sin(a0),
                    3 * math.cos(a1) - 4 * math.sin(a1), 4 * math.cos(a1) + 3 * math.sin(a1), 5, 6]
        else:  # rotate-half: pairs (0,2) angle a0, (1,3) angle a1
            want = [1 * math.cos(a0) - 3 * math.sin(a0), 2 * math.cos(a1) - 4 * math.sin(a1),
                    3 * math.cos(a0) + 1 * math.sin(a0), 4 * math.cos(a1) + 2 * math.sin(a1), 5, 6]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)
    # theta from a model config uses the same formula
    t, cfg = random_model("attn-only", positional_embedding_type="rotary", rotary_dim=4, d_head=6,
                        rotary_base=100, d_model=6, n_heads=1)
    np.testing.assert_allclose(F._weights(F.as_model(t, cfg)).theta, th, rtol=1e-15)


def test_rotary_scores_depend_on_relative_position_only():
    """RoPE's defining property: q(p).k(r) is unchanged when p and r shift together."""
    rng = np.random.default_rng(0)
    theta = 10000.0 ** (-2.0 * np.arange(4) / 8)
    for adjacent in (False, True):
        q, k = rng.standard_normal((2, 1, 1, 8))
        dots = []
        for shift in (0, 3, 11):
            cq, sq = F.rotary_cos_sin(theta, [5 + shift])
            ck, sk = F.rotary_cos_sin(theta, [2 + shift])
            dots.append(float(F.apply_rotary(q[None], cq, sq, 8, adjacent).ravel()
                              @ F.apply_rotary(k[None], ck, sk, 8, adjacent).ravel()))
        np.testing.assert_allclose(dots, dots[0], rtol=1e-12)


# ----------------------------------------------------------------------------- fast path

@pytest.mark.parametrize("over", [
    {}, dict(bias_std=0.4), dict(positional_embedding_type="rotary", rotary_dim=2),
    dict(normalization_type="LN", bias_std=0.3, attention="bidirectional"),
    dict(rotary_adjacent_pairs=True, positional_embedding_type="rotary", n_heads=3, attn_scale="2"),
])
def test_fast_path_equals_general_path(over, monkeypatch):
    tensors, cfg = random_model("attn-only", seed=5, **{**SMALL, **over})
    model = F.as_model(tensors, cfg)
    w = F._weights(model)
    rng = np.random.default_rng(1)
    for n in (1, 3, SMALL["n_ctx"]):
        toks = rng.integers(0, SMALL["d_vocab"], (500, n))
        assert F._fast_ok(model.config, n)
        np.testing.assert_allclose(F._last_logits_fast(w, toks), F._last_logits_general(w, toks),
                                   rtol=1e-11, atol=1e-11)
    monkeypatch.setattr(F, "_CHUNK_ELEMENTS", 1 << 14)  # force many chunks over the thread pool
    big = rng.integers(0, SMALL["d_vocab"], (20_000, SMALL["n_ctx"]))
    assert F._chunk_rows(model.config, SMALL["n_ctx"], True) < 2_000
    np.testing.assert_allclose(F.logits(model, big), F._last_logits_general(w, big), rtol=1e-11, atol=1e-11)


def _brute_counts(model, n):
    v = model.config.d_vocab
    toks = np.array(np.unravel_index(np.arange(v ** n), (v,) * n)).T
    lg = F._last_logits_general(F._weights(model), toks)
    mx = toks.max(axis=1)
    unique = sum(1 for row, m in zip(lg, mx) if row[m] > np.delete(row, m).max())
    return unique, int((lg.argmax(axis=1) == mx).sum())


@pytest.mark.parametrize("arch, over", [
    ("attn-only", dict(n_heads=1, d_head=8)),
    ("attn-only", dict(n_heads=2, d_head=4, bias_std=0.3)),
    ("attn-only", dict(n_heads=1, d_head=8, positional_embedding_type="rotary", normalization_type="LN")),
    ("attn-only", dict(n_heads=1, d_head=8, attn_scale="1/100000", embed_std=30)),  # shift would underflow
    ("preln", dict(n_heads=2, d_head=4)),  # no table path: logits over every input
])
def test_count_max_correct_matches_brute_force(arch, over):
    tensors, cfg = random_model(arch, d_vocab=6, d_model=8, n_ctx=3, seed=2, **over)
    model = F.as_model(tensors, cfg)
    for n in (1, 2, 3):
        unique, first = _brute_counts(model, n)
        assert F.count_max_correct(model, n=n, unique=True) == unique
        assert F.count_max_correct(model, n=n, unique=False) == first


def test_count_max_correct_ties_are_wrong_when_unique():
    """Tokens 3 and 4 get identical unembedding columns, so their logits tie exactly."""
    tensors, cfg = random_model("attn-only", d_vocab=6, d_model=8, n_heads=1, d_head=8, n_ctx=3, seed=4)
    tensors["unembed.W_U"][:, 4] = tensors["unembed.W_U"][:, 3]
    model = F.as_model(tensors, cfg)
    unique, first = _brute_counts(model, 3)
    assert unique < first
    assert F.count_max_correct(model, unique=True) == unique
    assert F.count_max_correct(model, unique=False) == first


def test_bad_tokens_are_refused():
    tensors, cfg = random_model("attn-only", **SMALL)
    model = F.as_model(tensors, cfg)
    for bad in (np.zeros((1, SMALL["n_ctx"] + 1), int), np.full((1, 2), SMALL["d_vocab"]),
                np.full((1, 2), -1), np.zeros((1, 2)), np.zeros((1, 0), int)):
        with pytest.raises(ValueError):
            F.logits(model, bad)


# ----------------------------------------------------------------------------- Max-of-4 anchors

@pytest.mark.parametrize("name, expected", [("maxof4_seed123.npz", 16_763_235), ("maxof4_seed50.npz", 16_771_350)])
def test_maxof4_anchor_brute_force_count(tmp_path, name, expected):
    """All 64^4 inputs through the checker's model file.

    Measured on the dev box (2 cores shared with other jobs, load average ~8): count_max_correct
    takes 13-23 s wall, 6-11 s CPU per anchor; plain forward.logits over all inputs in 2^20
    batches takes ~46 s CPU. No exact tie between the max token's logit and another occurs in these
    models, so the strict (unique argmax) and lowest-index conventions both give the published counts.
    """
    tensors, cfg = import_npz(str(ANCHORS / name))
    path = tmp_path / "m.safetensors"
    save_model(str(path), tensors, cfg)
    model = load_model(str(path))
    t0 = time.perf_counter()
    got = F.count_max_correct(model, unique=True)
    print(f"\n{name}: {got} of 64^4 correct, counted in {time.perf_counter() - t0:.1f} s")
    assert got == expected
