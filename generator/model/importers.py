"""Convert trained models from other formats into tcert's (tensors, config_dict).

Supported sources, none of which is ever unpickled:
  * a TransformerLens state_dict saved as numpy `.npz` with `.` in names written as `__`;
  * a safetensors file with TransformerLens names plus a JSON config;
  * a Hugging Face checkpoint folder (config.json + model.safetensors, possibly sharded): GPT-2, GPT-NeoX /
    Pythia and the Llama family (`tcert.generator.model.hf`, re-exported here);
  * a TransformerLens HookedTransformer in memory (`tcert.generator.model.transformer_lens`).
Each returns (tensors, config_dict) for `tcert.generator.model.files.save_model`. Anything that cannot be
represented exactly in the model-file semantics (other rope types, unknown activations, odd
rotary dims) is refused with a ValueError rather than approximated.
"""

import json
import re

import numpy as np

from tcert.checker.modelfile import CONFIG_ALIASES, CONFIG_DEFAULTS, CONFIG_INTS, expected_shapes, parse_config
from tcert.generator.model.hf import (import_gpt2, import_gpt_neox, import_hf, import_llama, read_safetensors,
                                     safetensors_metadata)

__all__ = ["infer_tl_config", "import_npz", "import_safetensors", "import_hf", "import_gpt2", "import_gpt_neox",
           "import_llama"]

# TransformerLens buffers and caches: not parameters of the function the model computes.
_BUFFER_SUFFIXES = ("mask", "IGNORE", "rotary_sin", "rotary_cos", "inv_freq", "masked_bias")


def infer_tl_config(tensors: dict, config=None) -> dict:
    """Infer a config dict from TransformerLens tensor names and shapes; `config` entries win.

    What shapes cannot tell (activation, parallel residual, rotary details, attention direction)
    must come from `config` when it matters: an MLP model without act_fn is refused, rotary models
    (no W_pos) need n_ctx; everything else gets the TransformerLens default.
    """
    config = {CONFIG_ALIASES.get(k, k): v for k, v in (config or {}).items()}
    if "embed.W_E" not in tensors or "blocks.0.attn.W_Q" not in tensors:
        raise ValueError("not a TransformerLens state_dict: embed.W_E or blocks.0.attn.W_Q missing")
    d_vocab, d_model = tensors["embed.W_E"].shape
    n_heads, _, d_head = tensors["blocks.0.attn.W_Q"].shape
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"blocks\.(\d+)\.", k))}
    n_layers = max(layers) + 1
    if layers != set(range(n_layers)):
        raise ValueError(f"blocks are not numbered 0..{n_layers - 1}: {sorted(layers)}")
    out = dict(n_layers=n_layers, d_model=int(d_model), n_heads=int(n_heads), d_head=int(d_head),
               d_vocab=int(d_vocab))
    if "pos_embed.W_pos" in tensors:
        out["positional_embedding_type"] = "standard"
        out["n_ctx"] = int(tensors["pos_embed.W_pos"].shape[0])
    else:
        out["positional_embedding_type"] = "rotary"
    has_ln = "blocks.0.ln1.w" in tensors
    # RMSNorm has a gain and no bias; grouped keys/values are TransformerLens's _W_K/_W_V
    out["normalization_type"] = ("LN" if "blocks.0.ln1.b" in tensors else "RMS") if has_ln else None
    if "blocks.0.attn._W_K" in tensors:
        out["n_key_value_heads"] = int(tensors["blocks.0.attn._W_K"].shape[0])
    if "blocks.0.mlp.W_in" in tensors:
        out["d_mlp"] = int(tensors["blocks.0.mlp.W_in"].shape[1])
        out["attn_only"] = False
        out["shared_ln"] = has_ln and "blocks.0.ln2.w" not in tensors
        out["gated_mlp"] = "blocks.0.mlp.W_gate" in tensors
    else:
        out["attn_only"] = True
    out["final_ln"] = "ln_final.w" in tensors
    out.update(config)
    if out["positional_embedding_type"] == "rotary" and "n_ctx" not in out:
        raise ValueError("rotary model without pos_embed.W_pos: give n_ctx (and rotary_dim/rotary_base) in config")
    if not out["attn_only"] and "act_fn" not in out:
        raise ValueError("the model has an MLP: its act_fn (relu, gelu, gelu_new or silu) must be given in config")
    unknown = set(out) - set(CONFIG_DEFAULTS) - set(CONFIG_INTS)
    if unknown:
        raise ValueError(f"unknown config field(s) {sorted(unknown)}")
    return out


