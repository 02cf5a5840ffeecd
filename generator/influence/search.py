"""Adversarial search for the largest single-token influence: a lower bound on the true worst case,
against which tightness reports and tests compare the certified bounds."""

import numpy as np


def adversarial_influence(model, n: int, trials: int = 64, greedy_rounds: int = 2, seed: int = 0):
    """Largest (||y - y'||_2, ||p - p'||_1) found over pairs of length-n inputs differing at one position
    i < n-1: random base inputs, then greedy coordinate ascent on the base and the substituted token
    (float64 forward pass; a lower bound on the true worst case, for tightness reports and tests)."""
    from tcert.generator.model.forward import logits, residuals
    cfg = model.config
    rng = np.random.default_rng(seed)
    V = cfg.d_vocab

    # Pairwise differences cost (replacements)^2 * d memory: past 256 tokens, search over a random
    # subset of replacements (still a lower bound on the worst case, which is all a search gives).
    replacements = np.arange(V) if V <= 256 else np.sort(rng.choice(V, size=256, replace=False))

    def measure(base, i):
        """Both quantities, worst over the replacement tokens at position i."""
        batch = np.repeat(base[None], len(replacements), axis=0)
        batch[:, i] = replacements
        y = residuals(model, batch)[-1][:, -1]
        lg = logits(model, batch)
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dy = np.sqrt(((y[:, None] - y[None]) ** 2).sum(-1)).max()
        dp = np.abs(p[:, None] - p[None]).sum(-1).max()
        return float(dy), float(dp)

    best_y = best_p = 0.0
    for _ in range(trials):
        base = rng.integers(0, V, n)
        i = int(rng.integers(0, n - 1))
        cur = measure(base, i)
        for _ in range(greedy_rounds):
            others = [pos for pos in range(n) if pos != i]
            for pos in rng.choice(others, size=min(len(others), 8), replace=False):
                cands = rng.choice(V, size=min(V, 6), replace=False)
                for tok in cands:
                    trial = base.copy()
                    trial[pos] = tok
                    val = measure(trial, i)
                    if val[0] > cur[0]:
                        base, cur = trial, val
        best_y, best_p = max(best_y, cur[0]), max(best_p, cur[1])
    return best_y, best_p
