"""Tests of the importers (TransformerLens npz / safetensors, Hugging Face GPT-NeoX) and inspect_model.

GPT-2, the Llama family and every dtype: tests/generator/test_hf_importers.py; TransformerLens objects in
memory: tests/generator/test_transformer_lens.py."""

import json

import numpy as np
import pytest

from tcert.testing import CERTIFICATES
from tcert.checker.modelfile import load_model
from tcert.generator.model import forward as F
from tcert.generator.model.importers import import_gpt_neox, import_npz, import_safetensors, infer_tl_config
from tcert.generator.model.summary import describe, format_description, main as inspect_main
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model

ANCHORS = CERTIFICATES / "anchors" / "maxofk"
SMALL = dict(d_vocab=9, d_model=8, n_heads=2, d_head=4, d_mlp=12, n_ctx=5)


def _write_npz(path, tensors, buffers=True):
    arrays = {k.replace(".", "__"): v for k, v in tensors.items()}
    if buffers:  # what a TransformerLens state_dict carries besides parameters
        arrays["blocks__0__attn__mask"] = np.tril(np.ones((5, 5), bool))
        arrays["blocks__0__attn__IGNORE"] = np.array(-1e5, np.float32)
    np.savez(path, **arrays)


# ----------------------------------------------------------------------------- TransformerLens

def test_anchor_npz_config_is_inferred():
    tensors, cfg = import_npz(str(ANCHORS / "maxof4_seed123.npz"))
    assert cfg == dict(n_layers=1, d_model=32, n_heads=1, d_head=32, d_vocab=64, n_ctx=4,
                       positional_embedding_type="standard", normalization_type=None, attn_only=True,
                       final_ln=False)
    assert "blocks.0.attn.mask" not in tensors and "blocks.0.attn.IGNORE" not in tensors
    assert all(v.dtype == np.float32 for v in tensors.values())
    with np.load(ANCHORS / "maxof4_seed123.npz") as raw:
        assert np.array_equal(tensors["blocks.0.attn.W_Q"], raw["blocks__0__attn__W_Q"])
    model = F.as_model(tensors, cfg)
    assert model.config.attn_scale is None and model.config.attention_dir == "causal"


@pytest.mark.parametrize("arch, over", [
    ("attn-only", dict(bias_std=0.1)),
    ("preln", dict(n_layers=2, act_fn="gelu_new", bias_std=0.1)),
    ("neox1l", dict(bias_std=0.1)),
])
def test_npz_round_trip(tmp_path, arch, over):
    tensors, cfg = random_model(arch, seed=1, **{**SMALL, **over})
    path = tmp_path / "m.npz"
    _write_npz(path, tensors)
    # Fields the shapes cannot show are given; the rest must be inferred to the same config.
    hidden = {k: cfg[k] for k in ("act_fn", "parallel_attn_mlp", "rotary_dim", "n_ctx", "attention",
                                  "positional_embedding_type") if k in cfg}
    got, gcfg = import_npz(str(path), hidden)
    assert set(got) == set(tensors) and all(np.array_equal(got[k], tensors[k]) for k in got)
    a = F.as_model(tensors, cfg).config
    b = F.as_model(got, gcfg).config
    assert a == b
    toks = np.random.default_rng(0).integers(0, SMALL["d_vocab"], (4, SMALL["n_ctx"]))
    np.testing.assert_array_equal(F.logits(F.as_model(got, gcfg), toks), F.logits(F.as_model(tensors, cfg), toks))


def test_npz_inference_refuses_what_it_cannot_know(tmp_path):
    tensors, cfg = random_model("preln", seed=1, **SMALL)
    _write_npz(tmp_path / "mlp.npz", tensors)
    with pytest.raises(ValueError, match="act_fn"):
        import_npz(str(tmp_path / "mlp.npz"))
    rot, _ = random_model("attn-only", positional_embedding_type="rotary", **SMALL)
    _write_npz(tmp_path / "rot.npz", rot)
    with pytest.raises(ValueError, match="n_ctx"):
        import_npz(str(tmp_path / "rot.npz"))
    with pytest.raises(ValueError, match="unknown config"):
        import_npz(str(tmp_path / "mlp.npz"), {"act_fn": "relu", "d_vocab_out": 3})
    # a tensor the config has no place for
    extra = dict(tensors, **{"blocks.0.attn.W_extra": np.zeros(3, np.float32)})
    _write_npz(tmp_path / "extra.npz", extra)
    with pytest.raises(ValueError, match="no place"):
        import_npz(str(tmp_path / "extra.npz"), {"act_fn": "gelu"})
    bad = dict(tensors)
    bad["embed.W_E"] = bad["embed.W_E"].copy()
    bad["embed.W_E"][0, 0] = np.nan
    _write_npz(tmp_path / "nan.npz", bad)
    with pytest.raises(ValueError, match="NaN"):
        import_npz(str(tmp_path / "nan.npz"), {"act_fn": "gelu"})


