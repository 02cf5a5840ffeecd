"""Hugging Face checkpoint folders -> tcert model files: GPT-2, GPT-NeoX/Pythia and the Llama family.

Every case builds a tiny model with `transformers` from a config (random init, every parameter perturbed so
that biases and norm gains are not trivially 0 and 1), casts it to the case's dtype and saves it with
save_pretrained (safetensors; sharded where the case says so). Nothing is downloaded. Then:
  * the import (`tcert model import FOLDER`) writes a model file the checker's reader accepts;
  * our float64 logits equal transformers' own forward pass run in float64 on the same stored weights
    (`.double()` of the saved dtype is exact), to float tolerance;
  * the checker's rigorous enclosure contains transformers' logits (up to that float tolerance);
  * a prediction certificate made from the imported file verifies with both backends.
Refusals: one line naming what is missing.
"""

import json
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.modelfile import load_model
from tcert.checker.verify import verify
from tcert.generator.cli import main as tcert_main
from tcert.generator.model import forward as F
from tcert.generator.model.hf import import_hf, read_safetensors
from tcert.generator.certificate import num
from tcert.generator.prediction import prediction_certificate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

V, N = 40, 12   # vocabulary and context of every tiny model
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def hf_model(arch: str, seed: int = 0, **kw):
    """A tiny transformers causal LM of `arch` with every parameter perturbed."""
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=V, n_positions=N, n_embd=16, n_layer=2, n_head=4, **kw)
        cls = transformers.GPT2LMHeadModel
    elif arch == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(vocab_size=V, max_position_embeddings=N, hidden_size=16, num_hidden_layers=2,
                                         num_attention_heads=2, intermediate_size=32, **kw)
        cls = transformers.GPTNeoXForCausalLM
    else:
        base = dict(vocab_size=V, max_position_embeddings=N, hidden_size=16, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=24)
        cfg_cls, cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[arch]
        cfg = cfg_cls(**{**base, **kw})
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def save(model, folder, dtype="f32", **save_kw):
    model = model.to(DTYPES[dtype])
    model.save_pretrained(str(folder), safe_serialization=True, **save_kw)
    return model.double()   # the stored values, exactly, for the float64 reference


def exact_rotary(ref, model):
    """transformers computes rotary angles in float32 whatever the model's dtype (about 1e-7 of the angle), and
    `.to(bfloat16)` even rounds its frequency buffer to bfloat16; for a float64 reference, swap its rotary
    tables for float64 ones of the imported config's frequencies, after checking that transformers' own
    frequencies are those up to that rounding (a misread base, fraction or scaling factor is far off)."""
    for module in [m for m in ref.modules() if hasattr(m, "inv_freq")]:
        theta = F._weights(model).theta
        np.testing.assert_allclose(module.inv_freq.double().numpy(), theta, rtol=1e-2)
        inv = torch.tensor(theta, dtype=torch.float64)

        def forward(x, position_ids, *args, **kw):
            freqs = position_ids[..., None].double() * inv
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        module.forward = forward


def exact_rms_norms(ref):
    """The Llama family's RMSNorm upcasts to float32, not to the model's float64: compute it in float64 (the
    same formula, x * rsqrt(mean(x^2) + eps) * weight)."""
    for module in [m for m in ref.modules() if type(m).__name__.endswith("RMSNorm")]:
        def forward(x, m=module):
            return m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
        module.forward = forward


def float64_reference(ref, model):
    if model.config.rotary:
        exact_rotary(ref, model)
    exact_rms_norms(ref)


def import_cli(folder, out):
    assert tcert_main(["model", "import", str(folder), "--out", str(out)]) == 0
    return load_model(str(out))


