"""`tcert predict`: certify the greedy next token on one input; demo section."""

import os

from tcert.checker.errors import BadInput
from tcert.checker.modelfile import load_model

from tcert.generator import certificate
from tcert.generator.cli import parse_tokens
from tcert.generator.demo import check_and_report
from tcert.generator.prediction import prediction_certificate


def cmd_predict(args) -> int:
    """Write a prediction certificate for --tokens (exit 3 on a near-tie)."""
    model = load_model(args.model)
    tokens = parse_tokens(args.tokens)
    if not tokens or len(tokens) > model.config.n_ctx or min(tokens) < 0 or max(tokens) >= model.config.d_vocab:
        raise BadInput(f"--tokens: need 1..{model.config.n_ctx} ids in [0, {model.config.d_vocab})")
    cert, p = prediction_certificate(model, tokens)
    if cert is None:
        print(f"near-tie: top logits {p['predicted']} and {p['runner_up']} differ by {p['gap']:.3g}; no certificate")
        return 3
    certificate.write(args.out, cert)
    print(f"predicted token {p['predicted']} (runner-up {p['runner_up']}, float gap {p['gap']:.6g}); wrote {args.out}")
    return 0


def add_commands(sub):
    """Register `tcert predict`."""
    p = sub.add_parser("predict", help="certify the greedy next token on one input")
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_predict)


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
    certificate.write(path, cert)
    print(f"  generator: next token {p['predicted']} (runner-up {p['runner_up']}, float gap {p['gap']:.6g}) -> {path}")
    return check_and_report(path, model.path, backend)
