"""Core `tcert` subcommands: model import/inspect/random, predict, demo."""

import json
import os
import sys

from checker.errors import BadInput
from checker.modelfile import load_model

from . import certio

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "certificates", "models", "maxof4_seed123.safetensors")


def parse_tokens(text: str) -> list:
    """Token ids from "3,17,5"."""
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise BadInput(f"--tokens: {text[:40]!r} is not a comma-separated list of integers") from None


def _import(args):
    from .importers import import_gpt_neox, import_npz, import_safetensors
    from .modelio import save_model
    src = args.src
    config = None
    if args.config:
        with open(args.config) as f:
            config = json.load(f)
    if os.path.isdir(src):
        tensors, cfg = import_gpt_neox(src)
    elif src.endswith(".npz"):
        tensors, cfg = import_npz(src, config)
    elif src.endswith(".safetensors"):
        if not args.config:
            raise BadInput("importing a bare safetensors file needs --config CONFIG.json")
        tensors, cfg = import_safetensors(src, args.config)
    else:
        raise BadInput(f"don't know how to import {src!r} (want .npz, .safetensors + --config, or a GPT-NeoX folder)")
    sha = save_model(args.out, tensors, cfg)
    print(f"wrote {args.out} (sha256 {sha})")


def cmd_import(args):
    """`tcert model import`: importer errors are the user's input problems, so one line each."""
    try:
        _import(args)
    except (ValueError, KeyError, OSError) as e:
        raise BadInput(f"model import: {e}") from None


def cmd_inspect(args):
    from .inspect_model import describe, format_description
    d = describe(load_model(args.model))
    print(json.dumps(d, indent=1, default=str) if args.json else format_description(d))


def cmd_random(args):
    from .modelio import save_model
    from .randmodel import random_model
    overrides = {}
    if args.attention:
        overrides["attention"] = args.attention
    if args.act_fn:
        overrides["act_fn"] = args.act_fn
    tensors, cfg = random_model(args.arch, d_vocab=args.d_vocab, d_model=args.d_model, n_heads=args.n_heads,
                                d_head=args.d_head, d_mlp=args.d_mlp, n_ctx=args.n_ctx, n_layers=args.n_layers,
                                seed=args.seed, **overrides)
    sha = save_model(args.out, tensors, cfg)
    print(f"wrote {args.out} (sha256 {sha})")


def cmd_predict(args):
    from .prediction import prediction_certificate
    model = load_model(args.model)
    tokens = parse_tokens(args.tokens)
    if not tokens or len(tokens) > model.config.n_ctx or min(tokens) < 0 or max(tokens) >= model.config.d_vocab:
        raise BadInput(f"--tokens: need 1..{model.config.n_ctx} ids in [0, {model.config.d_vocab})")
    cert, p = prediction_certificate(model, tokens)
    if cert is None:
        print(f"near-tie: top logits {p['predicted']} and {p['runner_up']} differ by {p['gap']:.3g}; no certificate")
        return 3
    certio.write(args.out, cert)
    print(f"predicted token {p['predicted']} (runner-up {p['runner_up']}, float gap {p['gap']:.6g}); wrote {args.out}")
    return 0


def cmd_demo(args):
    from .demo import run_demo
    return run_demo(args)


def add_commands(sub):
    """Register the core subcommands."""
    model = sub.add_parser("model", help="import, inspect or create model files")
    msub = model.add_subparsers(dest="model_command", required=True)
    p = msub.add_parser("import", help="convert a TransformerLens .npz / safetensors+config / GPT-NeoX folder")
    p.add_argument("src")
    p.add_argument("--config", help="config JSON (for bare safetensors, or to override inference for .npz)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_import)
    p = msub.add_parser("inspect", help="config, parameter counts, SHA-256")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)
    p = msub.add_parser("random", help="a seeded random model of a supported architecture")
    p.add_argument("--arch", choices=["neox1l", "attn-only", "preln"], required=True)
    p.add_argument("--d-vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--n-heads", type=int, default=1)
    p.add_argument("--d-head", type=int, default=32)
    p.add_argument("--d-mlp", type=int, default=128)
    p.add_argument("--n-ctx", type=int, default=16)
    p.add_argument("--n-layers", type=int, default=1)
    p.add_argument("--attention", choices=["causal", "bidirectional"])
    p.add_argument("--act-fn", choices=["relu", "gelu", "gelu_new"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_random)
    p = sub.add_parser("predict", help="certify the greedy next token on one input")
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_predict)
    p = sub.add_parser("demo", help="generate and check certificates on the shipped default model")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--out-dir", default=None, help="where to write certificates (default: a temp folder)")
    p.add_argument("--backend", choices=["flint", "mpmath"], default="flint")
    p.set_defaults(func=cmd_demo)
