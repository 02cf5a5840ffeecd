"""Import Hugging Face checkpoint folders (config.json + safetensors) into tcert's (tensors, config_dict).

Architectures, by config.json `model_type`:
  * `gpt2`: learned positions, LayerNorm, sequential MLP (gelu_new), Conv1D weights (stored (in, out)),
    tied or untied unembedding;
  * `gpt_neox` (Pythia): rotate-half RoPE on int(d_head * rotary_pct) components, parallel or sequential
    residual, fused per-head query_key_value;
  * `llama`, `mistral`, `qwen2` (the same block; TinyLlama and SmolLM are `llama`): RMSNorm, SiLU-gated MLP,
    grouped-query attention, RoPE with its base and plain linear scaling, biases where the checkpoint has
    them (qwen2's q/k/v), tied or untied embeddings.
Weights in float32, float16 or bfloat16 enter exactly (bf16 and f16 are binary rationals that float32
holds exactly: `read_safetensors` widens them without rounding). Sharded checkpoints
(model.safetensors.index.json) are read shard by shard. Nothing is ever unpickled: a folder with only
pytorch_model.bin is refused. Whatever the model format cannot represent exactly is refused with one
ValueError line naming it (e.g. "rope_scaling 'yarn' is not supported").
"""

import json
import math
import os
import re

import numpy as np

from tcert.checker.modelfile import parse_config

# Hugging Face hidden_act / activation_function -> the model format's act_fn. torch's tanh GELU
# ("gelu_pytorch_tanh") is GPT-2's gelu_new formula; "swish" is SiLU.
HF_ACTS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new",
           "silu": "silu", "swish": "silu"}
LLAMA_TYPES = ("llama", "mistral", "qwen2")
_NUMPY = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}


# ----------------------------------------------------------------------------- reading a folder

def _header(path: str):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file")
    return n, header


def safetensors_metadata(path: str) -> dict:
    """The string-to-string `__metadata__` of a safetensors file ({} when it has none)."""
    return _header(path)[1].get("__metadata__") or {}


def read_safetensors(path: str) -> dict:
    """name -> float array of a safetensors file; BF16 tensors are widened to float32 exactly (a bfloat16 is
    the upper 16 bits of the float32 with the same value). Integer or 8-bit (quantised) tensors are refused."""
    n, header = _header(path)
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if header else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        raw, shape = data[lo:hi], tuple(info["shape"])
        if info["dtype"] == "BF16":
            out[name] = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        elif info["dtype"] in _NUMPY:
            out[name] = np.array(raw.view(_NUMPY[info["dtype"]]).reshape(shape))
        else:
            raise ValueError(f"{os.path.basename(path)}: tensor {name} has dtype {info['dtype']}; only F32, F16, "
                             "BF16 and F64 weights are supported (no quantised checkpoints)")
    return out


def load_checkpoint(folder: str) -> dict:
    """All tensors of a checkpoint folder: model.safetensors, or the shards model.safetensors.index.json names."""
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(single):
        return read_safetensors(single)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as fh:
            weight_map = json.load(fh).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no weight_map object")
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            if os.path.basename(shard) != shard:
                raise ValueError(f"shard name {shard!r} points outside the checkpoint folder")
            tensors.update(read_safetensors(os.path.join(folder, shard)))
        return tensors
    if any(n.endswith((".bin", ".pt", ".pth", ".ckpt")) for n in os.listdir(folder)):
        raise ValueError(f"{folder}: only pickle checkpoints (pytorch_model.bin) found; convert to safetensors "
                         "(tcert never unpickles)")
    raise ValueError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def read_config(folder: str) -> dict:
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as fh:
        hf = json.load(fh)
    if not isinstance(hf, dict):
        raise ValueError("config.json is not a JSON object")
    return hf


