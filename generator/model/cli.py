"""`tcert model import | inspect | random`: convert, summarise and create model files."""

import json
import os

from tcert.checker.errors import BadInput
from tcert.checker.modelfile import load_model
from tcert.generator.model.files import DTYPES


def _import(args):
    from tcert.generator.model.importers import import_hf, import_npz, import_safetensors
    from tcert.generator.model.files import save_model
    src = args.src
    config = None
    if args.config:
        with open(args.config) as f:
            config = json.load(f)
    if os.path.isdir(src):
        tensors, cfg = import_hf(src)
    elif src.endswith(".npz"):
        tensors, cfg = import_npz(src, config)
    elif src.endswith(".safetensors"):
        if not args.config:
            raise BadInput("importing a bare safetensors file needs --config CONFIG.json")
        tensors, cfg = import_safetensors(src, args.config)
    else:
        raise BadInput(f"don't know how to import {src!r} (want .npz, .safetensors + --config, or a Hugging Face "
                       "checkpoint folder)")
    sha = save_model(args.out, tensors, cfg, args.dtype)
    print(f"wrote {args.out} (sha256 {sha})")


def cmd_import(args):
    """`tcert model import`: importer errors are the user's input problems, so one line each."""
    try:
        _import(args)
    except (ValueError, KeyError, OSError) as e:
        raise BadInput(f"model import: {e}") from None


def cmd_inspect(args):
    from tcert.generator.model.summary import describe, format_description
    d = describe(load_model(args.model))
    print(json.dumps(d, indent=1, default=str) if args.json else format_description(d))


def cmd_random(args):
    from tcert.generator.model.files import save_model
    from tcert.generator.model.random_models import random_model
    overrides = {}
    if args.attention:
        overrides["attention_dir"] = args.attention
    if args.act_fn:
        overrides["act_fn"] = args.act_fn
    if args.n_key_value_heads:
        overrides["n_key_value_heads"] = args.n_key_value_heads
    tensors, cfg = random_model(args.arch, d_vocab=args.d_vocab, d_model=args.d_model, n_heads=args.n_heads,
                                d_head=args.d_head, d_mlp=args.d_mlp, n_ctx=args.n_ctx, n_layers=args.n_layers,
                                seed=args.seed, **overrides)
    sha = save_model(args.out, tensors, cfg)
    print(f"wrote {args.out} (sha256 {sha})")


def add_commands(sub):
    """Register `tcert model ...`."""
    model = sub.add_parser("model", help="import, inspect or create model files")
    msub = model.add_subparsers(dest="model_command", required=True)
    p = msub.add_parser("import", help="convert a TransformerLens .npz / safetensors+config, or a Hugging Face "
                                       "folder (gpt2, gpt_neox, llama, mistral, qwen2)")
    p.add_argument("src")
    p.add_argument("--config", help="config JSON (for bare safetensors, or to override inference for .npz)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="stored dtype (default float32; bfloat16/float16 keep a half-precision checkpoint's size; "
                        "a value the dtype cannot hold exactly is refused)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_import)
    p = msub.add_parser("inspect", help="config, parameter counts, SHA-256")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)
    p = msub.add_parser("random", help="a seeded random model of a supported architecture")
    p.add_argument("--arch", choices=["neox1l", "attn-only", "preln", "llama"], required=True)
    p.add_argument("--d-vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--n-heads", type=int, default=1)
    p.add_argument("--d-head", type=int, default=32)
    p.add_argument("--d-mlp", type=int, default=128)
    p.add_argument("--n-ctx", type=int, default=16)
    p.add_argument("--n-layers", type=int, default=1)
    p.add_argument("--attention", choices=["causal", "bidirectional"])
    p.add_argument("--act-fn", choices=["relu", "gelu", "gelu_new", "silu"])
    p.add_argument("--n-key-value-heads", type=int, help="grouped-query attention (llama arch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_random)
