"""The model reader's config fields and dtypes: BF16 enters exactly, earlier spellings are aliases of the
TransformerLens names, the Llama-family pieces imply their tensors, and the kinds that do not cover those
pieces refuse them in one line."""

import json
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.errors import BadInput
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.kinds import checker_for
from tcert.checker.modelfile import expected_shapes, load_model, parse_config, parse_model_bytes
from tcert.checker.obligations import Obligations
from tcert.generator.model.files import config_json, in_memory_model, model_bytes
from tcert.generator.model.random_models import random_model
from tcert.testing import CERTIFICATES

SMALL = dict(d_vocab=9, d_model=8, n_heads=4, d_head=2, d_mlp=12, n_ctx=6)


def bf16_values(tensors):
    """The tensors truncated to bfloat16 values (still float32 arrays)."""
    return {k: (np.asarray(v, np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in tensors.items()}


def test_bf16_tensors_enter_exactly():
    tensors, cfg = random_model("llama", seed=1, n_key_value_heads=2, **SMALL)
    t16 = bf16_values(tensors)
    data = model_bytes(t16, cfg, "bfloat16")
    n = int.from_bytes(data[:8], "little")
    assert {e["dtype"] for k, e in json.loads(data[8:8 + n]).items() if k != "__metadata__"} == {"BF16"}
    bf, f32 = parse_model_bytes(data), parse_model_bytes(model_bytes(t16, cfg, "float32"))
    assert len(data) < len(model_bytes(t16, cfg, "float32"))
    for k in t16:
        assert bf.tensors[k].dtype == np.float32 and np.array_equal(bf.tensors[k], t16[k]), k
        assert not bf.tensors[k].flags.writeable
    B = make_backend("flint")
    got = [(B.lower(x), B.upper(x)) for x in last_logits(B, bf, [1, 2, 3])]
    assert got == [(B.lower(x), B.upper(x)) for x in last_logits(B, f32, [1, 2, 3])]   # the same exact numbers
    with pytest.raises(ValueError, match="not exactly representable in bfloat16"):
        model_bytes(tensors, cfg, "bfloat16")   # the writer never rounds


def test_earlier_spellings_are_aliases():
    tensors, cfg = random_model("preln", seed=0, **SMALL)
    new = parse_config({**cfg, "attention_dir": "bidirectional", "tokenizer_name": "v.txt"})
    old = dict(cfg, attention="bidirectional", tokenizer="v.txt")
    old.pop("attention_dir")
    assert parse_config(old) == new and new.attention_dir == "bidirectional" and new.tokenizer_name == "v.txt"
    with pytest.raises(BadInput, match="both attention_dir and its earlier spelling attention"):
        parse_config({**cfg, "attention": "causal"})
    # shipped models written before the rename keep loading, with their SHA-256 unchanged by reading
    text = load_model(str(CERTIFICATES / "models" / "text_small.safetensors"))
    assert "tokenizer" in json.loads(text.metadata["config"]) and text.config.tokenizer_name.endswith(".vocab.txt")


def test_transformer_lens_defaults():
    tensors, cfg = random_model("attn-only", seed=0, **SMALL)
    bare = {k: cfg[k] for k in ("n_layers", "d_model", "n_heads", "d_head", "d_vocab", "n_ctx", "attn_only")}
    c = parse_config(bare)
    assert c.normalization_type == "LN" and c.act_fn == "relu" and c.use_attn_scale and c.attn_scale is None
    assert c.attention_dir == "causal" and c.rotary_scaling_factor == 1 and c.n_key_value_heads is None
    assert parse_config({**bare, "use_attn_scale": False}).attn_scale == 1   # scores divided by exactly 1
    round_trip = parse_config(config_json(parse_config({**bare, "use_attn_scale": False})))
    assert round_trip == parse_config({**bare, "use_attn_scale": False})


def test_llama_pieces_imply_their_tensors():
    _, cfg = random_model("llama", seed=0, n_key_value_heads=2, bias_std=0.1, **SMALL)
    c = parse_config(cfg)
    shapes = expected_shapes(c)
    assert shapes["blocks.0.attn._W_K"] == (2, 8, 2) and shapes["blocks.0.attn._b_V"] == (2, 2)
    assert shapes["blocks.0.attn.W_Q"] == (4, 8, 2) and "blocks.0.attn.W_K" not in shapes
    assert shapes["blocks.0.mlp.W_gate"] == (8, 12) and "blocks.0.ln1.b" not in shapes and "ln_final.b" not in shapes
    assert c.llama_pieces() == ["RMSNorm", "act_fn silu", "gated MLP", "grouped-query attention (n_key_value_heads)"]
    assert parse_config({**cfg, "rotary_scaling_factor": "8"}).llama_pieces()[-1] == "rotary_scaling_factor"


@pytest.mark.parametrize("kind, claim, message", [
    ("overwhelm", {}, "overwhelm: RMSNorm, act_fn silu, gated MLP"),
    ("influence", {"local": {}}, "claim.local: RMSNorm, act_fn silu, gated MLP"),
    ("accuracy", {}, "accuracy: model architecture: needs n_layers = n_heads = 1; needs an attention-only model"),
])
def test_kinds_that_do_not_cover_the_llama_pieces_refuse_in_one_line(kind, claim, message):
    model = in_memory_model(*random_model("llama", seed=0, n_layers=1, n_key_value_heads=2, parallel_attn_mlp=True,
                                          **SMALL))
    with pytest.raises(BadInput) as e:
        checker_for(kind)(model, claim, {}, make_backend("flint"), Obligations())
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_accuracy_refuses_rms_norm_and_grouped_keys():
    """An attention-only one-head RMSNorm or grouped-key model is not Max-of-K's: refused, not misread."""
    for over in (dict(normalization_type="RMS"), dict(n_key_value_heads=1)):
        t, cfg = random_model("attn-only", seed=0, **{**SMALL, "n_heads": 1, "d_head": 8, **over})
        with pytest.raises(BadInput, match="without normalization or grouped-query attention"):
            checker_for("accuracy")(in_memory_model(t, cfg), {}, {}, make_backend("flint"), Obligations())


def test_exact_config_numbers_for_the_new_fields():
    _, cfg = random_model("llama", seed=0, **SMALL)
    assert parse_config({**cfg, "rotary_scaling_factor": 2.5}).rotary_scaling_factor == Fraction(5, 2)
    with pytest.raises(BadInput, match="rotary_scaling_factor"):
        parse_config({**cfg, "rotary_scaling_factor": "-1"})
    with pytest.raises(BadInput, match="normalization_type must be null"):
        parse_config({**cfg, "normalization_type": "RMSPre"})
