"""Moved into the product: `tcert experiment maxofk-sweep` (docs/experiments.md).

This forwarder keeps the old command lines of docs/accuracy.md working:

    python benchmarks/sweep_maxofk.py --seeds 10 [--cache DIR] [--jobs 2] [--k 4] [--d-vocab 64] [--steps 3000]
        [--no-anchors] [--strategies ...] [--samples N]

runs `tcert experiment maxofk-sweep --seeds 0-9 --out-dir DIR --anchors ...` (a seed COUNT here, a seed
list there; the old default cache folder is now the run folder, default ./maxofk_sweep). The brute-force
certificate is now always checked (the old --check-brute is accepted and ignored).
"""

import argparse
import sys

from tcert.generator.cli import main


def forward(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--cache", default="maxofk_sweep")
    p.add_argument("--no-anchors", action="store_true")
    p.add_argument("--check-brute", action="store_true")
    args, rest = p.parse_known_args(argv)
    new = ["experiment", "maxofk-sweep", "--seeds", f"0-{args.seeds - 1}", "--out-dir", args.cache] + rest
    return new if args.no_anchors else new + ["--anchors"]


if __name__ == "__main__":
    sys.exit(main(forward(sys.argv[1:])))
