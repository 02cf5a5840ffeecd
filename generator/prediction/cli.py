"""`tcert predict`: certify the greedy next token on one input (tcert.api.predict); demo section."""

import os

from tcert.generator.cli import EXIT_OK, Outcome, outcome_command
from tcert.generator.demo import check_and_report


@outcome_command
def cmd_predict(args) -> Outcome:
    """Write a prediction certificate for --tokens (exit 4 on a near-tie)."""
    import tcert.api as tc
    from tcert.api.files import writable
    out = writable(args.out)
    cert = tc.predict(tc.load_model(args.model), args.tokens)
    cert.save(out)
    f = cert.figures
    return Outcome(EXIT_OK, "written", out, f, f"predicted token {f['predicted']} (runner-up {f['runner_up']}, "
                                                f"float gap {f['gap']:.6g}); wrote {out}")


def add_commands(sub):
    """Register `tcert predict`."""
    p = sub.add_parser("predict", help="certify the greedy next token on one input")
    p.add_argument("--model", required=True, help="the model file")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True, help="where to write the certificate (its folder must exist)")
    p.set_defaults(func=cmd_predict)


def demo_section(model, out_dir: str, backend: str) -> bool:
    """The prediction section: certify the model's answer on one input."""
    import tcert.api as tc
    cfg = model.config
    tokens = [min(cfg.d_vocab - 1, 7 * i + 3) % cfg.d_vocab for i in range(min(cfg.n_ctx, 4))]
    print(f"[prediction] input tokens {tokens}")
    try:
        cert = tc.predict(model, tokens)
    except tc.InconclusiveError:
        print("  near-tie: no certificate")
        return False
    path = cert.save(os.path.join(out_dir, "prediction.json"))
    f = cert.figures
    print(f"  generator: next token {f['predicted']} (runner-up {f['runner_up']}, float gap {f['gap']:.6g}) -> {path}")
    return check_and_report(path, model.path, backend)
