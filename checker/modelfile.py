"""Read a model file: safetensors with TransformerLens tensor names and the config in its metadata.

The reader is part of the trusted base, so it parses the safetensors layout itself (8-byte
little-endian header length, a JSON header, raw little-endian tensor bytes) instead of trusting a
library: every offset, shape, dtype and config field is checked against the others, non-finite
weights are refused, and nothing is ever unpickled. Any problem raises `BadInput` with one line.
"""

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.numbers import show

MAX_MODEL_BYTES = 8 << 30
MAX_HEADER_BYTES = 16 << 20
MAX_TENSORS = 4096
MAX_DIM = 1 << 22

# BF16 has no numpy dtype: its 16 bits are read as <u2 and widened to float32 exactly (`_widen_bf16`).
DTYPES = {"F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}

CONFIG_DEFAULTS = {
    "d_mlp": None,
    "act_fn": "relu",
    "normalization_type": "LN",
    "eps": "1/100000",
    "positional_embedding_type": "standard",
    "rotary_dim": None,
    "rotary_base": 10000,
    "rotary_adjacent_pairs": False,
    "rotary_scaling_factor": 1,
    "parallel_attn_mlp": False,
    "shared_ln": False,
    "final_ln": False,
    "attn_only": False,
    "gated_mlp": False,
    "n_key_value_heads": None,
    "attention_dir": "causal",
    "use_attn_scale": True,
    "attn_scale": None,
    "tokenizer_name": None,
}
# Spellings of earlier versions of the format, read as the TransformerLens name they stand for.
CONFIG_ALIASES = {"attention": "attention_dir", "tokenizer": "tokenizer_name"}
# Config numbers: a decimal with optional exponent ("1e-05", "0.5", "10000") or a ratio ("1/100000").
_CONFIG_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\Z|[+-]?[0-9]+/[0-9]+\Z")
CONFIG_INTS = ("n_layers", "d_model", "n_heads", "d_head", "d_vocab", "n_ctx")
ACT_FNS = ("relu", "gelu", "gelu_new", "silu")
NORMALIZATIONS = (None, "LN", "RMS")


@dataclass
class Config:
    """The architecture a model file declares (TransformerLens field names)."""

    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_vocab: int
    n_ctx: int
    d_mlp: int | None
    act_fn: str
    normalization_type: str | None
    eps: Fraction
    positional_embedding_type: str
    rotary_dim: int | None
    rotary_base: Fraction
    rotary_adjacent_pairs: bool
    rotary_scaling_factor: Fraction  # positions are divided by it (linear RoPE scaling); 1: none
    parallel_attn_mlp: bool
    shared_ln: bool
    final_ln: bool
    attn_only: bool
    gated_mlp: bool
    n_key_value_heads: int | None  # None: every head has its own keys and values
    attention_dir: str
    use_attn_scale: bool
    attn_scale: Fraction | None  # None: the divisor is sqrt(d_head); 1 when use_attn_scale is false
    tokenizer_name: str | None

    @property
    def rotary(self) -> bool:
        return self.positional_embedding_type == "rotary"

    @property
    def has_ln(self) -> bool:
        """LayerNorm (mean-centred, with bias); RMSNorm is `has_rms`."""
        return self.normalization_type == "LN"

    @property
    def has_rms(self) -> bool:
        return self.normalization_type == "RMS"

    @property
    def has_norm(self) -> bool:
        return self.normalization_type is not None

    def llama_pieces(self) -> list:
        """The architecture pieces beyond the GPT-2/GPT-NeoX set that this model uses (RMSNorm, SiLU, gated
        MLP, grouped-query attention, linear RoPE scaling): kinds that do not cover them refuse by this list."""
        return [name for name, used in (
            ("RMSNorm", self.has_rms), ("act_fn silu", self.act_fn == "silu" and not self.attn_only),
            ("gated MLP", self.gated_mlp), ("grouped-query attention (n_key_value_heads)", self.n_key_value_heads),
            ("rotary_scaling_factor", self.rotary and self.rotary_scaling_factor != 1)) if used]


@dataclass
class Model:
    """A validated model: its config, its tensors (read-only numpy arrays) and the file's SHA-256."""

    config: Config
    tensors: dict
    sha256: str
    path: str = ""
    metadata: dict = field(default_factory=dict)

    def __getitem__(self, name):
        return self.tensors[name]


def _exact_config_number(value, key) -> Fraction:
    """Config numbers are exact decimals: 1e-5 means exactly 1/100000, not the nearest double."""
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise BadInput(f"model config: {key} must be a number")
    text = repr(value) if isinstance(value, float) else str(value)
    form = _CONFIG_NUMBER.match(text)
    if len(text) > 100 or not form or abs(int(form.group(1) or 0)) > 100:
        # Fraction("1e999999999") would build a billion-digit integer: refuse before parsing.
        raise BadInput(f"model config: {key}={text[:40]!r} is not a decimal, p/q or exponent within 100")
    try:
        out = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise BadInput(f"model config: {key}={text!r} is not an exact number") from None
    if out <= 0 or out > 10 ** 12 or out.denominator > 10 ** 30:
        raise BadInput(f"model config: {key}={show(out)} out of range (0, 10^12] with denominator <= 10^30")
    return out


def parse_config(raw: dict) -> Config:
    """Validate a config dict and fill defaults; raise BadInput on anything inconsistent."""
    if not isinstance(raw, dict):
        raise BadInput("model config: not a JSON object")
    raw = _canonical_names(raw)
    unknown = set(raw) - set(CONFIG_DEFAULTS) - set(CONFIG_INTS)
    if unknown:
        raise BadInput(f"model config: unknown field(s) {sorted(k[:40] for k in unknown)[:5]}")
    cfg = {**CONFIG_DEFAULTS, **raw}
    _check_dimensions(cfg)
    _check_choices(cfg)
    for key in ("eps", "rotary_base", "rotary_scaling_factor"):
        cfg[key] = _exact_config_number(cfg[key], key)
    if cfg["attn_scale"] is not None:
        cfg["attn_scale"] = _exact_config_number(cfg["attn_scale"], "attn_scale")
    _check_parts(cfg)
    _check_heads(cfg)
    return Config(**{k: cfg[k] for k in Config.__dataclass_fields__})


def _canonical_names(raw: dict) -> dict:
    """The config with earlier spellings (`attention`, `tokenizer`) renamed to their TransformerLens names."""
    out = dict(raw)
    for old, new in CONFIG_ALIASES.items():
        if old in out:
            if new in out:
                raise BadInput(f"model config: both {new} and its earlier spelling {old} are given")
            out[new] = out.pop(old)
    return out


def _check_dimensions(cfg: dict) -> None:
    """The sizes: integers in [1, MAX_DIM]; at most 64 layers and 1024 heads."""
    for key in CONFIG_INTS:
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
            raise BadInput(f"model config: {key} must be an integer in [1, {MAX_DIM}], got {show(v)}")
    if cfg["n_layers"] > 64 or cfg["n_heads"] > 1024:
        raise BadInput(f"model config: n_layers {show(cfg['n_layers'])} or n_heads {show(cfg['n_heads'])} "
                       "out of range (at most 64 and 1024)")


def _check_choices(cfg: dict) -> None:
    """The switches: booleans and one of the named choices each."""
    for key in ("rotary_adjacent_pairs", "parallel_attn_mlp", "shared_ln", "final_ln", "attn_only", "gated_mlp",
                "use_attn_scale"):
        if not isinstance(cfg[key], bool):
            raise BadInput(f"model config: {key} must be true or false")
    if cfg["act_fn"] not in ACT_FNS:
        raise BadInput(f"model config: act_fn must be one of {ACT_FNS}")
    if cfg["normalization_type"] not in NORMALIZATIONS:
        raise BadInput("model config: normalization_type must be null, \"LN\" or \"RMS\"")
    if cfg["positional_embedding_type"] not in ("standard", "rotary", "none"):
        raise BadInput("model config: positional_embedding_type must be standard, rotary or none")
    if cfg["attention_dir"] not in ("causal", "bidirectional"):
        raise BadInput("model config: attention_dir must be causal or bidirectional")


def _check_parts(cfg: dict) -> None:
    """The fields that depend on others: d_mlp (dropped when attn_only), rotary_dim (default d_head), the
    tokenizer name, and final/shared LN (need LN)."""
    if cfg["attn_only"]:
        cfg["d_mlp"], cfg["gated_mlp"] = None, False
    elif isinstance(cfg["d_mlp"], bool) or not isinstance(cfg["d_mlp"], int) or not 1 <= cfg["d_mlp"] <= MAX_DIM:
        raise BadInput(f"model config: d_mlp must be an integer in [1, {MAX_DIM}] unless attn_only, "
                       f"got {show(cfg['d_mlp'])}")
    if cfg["positional_embedding_type"] == "rotary":
        rd = cfg["rotary_dim"]
        if rd is None:
            rd = cfg["rotary_dim"] = cfg["d_head"]
        if isinstance(rd, bool) or not isinstance(rd, int) or rd < 2 or rd % 2 or rd > cfg["d_head"]:
            raise BadInput(f"model config: rotary_dim must be even and in [2, d_head = {cfg['d_head']}], "
                           f"got {show(rd)}")
    if cfg["tokenizer_name"] is not None and not isinstance(cfg["tokenizer_name"], str):
        raise BadInput("model config: tokenizer_name must be a string or null")
    if cfg["normalization_type"] is None and (cfg["final_ln"] or cfg["shared_ln"]):
        raise BadInput("model config: final_ln/shared_ln need normalization_type \"LN\" or \"RMS\"")


def _check_heads(cfg: dict) -> None:
    """n_key_value_heads divides n_heads; without the attention scale (TransformerLens use_attn_scale false)
    scores are divided by exactly 1."""
    kv = cfg["n_key_value_heads"]
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or cfg["n_heads"] % kv):
        raise BadInput(f"model config: n_key_value_heads must be null or a divisor of n_heads = {cfg['n_heads']}, "
                       f"got {show(kv)}")
    if not cfg["use_attn_scale"]:
        if cfg["attn_scale"] not in (None, 1):
            raise BadInput(f"model config: attn_scale {show(cfg['attn_scale'])} given but use_attn_scale is false")
        cfg["attn_scale"] = Fraction(1)


