"""`tcert-check CERT --model M`: re-verify a certificate against a model file.

Exit codes: 0 VERIFIED; 1 REJECTED (an obligation failed, or the model is not the one the certificate
names); 2 unusable input (unreadable, malformed, out of limits, unknown kind or version, a usage error, a
missing python-flint, --timeout reached); 3 internal error of the checker (a bug: reported, never
VERIFIED). Output is one line, or one JSON object with --json (usage errors included). A REJECTED check is
re-run once at a higher precision (`retry_prec`) and the line says whether that turns it around.

The verdict is `outcome`'s: `verify` and the mapping of its exceptions to exit codes. What surrounds it and
decides nothing lives beside the trusted base in tcert.audit: the progress line and the --timeout clock
(`tcert.audit.terminal`), the exact JSON of the figures and the versions, and the --report page
(`tcert.audit.report`, written after the verdict is decided).
"""

import argparse
import json
import math
import os
import sys
import time
from fractions import Fraction

from tcert.audit.terminal import PROGRESS_AFTER, Deadline, Progress, keep_freed_memory, obligations_json, versions
from tcert.checker import envelope
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import BACKEND_NAMES, DEFAULT_PREC, make_backend
from tcert.checker.modelfile import load_model
from tcert.checker.numbers import show
from tcert.checker.obligations import Obligations
from tcert.checker.resources import DEFAULT_MEMORY, DEFAULT_WORK, Limits
from tcert.checker.verify import verify

EXIT_VERIFIED, EXIT_REJECTED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
MIN_PREC, MAX_PREC = 30, 4096
RETRY_IF_FASTER_THAN = 10.0                  # seconds: a longer REJECTED check is not re-run unless asked
PRECISION_INDEPENDENT = ("model binding", "statement: the claim in words")
EXIT_CODES = """exit codes:
  0  VERIFIED        every obligation holds
  1  REJECTED        an obligation fails (named, with its numbers), or the model is not the certified one
  2  ERROR           unusable input: unreadable or malformed file, out of limits, unknown kind or version,
                     a usage error, python-flint missing for --backend flint, --timeout reached
  3  INTERNAL ERROR  a checker bug; never VERIFIED
tcert-check never exits 4 or 5; tcert, the generator, exits 4 when a run is inconclusive and writes no
certificate, 5 at its --timeout (0, 2 and 3 mean there what they mean here; tcert --help lists them)."""


class UsageError(Exception):
    """A command-line mistake (exit 2; one JSON object under --json)."""


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing and exiting, so --json can report it."""

    def error(self, message):
        raise UsageError(message)


def parser() -> Parser:
    """The tcert-check argument parser."""
    p = Parser(prog="tcert-check", description="Re-verify a tcert certificate against a model file.",
               epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("certificate", nargs="?", help="the certificate (JSON)")
    p.add_argument("--model", help="the model file (safetensors) the certificate binds to (required)")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="flint",
                   help="interval arithmetic: flint (python-flint's Arb; products with a point factor exact on float64 "
                        "BLAS) or mpmath (the reference); -exact / +exact switch the exact product layer off / on "
                        "(docs/soundness.md) (default: flint)")
    p.add_argument("--prec", type=int, default=DEFAULT_PREC,
                   help=f"interval precision in bits, {MIN_PREC}..{MAX_PREC} (default: {DEFAULT_PREC})")
    p.add_argument("--retry-prec", type=int, default=None, metavar="BITS",
                   help="after a REJECTED, re-check once at BITS to tell whether more precision turns it around; 0 "
                        f"never (default: max(256, 4 x --prec) when the check took under {RETRY_IF_FASTER_THAN:g} s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a line (default: off)")
    p.add_argument("--report", metavar="FILE", help="also write the audit report: FILE.html (one self-contained "
                                                    "page) or FILE.md (Markdown) (default: none)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a check that runs longer: ERROR, exit 2 (default: no limit)")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr (default: progress while a "
                                                        f"check runs past {PROGRESS_AFTER:g} s, on a terminal only)")
    p.add_argument("--max-work", type=float, default=DEFAULT_WORK, metavar="OPERATIONS",
                   help="refuse a check estimated to need more interval operations (default %(default).0e)")
    p.add_argument("--max-memory", type=float, default=DEFAULT_MEMORY / (1 << 30), metavar="GIB",
                   help="refuse a check estimated to need more memory, in GiB (default %(default)g)")
    p.add_argument("--version", action="store_true", help="print the tool and library versions and exit")
    return p


def main(argv=None) -> int:
    """Entry point of tcert-check; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser().parse_args(argv)
        if args.version:
            v = versions()
            libraries = ", ".join(f"{k} {x}" for k, x in v.items() if k != "tcert")
            print(json.dumps({"versions": v}) if args.json else f"tcert-check {v['tcert']} ({libraries})")
            return EXIT_VERIFIED
        check_usage(args)
    except UsageError as e:
        line = f"usage error: {e} (tcert-check --help)"
        print(json.dumps({"verdict": "ERROR", "error": line}) if "--json" in argv else one_line(line))
        return EXIT_BAD_INPUT
    keep_freed_memory()      # speed only (tcert.audit.terminal): freed numpy temporaries reuse the heap's pages
    start = time.perf_counter()
    code, line, fields, record = run_check(args)
    shown = args.json or args.report       # the versions (each library imported) only where they are printed
    result = {"certificate": args.certificate, "model": args.model, "backend": args.backend, "prec": args.prec,
              **fields, **({"versions": versions()} if shown else {}), "seconds": round(time.perf_counter() - start, 3)}
    if args.report:
        code = write_report(args, result, record, code)
    print(json.dumps(result) if args.json else one_line(line))
    return code


