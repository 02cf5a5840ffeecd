"""Tiny random models of every architecture variant the model format can declare."""

import os

from tcert.checker.modelfile import load_model
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model

SIZE = dict(d_vocab=16, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=8)


# Every architecture variant the model format can declare (name -> random_model arguments).
ARCHS = {
    "neox1l-rotate-half": dict(arch="neox1l"),
    "neox1l-adjacent-pairs": dict(arch="neox1l", rotary_adjacent_pairs=True),
    "neox1l-partial-rotary-final-ln": dict(arch="neox1l", rotary_dim=4, final_ln=True, bias_std=0.1),
    "attn-only": dict(arch="attn-only"),
    "attn-only-2l-bidirectional": dict(arch="attn-only", n_layers=2, attention="bidirectional"),
    "preln-gelu": dict(arch="preln", n_layers=2, act_fn="gelu", bias_std=0.1),
    "preln-gelu_new": dict(arch="preln", n_layers=2, act_fn="gelu_new"),
    "preln-relu-no-final-ln": dict(arch="preln", act_fn="relu", final_ln=False),
    "preln-parallel-separate-ln": dict(arch="preln", parallel_attn_mlp=True, shared_ln=False),
    "preln-shared-ln-parallel": dict(arch="preln", parallel_attn_mlp=True, shared_ln=True),
    "preln-bidirectional-rotary": dict(arch="preln", attention_dir="bidirectional",
                                       positional_embedding_type="rotary", attn_scale="3"),
    # Llama-family pieces: RMSNorm, SiLU-gated MLP, grouped-query attention, linearly scaled RoPE
    "llama-gqa": dict(arch="llama", n_layers=2, n_key_value_heads=1),
    "llama-rope-linear-biases": dict(arch="llama", rotary_scaling_factor="4", rotary_base=500, bias_std=0.1),
    "preln-rms-silu-no-attn-scale": dict(arch="preln", normalization_type="RMS", act_fn="silu",
                                         use_attn_scale=False, bias_std=0.1),
}


def build(tmp_dir, name: str, seed: int = 0):
    """Write the tiny random model `name` to tmp_dir and return its loaded Model."""
    kw = dict(ARCHS[name])
    arch = kw.pop("arch")
    tensors, config = random_model(arch, seed=seed, **{**SIZE, **kw})
    path = os.path.join(tmp_dir, f"{name}-{seed}.safetensors")
    save_model(path, tensors, config)
    return load_model(path)
