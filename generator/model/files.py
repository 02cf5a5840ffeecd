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
from safetensors.numpy import save_file

from tcert.checker.modelfile import Config, load_model, parse_config


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


def save_model(path: str, tensors: dict, config: dict, dtype=np.float32, provenance: dict | None = None) -> str:
    """Validate `config`, write `tensors` (cast to `dtype`) with it to `path` (and `provenance` as metadata);
    return the SHA-256."""
    cfg = parse_config(dict(config))
    arrays = {k: np.ascontiguousarray(np.asarray(v, dtype=dtype)) for k, v in tensors.items()}
    metadata = {"config": json.dumps(config_json(cfg), sort_keys=True)}
    if provenance is not None:
        metadata["provenance"] = json.dumps(provenance, sort_keys=True)
    save_file(arrays, path, metadata=metadata)
    return load_model(path).sha256  # re-read: a file we write must pass the checker's reader
