"""Convert trained models from other formats into tcert's (tensors, config_dict).

Supported sources, none of which is ever unpickled:
  * a TransformerLens state_dict saved as numpy `.npz` with `.` in names written as `__`;
  * a safetensors file with TransformerLens names plus a JSON config;
  * a Hugging Face GPT-NeoX checkpoint folder (config.json + model.safetensors, possibly sharded).
Each returns (tensors, config_dict) for `tcert.generator.model.files.save_model`. Anything that cannot be
represented exactly in the model-file semantics (other rope types, unknown activations, odd
rotary dims) is refused with a ValueError rather than approximated.
"""

import json
import math
import os
import re

import numpy as np

from tcert.checker.modelfile import CONFIG_DEFAULTS, CONFIG_INTS, expected_shapes, parse_config

# TransformerLens buffers and caches: not parameters of the function the model computes.
_BUFFER_SUFFIXES = ("mask", "IGNORE", "rotary_sin", "rotary_cos", "inv_freq", "masked_bias")


def _number(x):
    """A config number as written: ints stay ints, floats become the exact decimal of their repr."""
    if isinstance(x, bool):
        raise ValueError(f"expected a number, got {x!r}")
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"non-finite config number {x!r}")
        return int(x) if x.is_integer() else repr(x)
    return x


def infer_tl_config(tensors: dict, config=None) -> dict:
    """Infer a config dict from TransformerLens tensor names and shapes; `config` entries win.

    What shapes cannot tell (activation, parallel residual, rotary details, attention direction)
    must come from `config` when it matters: an MLP model without act_fn is refused, rotary models
    (no W_pos) need n_ctx; everything else gets the TransformerLens default.
    """
    config = dict(config or {})
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
    out["normalization_type"] = "LN" if has_ln else None
    if "blocks.0.mlp.W_in" in tensors:
        out["d_mlp"] = int(tensors["blocks.0.mlp.W_in"].shape[1])
        out["attn_only"] = False
        out["shared_ln"] = has_ln and "blocks.0.ln2.w" not in tensors
    else:
        out["attn_only"] = True
    out["final_ln"] = "ln_final.w" in tensors
    out.update(config)
    if out["positional_embedding_type"] == "rotary" and "n_ctx" not in out:
        raise ValueError("rotary model without pos_embed.W_pos: give n_ctx (and rotary_dim/rotary_base) in config")
    if not out["attn_only"] and "act_fn" not in out:
        raise ValueError("the model has an MLP: its act_fn (relu, gelu or gelu_new) must be given in config")
    unknown = set(out) - set(CONFIG_DEFAULTS) - set(CONFIG_INTS)
    if unknown:
        raise ValueError(f"unknown config field(s) {sorted(unknown)}")
    return out


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
        elif name.rsplit(".", 1)[1].startswith("b_"):
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
    return _finish_tl(tensors, infer_tl_config(tensors, config))


def import_safetensors(path: str, config_json_path=None):
    """Import a safetensors file with TransformerLens tensor names.

    The config comes from `config_json_path` (a JSON object of model-file config fields) when given,
    else from a 'config' entry in the file's own metadata; missing fields are inferred from shapes.
    """
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata() or {}
    if config_json_path is not None:
        with open(config_json_path, encoding="utf-8") as fh:
            config = json.load(fh)
    else:
        config = json.loads(meta["config"]) if "config" in meta else None
    if config is not None and not isinstance(config, dict):
        raise ValueError("config JSON must be an object")
    tensors = _drop_buffers(tensors)
    return _finish_tl(tensors, infer_tl_config(tensors, config))


# ----------------------------------------------------------------------------- GPT-NeoX

_HF_ACTS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_new",
            # torch's tanh-approximate GELU is the same formula as GPT-2's gelu_new
            "gelu_pytorch_tanh": "gelu_new"}


def _load_hf_safetensors(folder: str) -> dict:
    from safetensors.numpy import load_file

    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(single):
        return load_file(single)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as fh:
            weight_map = json.load(fh).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no weight_map object")
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            if os.path.basename(shard) != shard:
                raise ValueError(f"shard name {shard!r} points outside the checkpoint folder")
            tensors.update(load_file(os.path.join(folder, shard)))
        return tensors
    if any(n.endswith((".bin", ".pt", ".pth", ".ckpt")) for n in os.listdir(folder)):
        raise ValueError(f"{folder}: only pickle checkpoints found; convert to safetensors (tcert never unpickles)")
    raise ValueError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def _neox_rope(hf: dict):
    """(rotary fraction, base) from either the transformers-5 rope_parameters or the v4 fields."""
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling")
    if scaling:
        rope = {**scaling, **rope}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not plain RoPE; not representable")
    pct = rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    base = rope.get("rope_theta", hf.get("rotary_emb_base", 10000))
    return pct, base


