"""TransformerLens in memory: a `HookedTransformer` (its `cfg` and `state_dict()`) as a tcert model, no file.

    from tcert.generator.model.transformer_lens import from_hooked_transformer, to_file
    model = from_hooked_transformer(ht)      # a checker Model; model.sha256 is the file's it stands for
    cert, facts = prediction_certificate(model, tokens)   # binds to that SHA-256
    to_file(model, "m.safetensors")           # the file itself, byte for byte, when asked

The model file already uses TransformerLens's tensor names (embed.W_E, blocks.0.attn.W_Q, the grouped
blocks.0.attn._W_K, blocks.0.mlp.W_gate, ...) and config names (docs/model-format.md has the mapping
table), so the conversion is mostly a copy: buffers (mask, IGNORE, rotary tables) are dropped, folded norms
(LNPre / RMSPre, what `from_pretrained(fold_ln=True)` gives) become LN / RMS with gain 1 and bias 0, and
bfloat16 / float16 weights are widened to float32 exactly. The tcert model is the function in exact real
arithmetic of those weights; a TransformerLens feature the format cannot express is refused with one
ValueError line naming it. Needs `torch` and `transformer-lens` (the `tl` extra) only for the object
handed in; nothing here imports them.
"""

import math

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.modelfile import Model
from tcert.generator.model.files import in_memory_model, write_model
from tcert.generator.model.hf import number
from tcert.generator.model.importers import unfold_norms

_BUFFERS = ("mask", "IGNORE", "rotary_sin", "rotary_cos", "inv_freq")
_ACTS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "silu": "silu"}
_NORMS = {None: None, "LN": "LN", "LNPre": "LN", "RMS": "RMS", "RMSPre": "RMS"}
# TransformerLens switches the model format has no counterpart for: (field, value meaning "off").
_OFF = (("final_rms", False), ("use_local_attn", False), ("scale_attn_by_inverse_layer_idx", False),
        ("use_qk_norm", False), ("clip_qkv", None), ("use_logn_attn", False), ("use_dynamic_ntk_rope", False),
        ("use_NTK_by_parts_rope", False), ("use_yarn_rope", False), ("post_embedding_ln", False),
        ("use_normalization_before_and_after", False), ("num_experts", None), ("use_attention_sinks", False),
        ("load_in_4bit", False), ("attn_scores_soft_cap", -1.0), ("output_logits_soft_cap", -1.0))
_POST_NORM = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")


def tl_config(cfg) -> dict:
    """The model-file config of a HookedTransformerConfig (or anything with its attributes)."""
    on = [f"{name}={getattr(cfg, name)!r}" for name, off in _OFF if getattr(cfg, name, off) not in (off, 0)]
    if any(t != "global" for t in (getattr(cfg, "attn_types", None) or [])):
        on.append(f"attn_types={cfg.attn_types!r}")
    if getattr(cfg, "original_architecture", None) in _POST_NORM:
        on.append(f"original_architecture={cfg.original_architecture!r} (post-norm)")
    if on:
        raise ValueError(f"TransformerLens {', '.join(on)} is not supported")
    if cfg.normalization_type not in _NORMS or cfg.act_fn not in _ACTS and not cfg.attn_only:
        raise ValueError(f"TransformerLens normalization_type {cfg.normalization_type!r} / act_fn {cfg.act_fn!r} "
                         f"is not supported ({sorted(k for k in _NORMS if k)} / {sorted(_ACTS)})")
    if cfg.positional_embedding_type not in ("standard", "rotary"):
        raise ValueError(f"TransformerLens positional_embedding_type {cfg.positional_embedding_type!r} is not "
                         "supported (standard, rotary)")
    if getattr(cfg, "d_vocab_out", cfg.d_vocab) not in (cfg.d_vocab, -1):
        raise ValueError(f"d_vocab_out {cfg.d_vocab_out} differs from d_vocab {cfg.d_vocab}: not supported")
    out = dict(n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head,
               d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, attn_only=bool(cfg.attn_only),
               d_mlp=None if cfg.attn_only else cfg.d_mlp, act_fn=_ACTS.get(cfg.act_fn, "relu"),
               gated_mlp=bool(getattr(cfg, "gated_mlp", False)), normalization_type=_NORMS[cfg.normalization_type],
               final_ln=cfg.normalization_type is not None, eps=number(float(cfg.eps)),
               positional_embedding_type=cfg.positional_embedding_type, parallel_attn_mlp=bool(cfg.parallel_attn_mlp),
               n_key_value_heads=getattr(cfg, "n_key_value_heads", None), attention_dir=cfg.attention_dir,
               use_attn_scale=bool(cfg.use_attn_scale), tokenizer_name=getattr(cfg, "tokenizer_name", None))
    if cfg.use_attn_scale and float(cfg.attn_scale) != math.sqrt(cfg.d_head):
        out["attn_scale"] = number(float(cfg.attn_scale))   # sqrt(d_head) (the default) stays exact
    if cfg.positional_embedding_type == "rotary":
        out.update(rotary_dim=cfg.rotary_dim, rotary_base=number(cfg.rotary_base),
                   rotary_adjacent_pairs=bool(cfg.rotary_adjacent_pairs),
                   rotary_scaling_factor=number(float(getattr(cfg, "rotary_scaling_factor", 1.0))))
    return out


def _numpy(t) -> np.ndarray:
    """A torch tensor as numpy: float64 stays, every narrower float becomes float32 (exact)."""
    t = t.detach().cpu()
    return t.double().numpy() if str(t.dtype) == "torch.float64" else t.float().numpy()


def tl_tensors(state_dict: dict, cfg) -> dict:
    """The model-file tensors of a HookedTransformer state_dict: buffers dropped (folded norms: `unfold_norms`)."""
    return {k: _numpy(v) for k, v in state_dict.items() if k.rsplit(".", 1)[-1] not in _BUFFERS}


def from_hooked_transformer(model, dtype=None) -> Model:
    """The tcert Model of a HookedTransformer, built in memory. Its sha256 is the SHA-256 of the model file
    `to_file` writes (float32, or float64 when the weights are), so certificates made from it bind to that
    file. Raises ValueError (one line) on a feature the model format cannot express."""
    cfg = model.cfg
    # unfold_norms reads TransformerLens's own normalization_type (LNPre / RMSPre: unit gains to add)
    tensors, config = unfold_norms(tl_tensors(model.state_dict(), cfg),
                                   {**tl_config(cfg), "normalization_type": cfg.normalization_type})
    if dtype is None:
        dtype = "float64" if any(a.dtype == np.float64 for a in tensors.values()) else "float32"
    try:
        return in_memory_model(tensors, config, dtype)
    except BadInput as e:   # the checker's reader names the tensor or field it refused
        raise ValueError(f"HookedTransformer does not convert: {e}") from None


def to_file(model, path: str) -> str:
    """Write a tcert Model built in memory (or a HookedTransformer, converted first) to `path`; return the
    SHA-256, equal to model.sha256."""
    if not isinstance(model, Model):
        model = from_hooked_transformer(model)
    return write_model(model, path)
