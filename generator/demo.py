"""`tcert demo`: on the shipped default model, generate certificates, check them, say what was proved.

Each feature module may contribute a section through `demo_section(model, out_dir, backend) -> bool`
(True when its certificate verified); the demo runs them in FEATURE_MODULES order.
"""

import importlib
import importlib.util
import os
import tempfile

from tcert.generator import SHIPPED
from tcert.generator.cli import EXIT_FAILED, EXIT_OK, FEATURE_MODULES, Outcome, outcome_command

DEFAULT_MODEL = os.path.join(SHIPPED, "models", "maxof4_seed123.safetensors")


def check_and_report(path: str, model_path, backend: str) -> bool:
    """Run the independent checker (tcert.api.check) on a written certificate and print its verdict line."""
    import tcert.api as tc
    try:
        v = tc.check(path, model_path, backend)
    except tc.BadInputError as e:
        print(f"  checker: NOT VERIFIED: {e}")
        return False
    if not v:
        print(f"  checker: NOT VERIFIED: {v.obligation}: {v.detail}")
        return False
    print(f"  checker ({backend}, {v.seconds:.2f} s): VERIFIED: {v.kind}: {v.summary}")
    return True


@outcome_command
def run_demo(args) -> Outcome:
    """Run every available demo section; exit 0 only if every certificate verified."""
    import tcert.api as tc
    model = tc.load_model(args.model)
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="tcert-demo-")
    os.makedirs(out_dir, exist_ok=True)
    c = model.config
    print(f"model {os.path.basename(args.model)}: {c.n_layers} layer(s), d_vocab {c.d_vocab}, d_model {c.d_model}, "
          f"{c.n_heads} head(s), n_ctx {c.n_ctx}; sha256 {model.sha256[:16]}...")
    results = []
    for name in FEATURE_MODULES:
        if importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        if hasattr(module, "demo_section"):
            try:
                results.append(bool(module.demo_section(model, out_dir, args.backend)))
            except Exception as e:  # one broken section must not hide the others' results
                print(f"  section {name} failed: {type(e).__name__}: {e}")
                results.append(False)
    ok = all(results)
    return Outcome(EXIT_OK if ok else EXIT_FAILED, "verified" if ok else "failed", out_dir,
                   {"verified": sum(results), "certificates": len(results)},
                   f"{sum(results)} of {len(results)} certificates verified; files in {out_dir}")


def add_commands(sub):
    """Register `tcert demo`."""
    p = sub.add_parser("demo", help="generate and check certificates on the shipped default model")
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model file")
    p.add_argument("--out-dir", default=None, help="where to write certificates (default: a temp folder)")
    p.add_argument("--backend", choices=["flint", "mpmath"], default="flint", help="the checker's backend")
    p.set_defaults(func=run_demo)
