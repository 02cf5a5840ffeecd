"""The 'worst found' column of docs/influence.md ("Stronger search: causal key/value reuse"): the largest single-token
change `strong_influence` finds on a causal model, per input length, with its witness and wall time.

    python benchmarks/influence_worst_found.py --model text3.safetensors --n 64,256,1024 --depth 8 --rounds 2

One JSON line per n: the movement ||y - y'||_2 and ||p - p'||_1, the witness (tokens with a, and with b, at i),
the same movement recomputed by the uncached forward pass, and the seconds the search took (seed = n).
"""

import argparse
import json
import time

from tcert.checker.modelfile import load_model
from tcert.generator.influence.search import pair_movement, strong_influence


def main(argv=None):
    """Run the search at each requested length and print one JSON line per length."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", default="64,256,1024", help="comma-separated input lengths")
    ap.add_argument("--depth", type=int, default=8, help="context positions before the changed one to ascend")
    ap.add_argument("--rounds", type=int, default=2, help="ascent + re-pairing rounds per start")
    ap.add_argument("--offset", type=int, default=2, help="the changed position is n - offset")
    args = ap.parse_args(argv)
    model = load_model(args.model)
    for n in (int(v) for v in args.n.split(",")):
        start = time.perf_counter()
        dy, dp, tokens, i, a, b = strong_influence(model, n, offset=args.offset, depth=args.depth,
                                                   rounds=args.rounds, seed=n)
        seconds = time.perf_counter() - start
        print(json.dumps(dict(model=args.model, n=n, depth=args.depth, rounds=args.rounds, seed=n, dy=dy, dp=dp,
                              i=i, a=a, b=b, seconds=round(seconds, 1),
                              recomputed=pair_movement(model, tokens, i, a, b),
                              tokens=[int(v) for v in tokens])), flush=True)


if __name__ == "__main__":
    main()
