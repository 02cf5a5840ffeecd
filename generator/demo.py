"""`tcert demo`: on the shipped default model, generate certificates, check them, say what was proved.

Each feature module may contribute a section through `demo_section(model, out_dir, backend) -> bool`
(True when its certificate verified); the demo runs them in FEATURE_MODULES order.
"""

import importlib
import importlib.util
import os
import tempfile
import time

from checker.cli import verify_files
from checker.modelfile import load_model

from . import certio
from .cli import FEATURE_MODULES
from .prediction import prediction_certificate


def check_and_report(path: str, model_path: str, backend: str) -> bool:
    """Run the independent checker on a written certificate and print its verdict line."""
    from checker.errors import BadInput, Rejected
    start = time.perf_counter()
    try:
        ob, cert = verify_files(path, model_path, backend)
    except (Rejected, BadInput) as e:
        print(f"  checker: NOT VERIFIED: {e}")
        return False
    print(f"  checker ({backend}, {time.perf_counter() - start:.2f} s): VERIFIED: {cert['kind']}: {ob.summary}")
    return True


def demo_section(model, out_dir: str, backend: str) -> bool:
    """The prediction section: certify the model's answer on one input."""
    cfg = model.config
    tokens = [min(cfg.d_vocab - 1, 7 * i + 3) % cfg.d_vocab for i in range(min(cfg.n_ctx, 4))]
    print(f"[prediction] input tokens {tokens}")
    cert, p = prediction_certificate(model, tokens)
    if cert is None:
        print("  near-tie: no certificate")
        return False
    path = os.path.join(out_dir, "prediction.json")
    certio.write(path, cert)
    print(f"  generator: next token {p['predicted']} (runner-up {p['runner_up']}, float gap {p['gap']:.6g}) -> {path}")
    return check_and_report(path, model.path, backend)


def run_demo(args) -> int:
    """Run every available demo section; exit 0 only if every certificate verified."""
    model = load_model(args.model)
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="tcert-demo-")
    os.makedirs(out_dir, exist_ok=True)
    c = model.config
    print(f"model {os.path.basename(args.model)}: {c.n_layers} layer(s), d_vocab {c.d_vocab}, d_model {c.d_model}, "
          f"{c.n_heads} head(s), n_ctx {c.n_ctx}; sha256 {model.sha256[:16]}...")
    results = [demo_section(model, out_dir, args.backend)]
    for name in FEATURE_MODULES[1:]:
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
