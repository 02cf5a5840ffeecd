"""The 'worst found' column of docs/influence.md ("Stronger search: causal key/value reuse"): the largest single-token
change `strong_influence` finds on a causal model, per input length, with its witness and wall time.

    python benchmarks/influence_worst_found.py --model text3.safetensors --n 64,256,1024 --depth 8 --rounds 2
    python benchmarks/influence_worst_found.py --model text3.safetensors --n 64 --search seeded --queries 128 --pairs 32

One JSON line per n: the movement ||y - y'||_2 and ||p - p'||_1, the witness (tokens with a, and with b, at i),
the same movement recomputed by the uncached forward pass, and the seconds the search took (seed = n).
--search seeded: `seeded_influence` from the `--pairs` worst n = 2 pairs of `pair_table` over the `--queries` most
fragile last tokens (0: every token; the table is computed once, its seconds printed in a first JSON line).
--search grad (needs torch): `search_grad.grad_influence`, greedy coordinate gradient over the last `--window` positions
and re-pairing, started from the largest witness of length n in `--witness` (JSON lines printed by this script; none
of length n: the longest shorter one, its first token repeated in front), or without it from the witness of `--start`
(strong or seeded, run first; its seconds are included):

    python benchmarks/influence_worst_found.py --model text2.safetensors --n 64 --search grad --witness strong2.jsonl
"""

import argparse
import json
import time

from tcert.checker.modelfile import load_model
from tcert.generator.influence.search import (fragile_tokens, pair_movement, pair_table, seeded_influence,
                                              strong_influence)


def main(argv=None):
    """Run the search at each requested length and print one JSON line per length."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", default="64,256,1024", help="comma-separated input lengths")
    ap.add_argument("--depth", type=int, default=8, help="context positions before the changed one to ascend")
    ap.add_argument("--rounds", type=int, default=2, help="ascent + re-pairing rounds per start")
    ap.add_argument("--offset", type=int, default=2, help="the changed position is n - offset (strong search)")
    ap.add_argument("--search", choices=("strong", "seeded", "grad"), default="strong")
    ap.add_argument("--witness", help="grad: JSON lines of earlier runs; the largest witness of each n is the start")
    ap.add_argument("--start", choices=("strong", "seeded"), default="strong", help="grad: search run for a start")
    ap.add_argument("--window", type=int, default=0, help="grad: positions changed, counted from the end (0: all)")
    ap.add_argument("--steps", type=int, default=100, help="grad: GCG steps per round")
    ap.add_argument("--batch", type=int, default=64, help="grad: candidates evaluated per GCG step")
    ap.add_argument("--topk", type=int, default=32, help="grad: tokens proposed per position")
    ap.add_argument("--seconds", type=float, default=None, help="grad: time limit of each GCG round")
    ap.add_argument("--queries", type=int, default=128, help="seeded: last tokens of the n = 2 table (0: all)")
    ap.add_argument("--pairs", type=int, default=32, help="seeded: n = 2 pairs carried to length n")
    ap.add_argument("--keep", type=int, default=4, help="seeded: best filler inputs that get the ascent")
    args = ap.parse_args(argv)
    model = load_model(args.model)
    pairs = None
    if args.search == "seeded" or (args.search == "grad" and args.start == "seeded" and not args.witness):
        start, V = time.perf_counter(), model.config.d_vocab
        table = pair_table(model, range(V) if args.queries <= 0 else fragile_tokens(model, args.queries))
        pairs = [row[1:] for row in table[:args.pairs]]
        dy, q, a, b = table[0]
        print(json.dumps(dict(model=args.model, n=2, dy=dy, q=q, a=a, b=b, seconds=round(time.perf_counter() - start, 1),
                              recomputed=pair_movement(model, [a, q], 0, a, b))), flush=True)
    for n in (int(v) for v in args.n.split(",")):
        start = time.perf_counter()
        if args.search == "grad":
            dy, dp, tokens, i, a, b, begin, trace = grad_search(model, n, args, pairs)
        elif args.search == "seeded":
            dy, dp, tokens, i, a, b = seeded_influence(model, n, pairs, keep=args.keep, depth=args.depth,
                                                       rounds=args.rounds, seed=n)
        else:
            dy, dp, tokens, i, a, b = strong_influence(model, n, offset=args.offset, depth=args.depth,
                                                       rounds=args.rounds, seed=n)
        seconds = time.perf_counter() - start
        extra = {} if args.search != "grad" else dict(start_dy=begin, window=args.window, steps=args.steps,
                                                      batch=args.batch, topk=args.topk, gcg=trace)
        print(json.dumps(dict(model=args.model, search=args.search, n=n, depth=args.depth, rounds=args.rounds,
                              seed=n, dy=dy, dp=dp, **extra,
                              i=i, a=a, b=b, seconds=round(seconds, 1),
                              recomputed=pair_movement(model, tokens, i, a, b),
                              tokens=[int(v) for v in tokens])), flush=True)


def start_witness(model, n, args, pairs):
    """(tokens, i, a, b) to start the gradient search from: the largest witness of length n in the JSON lines
    of `--witness` (none of length n: the largest of the longest shorter witnesses, its first token repeated in
    front up to length n), else that of a `--start` search run now."""
    if args.witness:
        with open(args.witness) as f:
            rows = [json.loads(line) for line in f if line.strip().startswith("{")]
        rows = [r for r in rows if "tokens" in r and r["n"] <= n]
        if not rows:
            raise SystemExit(f"no witness of length <= {n} in {args.witness}")
        longest = max(r["n"] for r in rows)
        r = max((r for r in rows if r["n"] == longest), key=lambda r: r["dy"])
        pad = n - longest
        return [r["tokens"][0]] * pad + r["tokens"], r["i"] + pad, r["a"], r["b"]
    if pairs is not None:
        found = seeded_influence(model, n, pairs, keep=args.keep, depth=args.depth, rounds=args.rounds, seed=n)
    else:
        found = strong_influence(model, n, offset=args.offset, depth=args.depth, rounds=args.rounds, seed=n)
    return found[2:]


def grad_search(model, n, args, pairs):
    """`grad_influence` from `start_witness`: (dy, dp, tokens, i, a, b, the start's movement, per GCG round
    (steps, candidates evaluated, candidates accepted))."""
    try:
        import torch
    except ImportError:
        raise SystemExit("--search grad needs torch (the 'train' extra)") from None
    from tcert.generator.influence.search_grad import grad_influence
    torch.set_num_threads(1)   # one core: the machine is shared, and two threads under load ran ~5x slower
    tokens, i, a, b = start_witness(model, n, args, pairs)
    begin = pair_movement(model, tokens, i, a, b)[0]
    trace = []
    found = grad_influence(model, tokens, i, a, b, window=args.window or None, rounds=args.rounds,
                           steps=args.steps, batch=args.batch, topk=args.topk, seed=n, seconds=args.seconds,
                           trace=trace)
    return (*found, begin, trace)


if __name__ == "__main__":
    main()
