"""Influence test helpers: the exhaustive rigorous oracle the constants' soundness tests share."""

import itertools

from tcert.checker.forward import Weights, final_residual, last_logits, softmax
from tcert.checker.kinds.influence.rates import rate
from tcert.checker.numbers import parse_number


def exhaustive_worst(model, cert, B) -> float:
    """Every single non-final change at every n in range (Arb, 100 bits): asserts ||y - y'|| and ||p - p'||_1
    within the certified bounds; returns the largest ratio ||y - y'|| / bound."""
    cfg, claim, W = model.config, cert["claim"], Weights(B, model)
    c = {k: parse_number(claim[k], k) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
    worst = 0.0
    for n in range(claim["n_min"], claim["n_max"] + 1):
        r = rate(claim["rate"], n, cfg.n_layers)
        by, bp = min(c["C"] * r, c["C_abs"]), min(c["C_prob"] * r, c["C_prob_abs"])
        outs = {x: (final_residual(B, model, list(x), W), softmax(B, last_logits(B, model, list(x), W)))
                for x in itertools.product(range(cfg.d_vocab), repeat=n)}
        for x, (y, p) in outs.items():
            for i, tok in itertools.product(range(n - 1), range(cfg.d_vocab)):
                if tok > x[i]:
                    y2, p2 = outs[x[:i] + (tok,) + x[i + 1:]]
                    dy = B.upper(B.sqrt(B.fsum((a - b) * (a - b) for a, b in zip(y, y2))))
                    assert dy <= by and sum(B.abs_upper(a - b) for a, b in zip(p, p2)) <= bp, (n, x, i, tok)
                    worst = max(worst, float(dy / by))
    return worst
