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
--search grown: `search_long.grown_influence` from a witness (a JSON line with tokens, i, a, b, as this script
prints, e.g. benchmarks/witnesses/text3_n256.json): its last --tail tokens behind the best of every filler, then
--segments runs of the filler region re-filled (--fillers-kept best fillers, --sweeps), then --rounds of `wide_ascent`
(--depth positions before the change, the window's tokens + --extra random ones) and a new worst pair. --chain:
each n grows from the previous n's witness.
--search polish: `search_long.polish_influence` at the witness's own length: --rounds of `wide_ascent` over every
position (the window's tokens + --extra random ones; >= d_vocab: every token) and a new worst pair, then
--restarts from the best with a --perturb fraction of positions redrawn.

    python benchmarks/influence_worst_found.py --model text3.safetensors --n 1024 --search grown \
        --grow-from benchmarks/witnesses/text3_n256.json --tail 34 --depth 32 --rounds 2
--search flip: `search_flip.flip_influence` (the LayerNorm flip: a context that makes the last position's block-1
input nearly constant, then one change that turns it around; rotary or no positions, >= 2 layers) over the
--flip-queries last tokens of `flat_queries`, the change at n - offset for each of --flip-offsets (the best kept),
--rounds sweeps; its witness line is a start for --search polish:

    python benchmarks/influence_worst_found.py --model text4.safetensors --n 256 --search flip --flip-queries 8
"""

import argparse
import json
import time

from tcert.checker.modelfile import load_model
from tcert.generator.influence.search import (fragile_tokens, pair_movement, pair_table, seeded_influence,
                                              strong_influence)
from tcert.generator.influence.search_flip import flat_queries, flip_influence
from tcert.generator.influence.search_long import grown_influence, polish_influence


def main(argv=None):
    """Run the search at each requested length and print one JSON line per length."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", default="64,256,1024", help="comma-separated input lengths")
    ap.add_argument("--depth", type=int, default=8, help="context positions before the changed one to ascend")
    ap.add_argument("--rounds", type=int, default=2, help="ascent + re-pairing rounds per start")
    ap.add_argument("--offset", type=int, default=2, help="the changed position is n - offset (strong search)")
    ap.add_argument("--search", choices=("strong", "seeded", "grad", "grown", "polish", "flip"), default="strong")
    ap.add_argument("--witness", help="grad: JSON lines of earlier runs; the largest witness of each n is the start")
    ap.add_argument("--start", choices=("strong", "seeded"), default="strong", help="grad: search run for a start")
    ap.add_argument("--window", type=int, default=0, help="grad: positions changed, counted from the end (0: all)")
    ap.add_argument("--steps", type=int, default=100, help="grad: GCG steps per round")
    ap.add_argument("--batch", type=int, default=64, help="grad: candidates evaluated per GCG step")
    ap.add_argument("--topk", type=int, default=32, help="grad: tokens proposed per position")
    ap.add_argument("--seconds", type=float, default=None, help="grad: time limit of each GCG round")
    ap.add_argument("--grow-from", help="grown, polish: a JSON file whose first line holds the witness (tokens, i, "
                    "a, b)")
    ap.add_argument("--tail", type=int, default=16, help="grown: the witness's last positions kept")
    ap.add_argument("--segments", type=int, default=16, help="grown: runs of the filler region re-filled")
    ap.add_argument("--sweeps", type=int, default=2, help="grown: sweeps over the runs")
    ap.add_argument("--extra", type=int, default=32, help="grown: random candidates per position in the ascent")
    ap.add_argument("--restarts", type=int, default=0, help="grown, polish: runs of the ascent from random positions")
    ap.add_argument("--perturb", type=float, default=0.25, help="polish: fraction of positions redrawn per restart")
    ap.add_argument("--chain", action="store_true", help="grown: each n grows from the previous n's witness")
    ap.add_argument("--queries", type=int, default=128, help="seeded: last tokens of the n = 2 table (0: all)")
    ap.add_argument("--pairs", type=int, default=32, help="seeded: n = 2 pairs carried to length n")
    ap.add_argument("--keep", type=int, default=4, help="seeded: best filler inputs that get the ascent")
    ap.add_argument("--flip-queries", type=int, default=8, help="flip: last tokens tried (the flattest first)")
    ap.add_argument("--flip-offsets", default="2", help="flip: comma-separated offsets; the change at n - offset")
    ap.add_argument("--fillers-kept", type=int, default=16, help="grown: best fillers tried per run")
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
    if args.search in ("grown", "polish"):
        with open(args.grow_from) as fh:
            w = json.loads(fh.readline())
        grow = [w["tokens"], w["i"], w["a"], w["b"]]
        print(json.dumps(dict(model=args.model, start=args.grow_from, n=len(grow[0]), i=grow[1], a=grow[2], b=grow[3],
                              recomputed=pair_movement(model, *grow))), flush=True)
    for n in (int(v) for v in args.n.split(",")):
        start = time.perf_counter()
        if args.search == "grad":
            dy, dp, tokens, i, a, b, begin, trace = grad_search(model, n, args, pairs)
        elif args.search == "polish":
            if n != len(grow[0]):
                raise SystemExit(f"polish works at the witness's length {len(grow[0])}, not n = {n}")
            dy, dp, tokens, i, a, b = polish_influence(model, *grow, extra=args.extra, rounds=args.rounds,
                                                       restarts=args.restarts, perturb=args.perturb, seed=n)
        elif args.search == "grown":
            tokens0, i0, a0, b0 = grow
            k = min(args.tail, len(tokens0), n - 1)
            if len(tokens0) - i0 > k:
                raise SystemExit(f"--tail {k} does not reach the change at {i0} of {len(tokens0)} positions")
            dy, dp, tokens, i, a, b = grown_influence(model, n, tokens0[-k:], i0 - len(tokens0) + k, a0, b0,
                                                      keep=args.fillers_kept,
                                                      segments=args.segments, sweeps=args.sweeps, depth=args.depth,
                                                      extra=args.extra, rounds=args.rounds,
                                                      restarts=args.restarts, seed=n)
            if args.chain:
                grow = [tokens, i, a, b]
        elif args.search == "flip":
            queries = flat_queries(model, args.flip_queries)
            dy, dp, tokens, i, a, b = max((flip_influence(model, n, queries, i=n - int(o), rounds=args.rounds, seed=n)
                                           for o in args.flip_offsets.split(",")), key=lambda found: found[0])
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
                              **(dict(tail=args.tail, segments=args.segments, sweeps=args.sweeps, extra=args.extra,
                                      restarts=args.restarts, fillers_kept=args.fillers_kept)
                                 if args.search == "grown" else {}),
                              **(dict(extra=args.extra, restarts=args.restarts, perturb=args.perturb)
                                 if args.search == "polish" else {}),
                              **(dict(flip_queries=args.flip_queries, flip_offsets=args.flip_offsets)
                                 if args.search == "flip" else {}),
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
