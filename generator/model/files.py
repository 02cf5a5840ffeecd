"""Write model files in the format `checker.modelfile` reads (safetensors + config metadata).

Besides `config`, the metadata may hold `provenance` (JSON text; informational, read by no checker rule):
what `tcert model import` converted, as `provenance_of` describes it. Its bytes are part of the model file,
so a certificate's model_sha256 binds them too.
"""

import hashlib
import json
import os
from fractions import Fraction

import numpy as np
from safetensors.numpy import save

from tcert.checker.modelfile import Config, Model, load_model, parse_config, parse_model_bytes

DTYPES = ("float32", "float16", "bfloat16", "float64")


def config_json(config: Config) -> dict:
    """The config as the JSON object stored in a model file's metadata (exact numbers as "p/q" text)."""
    return {key: str(value) if isinstance(value, Fraction) else value for key, value in config.__dict__.items()}


def file_sha256(path: str) -> str:
    """SHA-256 of a file's bytes (read in 16 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            h.update(block)
    return h.hexdigest()


def provenance_of(src: str, config_path: str | None = None) -> dict:
    """What an import read: the source's name (no folders above it), format and SHA-256.

    A file: its SHA-256 (`sha256sum FILE`). A folder (a checkpoint): `files` maps each regular, non-hidden
    file at its top level to its SHA-256, and `sha256` is the SHA-256 of that listing as `sha256sum` prints
    it, sorted by name: `(cd FOLDER && sha256sum $(LC_ALL=C ls -p | grep -v /)) | sha256sum`. A
    config.json's `model_type` (Hugging Face) names the format. `config_path`: the --config file, if any."""
    src = os.path.normpath(src)
    out = {"source": os.path.basename(src), "tool": "tcert model import"}
    if os.path.isdir(src):
        names = sorted((n for n in os.listdir(src) if not n.startswith(".") and os.path.isfile(os.path.join(src, n))),
                       key=lambda n: n.encode())
        files = {n: file_sha256(os.path.join(src, n)) for n in names}
        out["format"] = "checkpoint folder" + _model_type(os.path.join(src, "config.json"))
        out["sha256"] = hashlib.sha256("".join(f"{h}  {n}\n" for n, h in files.items()).encode()).hexdigest()
        out["files"] = files
    else:
        out["format"] = os.path.splitext(src)[1].lstrip(".") or "file"
        out["sha256"] = file_sha256(src)
    if config_path:
        out["config"] = {"source": os.path.basename(config_path), "sha256": file_sha256(config_path)}
    return out


def _model_type(path: str) -> str:
    """' (Hugging Face model_type X)' from a checkpoint's config.json, or ''."""
    try:
        with open(path, encoding="utf-8") as f:
            kind = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return ""
    return f" (Hugging Face model_type {kind})" if isinstance(kind, str) else ""


def model_bytes(tensors: dict, config: dict, dtype="float32", provenance: dict | None = None) -> bytes:
    """The bytes of the model file holding `tensors` in `dtype` (one of DTYPES) with `config` (and
    `provenance` as metadata, when given).

    float32 and float64 are the usual choices; float16 and bfloat16 keep half-precision checkpoints at their
    size. A value the dtype cannot hold exactly is refused (ValueError): a model file never rounds the
    weights it was given, except that float64 input written as float32 is rounded as numpy rounds it."""
    cfg = parse_config(dict(config))
    meta = {"config": json.dumps(config_json(cfg), sort_keys=True)}
    if provenance is not None:
        meta["provenance"] = json.dumps(provenance, sort_keys=True)
    if dtype == "bfloat16":
        return _bf16_bytes(tensors, meta)
    if str(np.dtype(dtype)) not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {DTYPES}")
    arrays = {k: np.ascontiguousarray(np.asarray(v, dtype=dtype)) for k, v in tensors.items()}
    if np.dtype(dtype) == np.float16:
        _require_exact(tensors, arrays, "float16")
    if provenance is None:
        return save(arrays, metadata=meta)
    # safetensors keeps __metadata__ in a hash map, whose key order varies from process to process once it
    # holds two keys: with provenance the file is written by hand, in a fixed order (config, provenance).
    tag = {"float16": "F16", "float32": "F32", "float64": "F64"}[str(np.dtype(dtype))]
    return _hand_written({k: (tag, a.shape, a.astype(a.dtype.newbyteorder("<")).tobytes()) for k, a in arrays.items()},
                         meta)