def expected_shapes(c: Config) -> dict:
    """Every tensor name a model with config `c` must contain, with its shape."""
    d, v, h, dh = c.d_model, c.d_vocab, c.n_heads, c.d_head
    shapes = {"embed.W_E": (v, d), "unembed.W_U": (d, v), "unembed.b_U": (v,)}
    if c.positional_embedding_type == "standard":   # rotary and none have no position table
        shapes["pos_embed.W_pos"] = (c.n_ctx, d)
    norm = (".w",) if c.has_rms else (".w", ".b")   # RMSNorm has a gain and no bias
    kv, hk = kv_names(c), c.n_key_value_heads or h
    for i in range(c.n_layers):
        p = f"blocks.{i}."
        for m, heads in (("W_Q", h), (kv["W_K"], hk), (kv["W_V"], hk)):
            shapes[p + "attn." + m] = (heads, d, dh)
        for b, heads in (("b_Q", h), (kv["b_K"], hk), (kv["b_V"], hk)):
            shapes[p + "attn." + b] = (heads, dh)
        shapes[p + "attn.W_O"] = (h, dh, d)
        shapes[p + "attn.b_O"] = (d,)
        if c.has_norm:
            shapes.update({p + "ln1" + s: (d,) for s in norm})
            if not c.attn_only and not c.shared_ln:
                shapes.update({p + "ln2" + s: (d,) for s in norm})
        if not c.attn_only:
            shapes[p + "mlp.W_in"] = (d, c.d_mlp)
            shapes[p + "mlp.b_in"] = (c.d_mlp,)
            shapes[p + "mlp.W_out"] = (c.d_mlp, d)
            shapes[p + "mlp.b_out"] = (d,)
            if c.gated_mlp:
                shapes[p + "mlp.W_gate"] = (d, c.d_mlp)
    if c.final_ln:
        shapes.update({"ln_final" + s: (d,) for s in norm})
    return shapes


