"""Write model files in the format `checker.modelfile` reads (safetensors + config metadata)."""

import json
from fractions import Fraction

import numpy as np
from safetensors.numpy import save

from tcert.checker.modelfile import Config, Model, load_model, parse_config, parse_model_bytes

DTYPES = ("float32", "float16", "bfloat16", "float64")


def config_json(config: Config) -> dict:
    """The config as the JSON object stored in a model file's metadata (exact numbers as "p/q" text)."""
    return {key: str(value) if isinstance(value, Fraction) else value for key, value in config.__dict__.items()}


def model_bytes(tensors: dict, config: dict, dtype="float32") -> bytes:
    """The bytes of the model file holding `tensors` in `dtype` (one of DTYPES) with `config`.

    float32 and float64 are the usual choices; float16 and bfloat16 keep half-precision checkpoints at their
    size. A value the dtype cannot hold exactly is refused (ValueError): a model file never rounds the
    weights it was given, except that float64 input written as float32 is rounded as numpy rounds it."""
    cfg = parse_config(dict(config))
    meta = {"config": json.dumps(config_json(cfg), sort_keys=True)}
    if dtype == "bfloat16":
        return _bf16_bytes(tensors, meta)
    if str(np.dtype(dtype)) not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {DTYPES}")
    arrays = {k: np.ascontiguousarray(np.asarray(v, dtype=dtype)) for k, v in tensors.items()}
    if np.dtype(dtype) == np.float16:
        _require_exact(tensors, arrays, "float16")
    return save(arrays, metadata=meta)


def _require_exact(tensors: dict, arrays: dict, dtype: str) -> None:
    for k, v in tensors.items():
        if not np.array_equal(np.asarray(v, np.float64), np.asarray(arrays[k], np.float64)):
            raise ValueError(f"{k}: a value is not exactly representable in {dtype}")


def _bf16_bytes(tensors: dict, meta: dict) -> bytes:
    """A safetensors file of BF16 tensors, written by hand (numpy has no bfloat16): header JSON padded with
    spaces to a multiple of 8, then each tensor's upper 16 float32 bits, in name order."""
    header, chunks, offset = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        f32 = np.ascontiguousarray(np.asarray(tensors[name], np.float32))
        _require_exact({name: tensors[name]}, {name: f32}, "float32")
        bits = f32.view(np.uint32)
        if (bits & 0xFFFF).any():
            raise ValueError(f"{name}: a value is not exactly representable in bfloat16")
        chunk = (bits >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(f32.shape), "data_offsets": [offset, offset + len(chunk)]}
        chunks.append(chunk)
        offset += len(chunk)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def save_model(path: str, tensors: dict, config: dict, dtype="float32") -> str:
    """Validate `config`, write `tensors` (in `dtype`) with it to `path`; return the SHA-256."""
    with open(path, "wb") as f:
        f.write(model_bytes(tensors, config, dtype))
    return load_model(path).sha256  # re-read: a file we write must pass the checker's reader


def in_memory_model(tensors: dict, config: dict, dtype="float32") -> Model:
    """The Model the file `save_model` would write, read from its bytes without touching the disk: its sha256
    is that file's, so a certificate made from it binds to the file."""
    return parse_model_bytes(model_bytes(tensors, config, dtype))


def write_model(model: Model, path: str) -> str:
    """Write an in-memory Model (from `in_memory_model`) to `path`, byte for byte the file it stands for, and
    return the SHA-256. The reader widens BF16 to float32, so float32 tensors are written as float32 or, when
    that does not reproduce model.sha256, as bfloat16; a model no dtype reproduces is refused."""
    kinds = {str(a.dtype) for a in model.tensors.values()}
    tries = ["float64"] if "float64" in kinds else ["float16"] if kinds == {"float16"} else ["float32", "bfloat16"]
    for dtype in tries:
        try:
            data = model_bytes(model.tensors, config_json(model.config), dtype)
        except ValueError:   # not representable in this dtype: the file was not written in it
            continue
        sha = parse_model_bytes(data).sha256
        if not model.sha256 or sha == model.sha256:
            with open(path, "wb") as f:
                f.write(data)
            return sha
    raise ValueError(f"no dtype of {tries} reproduces the model's SHA-256 {model.sha256}")
