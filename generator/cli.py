"""`tcert`: the generator's command line, a thin layer over the Python API (tcert.api, docs/api.md).

Each feature module contributes its subcommands through `add_commands(subparsers)`; a module that a
build does not contain is simply absent from the command list. A command returns an `Outcome` (or, for
the older training and experiment commands, an exit code); `main` prints it as text or, with --json, as
one JSON object of one shape: {"command", "verdict", "out", "figures", "message"}.
"""

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

FEATURE_MODULES = (
    "tcert.generator.model.cli",        # model import/inspect/random
    "tcert.generator.prediction.cli",   # prediction certificates
    "tcert.generator.overwhelm.cli",    # overwhelm certificates
    "tcert.generator.accuracy.cli",     # Max-of-K accuracy certificates
    "tcert.generator.influence.cli",    # influence certificates
    "tcert.generator.train.cli",        # training (needs the torch extra at run time)
    "tcert.generator.experiments.cli",  # paper reproductions
    "tcert.generator.demo",             # the demo on the shipped default model
    "tcert.generator.selftest",         # the soundness campaign an auditor runs
)

# Exit codes. 3 means the same in tcert-check (a bug, reported, never a certificate); "inconclusive" has its own.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INCONCLUSIVE, EXIT_TIMEOUT = 0, 1, 2, 3, 4, 5
EXIT_CODES = """exit codes:
  0  done: the certificate was written (or the command succeeded)
  1  a check the command ran failed (demo: a certificate did not verify; selftest: a false VERIFIED or a
     backend disagreement)
  2  bad input or usage: one line naming the problem (a missing folder, a malformed model, a missing package)
  3  internal error of tcert (a bug: reported in one line, no certificate); tcert-check uses 3 the same way
  4  inconclusive: no certificate written (a near-tie, overwhelm Inconclusive, a vacuous accuracy bound)
  5  --timeout reached: no certificate written"""

GENERATOR_NEEDS = {"torch": "the train extra: pip install 'tcert[train]'",
                   "transformers": "the train extra: pip install 'tcert[train]'",
                   "tokenizers": "the train extra: pip install 'tcert[train]'",
                   "transformer_lens": "the tl extra: pip install 'tcert[tl]'"}


@dataclass
class Outcome:
    """What a command did: exit code, verdict word, the file it wrote, its figures, and the text line(s)."""

    code: int
    verdict: str
    out: str | None = None
    figures: dict = field(default_factory=dict)
    text: str = ""


class TimedOut(BaseException):
    """--timeout reached (a BaseException, so that no generator `except Exception` swallows it)."""


class UsageError(Exception):
    """argparse found a usage error while --json was asked for."""


def parse_tokens(text: str) -> list:
    """Token ids from "3,17,5"."""
    from tcert.api.kinds import _ids
    return _ids(text, "--tokens")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option shows its default (none for flags and required options); the epilog keeps its lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required:
            return (text + " (required)").strip()
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) \
                and "%(default)" not in text:
            return (text + " (default: %(default)s)").strip()
        return text or " "


def parser_tree(parser):
    """`parser` and every subparser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from parser_tree(sub)


def _is_leaf(parser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def build_parser() -> argparse.ArgumentParser:
    """The full `tcert` argument parser: every command has --json, --quiet and --timeout; every option's
    help shows its default; every help text ends with the exit codes."""
    from tcert.generator.certificate import GENERATOR_VERSION
    parser = argparse.ArgumentParser(prog="tcert", description="Generate tcert certificates about transformers.")
    parser.add_argument("--version", action="version", version=f"tcert {GENERATOR_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in FEATURE_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).add_commands(sub)
    for p in parser_tree(parser):
        p.formatter_class, p.epilog = HelpFormatter, EXIT_CODES
        for a in p._actions:   # argparse prints no line (so no default) for an option without help
            if a.option_strings and a.help is None:
                a.help = a.dest.replace("_", " ")
        p.error = _usage_error(p)
        if _is_leaf(p):
            have = {s for a in p._actions for s in a.option_strings}
            if "--json" not in have:
                p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
            if "--quiet" in have:   # the experiments draw their own progress bar
                p.set_defaults(own_progress=True)
            else:
                p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
            if "--timeout" in have:   # the experiments' --timeout is per cell: they enforce it themselves
                p.set_defaults(own_timeout=True)
            else:
                p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                               help="give up after this many seconds (exit 5, nothing written)")
    return parser


_JSON_USAGE = {"on": False}


def _usage_error(p):
    original = p.error

    def error(message):
        if _JSON_USAGE["on"]:
            raise UsageError(f"{p.prog}: {message}")
        original(message)
    return error


def _command_name(args) -> str:
    words = [getattr(args, "command", None)]
    for key in ("model_command", "train_command", "experiment_command"):
        if getattr(args, key, None):
            words.append(getattr(args, key))
    return " ".join(w for w in words if w)


def main(argv=None) -> int:
    """Run one `tcert` command; every ending is one of the exit codes above, never a traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    try:
        parser = build_parser()
    except ModuleNotFoundError as e:
        return _report(as_json, "", Outcome(EXIT_BAD_INPUT, "error", text=_missing(e)))
    _JSON_USAGE["on"] = as_json
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        words = [w for w in argv if not w.startswith("-")][:1]
        return _report(True, " ".join(words), Outcome(EXIT_BAD_INPUT, "error", text=f"usage: {e}"))
    finally:
        _JSON_USAGE["on"] = False
    command = _command_name(args)
    outcome = run_command(args, command)
    return _report(getattr(args, "json", False), command, outcome)


