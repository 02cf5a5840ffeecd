"""`tcert demo`: on the shipped default model, generate certificates, check them, say what was proved.

Each feature module may contribute a section through `demo_section(model, out_dir, backend) -> bool`
(True when its certificate verified); the demo runs them in FEATURE_MODULES order.
"""

import importlib
import importlib.util
import os
import tempfile
import time

from tcert.checker.verify import verify
from tcert.checker.modelfile import load_model

from tcert.generator import SHIPPED
from tcert.generator.cli import FEATURE_MODULES

DEFAULT_MODEL = os.path.join(SHIPPED, "models", "maxof4_seed123.safetensors")


def check_and_report(path: str, model_path: str, backend: str) -> bool:
    """Run the independent checker on a written certificate and print its verdict line."""
    from tcert.checker.errors import BadInput, Rejected
    start = time.perf_counter()
    try:
        ob = verify(path, model_path, backend)
        cert = ob.certificate
    except (Rejected, BadInput) as e:
        print(f"  checker: NOT VERIFIED: {e}")
        return False
    print(f"  checker ({backend}, {time.perf_counter() - start:.2f} s): VERIFIED: {cert['kind']}: {ob.summary}")
    return True


def run_demo(args) -> int:
    """Run every available demo section; exit 0 only if every certificate verified."""
    model = load_model(args.model)
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
    print(f"{sum(results)} of {len(results)} certificates verified; files in {out_dir}")
    return 0 if all(results) else 1


def add_commands(sub):
    """Register `tcert demo`."""
    p = sub.add_parser("demo", help="generate and check certificates on the shipped default model")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--out-dir", default=None, help="where to write certificates (default: a temp folder)")
    p.add_argument("--backend", choices=["flint", "mpmath"], default="flint")
    p.set_defaults(func=run_demo)
