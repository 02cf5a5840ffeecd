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


# --- reading and hashing in one pass (`read_hashed`) -------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 7, 8, 64, 1000])
@pytest.mark.parametrize("limit_extra", [-1, 0, 1, 50])
def test_read_hashed_is_read_then_sha256(tmp_path, monkeypatch, size, limit_extra):
    """The bytes and digest equal f.read(limit) and its SHA-256, at chunk sizes that split the file anywhere
    (a chunk the hashing thread skipped, or the tail past the size hint, would change the digest)."""
    import hashlib
    from tcert.checker import modelfile
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "m.bin"
    path.write_bytes(data)
    limit = max(size + limit_extra, 0)
    for chunk in (1, 3, 8, 1 << 20):
        monkeypatch.setattr(modelfile, "READ_CHUNK", chunk)
        with open(path, "rb") as f:
            got, sha = modelfile.read_hashed(f, limit)
        assert bytes(got) == data[:limit] and sha == hashlib.sha256(data[:limit]).hexdigest()


def test_read_hashed_reads_past_the_size_hint(tmp_path):
    """A pipe (size hint 0) and a file longer than its hint are read to the limit and hashed whole; the bytes
    come back read-only, so no array on them can be written after the hash."""
    import hashlib, os, threading
    from tcert.checker import modelfile
    data = bytes(range(256)) * 40
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    writer.start()
    with os.fdopen(r, "rb") as f:
        got, sha = modelfile.read_hashed(f, len(data) + 1)
    writer.join()
    assert bytes(got) == data and sha == hashlib.sha256(data).hexdigest()

    class Growing:
        """A file whose fstat says 100 bytes (another file's descriptor) while it holds 300."""
        def __init__(self, path, hint):
            self.f, self.h = open(path, "rb"), open(hint, "rb")
        def fileno(self):
            return self.h.fileno()
        def readinto(self, b):
            return self.f.readinto(b)
        def read(self, n):
            return self.f.read(n)
    path, hint = tmp_path / "long", tmp_path / "hint"
    path.write_bytes(data[:300])
    hint.write_bytes(b"x" * 100)
    g = Growing(path, hint)
    got, sha = modelfile.read_hashed(g, 10_000)
    g.f.close(), g.h.close()
    assert bytes(got) == data[:300] and sha == hashlib.sha256(data[:300]).hexdigest()
    with open(path, "rb") as f:
        view, _ = modelfile.read_hashed(f, 10_000)
    assert isinstance(view, memoryview) and view.readonly


def test_loaded_model_is_read_only_and_hashed(tmp_path):
    """load_model's digest is the SHA-256 of the file; its tensors cannot be written."""
    import hashlib
    from tcert.generator.model.files import save_model
    tensors, config = random_model("neox1l", seed=3, n_layers=1, **SMALL)
    path = tmp_path / "m.safetensors"
    save_model(str(path), tensors, config)
    model = load_model(str(path))
    assert model.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert not any(t.flags.writeable for t in model.tensors.values())
