"""`tcert-check CERT --model M`: re-verify a certificate against a model file.

Exit codes: 0 VERIFIED; 1 REJECTED (an obligation failed, or the model is not the one the certificate
names); 2 unusable input (unreadable, malformed, out of limits, unknown kind or version); 3 internal
error of the checker (a bug: reported, never VERIFIED). Output is one line, or one JSON object with
--json.
"""

import argparse
import json
import sys
import time

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import BACKENDS, DEFAULT_PREC
from tcert.checker.verify import verify

EXIT_VERIFIED, EXIT_REJECTED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def main(argv=None) -> int:
    """Entry point of tcert-check; returns the exit code."""
    parser = argparse.ArgumentParser(prog="tcert-check", description="Re-verify a tcert certificate.")
    parser.add_argument("certificate")
    parser.add_argument("--model", required=True, help="the model file (safetensors) the certificate binds to")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="flint")
    parser.add_argument("--prec", type=int, default=DEFAULT_PREC, help="interval precision in bits")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a line")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = {"certificate": args.certificate, "model": args.model, "backend": args.backend}
    try:
        if not 30 <= args.prec <= 4096:
            raise BadInput("--prec must be between 30 and 4096 bits")
        ob = verify(args.certificate, args.model, args.backend, args.prec)
        code, line = EXIT_VERIFIED, f"VERIFIED: {ob.kind}: {ob.summary}"
        result.update(verdict="VERIFIED", kind=ob.kind, summary=ob.summary,
                      obligations=[{"name": o.name, "seconds": round(o.seconds, 6)} for o in ob.done])
    except Rejected as e:
        code, line = EXIT_REJECTED, f"REJECTED: {e.obligation}: {e.detail}"
        result.update(verdict="REJECTED", obligation=e.obligation, detail=e.detail)
    except BadInput as e:
        code, line = EXIT_BAD_INPUT, f"ERROR: {e}"
        result.update(verdict="ERROR", error=str(e))
    except (MemoryError, RecursionError) as e:
        code, line = EXIT_BAD_INPUT, f"ERROR: input exhausted a resource limit ({type(e).__name__})"
        result.update(verdict="ERROR", error=line)
    except Exception as e:  # a checker bug must still never print a traceback or VERIFIED
        code, line = EXIT_INTERNAL, f"INTERNAL ERROR: {type(e).__name__}: {str(e)[:200]}"
        result.update(verdict="INTERNAL ERROR", error=line)
    result["seconds"] = round(time.perf_counter() - start, 3)
    print(json.dumps(result) if args.json else one_line(line))
    return code


def one_line(text: str) -> str:
    """`text` as one printable ASCII line: line breaks, control characters, lone surrogates (which a
    hostile certificate can put in a key quoted by a message) and other non-ASCII are escaped."""
    return "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)


def run():
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
