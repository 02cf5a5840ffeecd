"""Generate `prediction` certificates: the greedy next token on one input, with a margin the checker confirms.

The float64 forward pass finds the predicted token and the float gap. The claimed margin is then one the
checker can confirm, found with the checker's own rigorous forward pass (`tcert.checker.kinds.prediction`):

1. the float gap less a relative slack of RELATIVE_SLACK, when the rigorous pass at the checker's default
   precision certifies it (small models: the claim is the float gap to ~1e-9);
2. otherwise the certified lower bound less the enclosure's width, at the lowest precision (raised as
   the checker would raise it, at most MAX_PREC - 64 bits) whose enclosure is within GAP_LOSS of the float
   gap: the checker, raising its own precision from the default, reaches a precision at least as high
   and certifies at least that (its lower bound there is >= the true gap minus its own, smaller, width).

If even then nothing positive can be claimed, the input is reported as a near-tie (no certificate).
"""

import math
from fractions import Fraction

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.forward import Weights
from tcert.checker.interval import DEFAULT_PREC, make_backend
from tcert.checker.kinds.prediction import gap_at
from tcert.checker.kinds.prediction.precision import MAX_PREC, next_precision
from tcert.generator import certificate
from tcert.generator.model.forward import logits as forward_logits

# The float64 forward pass is within ~1e-12 relative of the exact value on small models; claiming the gap
# less this much slack keeps the claim true while staying tight (and the rigorous pass confirms it).
RELATIVE_SLACK = 1e-9
GAP_LOSS = Fraction(1, 2 ** 20)     # case 2: the claim may fall below the float gap by this much, relatively
GENERATOR_MAX_PREC = MAX_PREC - 64  # leaves the checker room for its own safety bits


def predict(model, tokens: list) -> dict:
    """Float facts about the next token: predicted id, runner-up, float gap and the float-based margin."""
    if model.config.d_vocab < 2:
        raise BadInput("a prediction needs d_vocab >= 2 (with one token there is no other to be ahead of)")
    lg = forward_logits(model, np.asarray([tokens], dtype=np.int64))[0]
    order = np.argsort(-lg, kind="stable")
    k, j = int(order[0]), int(order[1])
    gap = float(lg[k] - lg[j])
    slack = RELATIVE_SLACK * max(1.0, float(np.abs(lg).max()))
    return {"predicted": k, "runner_up": j, "gap": gap, "margin": gap - slack, "logits": lg}


def confirmed_margin(model, tokens: list, k: int, float_margin: float, gap: float):
    """(margin, precision): a float margin the checker confirms for token k, and the precision the generator
    certified it at (see the module docstring); margin None when nothing positive can be claimed."""
    B = make_backend("flint", DEFAULT_PREC)
    W = Weights(B, model)
    lower, _, _, bounds = gap_at(B, model, tokens, k, W)
    if math.isfinite(float_margin) and float_margin > 0 and lower >= Fraction(float_margin):
        return float_margin, B.prec
    target = Fraction(gap) * (1 - GAP_LOSS) if math.isfinite(gap) and gap > 0 else Fraction(0)
    while True:
        safe = min(lo - (hi - lo) for lo, hi in bounds)
        nxt = next_precision(B.prec, bounds, target) if target > 0 else GENERATOR_MAX_PREC + 1
        if safe >= target or nxt > GENERATOR_MAX_PREC:
            return (float_below(safe) if safe > 0 else None), B.prec
        B = make_backend("flint", nxt)
        W = Weights(B, model, W.norms)
        _, _, _, bounds = gap_at(B, model, tokens, k, W)


def float_below(x: Fraction) -> float:
    """The largest float64 <= x (x > 0), or None when that is not positive."""
    f = float(x)
    f = math.nextafter(f, 0.0) if Fraction(f) > x else f
    return f if f > 0 else None


def prediction_claim(model, tokens: list):
    """The prediction claim for `tokens` (or None when the top two logits are too close to certify)."""
    p = predict(model, tokens)
    margin, p["precision"] = confirmed_margin(model, tokens, p["predicted"], p["margin"], p["gap"])
    if margin is None:
        return None, p
    p["margin"] = margin
    return {"tokens": [int(t) for t in tokens], "predicted": p["predicted"],
            "margin": certificate.num(margin)}, p


def prediction_certificate(model, tokens: list):
    """A full prediction certificate for `tokens`, or None when the prediction is a near-tie."""
    claim, p = prediction_claim(model, tokens)
    if claim is None:
        return None, p
    return certificate.envelope("prediction", model, claim, {}, {"runner_up": p["runner_up"]}), p
