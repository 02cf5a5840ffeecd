"""In-process A/B of two checker trees on the same machine load: an older checker (e.g. main's) against this one.

    git archive 827e1e8 checker | tar -x -C /tmp/ab_before
    python benchmarks/ab_checker.py --before /tmp/ab_before --rounds 7 \
        --case seed1=M.safetensors,before_brute.json,before_refine.json,after_brute.json,after_refine.json ...

Both trees are imported into one process (each with its own `tcert.checker` modules, swapped into sys.modules
around every call, so lazy imports resolve to the right tree); every round verifies each case's brute and refine
certificate with each tree in turn (Arb backend, the model loaded once per tree), and the least CPU seconds of
the rounds are kept. Each tree checks its own certificates (a refine certificate follows its generator's
checker). Prints per case the brute and refine check CPU seconds of each tree and refine / brute.
"""

import argparse
import os
import sys
import tempfile
import time


def load_tree(root):
    """The `tcert.checker` modules of the checker tree under `root` (None: the one on the import path)."""
    for name in [k for k in sys.modules if k == "tcert" or k.startswith("tcert.")]:
        del sys.modules[name]
    if root:
        sys.path.insert(0, root)
    try:
        from tcert.checker.modelfile import load_model
        from tcert.checker.verify import verify
    finally:
        if root:
            sys.path.remove(root)
    return {k: v for k, v in sys.modules.items() if k == "tcert" or k.startswith("tcert.")}, verify, load_model


def timed(tree, cert, model):
    """CPU seconds of one verify with `tree`'s modules in sys.modules."""
    modules, verify, _ = tree
    for name in [k for k in sys.modules if k == "tcert" or k.startswith("tcert.")]:
        del sys.modules[name]
    sys.modules.update(modules)
    t0 = time.process_time()
    verify(cert, model, "flint")
    return time.process_time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="directory holding the older tree's checker/ directory")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--case", action="append", required=True,
                    help="label=model,before_brute,before_refine,after_brute,after_refine")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ab_tree_")
    os.makedirs(os.path.join(root, "tcert"))
    os.symlink(os.path.abspath(os.path.join(args.before, "checker")), os.path.join(root, "tcert", "checker"))
    trees = {"before": load_tree(root), "after": load_tree(None)}
    cases = []
    for spec in args.case:
        label, files = spec.split("=", 1)
        model, *certs = files.split(",")
        cases.append((label, {t: trees[t][2](model) for t in trees}, dict(zip(
            [("before", "brute"), ("before", "refine"), ("after", "brute"), ("after", "refine")], certs))))
    best = {}
    for _ in range(args.rounds):
        for label, models, certs in cases:
            for (tree, strategy), cert in certs.items():
                cpu = timed(trees[tree], cert, models[tree])
                best[label, tree, strategy] = min(best.get((label, tree, strategy), cpu), cpu)
    print(f"least of {args.rounds} rounds, CPU s (load {os.getloadavg()[0]:.1f})")
    print("| case | brute before | brute after | refine before | refine after | refine / brute before | after |")
    print("|---|---|---|---|---|---|---|")
    for label, _, _ in cases:
        b = {k[1:]: v for k, v in best.items() if k[0] == label}
        print(f"| {label} | {b['before', 'brute']:.3f} | {b['after', 'brute']:.3f} | {b['before', 'refine']:.3f} | "
              f"{b['after', 'refine']:.3f} | {b['before', 'refine'] / b['before', 'brute']:.3f} | "
              f"{b['after', 'refine'] / b['after', 'brute']:.3f} |")


if __name__ == "__main__":
    main()