def check_usage(args) -> None:
    """Refuse a command line that cannot run (UsageError), before any work."""
    if not args.certificate or not args.model:
        raise UsageError("give a certificate and --model MODEL")
    if not MIN_PREC <= args.prec <= MAX_PREC:
        raise UsageError(f"--prec {show(args.prec)} is not between {MIN_PREC} and {MAX_PREC} bits")
    if args.retry_prec is not None and args.retry_prec != 0 and not MIN_PREC <= args.retry_prec <= MAX_PREC:
        raise UsageError(f"--retry-prec {show(args.retry_prec)} is not 0 or between {MIN_PREC} and {MAX_PREC} bits")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError("--timeout must be a positive number of seconds")
    if not (0 < args.max_work < math.inf and 0 < args.max_memory < math.inf):
        raise UsageError(f"--max-work {show(args.max_work)} and --max-memory {show(args.max_memory)} must be "
                         "positive and finite")
    if args.report:
        if not args.report.lower().endswith((".html", ".htm", ".md")):
            raise UsageError(f"--report {args.report[:60]!r}: the file name must end in .html or .md")
        folder = os.path.dirname(os.path.abspath(args.report))
        if not os.path.isdir(folder):
            raise UsageError(f"--report: the folder {folder[:80]!r} does not exist")


def run_check(args) -> tuple:
    """(exit code, line, JSON fields, record for the report) of the check the arguments ask for, within
    --timeout; a REJECTED one is re-run once at a higher precision when `retry_prec` says so."""
    record = {"obligations": Obligations(), "model": None, "certificate": None}
    try:
        return checked(args, record)
    except BadInput as e:   # the --timeout interrupt arrived between two steps of this function
        return EXIT_BAD_INPUT, f"ERROR: {e}", {"verdict": "ERROR", **known(record), "error": str(e)}, record


def checked(args, record) -> tuple:
    """run_check's work, inside the deadline and the progress line."""
    with Deadline(args.timeout) as deadline, Progress(args, record["obligations"]):
        code, line, fields = outcome(args, record, deadline, args.prec, record["obligations"])
        again = retry_prec(args, fields, time.perf_counter() - deadline.start)
        if code == EXIT_REJECTED and again:
            code2, _, fields2 = outcome(args, {}, deadline, again, Obligations())
            if code2 in (EXIT_VERIFIED, EXIT_REJECTED):
                verdict = "VERIFIED" if code2 == EXIT_VERIFIED else "REJECTED"
                fields["prec_hint"] = {"prec": again, "verdict": verdict, "obligation": fields2.get("obligation")}
                hint = (f" [at --prec {args.prec}; VERIFIED at --prec {again}: re-run with --prec {again}]"
                        if code2 == EXIT_VERIFIED else f" [also REJECTED at --prec {again}]")
                line, fields["detail"] = line + hint, fields["detail"] + hint
        deadline.cancel()       # from here on a late timer cannot interrupt anything
    return code, line, fields, record


