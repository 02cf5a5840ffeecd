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
        parts.append(f"MLP d_mlp {cfg.d_mlp} {cfg.act_fn} ({'parallel' if cfg.parallel_attn_mlp else 'sequential'})")
    if cfg.has_ln:
        parts.append("LayerNorm" + (" shared" if cfg.shared_ln else "") + (" + final" if cfg.final_ln else ""))
    else:
        parts.append("no LayerNorm")
    if cfg.positional_embedding_type == "rotary":
        parts.append(f"RoPE (rotary_dim {cfg.rotary_dim}, base {cfg.rotary_base})")
    else:
        parts.append({"none": "no positional embedding", "standard": "learned positions"}[cfg.positional_embedding_type])
    parts.append(f"{cfg.attention} attention")
    if cfg.tokenizer is not None:
        parts.append(f"tokenizer {cfg.tokenizer}")
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
