"""Deterministic random models of the architecture families tcert certifies.

`random_model` returns (tensors, config_dict) ready for `tcert.generator.model.files.save_model`. Weights are
drawn from numpy's default_rng(seed) in float32 (fast enough for paper-size models, and float32 is
what model files store anyway), with standard deviation 1/sqrt(fan_in) so that activations stay of
order one at every depth; embeddings have standard deviation 1 (their "fan-in" is one one-hot row).
"""

import numpy as np

from tcert.checker.modelfile import CONFIG_ALIASES, expected_shapes, parse_config

ARCHS = ("neox1l", "attn-only", "preln", "llama")

# Overrides that shape the random draw rather than the config.
_DRAW_KEYS = ("bias_std", "ln_std", "weight_scale", "embed_std")


def _arch_config(arch, d_vocab, d_model, n_heads, d_head, d_mlp, n_ctx, n_layers) -> dict:
    base = dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_head, d_vocab=d_vocab,
                n_ctx=n_ctx, attention_dir="causal")
    if arch == "neox1l":
        # The overwhelm paper's block: one LN shared by attention and MLP, parallel residual,
        # RoPE over the whole head, ReLU MLP, no final LN.
        base.update(d_mlp=d_mlp, act_fn="relu", normalization_type="LN", positional_embedding_type="rotary",
                    rotary_dim=d_head, parallel_attn_mlp=True, shared_ln=True, final_ln=False)
    elif arch == "attn-only":
        # Max-of-K style: learned positions, no LN, no MLP.
        base.update(attn_only=True, normalization_type=None, positional_embedding_type="standard")
    elif arch == "preln":
        base.update(d_mlp=d_mlp, act_fn="gelu", normalization_type="LN", positional_embedding_type="standard",
                    parallel_attn_mlp=False, shared_ln=False, final_ln=True)
    elif arch == "llama":
        # Llama-family block: RMSNorm, SiLU-gated MLP, rotate-half RoPE over the whole head, final RMSNorm.
        # Grouped-query attention by the override n_key_value_heads.
        base.update(d_mlp=d_mlp, act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
                    rotary_dim=d_head, gated_mlp=True, parallel_attn_mlp=False, shared_ln=False, final_ln=True)
    else:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    return base


def random_model(arch: str, d_vocab: int = 16, d_model: int = 16, n_heads: int = 2, d_head: int = 8,
                 d_mlp: int = 32, n_ctx: int = 8, n_layers: int = 1, seed: int = 0, **overrides):
    """A random model of family `arch` ('neox1l', 'attn-only', 'preln' or 'llama'): (tensors, config_dict).

    Any config field may be overridden (e.g. positional_embedding_type='rotary', act_fn='gelu_new',
    attention_dir='bidirectional', n_key_value_heads=1, rotary_dim=4, rotary_adjacent_pairs=True, attn_scale='4', eps='1/1000').
    Extra draw controls, also as keyword overrides:
      bias_std (std of every bias, LayerNorm biases included; default 0: present but exactly zero),
      ln_std (spread of LayerNorm gains around 1; default 0.1), weight_scale (multiplies the std of
      every non-embedding matrix; default 1), embed_std (std of W_E and W_pos; default 1).
    The same arguments and seed always give bit-identical tensors.
    """
    draw = {k: overrides.pop(k) for k in _DRAW_KEYS if k in overrides}
    overrides = {CONFIG_ALIASES.get(k, k): v for k, v in overrides.items()}
    cfg = _arch_config(arch, d_vocab, d_model, n_heads, d_head, d_mlp, n_ctx, n_layers)
    cfg.update(overrides)
    if cfg.get("positional_embedding_type") == "rotary" and "rotary_dim" not in cfg:
        cfg["rotary_dim"] = d_head  # overrides switching preln to rotary rotate the whole head
    parsed = parse_config(cfg)  # raise early on an inconsistent combination
    bias_std = float(draw.get("bias_std", 0.0))
    ln_std = float(draw.get("ln_std", 0.1))
    scale = float(draw.get("weight_scale", 1.0))
    embed_std = float(draw.get("embed_std", 1.0))
    rng = np.random.default_rng(seed)
    d, h, dh, f = parsed.d_model, parsed.n_heads, parsed.d_head, parsed.d_mlp

    def normal(shape, std):
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(std)
        return out

    def bias(shape):
        return normal(shape, bias_std) if bias_std else np.zeros(shape, np.float32)

    fan_in = {"W_Q": d, "W_K": d, "W_V": d, "_W_K": d, "_W_V": d, "W_O": h * dh, "W_in": d, "W_gate": d,
              "W_out": f or 1}
    tensors = {}
    # Iterate the names the reader expects, in a fixed order, so the draw sequence is stable.
    for name, shape in expected_shapes(parsed).items():
        leaf = name.rsplit(".", 1)[1]
        if name in ("embed.W_E", "pos_embed.W_pos"):
            t = normal(shape, embed_std)
        elif name == "unembed.W_U":
            t = normal(shape, scale / np.sqrt(d))
        elif leaf in fan_in:
            t = normal(shape, scale / np.sqrt(fan_in[leaf]))
        elif leaf == "w":  # LayerNorm gain: near 1
            t = (1.0 + normal(shape, ln_std)).astype(np.float32) if ln_std else np.ones(shape, np.float32)
        elif leaf == "b" or leaf.lstrip("_").startswith("b_"):  # LayerNorm and linear biases alike
            t = bias(shape)
        else:  # every tensor the format defines is covered above; this keeps a new one loud
            raise AssertionError(f"no initialiser for {name}")
        tensors[name] = t
    return tensors, cfg
