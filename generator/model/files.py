"""Write model files in the format `checker.modelfile` reads (safetensors + config metadata)."""

import json
from fractions import Fraction

import numpy as np
from safetensors.numpy import save_file

from tcert.checker.modelfile import Config, load_model, parse_config


def config_json(config: Config) -> dict:
    """The config as the JSON object stored in a model file's metadata (exact numbers as "p/q" text)."""
    return {key: str(value) if isinstance(value, Fraction) else value for key, value in config.__dict__.items()}


def save_model(path: str, tensors: dict, config: dict, dtype=np.float32) -> str:
    """Validate `config`, write `tensors` (cast to `dtype`) with it to `path`; return the SHA-256."""
    cfg = parse_config(dict(config))
    arrays = {k: np.ascontiguousarray(np.asarray(v, dtype=dtype)) for k, v in tensors.items()}
    save_file(arrays, path, metadata={"config": json.dumps(config_json(cfg), sort_keys=True)})
    return load_model(path).sha256  # re-read: a file we write must pass the checker's reader