def kv_names(c: Config) -> dict:
    """The tensor names of keys and values: with n_key_value_heads set they are TransformerLens's grouped
    `_W_K`, `_W_V`, `_b_K`, `_b_V` (one per key/value head), else `W_K`, ... (one per head)."""
    pre = "_" if c.n_key_value_heads is not None else ""
    return {m: pre + m for m in ("W_K", "W_V", "b_K", "b_V")}


def _read_header(data: bytes):
    if len(data) < 8:
        raise BadInput("model file: shorter than the 8-byte safetensors header length")
    n = int.from_bytes(data[:8], "little")
    if n > MAX_HEADER_BYTES or n > len(data) - 8:
        raise BadInput(f"model file: header length {show(n)} exceeds the file ({show(len(data) - 8)} bytes after "
                       f"it) or the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadInput(f"model file: header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise BadInput("model file: header is not a JSON object")
    return header, 8 + n


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def load_model(path: str) -> Model:
    """Read, hash and validate the model file at `path`; raise BadInput on any defect."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MODEL_BYTES + 1)
    except OSError as e:
        raise BadInput(f"model file: cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_MODEL_BYTES:
        raise BadInput(f"model file: larger than {MAX_MODEL_BYTES} bytes")
    model = parse_model_bytes(data)
    model.path = path
    return model


def parse_model_bytes(data: bytes) -> Model:
    """Validate the bytes of a model file and return the Model they describe."""
    sha = hashlib.sha256(data).hexdigest()
    header, start = _read_header(data)
    meta = header.pop("__metadata__", {})
    config = parse_config(_config_object(meta))
    tensors = _read_tensors(data, header, start, expected_shapes(config))
    return Model(config=config, tensors=tensors, sha256=sha, metadata=meta)


def _config_object(meta) -> dict:
    """The JSON config object in the safetensors metadata (a string-to-string map)."""
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise BadInput("model file: __metadata__ must map strings to strings")
    if "config" not in meta:
        raise BadInput("model file: no 'config' in the safetensors metadata")
    try:
        return json.loads(meta["config"], object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError):
        raise BadInput("model file: metadata 'config' is not valid JSON") from None


def _read_tensors(data: bytes, header: dict, start: int, expected: dict) -> dict:
    """name -> read-only array for every header entry: exactly the config's tensors, each of its
    declared dtype and shape, inside the body, finite, and no two overlapping."""
    if len(header) > MAX_TENSORS:
        raise BadInput(f"model file: {show(len(header))} tensors, more than {MAX_TENSORS}")
    missing, extra = sorted(set(expected) - set(header)), sorted(k[:80] for k in set(header) - set(expected))
    if missing:
        raise BadInput(f"model file: missing tensor(s) {missing[:4]} required by the config")
    if extra:
        raise BadInput(f"model file: unexpected tensor(s) {extra[:4]} for the config")
    body, spans, tensors = len(data) - start, [], {}
    for name, info in header.items():
        dtype, shape, (lo, hi) = _tensor_entry(name, info, expected[name], body)
        spans.append((lo, hi, name))
        arr = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=start + lo).reshape(shape)
        if info["dtype"] == "BF16":
            arr = _widen_bf16(arr)
        if not np.isfinite(arr).all():
            raise BadInput(f"model file: tensor {name} contains NaN or infinity")
        tensors[name] = arr
    spans.sort()
    for (a_lo, a_hi, a), (b_lo, b_hi, b) in zip(spans, spans[1:]):
        if b_lo < a_hi:
            raise BadInput(f"model file: tensors {a} and {b} overlap (bytes {show(b_lo)} < {show(a_hi)})")
    return tensors


def _widen_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values as float32, exactly: a bfloat16 is the upper half of the float32 with the same value."""
    out = (bits.astype(np.uint32) << 16).view(np.float32)
    out.flags.writeable = False
    return out


def _tensor_entry(name: str, info, shape_wanted: tuple, body: int):
    """(dtype, shape, data_offsets) of one header entry, checked against the config's shape and the body."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise BadInput(f"model file: tensor {name}: entry must have dtype, shape, data_offsets")
    dtype = DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise BadInput(f"model file: tensor {name}: dtype {str(info['dtype'])[:20]!r} not one of {sorted(DTYPES)}")
    shape = info["shape"]
    if not isinstance(shape, list) or not all(_is_int(s) and 0 <= s <= MAX_DIM for s in shape):
        raise BadInput(f"model file: tensor {name}: shape must be a list of integers in [0, {MAX_DIM}]")
    if tuple(shape) != shape_wanted:
        raise BadInput(f"model file: tensor {name}: shape {tuple(shape)} but the config implies {shape_wanted}")
    offs = info["data_offsets"]
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) for o in offs)):
        raise BadInput(f"model file: tensor {name}: data_offsets must be two integers")
    size = math.prod(shape) * dtype.itemsize
    if not 0 <= offs[0] <= offs[1] <= body or offs[1] - offs[0] != size:
        raise BadInput(f"model file: tensor {name}: data_offsets [{show(offs[0])}, {show(offs[1])}] do not fit "
                       f"{show(size)} bytes in a {show(body)}-byte body")
    return dtype, shape, offs


def _is_int(x) -> bool:
    """A JSON integer (not a boolean)."""
    return isinstance(x, int) and not isinstance(x, bool)
