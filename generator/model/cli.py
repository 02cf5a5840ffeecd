"""`tcert model import | inspect | random`: convert, summarise and create model files."""

import json

from tcert.generator.cli import EXIT_OK, Outcome, outcome_command
from tcert.generator.model.files import DTYPES


@outcome_command
def cmd_import(args) -> Outcome:
    """`tcert model import` (tcert.api.import_model + save_model): importer errors are one line each."""
    import tcert.api as tc
    from tcert.api.files import writable
    out = writable(args.out)
    sha = tc.save_model(tc.import_model(args.src, args.config, args.dtype), out)
    return Outcome(EXIT_OK, "written", out, {"sha256": sha}, f"wrote {out} (sha256 {sha})")


@outcome_command
def cmd_inspect(args) -> Outcome:
    """`tcert model inspect`: config, parameter counts, SHA-256."""
    import tcert.api as tc
    from tcert.generator.model.summary import describe, format_description
    d = json.loads(json.dumps(describe(tc.load_model(args.model)), default=str))
    return Outcome(EXIT_OK, "done", None, d, format_description(d))


@outcome_command
def cmd_random(args) -> Outcome:
    """`tcert model random`: a seeded random model file."""
    import tcert.api as tc
    from tcert.api.files import writable
    overrides = {}
    if args.attention:
        overrides["attention_dir"] = args.attention
    if args.act_fn:
        overrides["act_fn"] = args.act_fn
    if args.n_key_value_heads:
        overrides["n_key_value_heads"] = args.n_key_value_heads
    out = writable(args.out)
    model = tc.random_model(args.arch, seed=args.seed, d_vocab=args.d_vocab, d_model=args.d_model,
                            n_heads=args.n_heads, d_head=args.d_head, d_mlp=args.d_mlp, n_ctx=args.n_ctx,
                            n_layers=args.n_layers, **overrides)
    sha = tc.save_model(model, out)
    return Outcome(EXIT_OK, "written", out, {"sha256": sha}, f"wrote {out} (sha256 {sha})")


def add_commands(sub):
    """Register `tcert model ...`."""
    model = sub.add_parser("model", help="import, inspect or create model files")
    msub = model.add_subparsers(dest="model_command", required=True)
    p = msub.add_parser("import", help="convert a TransformerLens .npz / safetensors+config, or a Hugging Face "
                                       "folder (gpt2, gpt_neox, llama, mistral, qwen2)")
    p.add_argument("src", help="the checkpoint: a folder, a .npz or a .safetensors file")
    p.add_argument("--config", help="config JSON (for bare safetensors, or to override inference for .npz)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="stored dtype (default float32; bfloat16/float16 keep a half-precision checkpoint's size; "
                        "a value the dtype cannot hold exactly is refused)")
    p.add_argument("--out", required=True, help="the model file to write (its folder must exist)")
    p.set_defaults(func=cmd_import)
    p = msub.add_parser("inspect", help="config, parameter counts, SHA-256")
    p.add_argument("model", help="the model file")
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
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", required=True, help="the model file to write (its folder must exist)")
    p.set_defaults(func=cmd_random)
