"""`tcert`: the generator's command line (model tools, certificate generation, demo).

Each feature module contributes its subcommands through `add_commands(subparsers)`; a module that a
build does not contain is simply absent from the command list.
"""

import argparse
import importlib
import importlib.util
import sys

from tcert.checker.errors import BadInput
from tcert.generator import certificate

# Import names of the `generator` extra (pyproject.toml); the base install is the checker alone.
GENERATOR_REQUIRES = ("safetensors", "scipy", "tqdm", "matplotlib", "dask", "distributed")

FEATURE_MODULES = (
    "tcert.generator.model.cli",        # model import/inspect/random
    "tcert.generator.prediction.cli",   # prediction certificates
    "tcert.generator.overwhelm.cli",    # overwhelm certificates
    "tcert.generator.accuracy.cli",     # Max-of-K accuracy certificates
    "tcert.generator.influence.cli",    # influence certificates
    "tcert.generator.train.cli",        # training (needs the torch extra at run time)
    "tcert.generator.experiments.cli",  # paper reproductions
    "tcert.generator.demo",             # the demo on the shipped default model
)


def parse_tokens(text: str) -> list:
    """Token ids from "3,17,5"."""
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise BadInput(f"--tokens: {text[:40]!r} is not a comma-separated list of integers") from None


def build_parser() -> argparse.ArgumentParser:
    """The full `tcert` argument parser."""
    parser = argparse.ArgumentParser(prog="tcert", description="Generate tcert certificates about transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in FEATURE_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).add_commands(sub)
    return parser


def main(argv=None) -> int:
    """Run one `tcert` command; bad input gives one line on stderr and exit 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        with certificate.recording_command(["tcert", *argv]):     # generator.command in each certificate
            return int(args.func(args) or 0)
    except BadInput as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def missing_requirements() -> list:
    """The generator extra's packages that this environment lacks (a checker-only install lacks all)."""
    return [name for name in GENERATOR_REQUIRES if importlib.util.find_spec(name) is None]


def run():
    """Console-script wrapper. In a checker-only install it says in one line what to install (exit 2)."""
    missing = missing_requirements()
    if missing:
        print(f"tcert: the generator needs {', '.join(missing)}: pip install 'tcert[generator]' (from a source "
              "checkout: pip install -e '.[generator]'); tcert-check works without them", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())


if __name__ == "__main__":
    run()
