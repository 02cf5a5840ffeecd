"""Benchmark: overwhelm `--method tight` on a paper-scale real GPT-NeoX block (issue 6, part 3).

    python benchmarks/bench_overwhelm_real_blocks.py [--workdir DIR] [--n-fix 1500]

bench_overwhelm_tight.py (same query, 35-token multiset, repeated-token prefix, force=True, checker = Arb
in a fresh process) on another model: the shape of bench_overwhelm.py (d_vocab 30522, d_model 512, 8
heads of 64, d_mlp 2048) as a Pythia-style block with separate ln1/ln2, a final LayerNorm, exact-erf GELU,
every bias drawn (std 0.1) and partial rotary (rotary_dim 16 = 25% of the head, as in Pythia), seed 0.
Use a workdir of its own: the model file keeps bench_overwhelm_tight's name.
"""

import argparse
import tempfile

from tcert.testing.bench import tight_case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--n-fix", type=int, default=1500)
    args = ap.parse_args()
    tight_case(args.workdir or tempfile.mkdtemp(prefix="tcert-bench-overwhelm-real-"), args.n_fix, real_block=True)


if __name__ == "__main__":
    main()
