"""Generate `prediction` certificates: the greedy next token on one input, with a safe margin."""

import math

import numpy as np

from tcert.checker.errors import BadInput
from tcert.generator import certificate
from tcert.generator.model.forward import logits as forward_logits

# The float64 forward pass is within ~1e-12 relative of the exact value; claiming the gap less this
# much slack keeps the claim true while staying tight.
RELATIVE_SLACK = 1e-9


def predict(model, tokens: list) -> dict:
    """Float facts about the next token: predicted id, runner-up, float gap and a safe margin."""
    if model.config.d_vocab < 2:
        raise BadInput("a prediction needs d_vocab >= 2 (with one token there is no other to be ahead of)")
    lg = forward_logits(model, np.asarray([tokens], dtype=np.int64))[0]
    order = np.argsort(-lg, kind="stable")
    k, j = int(order[0]), int(order[1])
    gap = float(lg[k] - lg[j])
    slack = RELATIVE_SLACK * max(1.0, float(np.abs(lg).max()))
    margin = gap - slack
    return {"predicted": k, "runner_up": j, "gap": gap, "margin": margin, "logits": lg}


def prediction_claim(model, tokens: list):
    """The prediction claim for `tokens` (or None when the top two logits are too close to certify)."""
    p = predict(model, tokens)
    if not p["margin"] > 0 or not math.isfinite(p["margin"]):
        return None, p
    return {"tokens": [int(t) for t in tokens], "predicted": p["predicted"],
            "margin": certificate.num(p["margin"])}, p


def prediction_certificate(model, tokens: list):
    """A full prediction certificate for `tokens`, or None when the prediction is a near-tie."""
    claim, p = prediction_claim(model, tokens)
    if claim is None:
        return None, p
    return certificate.envelope("prediction", model, claim, {}, {"runner_up": p["runner_up"]}), p