def _require_exact(tensors: dict, arrays: dict, dtype: str) -> None:
    for k, v in tensors.items():
        if not np.array_equal(np.asarray(v, np.float64), np.asarray(arrays[k], np.float64)):
            raise ValueError(f"{k}: a value is not exactly representable in {dtype}")


def _bf16_bytes(tensors: dict, meta: dict) -> bytes:
    """A safetensors file of BF16 tensors, written by hand (numpy has no bfloat16): header JSON padded with
    spaces to a multiple of 8, then each tensor's upper 16 float32 bits, in name order."""
    out = {}
    for name in sorted(tensors):
        f32 = np.ascontiguousarray(np.asarray(tensors[name], np.float32))
        _require_exact({name: tensors[name]}, {name: f32}, "float32")
        bits = f32.view(np.uint32)
        if (bits & 0xFFFF).any():
            raise ValueError(f"{name}: a value is not exactly representable in bfloat16")
        out[name] = ("BF16", f32.shape, (bits >> 16).astype("<u2").tobytes())
    return _hand_written(out, meta)


def _hand_written(tensors: dict, meta: dict) -> bytes:
    """A safetensors file of `tensors` {name: (dtype tag, shape, little-endian bytes)} in name order, with
    `meta` as __metadata__ in its own key order: header JSON padded with spaces to a multiple of 8."""
    header, chunks, offset = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        tag, shape, chunk = tensors[name]
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [offset, offset + len(chunk)]}
        chunks.append(chunk)
        offset += len(chunk)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def save_model(path: str, tensors: dict, config: dict, dtype="float32", provenance: dict | None = None) -> str:
    """Validate `config`, write `tensors` (in `dtype`) with it to `path` (and `provenance` as metadata);
    return the SHA-256."""
    with open(path, "wb") as f:
        f.write(model_bytes(tensors, config, dtype, provenance))
    return load_model(path).sha256  # re-read: a file we write must pass the checker's reader


def in_memory_model(tensors: dict, config: dict, dtype="float32", provenance: dict | None = None) -> Model:
    """The Model the file `save_model` would write, read from its bytes without touching the disk: its sha256
    is that file's, so a certificate made from it binds to the file."""
    return parse_model_bytes(model_bytes(tensors, config, dtype, provenance))


def write_model(model: Model, path: str) -> str:
    """Write an in-memory Model (from `in_memory_model`) to `path`, byte for byte the file it stands for, and
    return the SHA-256. The reader widens BF16 to float32, so float32 tensors are written as float32 or, when
    that does not reproduce model.sha256, as bfloat16; a model no dtype reproduces is refused."""
    kinds = {str(a.dtype) for a in model.tensors.values()}
    tries = ["float64"] if "float64" in kinds else ["float16"] if kinds == {"float16"} else ["float32", "bfloat16"]
    provenance = json.loads(model.metadata["provenance"]) if "provenance" in model.metadata else None
    for dtype in tries:
        try:
            data = model_bytes(model.tensors, config_json(model.config), dtype, provenance)
        except ValueError:   # not representable in this dtype: the file was not written in it
            continue
        sha = parse_model_bytes(data).sha256
        if not model.sha256 or sha == model.sha256:
            with open(path, "wb") as f:
                f.write(data)
            return sha
    raise ValueError(f"no dtype of {tries} reproduces the model's SHA-256 {model.sha256}")
