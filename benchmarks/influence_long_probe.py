"""Why the worst single-token change found falls with n on the causal text models (docs/influence.md, "Long
inputs: what limits the search"): three float64 measurements, one JSON line each.

    python benchmarks/influence_long_probe.py --model /tmp/h_models/text3.safetensors \
        --vocab /tmp/h_models/text3.vocab.txt

sink: on held-out text (the 'lee' sentences, concatenated and cut to n) the last row's attention weight on
position 0 per block (largest over heads) against 1/n, and the largest weight of that row on any position.
early: the worst pair at position i = 0 (and 1) of the inputs f...f q of `strong_influence`'s starts, over
--pool random tokens: a change at the start of the input, which every later row may read.
block0: over every last token q, the most weight one position can take in the last row of block 0 at length n
(`block0_weight_caps`, attained) and the bound on that row's block-0 move (`block0_reach`: largest, median, and
largest over the 16 most `fragile_tokens`), against n = 2.
"""

import argparse
import json
import time

import numpy as np

from tcert.checker.modelfile import load_model
from tcert.generator.influence.search import context_pairs, fragile_tokens, low_keys, sharp_seeds
from tcert.generator.influence.search_long import block0_reach, block0_weight_caps, last_row_weights


def main(argv=None):
    """Print the three measurements for each requested length."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--vocab", required=True, help="the model's tokenizer vocabulary (held-out text)")
    ap.add_argument("--n", default="64,256,1024")
    ap.add_argument("--pool", type=int, default=64, help="early: random tokens tried at the changed position")
    args = ap.parse_args(argv)
    from tcert.generator.train import text_data
    model, lengths = load_model(args.model), [int(v) for v in args.n.split(",")]
    tok, ids = text_data.load_vocab_tokenizer(args.vocab), []
    for sentence in text_data.held_out_sentences("lee"):
        ids += text_data.encode(tok, sentence)
        if len(ids) >= max(lengths):
            break
    for n in lengths:
        w = last_row_weights(model, ids[:n])
        print(json.dumps(dict(probe="sink", n=n, inv_n=1 / n, w0=[round(float(x), 4) for x in w[:, :, 0].max(axis=1)],
                              top=[round(float(x), 4) for x in w.max(axis=(1, 2))])), flush=True)
    rng = np.random.default_rng(0)
    starts = list(sharp_seeds(model)) + [(int(low_keys(model, int(q), 1)[0]), int(q)) for q in fragile_tokens(model, 4)]
    for n in lengths:
        start = time.perf_counter()
        for i in (0, 1):
            best = max((context_pairs(model, np.r_[np.full(n - 1, f), q], i,
                                      rng.choice(model.config.d_vocab, args.pool, replace=False), chunk=4)[0], f, q)
                       for f, q in starts)
            print(json.dumps(dict(probe="early", n=n, i=i, pool=args.pool, dy=best[0], f=int(best[1]), q=int(best[2]),
                                  seconds=round(time.perf_counter() - start, 1))), flush=True)
    start, fragile = time.perf_counter(), fragile_tokens(model, 16)
    caps = block0_weight_caps(model, [2] + lengths)
    reach = block0_reach(model, [2] + lengths, caps=caps)
    for col, n in enumerate([2] + lengths):
        q = int(np.argmax(reach[:, col]))
        heads = [round(float(x), 4) for x in caps[:, col].max(axis=0)]
        print(json.dumps(dict(probe="block0", n=n, max_weight_per_head=heads,
                              reach_max=round(float(reach[q, col]), 3), q=q,
                              reach_median=round(float(np.median(reach[:, col])), 3),
                              reach_fragile16=round(float(reach[fragile, col].max()), 3),
                              seconds=round(time.perf_counter() - start, 1))), flush=True)


if __name__ == "__main__":
    main()
