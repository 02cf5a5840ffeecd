"""Mutation tally: every mutant of small certificates of each kind (generated on tiny models) and of the
shipped certificates under certificates/, checked in-process; prints per kind the mutants tried,
rejected, accepted-and-true (and of those, how many changed the claim and were judged true by the
kind's oracle), accepted-and-false (must be 0), undecided, internal errors, and the time.

    python benchmarks/mutation_tally.py                     # every tiny-model mutant, shipped sampled
    python benchmarks/mutation_tally.py --shipped-sample 0  # every shipped mutant too (hours on Max-of-4)

Exit status 1 when any mutant is accepted-and-false, accepted-undecided or an internal error. The
harness is tests/support/mutation.py (moves, classification, oracles); docs/soundness.md has the latest table.
"""

import argparse
import os
import random
import sys
import tempfile
import time
from collections import Counter

import tcert.testing.mutation as M
from tcert.testing import ROOT

BIG = 5000   # shipped certificates with more mutants than this are sampled (--shipped-sample)


def main(argv=None) -> int:
    """Run the tally; return the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=0, help="mutants per tiny-model certificate (0: all)")
    ap.add_argument("--shipped-sample", type=int, default=40,
                    help=f"mutants per shipped certificate with more than {BIG} (0: all)")
    ap.add_argument("--mpmath-sample", type=int, default=30,
                    help="mutants per tiny-model certificate re-run with the mpmath backend")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-shipped", action="store_true")
    ap.add_argument("--accepted", action="store_true",
                    help="also list the accepted-and-true mutants grouped by kind, field and move")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        cases = M.tiny_cases(work)
        shipped = [] if args.no_shipped else M.shipped_cases(ROOT / "certificates")
        shas = M.model_shas(cases + shipped)
        per_kind = {k: M.Tally() for k in M.KINDS}
        print(f"{'certificate':<52} {'backend':<7} {'tried':>6} {'rej':>6} {'acc-true':>8} {'(claim)':>7} "
              f"{'acc-false':>9} {'undec':>5} {'intern':>6} {'seconds':>8}", flush=True)
        for case in cases + shipped:
            sample = args.sample or None
            if case.shipped:
                n = len(M.case_mutants(case, shas))
                sample = args.shipped_sample if args.shipped_sample and n > BIG else None
            runs = [("flint", sample, args.seed)]
            if not case.shipped and args.mpmath_sample:
                runs.append(("mpmath", args.mpmath_sample, args.seed + 1))
            for backend, size, seed in runs:
                t = M.run_case(case, shas, size, seed, backend=backend)
                per_kind[case.kind].merge(t)
                print(f"{case.kind + ': ' + case.name:<52} {backend:<7} " + counts(t), flush=True)
    print()
    print(f"{'kind':<60} {'tried':>6} {'rej':>6} {'acc-true':>8} {'(claim)':>7} {'acc-false':>9} {'undec':>5} "
          f"{'intern':>6} {'seconds':>8}")
    bad = []
    for kind, t in per_kind.items():
        print(f"{kind:<60} " + counts(t))
        bad += t.bad
    if args.accepted:
        print("\naccepted-and-true mutants by kind, family, field (array indices dropped) and move:")
        for kind, t in per_kind.items():
            groups = Counter(group(label) for label in t.accepted)
            for g, n in sorted(groups.items()):
                print(f"  {kind:<11} {n:>5}  {g}")
    print(f"\ntotal {time.perf_counter() - start:.1f} s wall, {time.process_time():.1f} s CPU, "
          f"load average {os.getloadavg()[0]:.1f}")
    for cls, label, detail, _ in bad[:20]:
        print(f"!! {cls}: {label}: {detail[:200]}")
    return 1 if bad else 0


def group(label: str) -> str:
    """A mutant label without array indices and move counters (drop3 -> drop)."""
    family, path, move = label.split(":", 2)
    field = ".".join(p for p in path.split(".") if not p.isdigit())
    return f"{family}:{field}:{move.rstrip('0123456789')}"


def counts(t) -> str:
    """One table row's numbers."""
    c = t.counts
    return (f"{t.tried:>6} {c['rejected']:>6} {c['accepted-true']:>8} {t.claim_true:>7} {c['accepted-false']:>9} "
            f"{c['accepted-undecided']:>5} {c['internal']:>6} {t.seconds:>8.1f}")


if __name__ == "__main__":
    random.seed(0)
    sys.exit(main())