def test_npz_missing_biases_become_zero(tmp_path):
    tensors, cfg = random_model("attn-only", seed=2, **SMALL)
    no_bias = {k: v for k, v in tensors.items() if not k.rsplit(".", 1)[1].startswith("b_")}
    _write_npz(tmp_path / "nb.npz", no_bias, buffers=False)
    got, gcfg = import_npz(str(tmp_path / "nb.npz"))
    assert not got["unembed.b_U"].any() and got["blocks.0.attn.b_Q"].shape == (2, 4)
    save_model(str(tmp_path / "nb.safetensors"), got, gcfg)


def test_npz_folded_layer_norm(tmp_path):
    """A folded state dict (TransformerLens LNPre: no ln weights at all) imports as LN with gain 1, bias 0."""
    tensors, cfg = random_model("preln", seed=4, n_layers=2, ln_std=0, bias_std=0.1, **SMALL)
    folded = {k: v for k, v in tensors.items() if ".ln" not in k and not k.startswith("ln_final")}
    tensors.update({k: np.zeros_like(v) for k, v in tensors.items() if k.endswith((".ln1.b", ".ln2.b", "ln_final.b"))})
    _write_npz(tmp_path / "folded.npz", folded)
    got, gcfg = import_npz(str(tmp_path / "folded.npz"), {"act_fn": "gelu", "normalization_type": "LNPre"})
    assert gcfg["normalization_type"] == "LN" and gcfg["final_ln"] and (got["blocks.1.ln2.w"] == 1).all()
    toks = np.random.default_rng(0).integers(0, SMALL["d_vocab"], (3, SMALL["n_ctx"]))
    np.testing.assert_array_equal(F.logits(F.as_model(got, gcfg), toks), F.logits(F.as_model(tensors, cfg), toks))


def test_import_safetensors_with_json_and_metadata(tmp_path):
    from safetensors.numpy import save_file

    tensors, cfg = random_model("preln", seed=3, bias_std=0.2, **SMALL)
    save_file(tensors, str(tmp_path / "tl.safetensors"))
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    got, gcfg = import_safetensors(str(tmp_path / "tl.safetensors"), str(tmp_path / "cfg.json"))
    assert all(np.array_equal(got[k], tensors[k]) for k in tensors)
    assert F.as_model(got, gcfg).config == F.as_model(tensors, cfg).config
    # our own model files carry the config in their metadata: no JSON needed
    save_model(str(tmp_path / "own.safetensors"), tensors, cfg)
    got2, gcfg2 = import_safetensors(str(tmp_path / "own.safetensors"))
    assert F.as_model(got2, gcfg2).config == F.as_model(tensors, cfg).config


def test_infer_tl_config_shared_ln_and_rotary():
    tensors, cfg = random_model("neox1l", **SMALL)
    inferred = infer_tl_config(tensors, {"act_fn": "relu", "n_ctx": 5, "parallel_attn_mlp": True})
    assert inferred["shared_ln"] and inferred["positional_embedding_type"] == "rotary"
    assert inferred["normalization_type"] == "LN" and not inferred["final_ln"] and inferred["d_mlp"] == 12


# ----------------------------------------------------------------------------- GPT-NeoX

NEOX_CASES = [
    dict(num_hidden_layers=1, use_parallel_residual=True),
    dict(num_hidden_layers=2, use_parallel_residual=True),
    dict(num_hidden_layers=1, use_parallel_residual=False),
    dict(num_hidden_layers=2, use_parallel_residual=False),
    dict(num_hidden_layers=2, use_parallel_residual=False, attention_bias=False, hidden_act="relu",
         tie_word_embeddings=True, rotary_pct=1.0, rotary_emb_base=500, layer_norm_eps=1e-3),
]


def _hf_neox(tmp_path, case, seed=0, **save_kw):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=64, rotary_pct=0.5,
              max_position_embeddings=16)
    kw.update(case)
    torch.manual_seed(seed)
    model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**kw)).eval()
    with torch.no_grad():  # default init has zero biases and unit LN gains: perturb everything
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    folder = tmp_path / "neox"
    model.save_pretrained(str(folder), safe_serialization=True, **save_kw)
    return torch, model, folder


