"""Generate Max-of-K `accuracy` certificates (float, untrusted): the claim, one certificate per strategy
(brute | cubic | subcubic[:NAME], the modules of this package), and an estimate that is never a certificate.

The layout mirrors the checker's `tcert.checker.kinds.accuracy`: `tables` (float EQKE, EQKP, EU, EVOU, PVOU),
`brute`, `cubic`, `subcubic`. See docs/accuracy.md for the arguments.
"""

import math
import time

import numpy as np

from tcert.checker.kinds.accuracy.tables import require_maxofk

from tcert.generator import certificate
from tcert.generator.accuracy.brute import brute_count, brute_flops
from tcert.generator.accuracy.cubic import cubic_cases, cubic_flops
from tcert.generator.accuracy.subcubic import subcubic_evidence
from tcert.generator.accuracy.tables import float_tables, tables_flops


def claim_for(model, count: int) -> dict:
    """The accuracy claim: correct (max token's logit strictly largest) on >= count inputs."""
    c = model.config
    return {"task": "max-of-k", "d_vocab": c.d_vocab, "n_ctx": c.n_ctx,
            "inputs": c.d_vocab ** c.n_ctx, "correct_at_least": int(count)}


# ----------------------------------------------------------------------------------------- certificates

def make_certificate(model, strategy: str, true_count: int | None = None):
    """(certificate, report) for `strategy` in brute | cubic | subcubic[:NAME]."""
    require_maxofk(model)
    c = model.config
    v, n = c.d_vocab, c.n_ctx
    start = time.perf_counter()
    T = float_tables(model)
    report = {"strategy": strategy}
    if strategy == "brute":
        count = brute_count(model, T)
        evidence = {"strategy": "brute"}
        true_count = count if true_count is None else true_count
        flops = brute_flops(v, n, c.d_model, c.d_head)
        info = {"complexity": "O(d_vocab^n_ctx * n_ctx * d_vocab)", "flops": flops, "checker_flops": flops}
    elif strategy == "cubic":
        cases, count = cubic_cases(model, T)
        evidence = {"strategy": "cubic",
                    "cases": [[m, q, cc, format(mask, "x")] for m, q, cc, mask in cases]}
        claimed = sum(bin(mask).count("1") if cc else 1 for _, _, cc, mask in cases)
        info = {"complexity": "O(d_vocab^3 * n_ctx^2)", "flops": cubic_flops(v, n, c.d_model, c.d_head),
                "checker_flops": tables_flops(v, n, c.d_model, c.d_head) + v * 8 * v * v + claimed * 2 * 12}
    elif strategy == "subcubic" or strategy.startswith("subcubic:"):
        evidence, count, info = subcubic_evidence(model, T, strategy.partition(":")[2] or None)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    report["generator_seconds"] = time.perf_counter() - start
    info = dict(info, strategy=strategy, bound=count, inputs=v ** n)
    if true_count is not None:
        info["true_count"] = int(true_count)
        info["bound_over_true"] = f"{count / true_count:.7f}" if true_count else "n/a"
    info["bound_over_inputs"] = f"{count / v ** n:.7f}"
    report.update(info)
    cert = certificate.envelope("accuracy", model, claim_for(model, count), evidence, info)
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
