"""The hostile-input fuzz campaign at a large size (CI runs it small: tests/soundness/test_fuzz_campaign.py).

    python benchmarks/fuzz_campaign.py [--per-class 200] [--seed 0] [--classes weights,numbers,...]

Builds --per-class cases of each class (tcert.testing.fuzz: extreme exponents in weights and numbers,
sharp and flat attention, huge declared contexts, degenerate vocabularies and dimensions, deep and wide
JSON), checks each with both backends in this process (per run: a time cap, the peak RSS above the
baseline from /proc/self/status after resetting VmHWM) and prints the tally that docs/soundness.md
reports, then every failing case and every generator crash. Exit 1 when a case failed.
"""

import argparse
import tempfile
import time

from tcert.testing.fuzz import CLASSES, run_campaign, tally


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--classes", default=",".join(CLASSES))
    args = ap.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tcert-fuzz-") as workdir:
        records = run_campaign(args.per_class, args.seed, workdir, args.classes.split(","))
    print(f"fuzz campaign: {len(records)} cases, seed {args.seed}, {time.perf_counter() - start:.0f} s\n")
    print(tally(records))
    for r in records:
        if not r["passed"]:
            print(f"FAILED {r['class']} #{r['index']} ({r['what']}): exits {r['exits']}, {r['seconds']:.1f} s, "
                  f"{r['rss'] >> 20} MiB: {r['lines']}")
        if r["generator_crash"]:
            print(f"generator crash {r['class']} #{r['index']}: {r['generator_crash']}")
    return 0 if all(r["passed"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
