"""`tcert-check CERT --model M`: re-verify a certificate against a model file.

Exit codes: 0 VERIFIED; 1 REJECTED (an obligation failed, or the model is not the one the certificate
names); 2 unusable input (unreadable, malformed, out of limits, unknown kind or version); 3 internal
error of the checker (a bug: reported, never VERIFIED). Output is one line, or one JSON object with
--json.
"""

import argparse
import json
import math
import sys
import time

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import BACKENDS, DEFAULT_PREC
from tcert.checker.numbers import show
from tcert.checker.resources import DEFAULT_MEMORY, DEFAULT_WORK, Limits
from tcert.checker.verify import verify

EXIT_VERIFIED, EXIT_REJECTED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
MIN_PREC, MAX_PREC = 30, 4096


def main(argv=None) -> int:
    """Entry point of tcert-check; returns the exit code."""
    args = parser().parse_args(argv)
    start = time.perf_counter()
    result = {"certificate": args.certificate, "model": args.model, "backend": args.backend}
    code, line, fields = outcome(args)
    result.update(fields)
    result["seconds"] = round(time.perf_counter() - start, 3)
    print(json.dumps(result) if args.json else one_line(line))
    return code


def parser() -> argparse.ArgumentParser:
    """The tcert-check argument parser."""
    p = argparse.ArgumentParser(prog="tcert-check", description="Re-verify a tcert certificate.")
    p.add_argument("certificate")
    p.add_argument("--model", required=True, help="the model file (safetensors) the certificate binds to")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="flint")
    p.add_argument("--prec", type=int, default=DEFAULT_PREC, help="interval precision in bits")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a line")
    p.add_argument("--max-work", type=float, default=DEFAULT_WORK, metavar="OPERATIONS",
                   help="refuse a check estimated to need more interval operations (default %(default).0e)")
    p.add_argument("--max-memory", type=float, default=DEFAULT_MEMORY / (1 << 30), metavar="GIB",
                   help="refuse a check estimated to need more memory, in GiB (default %(default)g)")
    return p


def resource_limits(args) -> Limits:
    """The --max-work / --max-memory limits (BadInput unless positive and finite)."""
    if not (0 < args.max_work < math.inf and 0 < args.max_memory < math.inf):
        raise BadInput(f"--max-work {show(args.max_work)} and --max-memory {show(args.max_memory)} must be "
                       "positive and finite")
    return Limits(args.max_work, args.max_memory * (1 << 30))


def outcome(args) -> tuple:
    """(exit code, verdict line, JSON fields) of checking the certificate the arguments name. Every
    outcome is one of the four exit codes; nothing escapes as a traceback."""
    try:
        if not MIN_PREC <= args.prec <= MAX_PREC:
            raise BadInput(f"--prec {show(args.prec)} is not between {MIN_PREC} and {MAX_PREC} bits")
        ob = verify(args.certificate, args.model, args.backend, args.prec, limits=resource_limits(args))
        return EXIT_VERIFIED, f"VERIFIED: {ob.kind}: {ob.summary}", {
            "verdict": "VERIFIED", "kind": ob.kind, "summary": ob.summary,
            "obligations": [{"name": o.name, "seconds": round(o.seconds, 6)} for o in ob.done]}
    except Rejected as e:
        return EXIT_REJECTED, f"REJECTED: {e.obligation}: {e.detail}", {
            "verdict": "REJECTED", "obligation": e.obligation, "detail": e.detail}
    except BadInput as e:
        return EXIT_BAD_INPUT, f"ERROR: {e}", {"verdict": "ERROR", "error": str(e)}
    except (MemoryError, RecursionError) as e:
        line = f"ERROR: input exhausted a resource limit ({type(e).__name__})"
        return EXIT_BAD_INPUT, line, {"verdict": "ERROR", "error": line}
    except Exception as e:  # a checker bug must still never print a traceback or VERIFIED
        line = f"INTERNAL ERROR: {type(e).__name__}: {str(e)[:200]}"
        return EXIT_INTERNAL, line, {"verdict": "INTERNAL ERROR", "error": line}


def one_line(text: str) -> str:
    """`text` as one printable ASCII line: line breaks, control characters, lone surrogates (which a
    hostile certificate can put in a key quoted by a message) and other non-ASCII are escaped."""
    return "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)


def run():
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
