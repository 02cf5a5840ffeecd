"""TransformerLens in memory: a HookedTransformer built from a HookedTransformerConfig (no download) becomes
a tcert Model without a file; its logits equal TransformerLens's; a certificate made from it verifies
against it and against the file `to_file` writes, whose SHA-256 is the in-memory model's."""

import numpy as np
import pytest

from tcert.checker.errors import Rejected
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.modelfile import load_model
from tcert.checker.verify import verify
from tcert.generator.certificate import num
from tcert.generator.model import forward as F
from tcert.generator.model.transformer_lens import from_hooked_transformer, to_file
from tcert.generator.prediction import prediction_certificate

torch = pytest.importorskip("torch")
tl = pytest.importorskip("transformer_lens")
pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated")]

SIZE = dict(n_layers=2, d_model=16, n_ctx=10, d_head=4, n_heads=4, d_mlp=24, d_vocab=13)

CASES = {
    "attn-only-standard": dict(attn_only=True, normalization_type=None, n_layers=1),
    "preln-gelu-LN": dict(act_fn="gelu", normalization_type="LN"),
    "preln-gelu-LN-folded": dict(act_fn="gelu", normalization_type="LN", fold=True),
    "rotary-parallel-adjacent": dict(act_fn="gelu_new", positional_embedding_type="rotary", rotary_dim=2,
                                     parallel_attn_mlp=True, rotary_adjacent_pairs=True),
    "rms-gated-gqa-f64": dict(act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
                              n_key_value_heads=2, gated_mlp=True, rotary_base=500, rotary_scaling_factor=2.0,
                              dtype=torch.float64),
    "bidirectional-no-attn-scale-relu": dict(act_fn="relu", attention_dir="bidirectional", use_attn_scale=False),
    "bf16-attn-scale": dict(act_fn="gelu", attn_scale=3.0, dtype=torch.bfloat16),
}


def hooked(seed=0, fold=False, **kw):
    cfg = tl.HookedTransformerConfig(**{**SIZE, **kw, "seed": seed})
    ht = tl.HookedTransformer(cfg).eval()
    torch.manual_seed(seed)
    with torch.no_grad():   # default init has zero biases and unit norm gains: perturb everything
        for p in ht.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    if fold:   # what from_pretrained does by default: LN folded into the next weights (LNPre)
        ht.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    return ht


@pytest.fixture(scope="module")
def converted():
    out = {}
    for j, (name, kw) in enumerate(CASES.items()):
        ht = hooked(seed=j, **kw)
        out[name] = (ht, from_hooked_transformer(ht))
    return out


def tl_logits(ht, toks):
    with torch.no_grad():
        return ht(torch.tensor(toks)).double().numpy()


@pytest.mark.parametrize("name", CASES)
def test_logits_equal_transformer_lens(converted, name):
    ht, model = converted[name]
    toks = np.random.default_rng(1).integers(0, SIZE["d_vocab"], (3, SIZE["n_ctx"]))
    want = tl_logits(ht, toks)
    # TransformerLens runs in its dtype; float64 models agree to float64 rounding
    rel = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 5e-2}[ht.cfg.dtype]
    tol = rel * np.abs(want).max()
    np.testing.assert_allclose(F.all_logits(model, toks[0]), want[0], rtol=0, atol=tol)
    np.testing.assert_allclose(F.logits(model, toks), want[:, -1], rtol=0, atol=tol)
    if ht.cfg.dtype == torch.float64:   # and the rigorous enclosure holds TransformerLens's float64 logits
        B = make_backend("flint")
        for j, x in enumerate(last_logits(B, model, toks[0].tolist())):
            assert float(B.lower(x)) - tol <= want[0, -1, j] <= float(B.upper(x)) + tol


def test_config_and_tensors_follow_transformer_lens(converted):
    c = {name: m.config for name, (_, m) in converted.items()}
    assert c["attn-only-standard"].attn_only and c["attn-only-standard"].normalization_type is None
    assert c["preln-gelu-LN-folded"].normalization_type == "LN" and c["preln-gelu-LN-folded"].final_ln
    _, folded = converted["preln-gelu-LN-folded"]
    assert (folded.tensors["blocks.1.ln2.w"] == 1).all() and not folded.tensors["ln_final.b"].any()
    g = c["rms-gated-gqa-f64"]
    assert (g.normalization_type, g.gated_mlp, g.n_key_value_heads, g.rotary_scaling_factor) == ("RMS", True, 2, 2)
    ht, m = converted["rms-gated-gqa-f64"]
    assert np.array_equal(m.tensors["blocks.0.attn._W_K"], ht.blocks[0].attn._W_K.detach().numpy())
    assert m.tensors["blocks.0.attn._W_K"].dtype == np.float64
    assert c["bidirectional-no-attn-scale-relu"].attention_dir == "bidirectional"
    assert c["bidirectional-no-attn-scale-relu"].attn_scale == 1
    assert c["bf16-attn-scale"].attn_scale == 3 and c["preln-gelu-LN"].attn_scale is None
    ht, m = converted["bf16-attn-scale"]   # bfloat16 weights enter exactly
    assert np.array_equal(m.tensors["blocks.1.mlp.W_in"], ht.blocks[1].mlp.W_in.detach().float().numpy())


@pytest.mark.parametrize("name", ["attn-only-standard", "preln-gelu-LN-folded", "rms-gated-gqa-f64",
                                  "bf16-attn-scale"])
def test_certificate_from_memory_verifies_and_binds_to_the_file(converted, tmp_path, name):
    ht, model = converted[name]
    cert, facts = prediction_certificate(model, [1, 2, 3, 4, 5])
    assert cert is not None and cert["model_sha256"] == model.sha256
    # the generator's 1e-9 slack can be thinner than the 64-bit rigorous pass: claim 1e-6 of the scale less
    cert["claim"]["margin"] = num(facts["gap"] - 1e-6 * np.abs(facts["logits"]).max())
    for backend in ("flint", "mpmath"):
        verify(cert, model, backend)
    path = tmp_path / "m.safetensors"
    assert to_file(model, str(path)) == model.sha256 == load_model(str(path)).sha256
    verify(cert, str(path), "flint")
    assert to_file(ht, str(tmp_path / "again.safetensors")) == model.sha256   # straight from the object
    other = from_hooked_transformer(hooked(seed=99, **CASES["attn-only-standard"]))
    with pytest.raises(Rejected, match="model binding"):
        verify(cert, other, "flint")


@pytest.mark.parametrize("change, message", [
    (dict(final_rms=True), "final_rms=True is not supported"),
    (dict(attn_types=["global", "local"], window_size=3, use_local_attn=True), "use_local_attn=True"),
    (dict(positional_embedding_type="shortformer"), "positional_embedding_type 'shortformer'"),
    (dict(act_fn="solu_ln"), "act_fn 'solu_ln'"),
    (dict(d_vocab_out=7), "d_vocab_out 7"),
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
])
def test_unsupported_configs_get_one_line(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
        from_hooked_transformer(hooked(**{"act_fn": "gelu", **change}))
    assert "\n" not in str(e.value)
