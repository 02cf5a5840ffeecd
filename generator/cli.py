"""`tcert`: the generator's command line (model tools, certificate generation, demo).

Each feature module contributes its subcommands through `add_commands(subparsers)`; a module that a
build does not contain is simply absent from the command list.
"""

import argparse
import importlib
import importlib.util
import sys

from checker.errors import BadInput

FEATURE_MODULES = (
    "generator.commands",        # model import/inspect/random, predict, demo
    "generator.overwhelm_cli",   # overwhelm certificates
    "generator.accuracy_cli",    # Max-of-K accuracy certificates
    "generator.influence_cli",   # influence certificates
    "generator.train",           # training (needs the torch extra at run time)
    "generator.experiments",     # paper reproductions
)


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
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BadInput as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def run():
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