def import_gpt_neox(folder: str):
    """Import a Hugging Face GPT-NeoX checkpoint folder (config.json + safetensors weights).

    The fused query_key_value weight has rows laid out [head, (q, k, v), d_head] (transformers'
    GPTNeoXAttention views the projection as (..., H, 3*Dh) and chunks the last axis), so it is
    split per head. Rotate-half RoPE on int(d_head * rotary_pct) components, causal attention,
    separate ln1/ln2 and a final LayerNorm; embed_out (or a tied embed_in) becomes W_U, b_U = 0.
    """
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
        hf = json.load(fh)
    if hf.get("model_type", "gpt_neox") != "gpt_neox":
        raise ValueError(f"model_type {hf.get('model_type')!r} is not gpt_neox")
    raw = _load_hf_safetensors(folder)
    raw = {k[len("gpt_neox."):] if k.startswith("gpt_neox.") else k: v for k, v in raw.items()}
    missing = [k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
               if not isinstance(hf.get(k), int)]
    if missing:
        raise ValueError(f"config.json lacks integer field(s) {missing}")
    if "embed_in.weight" not in raw:
        raise ValueError("checkpoint lacks gpt_neox.embed_in.weight")
    d, h, n_layers = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    if d % h:
        raise ValueError("hidden_size is not divisible by num_attention_heads")
    dh = d // h
    act = hf.get("hidden_act", "gelu")
    if act not in _HF_ACTS:
        raise ValueError(f"hidden_act {act!r} not supported (relu, gelu, gelu_new, gelu_pytorch_tanh)")
    pct, base = _neox_rope(hf)
    rotary_dim = int(dh * pct)  # transformers truncates the same way
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim = int({dh} * {pct}) = {rotary_dim} must be even and >= 2")
    w_e = raw["embed_in.weight"]
    d_vocab = w_e.shape[0]
    config = dict(n_layers=n_layers, d_model=d, n_heads=h, d_head=dh, d_vocab=int(d_vocab),
                  n_ctx=hf.get("max_position_embeddings", 2048), d_mlp=hf["intermediate_size"],
                  act_fn=_HF_ACTS[act], normalization_type="LN", eps=_number(hf.get("layer_norm_eps", 1e-5)),
                  positional_embedding_type="rotary", rotary_dim=rotary_dim, rotary_base=_number(base),
                  rotary_adjacent_pairs=False, parallel_attn_mlp=bool(hf.get("use_parallel_residual", True)),
                  shared_ln=False, final_ln=True, attn_only=False, attention="causal", attn_scale=None)

    used = set()

    def get(name, shape=None, zeros=False):
        used.add(name)
        if name in raw:
            arr = np.asarray(raw[name])
        elif zeros:  # attention_bias=False checkpoints have no bias tensors: zero is the same function
            arr = np.zeros(shape, np.float32)
        else:
            raise ValueError(f"checkpoint lacks {name}")
        if shape is not None and arr.shape != tuple(shape):
            raise ValueError(f"{name}: shape {arr.shape}, expected {tuple(shape)}")
        return arr.astype(np.float32) if arr.dtype not in (np.float32, np.float64) else arr

    t = {"embed.W_E": get("embed_in.weight", (d_vocab, d))}
    for i in range(n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        qkv_w = get(p + "attention.query_key_value.weight", (3 * d, d)).reshape(h, 3, dh, d)
        qkv_b = get(p + "attention.query_key_value.bias", (3 * d,), zeros=True).reshape(h, 3, dh)
        for j, m in enumerate("QKV"):
            t[o + f"attn.W_{m}"] = qkv_w[:, j].transpose(0, 2, 1)  # (H, D, Dh): x @ W
            t[o + f"attn.b_{m}"] = qkv_b[:, j]
        # dense acts on the concatenation of heads: input column h*Dh + e belongs to head h
        t[o + "attn.W_O"] = get(p + "attention.dense.weight", (d, d)).T.reshape(h, dh, d)
        t[o + "attn.b_O"] = get(p + "attention.dense.bias", (d,), zeros=True)
        for src, dst in (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2")):
            t[o + dst + ".w"] = get(p + src + ".weight", (d,))
            t[o + dst + ".b"] = get(p + src + ".bias", (d,), zeros=True)
        f = config["d_mlp"]
        t[o + "mlp.W_in"] = get(p + "mlp.dense_h_to_4h.weight", (f, d)).T
        t[o + "mlp.b_in"] = get(p + "mlp.dense_h_to_4h.bias", (f,), zeros=True)
        t[o + "mlp.W_out"] = get(p + "mlp.dense_4h_to_h.weight", (d, f)).T
        t[o + "mlp.b_out"] = get(p + "mlp.dense_4h_to_h.bias", (d,), zeros=True)
    t["ln_final.w"] = get("final_layer_norm.weight", (d,))
    t["ln_final.b"] = get("final_layer_norm.bias", (d,), zeros=True)
    # transformers 5 writes embed_out.weight (renamed from lm_head on save); accept either, and the
    # input embedding itself when the config ties them.
    for head in ("embed_out.weight", "lm_head.weight"):
        if head in raw:
            t["unembed.W_U"] = get(head, (d_vocab, d)).T
            break
    else:
        if not hf.get("tie_word_embeddings", False):
            raise ValueError("checkpoint has no embed_out.weight / lm_head.weight and embeddings are not tied")
        t["unembed.W_U"] = t["embed.W_E"].T
    t["unembed.b_U"] = np.zeros(d_vocab, np.float32)
    # Old checkpoints carry the causal mask and rotary tables as buffers; anything else unused means
    # the checkpoint computes something this importer does not model, so refuse it.
    leftover = sorted(k for k in set(raw) - used
                      if not re.fullmatch(r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)", k)
                      and k not in ("embed_out.weight", "lm_head.weight", "rotary_emb.inv_freq"))
    if leftover:
        raise ValueError(f"checkpoint tensor(s) {leftover[:4]} are not part of a GPT-NeoX model as imported")
    tensors = {k: np.ascontiguousarray(v) for k, v in t.items()}
    parse_config(dict(config))
    return tensors, config