def retry_prec(args, fields: dict, seconds: float):
    """The precision to re-check a REJECTED verdict at, or None: not for precision-independent obligations,
    not when --retry-prec is 0 or no higher than --prec, by default only after a check under
    RETRY_IF_FASTER_THAN seconds."""
    if fields.get("verdict") != "REJECTED" or fields.get("obligation") in PRECISION_INDEPENDENT:
        return None
    if args.retry_prec is None:
        bits = min(MAX_PREC, max(256, 4 * args.prec))
        return bits if bits > args.prec and seconds < RETRY_IF_FASTER_THAN else None
    return args.retry_prec if args.retry_prec > args.prec else None


def outcome(args, record: dict, deadline, prec: int, ob: Obligations) -> tuple:
    """(exit code, verdict line, JSON fields) of one check at `prec`. Every outcome is one of the four exit
    codes; nothing escapes as a traceback. `record` receives the model and certificate for the report."""
    try:
        limits = Limits(args.max_work, args.max_memory * (1 << 30))
        data = envelope.read_certificate_bytes(args.certificate)
        record["certificate"] = envelope.parse_certificate_bytes(data, int(limits.memory) // 8)
        model = record["model"] = load_model(args.model)
        ob = verify(data, model, backend(args.backend, prec), obligations=ob, limits=limits)
        return EXIT_VERIFIED, f"VERIFIED: {ob.kind}: {ob.summary}", {
            "verdict": "VERIFIED", "kind": ob.kind, "model_sha256": model.sha256, "statement": ob.statement,
            "summary": ob.summary, "obligations": obligations_json(ob)}
    except Rejected as e:
        return EXIT_REJECTED, f"REJECTED: {e.obligation}: {e.detail}", {
            "verdict": "REJECTED", **known(record), "obligation": e.obligation, "detail": e.detail,
            "obligations": obligations_json(ob)}
    except BadInput as e:
        return EXIT_BAD_INPUT, f"ERROR: {e}", {"verdict": "ERROR", **known(record), "error": str(e)}
    except (MemoryError, RecursionError) as e:
        error = f"input exhausted a resource limit ({type(e).__name__})"
        return EXIT_BAD_INPUT, f"ERROR: {error}", {"verdict": "ERROR", **known(record), "error": error}
    except KeyboardInterrupt:
        if not deadline.expired:
            raise
        error = f"the check did not finish within --timeout {show(Fraction(args.timeout))} s"
        return EXIT_BAD_INPUT, f"ERROR: {error}", {"verdict": "ERROR", **known(record), "error": error}
    except Exception as e:  # a checker bug must still never print a traceback or VERIFIED
        error = f"{type(e).__name__}: {str(e)[:200]}"
        return EXIT_INTERNAL, f"INTERNAL ERROR: {error}", {"verdict": "INTERNAL ERROR", **known(record), "error": error}


def backend(name: str, prec: int):
    """The named backend; a missing library is unusable input with a one-line hint, not a checker bug."""
    try:
        return make_backend(name, prec)
    except ImportError as e:
        package = {"flint": "python-flint"}.get(getattr(e, "name", None) or "", getattr(e, "name", None))
        raise BadInput(f"backend {name} needs the package {package}, which is not installed: pip install {package}"
                       + (", or use --backend mpmath" if name.startswith("flint") else "")) from None


def known(record: dict) -> dict:
    """The JSON fields known even when a check ended early: the certificate's kind, the model's SHA-256."""
    cert, model = record.get("certificate"), record.get("model")
    out = {"kind": cert["kind"]} if cert else {}
    return {**out, "model_sha256": model.sha256} if model is not None else out


def write_report(args, result: dict, record: dict, code: int) -> int:
    """Write the audit report (tcert.audit.report, outside the trusted base: the verdict is already decided);
    a report that cannot be written is one line on stderr and exit 2 (the verdict line is still printed)."""
    if record["model"] is None:     # the check ended before the model was read: the page still names it
        try:
            record["model"] = load_model(args.model)
        except BadInput:
            pass
    try:
        from tcert.audit.report import write
        write(args.report, result, record, ["tcert-check", args.certificate, "--model", args.model, "--backend",
                                            args.backend, "--prec", str(args.prec)])
    except Exception as e:  # the report must never turn into a traceback or change the verdict line
        print(one_line(f"ERROR: --report {args.report}: {type(e).__name__}: {str(e)[:160]}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    return code


def one_line(text: str) -> str:
    """`text` as one printable ASCII line: line breaks, control characters, lone surrogates (which a
    hostile certificate can put in a key quoted by a message) and other non-ASCII are escaped."""
    return "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)


def run():
    """Console-script wrapper."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run()
