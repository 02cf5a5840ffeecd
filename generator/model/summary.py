"""Summarise a model file: its config, parameter counts by group, and its SHA-256.

Usage: python -m generator.inspect_model MODEL.safetensors [--json]
"""

import json
import sys

from tcert.checker.errors import BadInput
from tcert.checker.modelfile import Model, load_model
from tcert.generator.model.files import config_json

_GROUPS = ("embed", "pos_embed", "attn", "mlp", "layernorm", "unembed")


def _group(name: str) -> str:
    """Group of a tensor name: its top-level module, or within a block its sub-module."""
    parts = name.split(".")
    if parts[0] == "blocks":
        return {"ln1": "layernorm", "ln2": "layernorm"}.get(parts[2], parts[2])   # RMSNorm gains too
    return "layernorm" if parts[0] == "ln_final" else parts[0]


def describe(model: Model) -> dict:
    """Config, parameter counts (per tensor, per group, per layer, total) and SHA-256 of `model`."""
    per_tensor = {name: int(arr.size) for name, arr in sorted(model.tensors.items())}
    groups = dict.fromkeys(_GROUPS, 0)
    per_layer = [0] * model.config.n_layers
    for name, size in per_tensor.items():
        g = _group(name)
        groups[g] = groups.get(g, 0) + size
        if name.startswith("blocks."):
            per_layer[int(name.split(".")[1])] += size
    dtypes = sorted({str(arr.dtype) for arr in model.tensors.values()})
    return {
        "sha256": model.sha256,
        "path": model.path,
        "config": config_json(model.config),
        "dtypes": dtypes,
        "params_total": sum(per_tensor.values()),
        "params_by_group": {g: n for g, n in groups.items() if n},
        "params_by_layer": per_layer,
        "params_by_tensor": per_tensor,
    }


def _arch_summary(c: dict) -> str:
    parts = [f"{c['n_layers']} layer(s)", f"d_model {c['d_model']}", f"{c['n_heads']} head(s) x {c['d_head']}",
             f"vocab {c['d_vocab']}", f"n_ctx {c['n_ctx']}"]
    if c["attn_only"]:
        parts.append("attention-only")
    else:
        parts.append(f"MLP {c['d_mlp']} {c['act_fn']}" + (" gated" if c["gated_mlp"] else "")
                     + (" parallel" if c["parallel_attn_mlp"] else " sequential"))
    if c["n_key_value_heads"]:
        parts.append(f"{c['n_key_value_heads']} key/value head(s)")
    if c["normalization_type"]:
        parts.append(c["normalization_type"] + (" shared" if c["shared_ln"] else "") + (" +final" if c["final_ln"] else ""))
    else:
        parts.append("no LN")
    if c["positional_embedding_type"] == "rotary":
        pairs = "adjacent" if c["rotary_adjacent_pairs"] else "rotate-half"
        scaled = f" /{c['rotary_scaling_factor']}" if c["rotary_scaling_factor"] != "1" else ""
        parts.append(f"RoPE dim {c['rotary_dim']} base {c['rotary_base']}{scaled} {pairs}")
    elif c["positional_embedding_type"] == "none":
        parts.append("no positions")
    else:
        parts.append("learned positions")
    parts.append(c["attention_dir"])
    parts.append("scale " + (c["attn_scale"] if c["attn_scale"] is not None else "sqrt(d_head)"))
    return ", ".join(parts)


def format_description(d: dict) -> str:
    """Human-readable multi-line rendering of `describe`'s output."""
    lines = [f"model    {d['path'] or '(in memory)'}", f"sha256   {d['sha256']}",
             f"arch     {_arch_summary(d['config'])}", f"eps      {d['config']['eps']}",
             f"dtypes   {', '.join(d['dtypes'])}", f"params   {d['params_total']:,}"]
    width = max(len(g) for g in d["params_by_group"]) if d["params_by_group"] else 0
    for g, n in d["params_by_group"].items():
        lines.append(f"  {g:<{width}}  {n:>14,}  ({100 * n / max(1, d['params_total']):.1f}%)")
    if len(d["params_by_layer"]) > 1:
        lines.append("  per layer: " + ", ".join(f"{n:,}" for n in d["params_by_layer"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    """Print the description of each model file named on the command line."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    paths = [a for a in args if a != "--json"]
    if not paths:
        print("usage: python -m generator.inspect_model MODEL.safetensors [--json]", file=sys.stderr)
        return 2
    for p in paths:
        try:
            d = describe(load_model(p))
        except BadInput as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(d, indent=1, sort_keys=True) if as_json else format_description(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