CASES = {
    "gpt2": ("gpt2", "f32", {}),
    "gpt2-untied-gelu-eps-ninner": ("gpt2", "f32", dict(tie_word_embeddings=False, activation_function="gelu",
                                                         layer_norm_epsilon=1e-3, n_inner=24)),
    "gpt2-no-attn-scale-bf16": ("gpt2", "bf16", dict(scale_attn_weights=False)),
    "gpt2-f16": ("gpt2", "f16", {}),
    "neox-parallel-bf16": ("gpt_neox", "bf16", dict(rotary_pct=0.5, use_parallel_residual=True)),
    "neox-sequential-f16": ("gpt_neox", "f16", dict(rotary_pct=1.0, use_parallel_residual=False)),
    "neox-rotary-pct-quarter-linear-scaling": ("gpt_neox", "f32", dict(rotary_pct=0.25, rope_scaling={
        "rope_type": "linear", "factor": 2.0})),
    "neox-rotary-pct-zero": ("gpt_neox", "f32", dict(rotary_pct=0.0)),
    "llama-gqa-untied": ("llama", "f32", {}),
    "llama-tied-linear-rope-bf16": ("llama", "bf16", dict(tie_word_embeddings=True, rope_theta=500.0, rope_scaling={
        "rope_type": "linear", "factor": 4.0})),
    "llama-mha-head-dim-biases-f16": ("llama", "f16", dict(num_key_value_heads=4, head_dim=8, attention_bias=True)),
    "qwen2-gqa-qkv-biases": ("qwen2", "f32", dict(num_key_value_heads=1)),
    "mistral-gqa-bf16": ("mistral", "bf16", dict(sliding_window=None, head_dim=4)),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """case -> (the float64 transformers model of the stored weights, the imported model file)."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for j, (name, (arch, dtype, kw)) in enumerate(CASES.items()):
        ref = save(hf_model(arch, seed=j, **kw), root / name, dtype)
        model = import_cli(root / name, root / f"{name}.safetensors")
        float64_reference(ref, model)
        out[name] = (ref, model)
    return out


def reference(ref, toks):
    with torch.no_grad():
        return ref(torch.tensor(toks)).logits.double().numpy()


@pytest.mark.parametrize("name", CASES)
def test_float_logits_equal_transformers(imported, name):
    ref, model = imported[name]
    toks = np.random.default_rng(1).integers(0, V, (4, N))
    want = reference(ref, toks)
    tol = 1e-9 * np.abs(want).max()
    for n in (1, 5, N):   # last-position logits of several lengths
        np.testing.assert_allclose(F.logits(model, toks[:, :n]), want[:, n - 1], rtol=0, atol=tol)
    np.testing.assert_allclose(F.all_logits(model, toks[0]), want[0], rtol=0, atol=tol)


@pytest.mark.parametrize("name", CASES)
def test_rigorous_enclosure_contains_transformers_logits(imported, name):
    ref, model = imported[name]
    toks = np.random.default_rng(2).integers(0, V, N).tolist()
    want = reference(ref, [toks])[0, -1]
    tol = 1e-9 * np.abs(want).max()
    B = make_backend("flint")
    for j, x in enumerate(last_logits(B, model, toks)):
        lo, hi = B.lower(x), B.upper(x)
        assert float(lo) - tol <= want[j] <= float(hi) + tol, (name, j, float(lo), want[j], float(hi))
        # meaningful, not merely wide (the width is the rigorous pass's own precision, not the importer's)
        assert hi - lo < 1000 * tol, f"{name}: enclosure of logit {j} is {float(hi - lo)} wide"


@pytest.mark.parametrize("name", CASES)
def test_prediction_certificate_verifies_with_both_backends(imported, name):
    _, model = imported[name]
    cert, facts = prediction_certificate(model, [3, 1, 4, 1, 5, 9, 2, 6])
    assert cert is not None, facts
    # The generator claims the float gap less 1e-9 of the logit scale; at 64 bits the rigorous pass is wider
    # than that on some of these models (its precision is the rigorous forward pass's, not the importer's),
    # so claim a margin 1e-6 of the scale below the float gap: still within a millionth of the truth.
    cert["claim"]["margin"] = num(facts["gap"] - 1e-6 * np.abs(facts["logits"]).max())
    claims = {verify(cert, model, backend).summary.split(" (certified")[0] for backend in ("flint", "mpmath")}
    assert len(claims) == 1   # both VERIFIED the same statement (their certified digits may differ)


def test_imported_configs_say_what_transformers_does(imported):
    c = {name: m.config for name, (_, m) in imported.items()}
    assert c["gpt2"].act_fn == "gelu_new" and c["gpt2"].positional_embedding_type == "standard"
    assert c["gpt2-untied-gelu-eps-ninner"].eps == Fraction(1, 1000) and c["gpt2-untied-gelu-eps-ninner"].d_mlp == 24
    assert c["gpt2-no-attn-scale-bf16"].attn_scale == 1 and not c["gpt2-no-attn-scale-bf16"].use_attn_scale
    assert c["neox-rotary-pct-zero"].positional_embedding_type == "none"
    assert c["neox-rotary-pct-quarter-linear-scaling"].rotary_dim == 2
    assert c["neox-rotary-pct-quarter-linear-scaling"].rotary_scaling_factor == 2
    llama = c["llama-gqa-untied"]
    assert (llama.normalization_type, llama.act_fn, llama.gated_mlp, llama.n_key_value_heads) == ("RMS", "silu", True, 2)
    assert c["llama-tied-linear-rope-bf16"].rotary_base == 500 and c["llama-tied-linear-rope-bf16"].rotary_scaling_factor == 4
    assert c["llama-mha-head-dim-biases-f16"].n_key_value_heads is None and c["llama-mha-head-dim-biases-f16"].d_head == 8
    assert c["qwen2-gqa-qkv-biases"].n_key_value_heads == 1
    # qwen2 has q/k/v biases and no output bias; tied GPT-2 unembeds with W_E^T exactly
    _, q = imported["qwen2-gqa-qkv-biases"]
    assert q.tensors["blocks.0.attn._b_K"].any() and not q.tensors["blocks.0.attn.b_O"].any()
    _, g = imported["gpt2"]
    assert np.array_equal(g.tensors["unembed.W_U"], g.tensors["embed.W_E"].T)


def test_bf16_and_f16_weights_enter_exactly(tmp_path):
    """Every stored bf16/f16 value reaches the model file unchanged (no rounding anywhere)."""
    for dtype in ("bf16", "f16"):
        hf = hf_model("llama", seed=5).to(DTYPES[dtype])
        hf.save_pretrained(str(tmp_path / dtype), safe_serialization=True)
        model = import_cli(tmp_path / dtype, tmp_path / f"{dtype}.safetensors")
        w = hf.model.layers[1].mlp.down_proj.weight.detach().double().numpy()
        assert np.array_equal(model.tensors["blocks.1.mlp.W_out"], w.T)
        raw = read_safetensors(str(tmp_path / dtype / "model.safetensors"))
        assert np.array_equal(raw["model.embed_tokens.weight"], model.tensors["embed.W_E"])


def test_sharded_checkpoints(tmp_path):
    for arch in ("gpt2", "llama"):
        ref = save(hf_model(arch), tmp_path / arch, "bf16", max_shard_size="4KB")
        assert (tmp_path / arch / "model.safetensors.index.json").exists()
        assert not (tmp_path / arch / "model.safetensors").exists()
        model = F.as_model(*import_hf(str(tmp_path / arch)))
        float64_reference(ref, model)
        toks = np.random.default_rng(3).integers(0, V, (2, N))
        want = reference(ref, toks)[:, -1]
        got = F.logits(model, toks)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * np.abs(want).max())


# ----------------------------------------------------------------------------- refusals

def _config_change(tmp_path, arch, change, **kw):
    folder = tmp_path / arch
    if not folder.exists():
        save(hf_model(arch, **kw), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


REFUSALS = [
    ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}), "rope_scaling 'yarn' is not supported"),
    ("llama", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "rope_scaling 'dynamic'"),
    ("llama", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}), "rope_scaling 'llama3'"),
    ("llama", dict(mlp_bias=True), "mlp_bias is not supported"),
    ("llama", dict(hidden_act="quick_gelu"), "hidden_act 'quick_gelu' is not supported"),
    ("llama", dict(model_type="gemma"), "model_type 'gemma' is not supported"),
    ("llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor 0.5"),
    ("mistral", dict(sliding_window=4), "sliding-window attention (sliding_window 4"),
    ("qwen2", dict(use_sliding_window=True, sliding_window=4, layer_types=["sliding_attention"] * 2), "sliding-window"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx is not supported"),
    ("gpt_neox", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.375}),
     "int(8 * 0.375) = 3 must be even"),
]


@pytest.mark.parametrize("arch, change, message", REFUSALS, ids=[r[2][:30] for r in REFUSALS])
def test_unsupported_checkpoints_get_one_line(tmp_path, capsys, arch, change, message):
    kw = dict(sliding_window=None) if arch == "mistral" else {}
    folder = _config_change(tmp_path, arch, change, **kw)
    capsys.readouterr()   # transformers' own progress output while saving
    assert tcert_main(["model", "import", str(folder), "--out", str(tmp_path / "m.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR: model import: ") and message in err and err.count("\n") == 1, err


def test_pickle_and_quantised_checkpoints_are_refused(tmp_path):
    from safetensors.numpy import save_file
    folder = _config_change(tmp_path, "gpt2", {})
    pick = tmp_path / "pickle_only"
    pick.mkdir()
    (pick / "config.json").write_text((folder / "config.json").read_text())
    (pick / "pytorch_model.bin").write_bytes(b"never opened")
    with pytest.raises(ValueError, match="never unpickles"):
        import_hf(str(pick))
    quant = tmp_path / "int8"
    quant.mkdir()
    (quant / "config.json").write_text((folder / "config.json").read_text())
    save_file({"transformer.wte.weight": np.zeros((V, 16), np.int8)}, str(quant / "model.safetensors"))
    with pytest.raises(ValueError, match="dtype I8; only F32, F16, BF16 and F64"):
        import_hf(str(quant))
