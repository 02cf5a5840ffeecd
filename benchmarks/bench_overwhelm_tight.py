"""Benchmark: overwhelm `--method tight` at paper scale (issue 6 speed target).

    python benchmarks/bench_overwhelm_tight.py [--workdir DIR] [--n-fix 1500]

Same model, query, 35-token free multiset and repeated-token prefix as benchmarks/bench_overwhelm.py
--case perm (random neox1l, d_vocab 30522, d_model 512, 8 heads, seed 0); the generator writes the
certificate even when Inconclusive (force=True) and the checker (Arb, fresh process,
`tcert.testing.bench.fresh_check`) runs every obligation. Targets: generator <= 30 s, checker <= 5 min.
"""

import argparse
import tempfile

from tcert.testing.bench import tight_case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir")
    ap.add_argument("--n-fix", type=int, default=1500)
    args = ap.parse_args()
    tight_case(args.workdir or tempfile.mkdtemp(prefix="tcert-bench-overwhelm-tight-"), args.n_fix)


if __name__ == "__main__":
    main()
