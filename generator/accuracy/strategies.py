"""Generate Max-of-K `accuracy` certificates (float, untrusted): the claim, one certificate per strategy
(brute | cubic | subcubic[:NAME] | refine[:BUDGET], the modules of this package), optionally under an input
distribution, and an estimate that is never a certificate.

The layout mirrors the checker's `tcert.checker.kinds.accuracy`: `tables` (float EQKE, EQKP, EU, EVOU, PVOU),
`brute`, `cubic`, `subcubic`, `refine`. Weights of claimed input sets are exact: the generator sums them with
the checker's own `Distribution` (the weights are part of the claim; which inputs are claimed is decided in
floats). See docs/accuracy.md for the arguments.
"""

import math
import time

import numpy as np

from tcert.checker.kinds.accuracy.distribution import parse_distribution
from tcert.checker.kinds.accuracy.tables import require_maxofk

from tcert.generator import certificate
from tcert.generator.accuracy.brute import brute_count, brute_flops, checker_weight, pruned_flops
from tcert.generator.accuracy.cubic import cubic_cases, cubic_flops
from tcert.generator.accuracy.refine import parse_budget, refine_evidence
from tcert.generator.accuracy.subcubic import subcubic_evidence
from tcert.generator.accuracy.tables import float_tables, tables_flops


def claim_for(model, count, distribution: dict | None = None) -> dict:
    """The accuracy claim: correct (max token's logit strictly largest) on >= count inputs; with a
    distribution (claim.distribution's JSON form), on inputs of weight >= count (an exact number)."""
    c = model.config
    claim = {"task": "max-of-k", "d_vocab": c.d_vocab, "n_ctx": c.n_ctx, "inputs": c.d_vocab ** c.n_ctx}
    if distribution is None:
        return dict(claim, correct_at_least=int(count))
    dist = input_distribution(model, distribution)
    return dict(claim, distribution=distribution, total_weight=certificate.num(dist.value(dist.total())),
                correct_at_least=certificate.num(count))


def input_distribution(model, distribution: dict | None):
    """The checker's `Distribution` of claim.distribution's JSON form (uniform counting for None)."""
    c = model.config
    return parse_distribution({} if distribution is None else {"distribution": distribution}, c.n_ctx, c.d_vocab)


# ----------------------------------------------------------------------------------------- certificates

def make_certificate(model, strategy: str, true_count: int | None = None, distribution: dict | None = None):
    """(certificate, report) for `strategy` in brute | cubic | subcubic[:NAME] | refine[:BUDGET], counting
    inputs (or their weight under `distribution`, claim.distribution's JSON form)."""
    require_maxofk(model)
    c = model.config
    v, n = c.d_vocab, c.n_ctx
    start = time.perf_counter()
    T = float_tables(model)
    dist = input_distribution(model, distribution)
    report = {"strategy": strategy}
    if strategy == "brute":
        count, hard = brute_count(model, T, dist)
        count = max(count, checker_weight(model, dist))   # the float test under-claims on sharp models
        evidence = {"strategy": "brute"}
        true_count = count if true_count is None else true_count
        info = {"complexity": "O(d_vocab^n_ctx * n_ctx * d_vocab)", "flops": brute_flops(v, n, c.d_model, c.d_head),
                "checker_flops": pruned_flops(v, n, c.d_model, c.d_head, hard)}
    elif strategy == "cubic":
        cases, _ = cubic_cases(model, T)
        evidence = {"strategy": "cubic",
                    "cases": [[m, q, cc, format(mask, "x")] for m, q, cc, mask in cases]}
        count = sum(dist.case(m, q, [([k for k in range(m) if mask >> k & 1], cc)] if cc else [])
                    for m, q, cc, mask in cases)
        claimed = sum(bin(mask).count("1") if cc else 1 for _, _, cc, mask in cases)
        info = {"complexity": "O(d_vocab^3 * n_ctx^2)", "flops": cubic_flops(v, n, c.d_model, c.d_head),
                "checker_flops": tables_flops(v, n, c.d_model, c.d_head) + v * 8 * v * v + claimed * 2 * 12}
    elif strategy == "subcubic" or strategy.startswith("subcubic:"):
        evidence, _, info = subcubic_evidence(model, T, strategy.partition(":")[2] or None)
        count = sum(dist.case(m, q, [(range(j + 1), cc)] if cc else []) for m, q, cc, j in evidence["cases"])
    elif strategy == "refine" or strategy.startswith("refine:"):
        evidence, count, info = refine_evidence(model, parse_budget(strategy.partition(":")[2] or None), T, dist)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    report["generator_seconds"] = time.perf_counter() - start
    total = dist.value(dist.total())
    bound = dist.value(count)
    info = dict(info, strategy=strategy, bound=certificate.num(bound) if distribution else count, inputs=v ** n)
    if true_count is not None and distribution is None:
        info["true_count"] = int(true_count)
        info["bound_over_true"] = f"{count / true_count:.7f}" if true_count else "n/a"
    info["bound_over_inputs"] = f"{float(bound / total) if total else 0.0:.7f}"
    report.update(info)
    cert = certificate.envelope("accuracy", model, claim_for(model, bound, distribution), evidence, info)
    return cert, report


# ------------------------------------------------------------------------------ estimate (never a certificate)

def estimate_accuracy(model, samples: int = 100_000, seed: int = 0) -> dict:
    """Stratified importance-sampled ESTIMATE of the accuracy, for K where brute force is out of reach.

    Strata: the max token m, of probability pi_m = ((m+1)^K - m^K) / d_vocab^K. Stratum m gets samples in
    proportion to sqrt(pi_m) (at least 64), so rare small-max inputs, where errors concentrate, are
    oversampled; inputs are drawn uniformly inside a stratum (rejection from [0, m]^K). The estimate is
    sum_m pi_m p_m with standard error sqrt(sum_m pi_m^2 p_m (1 - p_m) / n_m). Float64, no guarantee:
    it is printed as an estimate and never written into a certificate.
    """
    from tcert.generator.model.forward import logits
    c = model.config
    v, n = c.d_vocab, c.n_ctx
    rng = np.random.default_rng(seed)
    pi = np.array([((m + 1) ** n - m ** n) / v ** n for m in range(v)])
    alloc = np.maximum(64, np.round(samples * np.sqrt(pi) / np.sqrt(pi).sum())).astype(int)
    est = var = 0.0
    for m in range(v):
        want, rows = int(alloc[m]), []
        while sum(len(r) for r in rows) < want:
            draw = rng.integers(0, m + 1, size=(2 * want + 8, n))
            rows.append(draw[draw.max(axis=1) == m])
        toks = np.concatenate(rows)[:want]
        lg = logits(model, toks)
        right = lg[:, m].copy()
        lg[:, m] = -np.inf
        p = float(np.mean(right > lg.max(axis=1)))
        est += pi[m] * p
        var += pi[m] ** 2 * p * (1 - p) / want
    return {"estimate": est, "stderr": math.sqrt(var), "samples": int(alloc.sum()), "seed": seed,
            "note": "importance-sampled estimate (float64), not a certificate"}