def import_hf(folder: str):
    """Import the Hugging Face checkpoint folder `folder`, dispatching on config.json's model_type."""
    hf = read_config(folder)
    kind = hf.get("model_type", "gpt_neox")
    if kind == "gpt2":
        return import_gpt2(folder)
    if kind == "gpt_neox":
        return import_gpt_neox(folder)
    if kind in LLAMA_TYPES:
        return import_llama(folder)
    raise ValueError(f"model_type {kind!r} is not supported (gpt2, gpt_neox, {', '.join(LLAMA_TYPES)})")


# ----------------------------------------------------------------------------- shared pieces

def number(x):
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


def require_ints(hf: dict, keys) -> None:
    missing = [k for k in keys if isinstance(hf.get(k), bool) or not isinstance(hf.get(k), int)]
    if missing:
        raise ValueError(f"config.json lacks integer field(s) {missing}")


def act_fn(hf: dict, key: str, default: str) -> str:
    act = hf.get(key, default)
    if act not in HF_ACTS:
        raise ValueError(f"{key} {act!r} is not supported ({', '.join(sorted(HF_ACTS))})")
    return HF_ACTS[act]


def rope(hf: dict, default_fraction):
    """(rotary fraction, base, linear factor) from transformers-5 rope_parameters or the v4 fields
    (rope_scaling, rope_theta / rotary_emb_base, partial_rotary_factor / rotary_pct). Only plain RoPE and
    linear scaling are representable; every other rope type is refused by name."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling")
    if scaling:
        params = {**scaling, **params}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear"):
        raise ValueError(f"rope_scaling {kind!r} is not supported (plain RoPE and 'linear' scaling are)")
    factor = params.get("factor", 1) if kind == "linear" else 1
    fraction = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct",
                                                                                           default_fraction)))
    base = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000)))
    return fraction, number(base), number(factor)


class Take:
    """Checkpoint tensors handed out by name, each checked for shape; `leftover` lists what was not taken."""

    def __init__(self, raw: dict):
        self.raw, self.used = raw, set()

    def __call__(self, name, shape, zeros=False):
        self.used.add(name)
        if name in self.raw:
            arr = np.asarray(self.raw[name])
        elif zeros:   # checkpoints without a bias: a zero bias is the same function
            arr = np.zeros(shape, np.float32)
        else:
            raise ValueError(f"checkpoint lacks {name}")
        if arr.shape != tuple(shape):
            raise ValueError(f"{name}: shape {arr.shape}, expected {tuple(shape)}")
        return arr.astype(np.float32) if arr.dtype not in (np.float32, np.float64) else arr

    def has(self, name) -> bool:
        return name in self.raw

    def leftover(self, ignore: str) -> list:
        """Tensors not taken and not matching the regular expression `ignore` (buffers such as masks)."""
        return sorted(k for k in set(self.raw) - self.used if not re.fullmatch(ignore, k))


def unembedding(take: Take, hf: dict, w_e, names) -> np.ndarray:
    """W_U (D, V): the first of the output-head tensors `names` present, else the input embedding when the
    config ties them."""
    for name in names:
        if take.has(name):
            return take(name, w_e.shape).T
    if not hf.get("tie_word_embeddings", False):
        raise ValueError(f"checkpoint has no {' / '.join(names)} and tie_word_embeddings is false")
    return w_e.T


def finish(take: Take, t: dict, config: dict, ignore: str, arch: str):
    """Refuse checkpoint tensors the import did not place, validate the config, return (tensors, config)."""
    leftover = take.leftover(ignore)
    if leftover:
        raise ValueError(f"checkpoint tensor(s) {leftover[:4]} are not part of a {arch} model as imported")
    parse_config(dict(config))
    return {k: np.ascontiguousarray(v) for k, v in t.items()}, config


def strip(raw: dict, prefix: str) -> dict:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in raw.items()}


# ----------------------------------------------------------------------------- GPT-2

def import_gpt2(folder: str):
    """GPT-2 (`gpt2`): Conv1D layers store their weight as (in, out), so x @ W needs no transpose; c_attn's
    3*D output columns are [q | k | v], each split into heads of d_head consecutive columns."""
    hf = read_config(folder)
    require_ints(hf, ("n_embd", "n_head", "n_layer", "vocab_size", "n_positions"))
    for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"{flag} is not supported")
    d, h, n_layers = hf["n_embd"], hf["n_head"], hf["n_layer"]
    if d % h:
        raise ValueError("n_embd is not divisible by n_head")
    dh, f = d // h, hf.get("n_inner") or 4 * d
    take = Take(strip(load_checkpoint(folder), "transformer."))
    w_e = take("wte.weight", (hf["vocab_size"], d))
    config = dict(n_layers=n_layers, d_model=d, n_heads=h, d_head=dh, d_vocab=int(w_e.shape[0]),
                  n_ctx=hf["n_positions"], d_mlp=f, act_fn=act_fn(hf, "activation_function", "gelu_new"),
                  normalization_type="LN", eps=number(hf.get("layer_norm_epsilon", 1e-5)),
                  positional_embedding_type="standard", final_ln=True, attention_dir="causal",
                  use_attn_scale=bool(hf.get("scale_attn_weights", True)))
    t = {"embed.W_E": w_e, "pos_embed.W_pos": take("wpe.weight", (hf["n_positions"], d))}
    for i in range(n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        w, b = take(p + "attn.c_attn.weight", (d, 3 * d)), take(p + "attn.c_attn.bias", (3 * d,))
        for j, m in enumerate("QKV"):
            t[o + f"attn.W_{m}"] = w[:, j * d:(j + 1) * d].reshape(d, h, dh).transpose(1, 0, 2)
            t[o + f"attn.b_{m}"] = b[j * d:(j + 1) * d].reshape(h, dh)
        t[o + "attn.W_O"] = take(p + "attn.c_proj.weight", (d, d)).reshape(h, dh, d)
        t[o + "attn.b_O"] = take(p + "attn.c_proj.bias", (d,))
        for src, dst in (("ln_1", "ln1"), ("ln_2", "ln2")):
            t[o + dst + ".w"], t[o + dst + ".b"] = take(p + src + ".weight", (d,)), take(p + src + ".bias", (d,))
        t[o + "mlp.W_in"], t[o + "mlp.b_in"] = take(p + "mlp.c_fc.weight", (d, f)), take(p + "mlp.c_fc.bias", (f,))
        t[o + "mlp.W_out"] = take(p + "mlp.c_proj.weight", (f, d))
        t[o + "mlp.b_out"] = take(p + "mlp.c_proj.bias", (d,))
    t["ln_final.w"], t["ln_final.b"] = take("ln_f.weight", (d,)), take("ln_f.bias", (d,))
    t["unembed.W_U"] = unembedding(take, hf, w_e, ("lm_head.weight",))
    t["unembed.b_U"] = np.zeros(w_e.shape[0], np.float32)
    # old checkpoints carry the causal mask as attn.bias / attn.masked_bias buffers
    return finish(take, t, config, r"h\.\d+\.attn\.(bias|masked_bias)", "GPT-2")


# ----------------------------------------------------------------------------- GPT-NeoX

def import_gpt_neox(folder: str):
    """GPT-NeoX / Pythia (`gpt_neox`). The fused query_key_value weight has rows laid out [head, (q, k, v),
    d_head] (transformers views the projection as (..., H, 3*Dh) and chunks the last axis), so it is split
    per head. Rotate-half RoPE on int(d_head * rotary_pct) components (none at all when that is 0), causal
    attention, separate ln1/ln2 and a final LayerNorm; embed_out (or a tied embed_in) becomes W_U, b_U = 0."""
    hf = read_config(folder)
    if hf.get("model_type", "gpt_neox") != "gpt_neox":
        raise ValueError(f"model_type {hf.get('model_type')!r} is not gpt_neox")
    require_ints(hf, ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size"))
    d, h, n_layers, f = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"], hf["intermediate_size"]
    if d % h:
        raise ValueError("hidden_size is not divisible by num_attention_heads")
    dh = d // h
    fraction, base, factor = rope(hf, 0.25)
    rotary_dim = int(dh * fraction)  # transformers truncates the same way
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim = int({dh} * {fraction}) = {rotary_dim} must be even")
    take = Take(strip(load_checkpoint(folder), "gpt_neox."))
    if not take.has("embed_in.weight"):
        raise ValueError("checkpoint lacks gpt_neox.embed_in.weight")
    w_e = take("embed_in.weight", (take.raw["embed_in.weight"].shape[0], d))
    positions = dict(positional_embedding_type="rotary", rotary_dim=rotary_dim, rotary_base=base,
                     rotary_scaling_factor=factor) if rotary_dim else dict(positional_embedding_type="none")
    config = dict(n_layers=n_layers, d_model=d, n_heads=h, d_head=dh, d_vocab=int(w_e.shape[0]),
                  n_ctx=hf.get("max_position_embeddings", 2048), d_mlp=f, act_fn=act_fn(hf, "hidden_act", "gelu"),
                  normalization_type="LN", eps=number(hf.get("layer_norm_eps", 1e-5)), **positions,
                  parallel_attn_mlp=bool(hf.get("use_parallel_residual", True)), final_ln=True,
                  attention_dir="causal")
    t = {"embed.W_E": w_e}
    for i in range(n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        qkv_w = take(p + "attention.query_key_value.weight", (3 * d, d)).reshape(h, 3, dh, d)
        qkv_b = take(p + "attention.query_key_value.bias", (3 * d,), zeros=True).reshape(h, 3, dh)
        for j, m in enumerate("QKV"):
            t[o + f"attn.W_{m}"] = qkv_w[:, j].transpose(0, 2, 1)  # (H, D, Dh): x @ W
            t[o + f"attn.b_{m}"] = qkv_b[:, j]
        # dense acts on the concatenation of heads: input column h*Dh + e belongs to head h
        t[o + "attn.W_O"] = take(p + "attention.dense.weight", (d, d)).T.reshape(h, dh, d)
        t[o + "attn.b_O"] = take(p + "attention.dense.bias", (d,), zeros=True)
        for src, dst in (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2")):
            t[o + dst + ".w"] = take(p + src + ".weight", (d,))
            t[o + dst + ".b"] = take(p + src + ".bias", (d,), zeros=True)
        t[o + "mlp.W_in"] = take(p + "mlp.dense_h_to_4h.weight", (f, d)).T
        t[o + "mlp.b_in"] = take(p + "mlp.dense_h_to_4h.bias", (f,), zeros=True)
        t[o + "mlp.W_out"] = take(p + "mlp.dense_4h_to_h.weight", (d, f)).T
        t[o + "mlp.b_out"] = take(p + "mlp.dense_4h_to_h.bias", (d,), zeros=True)
    t["ln_final.w"] = take("final_layer_norm.weight", (d,))
    t["ln_final.b"] = take("final_layer_norm.bias", (d,), zeros=True)
    # transformers 5 writes embed_out.weight (renamed from lm_head on save); accept either, and the
    # input embedding itself when the config ties them.
    t["unembed.W_U"] = unembedding(take, hf, w_e, ("embed_out.weight", "lm_head.weight"))
    t["unembed.b_U"] = np.zeros(w_e.shape[0], np.float32)
    # Old checkpoints carry the causal mask and rotary tables as buffers.
    return finish(take, t, config, r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)|"
                                   r"rotary_emb\.inv_freq", "GPT-NeoX")


# ----------------------------------------------------------------------------- Llama family

def _llama_refusals(hf: dict, kind: str, n_ctx: int) -> None:
    """One line for each Llama-family feature the model format does not have."""
    layer_types = hf.get("layer_types") or []
    window = hf.get("sliding_window") if hf.get("use_sliding_window", True) else None
    if any(x != "full_attention" for x in layer_types) or (not layer_types and window is not None
                                                            and window < n_ctx):
        raise ValueError(f"sliding-window attention (sliding_window {window} < max_position_embeddings {n_ctx}) "
                         "is not supported")
    if hf.get("mlp_bias"):
        raise ValueError("mlp_bias is not supported (a bias inside the gated product)")
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "use_qk_norm", "qk_layernorm"):
        if hf.get(key):
            raise ValueError(f"{key} is not supported")
    if kind not in LLAMA_TYPES:
        raise ValueError(f"model_type {kind!r} is not one of {LLAMA_TYPES}")


def import_llama(folder: str):
    """The Llama block (`llama`, `mistral`, `qwen2`): RMSNorm before attention and MLP and at the end, rotate-
    half RoPE over the whole head, grouped-query attention when num_key_value_heads < num_attention_heads,
    the SiLU-gated MLP down(act(gate(x)) * up(x)) -> W_gate = gate^T, W_in = up^T, W_out = down^T. nn.Linear
    stores (out, in), so every projection is transposed; q/k/v/o biases are read when present."""
    hf = read_config(folder)
    require_ints(hf, ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                      "vocab_size"))
    d, h, n_layers, f = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"], hf["intermediate_size"]
    n_ctx = hf.get("max_position_embeddings", 2048)
    _llama_refusals(hf, hf.get("model_type"), n_ctx)
    dh, hk = hf.get("head_dim") or d // h, hf.get("num_key_value_heads") or h
    if h % hk:
        raise ValueError(f"num_key_value_heads {hk} does not divide num_attention_heads {h}")
    fraction, base, factor = rope(hf, 1.0)
    if fraction != 1:
        raise ValueError(f"partial_rotary_factor {fraction} is not supported for {hf.get('model_type')}")
    take = Take(strip(load_checkpoint(folder), "model."))
    w_e = take("embed_tokens.weight", (hf["vocab_size"], d))
    config = dict(n_layers=n_layers, d_model=d, n_heads=h, d_head=dh, d_vocab=int(w_e.shape[0]), n_ctx=n_ctx,
                  d_mlp=f, act_fn=act_fn(hf, "hidden_act", "silu"), gated_mlp=True, normalization_type="RMS",
                  eps=number(hf.get("rms_norm_eps", 1e-6)), positional_embedding_type="rotary", rotary_dim=dh,
                  rotary_base=base, rotary_scaling_factor=factor, final_ln=True, attention_dir="causal",
                  n_key_value_heads=hk if hk != h else None)
    kv = "_" if hk != h else ""
    t = {"embed.W_E": w_e}
    for i in range(n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        for m, heads, name in (("q", h, "W_Q"), ("k", hk, kv + "W_K"), ("v", hk, kv + "W_V")):
            t[o + "attn." + name] = take(p + f"self_attn.{m}_proj.weight", (heads * dh, d)).reshape(
                heads, dh, d).transpose(0, 2, 1)
            t[o + "attn." + name.replace("W_", "b_")] = take(p + f"self_attn.{m}_proj.bias", (heads * dh,),
                                                             zeros=True).reshape(heads, dh)
        t[o + "attn.W_O"] = take(p + "self_attn.o_proj.weight", (d, h * dh)).T.reshape(h, dh, d)
        t[o + "attn.b_O"] = take(p + "self_attn.o_proj.bias", (d,), zeros=True)
        t[o + "ln1.w"] = take(p + "input_layernorm.weight", (d,))
        t[o + "ln2.w"] = take(p + "post_attention_layernorm.weight", (d,))
        t[o + "mlp.W_gate"] = take(p + "mlp.gate_proj.weight", (f, d)).T
        t[o + "mlp.W_in"] = take(p + "mlp.up_proj.weight", (f, d)).T
        t[o + "mlp.b_in"] = np.zeros(f, np.float32)
        t[o + "mlp.W_out"] = take(p + "mlp.down_proj.weight", (d, f)).T
        t[o + "mlp.b_out"] = np.zeros(d, np.float32)
    t["ln_final.w"] = take("norm.weight", (d,))
    t["unembed.W_U"] = unembedding(take, hf, w_e, ("lm_head.weight",))
    t["unembed.b_U"] = np.zeros(w_e.shape[0], np.float32)
    return finish(take, t, config, r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq|rotary_emb\.inv_freq",
                  "Llama-family")
