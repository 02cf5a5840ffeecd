"""Headroom of a direct-path (EU) subcubic variant: replace the mean+diff bound of Tm by the exact value.

    python benchmarks/eu_headroom_maxofk.py [MODEL.safetensors]   (default: the shipped seed123 anchor)

Tm[q, m] = max_{x != m} (EU[q,x] - EU[q,m]) + G_m[x] is what the subcubic proofs bound with the mean+diff
trick on EU (O(d_vocab^2)); its exact value is a d_vocab^3 computation. Any cheaper EU treatment (low-rank
EU with a remainder bound, ...) can at best reach the exact value, so the float bound obtained with the
exact Tm is an upper limit on what such a variant could add. Next to it, the count the shipped EU option
(`+eu`: mean+diff with one centre per group of queries, certified) reaches. Float generator only.
"""

import os
import sys

import numpy as np

import tcert.generator.accuracy.subcubic as ms
from tcert.checker.modelfile import load_model
from tcert.generator.accuracy.tables import float_tables
from tcert.testing import ROOT

mean_diff = ms.value_bounds


def exact_tm(T, groups=None):
    """`value_bounds` with Tm computed exactly (cubic)."""
    Tm, Tq, EUp, Rpre = mean_diff(T)
    n, v = T["n"], T["v"]
    EU, EVOU, PVOU = T["EU"], T["EVOU"], T["PVOU"]
    Pn = (PVOU[: n - 1, None, :] - PVOU[: n - 1, :, None]).max(axis=0)
    G = EVOU - np.diag(EVOU)[:, None] + Pn
    X = EU[:, None, :] + G[None, :, :]                      # (q, m, x)
    X[:, np.arange(v), np.arange(v)] = -np.inf
    return X.max(axis=2) - EU, Tq, EUp, Rpre


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "certificates", "models",
                                                                "maxof4_seed123.safetensors")
    model = load_model(path)
    T = float_tables(model)
    for variant in ("svd", "svd2", "svd-rec", "exact-eqke"):
        ms.value_bounds = mean_diff
        base = ms.subcubic_evidence(model, T, variant)[1]
        grouped = ms.subcubic_evidence(model, T, variant + "+eu")[1]
        ms.value_bounds = exact_tm
        best = ms.subcubic_evidence(model, T, variant)[1]
        ms.value_bounds = mean_diff
        print(f"subcubic:{variant:11s} mean+diff Tm: {base:>10d}   +eu (grouped): {grouped:>10d} "
              f"({(grouped - base) / base:+.2%})   exact Tm: {best:>10d}   headroom {(best - base) / base:+.2%}")


if __name__ == "__main__":
    main()