@pytest.mark.parametrize("case", NEOX_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_gpt_neox_matches_transformers(tmp_path, case):
    torch, hf, folder = _hf_neox(tmp_path, case)
    tensors, cfg = import_gpt_neox(str(folder))
    assert cfg["parallel_attn_mlp"] == case["use_parallel_residual"]
    assert cfg["rotary_dim"] == int(8 * case.get("rotary_pct", 0.5))
    assert not cfg.get("rotary_adjacent_pairs", False) and cfg["attention_dir"] == "causal" and cfg["final_ln"]
    path = tmp_path / "m.safetensors"
    save_model(str(path), tensors, cfg)
    model = load_model(str(path))
    toks = np.random.default_rng(1).integers(0, 50, (6, 16))
    with torch.no_grad():
        ref = hf(torch.tensor(toks)).logits.double().numpy()
    for n in (1, 5, 16):  # last-position logits of several lengths
        got = F.logits(model, toks[:, :n])
        scale = np.abs(ref[:, n - 1]).max()
        np.testing.assert_allclose(got, ref[:, n - 1], rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(F.all_logits(model, toks[0]), ref[0], rtol=0, atol=1e-5 * np.abs(ref[0]).max())


def test_gpt_neox_sharded_checkpoint(tmp_path):
    torch, hf, folder = _hf_neox(tmp_path, dict(num_hidden_layers=2), max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").exists() and not (folder / "model.safetensors").exists()
    tensors, cfg = import_gpt_neox(str(folder))
    toks = np.random.default_rng(2).integers(0, 50, (3, 9))
    with torch.no_grad():
        ref = hf(torch.tensor(toks)).logits[:, -1].double().numpy()
    np.testing.assert_allclose(F.logits(F.as_model(tensors, cfg), toks), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_gpt_neox_qkv_split_by_hand(tmp_path):
    """Row h*3*Dh + j*Dh + e of query_key_value is component e of head h's q (j=0), k (1) or v (2)."""
    torch, hf, folder = _hf_neox(tmp_path, dict(num_hidden_layers=1))
    tensors, _ = import_gpt_neox(str(folder))
    w = hf.gpt_neox.layers[0].attention.query_key_value.weight.detach().numpy()
    b = hf.gpt_neox.layers[0].attention.query_key_value.bias.detach().numpy()
    dh = 8
    for h in range(4):
        for j, m in enumerate("QKV"):
            rows = slice(h * 3 * dh + j * dh, h * 3 * dh + (j + 1) * dh)
            assert np.array_equal(tensors[f"blocks.0.attn.W_{m}"][h], w[rows].T)
            assert np.array_equal(tensors[f"blocks.0.attn.b_{m}"][h], b[rows])


def test_gpt_neox_refusals(tmp_path):
    torch, hf, folder = _hf_neox(tmp_path, dict(num_hidden_layers=1))
    cfg = json.loads((folder / "config.json").read_text())
    # pickle-only checkpoints are refused without being opened
    pick = tmp_path / "pickle_only"
    pick.mkdir()
    (pick / "config.json").write_text(json.dumps(cfg))
    (pick / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(ValueError, match="never unpickles"):
        import_gpt_neox(str(pick))
    for change, msg in ((dict(hidden_act="quick_gelu"), "hidden_act"),
                        (dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                                               "partial_rotary_factor": 0.5}), "rope_scaling 'yarn'"),
                        (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                               "partial_rotary_factor": 0.4}), "even"),
                        (dict(model_type="llama"), "gpt_neox")):
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(ValueError, match=msg):
            import_gpt_neox(str(folder))


def test_gpt_neox_transformers4_config_fields(tmp_path):
    """Older config.json files spell RoPE as rotary_pct / rotary_emb_base at top level."""
    _, _, folder = _hf_neox(tmp_path, dict(num_hidden_layers=1))
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rotary_pct=0.25, rotary_emb_base=20000, layer_norm_eps=1e-05)
    (folder / "config.json").write_text(json.dumps(cfg))
    _, out = import_gpt_neox(str(folder))
    assert out["rotary_dim"] == 2 and out["rotary_base"] == 20000 and out["eps"] == "1e-05"


# ----------------------------------------------------------------------------- inspect_model

def test_describe_and_format(tmp_path, capsys):
    tensors, cfg = random_model("preln", n_layers=2, seed=0, **SMALL)
    path = tmp_path / "m.safetensors"
    sha = save_model(str(path), tensors, cfg)
    d = describe(load_model(str(path)))
    assert d["sha256"] == sha
    assert d["params_total"] == sum(v.size for v in tensors.values())
    assert sum(d["params_by_group"].values()) == d["params_total"]
    assert d["params_by_group"]["embed"] == 9 * 8 and d["params_by_group"]["pos_embed"] == 5 * 8
    assert d["params_by_group"]["layernorm"] == 2 * 2 * 2 * 8 + 2 * 8
    assert d["params_by_layer"][0] == d["params_by_layer"][1]
    assert d["config"]["act_fn"] == "gelu" and d["dtypes"] == ["float32"]
    text = format_description(d)
    assert sha in text and f"{d['params_total']:,}" in text and "learned positions" in text
    json.dumps(d)  # the description is plain JSON
    assert inspect_main([str(path)]) == 0 and sha in capsys.readouterr().out
    assert inspect_main([str(tmp_path / "missing.safetensors")]) == 2
    assert "error:" in capsys.readouterr().err