def unfold_norms(tensors: dict, config: dict) -> tuple:
    """A folded TransformerLens state dict (normalization_type "LNPre" / "RMSPre", what from_pretrained with
    fold_ln=True gives: the norm's gain and bias are folded into the next weights, the state dict has none) as
    LN / RMS with gain 1 and bias 0, which computes the same function. Other configs pass unchanged."""
    kind = config.get("normalization_type")
    if kind not in ("LNPre", "RMSPre"):
        return tensors, config
    d, out = tensors["embed.W_E"].shape[1], dict(tensors)
    names = ["ln_final"] + [f"blocks.{i}.ln{j}" for i in range(config["n_layers"])
                            for j in ((1,) if config.get("attn_only") else (1, 2))]
    for name in names:
        out[name + ".w"] = np.ones(d, np.float32)
        if kind == "LNPre":
            out[name + ".b"] = np.zeros(d, np.float32)
    return out, {**config, "normalization_type": kind[:-3], "final_ln": True, "shared_ln": False}


def _finish_tl(tensors: dict, config: dict):
    """Check names and shapes against the config, fill absent biases with zeros, cast to float32."""
    parsed = parse_config(dict(config))
    shapes = expected_shapes(parsed)
    out = {}
    for name, shape in shapes.items():
        if name in tensors:
            arr = np.asarray(tensors[name])
            if arr.shape != shape:
                raise ValueError(f"{name}: shape {arr.shape}, config implies {shape}")
        elif name.rsplit(".", 1)[1].lstrip("_").startswith("b_"):
            # TransformerLens variants without biases: a zero bias is the same function.
            arr = np.zeros(shape, np.float32)
        else:
            raise ValueError(f"tensor {name} required by the config is missing")
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"{name}: dtype {arr.dtype} is not floating point")
        if not np.isfinite(arr).all():
            raise ValueError(f"{name}: contains NaN or infinity")
        out[name] = np.ascontiguousarray(arr.astype(np.float32) if arr.dtype != np.float64 else arr)
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise ValueError(f"tensor(s) {extra[:4]} have no place in the config {config}")
    return out, config


def _drop_buffers(tensors: dict) -> dict:
    return {k: v for k, v in tensors.items() if not k.rsplit(".", 1)[-1] in _BUFFER_SUFFIXES}


def import_npz(path: str, config=None):
    """Import a TransformerLens state_dict stored as `.npz` (names with `.` written as `__`).

    `config` (dict, optional) fixes fields the tensors cannot show (e.g. act_fn, attention); the rest
    is inferred from names and shapes. Buffers such as `mask` and `IGNORE` are skipped.
    """
    with np.load(path, allow_pickle=False) as data:
        tensors = {k.replace("__", "."): data[k] for k in data.files}
    tensors = _drop_buffers(tensors)
    return _finish_tl(*unfold_norms(tensors, infer_tl_config(tensors, config)))


def import_safetensors(path: str, config_json_path=None):
    """Import a safetensors file with TransformerLens tensor names.

    The config comes from `config_json_path` (a JSON object of model-file config fields) when given,
    else from a 'config' entry in the file's own metadata; missing fields are inferred from shapes.
    """
    tensors, meta = read_safetensors(path), safetensors_metadata(path)
    if config_json_path is not None:
        with open(config_json_path, encoding="utf-8") as fh:
            config = json.load(fh)
    else:
        config = json.loads(meta["config"]) if "config" in meta else None
    if config is not None and not isinstance(config, dict):
        raise ValueError("config JSON must be an object")
    tensors = _drop_buffers(tensors)
    return _finish_tl(*unfold_norms(tensors, infer_tl_config(tensors, config)))
