"""Models for the API: load a file, convert an object, import a checkpoint, draw or train one in memory.

Every function returns the checker's own `Model` (tcert.checker.modelfile.Model). A model built in memory
carries the SHA-256 of the file it stands for, so a certificate made from it binds to that file, and
`save_model` writes that file byte for byte.
"""

import json
import os

from tcert.checker.modelfile import Model

from tcert.api.errors import BadInputError, bad_input, translating


@translating
def load_model(source) -> Model:
    """A Model from `source`: a tcert model file (path), a Model (returned as is), or a TransformerLens
    HookedTransformer (converted in memory; needs the `tl` extra only for the object itself). A Hugging Face
    folder or a TransformerLens state dict on disk goes through `import_model`."""
    if isinstance(source, Model):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path) or path.endswith(".npz"):
            raise BadInputError(f"{path} is a checkpoint, not a tcert model file: use tc.import_model(path)")
        from tcert.checker.modelfile import load_model as read
        return read(path)
    if hasattr(source, "cfg") and hasattr(source, "state_dict"):   # HookedTransformer (duck-typed: no import)
        from tcert.generator.model.transformer_lens import from_hooked_transformer
        try:
            return from_hooked_transformer(source)
        except ValueError as e:
            raise bad_input(e) from None
    raise BadInputError(f"load_model: cannot make a model of a {type(source).__name__} (want a model file path, "
                        "a tcert Model or a TransformerLens HookedTransformer)")


@translating
def import_model(source, config: dict | str | None = None, dtype: str = "float32") -> Model:
    """A Model from a checkpoint: a Hugging Face folder (gpt2, gpt_neox, llama, mistral, qwen2), a
    TransformerLens `.npz` state dict (config inferred, or given), or a bare `.safetensors` with `config` (a
    dict or a JSON file). Built in memory; `save_model` writes it."""
    from tcert.generator.model.files import in_memory_model
    from tcert.generator.model.importers import import_hf, import_npz, import_safetensors
    src = os.fspath(source)
    try:
        if isinstance(config, (str, os.PathLike)):
            with open(config) as f:
                config = json.load(f)
        if os.path.isdir(src):
            tensors, cfg = import_hf(src)
        elif src.endswith(".npz"):
            tensors, cfg = import_npz(src, config)
        elif src.endswith(".safetensors"):
            if config is None:
                raise BadInputError("importing a bare safetensors file needs its config")
            import tempfile
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(config, f)
            try:
                tensors, cfg = import_safetensors(src, f.name)
            finally:
                os.unlink(f.name)
        else:
            raise BadInputError(f"don't know how to import {src!r} (want .npz, .safetensors + config, or a Hugging "
                                "Face checkpoint folder)")
        return in_memory_model(tensors, cfg, dtype)
    except (ValueError, KeyError, OSError) as e:
        raise bad_input(f"model import: {e}") from None


@translating
def save_model(model, path) -> str:
    """Write `model` (a Model from any function here, or a HookedTransformer) to `path`; return its SHA-256."""
    from tcert.generator.model.files import write_model
    from tcert.api.files import writable
    model = load_model(model)
    path = writable(path)
    if model.path:   # a model read from a file: that file, byte for byte
        with open(model.path, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())
        return model.sha256
    try:
        return write_model(model, path)
    except ValueError as e:
        raise bad_input(e) from None


@translating
def random_model(arch: str, seed: int = 0, dtype: str = "float32", **shape) -> Model:
    """A seeded random model of `arch` ('neox1l', 'attn-only', 'preln', 'llama'), in memory; `shape` takes
    d_vocab, d_model, n_heads, d_head, d_mlp, n_ctx, n_layers and any config override (random_models.py)."""
    from tcert.generator.model.files import in_memory_model
    from tcert.generator.model.random_models import random_model as draw
    try:
        tensors, cfg = draw(arch, seed=seed, **shape)
    except (TypeError, ValueError, KeyError) as e:
        raise bad_input(f"random_model: {e}") from None
    return in_memory_model(tensors, cfg, dtype)


@translating
def train_maxofk(k: int = 3, d_vocab: int = 8, d_model: int = 16, steps: int = 300, seed: int = 0,
                 batch: int = 128, progress: bool = False) -> Model:
    """Train a 1-layer attention-only Max-of-K model (the reference recipe; needs the `train` extra) and return
    it in memory. Deterministic on CPU for a given seed."""
    from tcert.generator.model.files import in_memory_model
    from tcert.generator.train.maxofk import train_maxofk as train
    tensors, cfg, _history = train(k=k, seed=seed, d_vocab=d_vocab, d_model=d_model, steps=steps, batch=batch,
                                   progress=progress)
    return in_memory_model(tensors, cfg)
