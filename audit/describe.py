"""Informational facts about a model file: architecture in one line, parameter count, provenance.

Read by no rule of the checker. The generator copies them into a certificate's `model` field; the report
computes them again from the model file it was handed (whose bytes the certificate binds by SHA-256).
"""

import json
import math
import os


def architecture(cfg) -> str:
    """The architecture a model config declares, in one line (TransformerLens vocabulary)."""
    parts = [f"{cfg.n_layers} layer(s)", f"d_model {cfg.d_model}", f"{cfg.n_heads} head(s) x d_head {cfg.d_head}",
             f"d_vocab {cfg.d_vocab}", f"n_ctx {cfg.n_ctx}"]
    if cfg.attn_only:
        parts.append("attention-only")
    else:
        parts.append(f"{'gated ' if cfg.gated_mlp else ''}MLP d_mlp {cfg.d_mlp} {cfg.act_fn} "
                     f"({'parallel' if cfg.parallel_attn_mlp else 'sequential'})")
    if cfg.has_norm:
        parts.append(("LayerNorm" if cfg.has_ln else "RMSNorm") + (" shared" if cfg.shared_ln else "")
                     + (" + final" if cfg.final_ln else ""))
    else:
        parts.append("no LayerNorm")
    if cfg.n_key_value_heads is not None:
        parts.append(f"grouped-query attention ({cfg.n_key_value_heads} key/value head(s))")
    if cfg.positional_embedding_type == "rotary":
        scaling = f", scaling factor {cfg.rotary_scaling_factor}" if cfg.rotary_scaling_factor != 1 else ""
        parts.append(f"RoPE (rotary_dim {cfg.rotary_dim}, base {cfg.rotary_base}{scaling})")
    else:
        parts.append({"none": "no positional embedding", "standard": "learned positions"}[cfg.positional_embedding_type])
    parts.append(f"{cfg.attention_dir} attention" + ("" if cfg.use_attn_scale else ", unscaled scores"))
    if cfg.tokenizer_name is not None:
        parts.append(f"tokenizer {cfg.tokenizer_name}")
    return ", ".join(parts)


def parameter_count(model) -> int:
    """Number of stored weights (every tensor's entries)."""
    return sum(math.prod(a.shape) for a in model.tensors.values())


def provenance(model):
    """The provenance `tcert model import` recorded in the model file's metadata (a dict), or None."""
    text = model.metadata.get("provenance")
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]}
    return value if isinstance(value, dict) else {"unreadable": text[:200]}


def model_info(model) -> dict:
    """The certificate's informational `model` field: file name, architecture, parameters, provenance."""
    return {"file": os.path.basename(model.path) if model.path else None, "architecture": architecture(model.config),
            "parameters": parameter_count(model), "provenance": provenance(model)}