def run_command(args, command: str) -> Outcome:
    """Call the command's function under the timeout and the progress line; map every ending to an Outcome."""
    from tcert.checker.errors import BadInput
    from tcert.api.errors import InconclusiveError
    as_json = getattr(args, "json", False)
    try:
        whole = None if getattr(args, "own_timeout", False) else getattr(args, "timeout", None)
        with _timeout(whole), _progress(command, args):
            if as_json:   # stdout holds the one JSON object: whatever a command prints goes to stderr
                with contextlib.redirect_stdout(sys.stderr):
                    result = args.func(args)
            else:
                result = args.func(args)
        if isinstance(result, Outcome):
            return result
        code = int(result or 0)
        return Outcome(code, "done" if code == 0 else "failed", getattr(args, "out", None))
    except InconclusiveError as e:
        return Outcome(EXIT_INCONCLUSIVE, "inconclusive", None, e.figures, e.reason)
    except BadInput as e:
        return Outcome(EXIT_BAD_INPUT, "error", text=f"ERROR: {e}")
    except TimedOut:
        return Outcome(EXIT_TIMEOUT, "timeout", text=f"ERROR: --timeout {args.timeout:g} s reached; nothing written")
    except ModuleNotFoundError as e:
        return Outcome(EXIT_BAD_INPUT, "error", text=_missing(e))
    except BrokenPipeError:
        raise
    except OSError as e:
        return Outcome(EXIT_BAD_INPUT, "error", text=f"ERROR: {e.filename or ''}: {e.strerror or e}".replace(": : ", ": "))
    except KeyboardInterrupt:
        return Outcome(130, "interrupted", text="interrupted")
    except Exception as e:   # a bug of tcert: one line, exit 3 (TCERT_DEBUG=1 shows the traceback)
        if os.environ.get("TCERT_DEBUG"):
            raise
        return Outcome(EXIT_INTERNAL, "internal error",
                       text=f"INTERNAL ERROR: {type(e).__name__}: {str(e)[:200]} (TCERT_DEBUG=1 for the traceback)")


def _missing(e: ModuleNotFoundError) -> str:
    name = (e.name or "").split(".")[0]
    hint = GENERATOR_NEEDS.get(name, "the full generator install: pip install tcert (the checker-only install "
                                     "has tcert-check alone)")
    return f"ERROR: tcert needs the Python package {name!r}: install {hint}"


def _report(as_json: bool, command: str, o: Outcome) -> int:
    """Print the outcome (errors on stderr in text mode) and return its exit code."""
    if as_json:
        print(json.dumps({"command": command, "verdict": o.verdict, "out": o.out, "figures": o.figures,
                          "message": o.text}, default=float, sort_keys=True))
    elif o.text:
        print(o.text, file=sys.stderr if o.code in (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_TIMEOUT) else sys.stdout)
    return o.code


@contextlib.contextmanager
def _timeout(seconds):
    """Raise TimedOut in the main thread after `seconds` (SIGALRM; no-op where it does not exist)."""
    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise TimedOut()
    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _progress(command: str, args):
    """An elapsed-time line on stderr every second while the command runs, when stderr is a terminal and
    --quiet is off (commands with their own progress bar set the default `own_progress`)."""
    stream = sys.stderr
    quiet = getattr(args, "quiet", False) or getattr(args, "own_progress", False)
    if quiet or not stream.isatty():
        yield
        return
    stop, start = threading.Event(), time.monotonic()

    def tick():
        while not stop.wait(1.0):
            stream.write(f"\rtcert {command}: working, {time.monotonic() - start:.0f} s ")
            stream.flush()
    t = threading.Thread(target=tick, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        if time.monotonic() - start >= 1.0:
            stream.write("\r\033[K")
            stream.flush()


def outcome_command(fn):
    """Mark a command function that returns an Outcome (its text is printed by `main`, its figures are the
    --json object's); the training and experiment commands return an exit code and print for themselves."""
    fn.returns_outcome = True
    return fn


def run():
    """Console-script wrapper: a closed pipe (`tcert model inspect M | head`) ends quietly."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # Python would flush stdout again at exit and fail
        code = EXIT_OK
    sys.exit(code)


if __name__ == "__main__":
    run()
