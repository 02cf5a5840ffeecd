"""`prediction`: on token sequence x, model M's greedy next token is k, ahead of every other by >= m.

claim    {"tokens": [int, ...], "predicted": int, "margin": exact number > 0}
evidence {}  (nothing to hint: the checker runs the forward pass itself)

Obligation "prediction: logit gap": the logit enclosures of the last position satisfy
lower(logit_k - logit_j) >= m for every j != k; the certified min gap is recorded as figure
"claim.margin". Other kinds reuse `logit_gaps` and `check_claim` for their sample inputs (figure
"<where>.margin", e.g. "evidence.sample.margin").
"""

from fractions import Fraction

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_int, parse_number
from tcert.checker.forward import Weights, last_logits
from tcert.checker.numbers import show


def parse_claim(claim: dict, cfg, where: str = "claim"):
    """Validate a prediction claim against the model config; return (tokens, k, margin)."""
    fields(claim, where, {"tokens", "predicted", "margin"})
    if cfg.d_vocab < 2:
        raise BadInput(f"{where}: the model has d_vocab = 1, so there is no other token to be ahead of")
    tokens = claim["tokens"]
    if not isinstance(tokens, list) or not 1 <= len(tokens) <= cfg.n_ctx:
        raise BadInput(f"{where}.tokens: must be a list of 1..n_ctx={cfg.n_ctx} token ids")
    tokens = [parse_int(t, f"{where}.tokens[{i}]", 0, cfg.d_vocab - 1) for i, t in enumerate(tokens)]
    k = parse_int(claim["predicted"], f"{where}.predicted", 0, cfg.d_vocab - 1)
    margin = parse_number(claim["margin"], f"{where}.margin")
    if margin <= 0:
        raise BadInput(f"{where}.margin: must be positive")
    return tokens, k, margin


def logit_gaps(B, model, tokens: list, k: int, W=None) -> list:
    """Exact lower bounds of logit_k - logit_j at the last position, for every j (j = k gives 0)."""
    logits = last_logits(B, model, tokens, W)
    return [Fraction(0) if j == k else B.lower(logits[k] - logits[j]) for j in range(len(logits))]


def check_claim(B, model, claim: dict, ob, where: str = "claim", W=None, name: str | None = None) -> Fraction:
    """Obligation `name` (default "prediction: logit gap", "prediction: logit gap at <where>" for a sample
    inside another kind): the certified margin min_j lower(logit_k - logit_j) is >= the claimed one.
    Records it as figure f"{where}.margin" and returns it."""
    tokens, k, margin = parse_claim(claim, model.config, where)
    with ob.step(name or ("prediction: logit gap" if where == "claim" else f"prediction: logit gap at {where}")) as fig:
        gaps = logit_gaps(B, model, tokens, k, W or Weights(B, model))
        certified, j = min((g, j) for j, g in enumerate(gaps) if j != k)
        fig[f"{where}.margin"] = certified
        ob.require(certified >= margin, f"logit[{k}] - logit[{j}] >= {show(certified)} is not >= claimed margin "
                                        f"{show(margin)}")
    return certified


def check(model, claim, evidence, B, ob):
    """Verify a prediction certificate."""
    fields(evidence, "evidence", set())
    certified = check_claim(B, model, claim, ob)
    tokens, k, margin = parse_claim(claim, model.config)
    ob.summary = (f"on {len(tokens)} input tokens the next token is {k}, ahead of every other token "
                  f"by >= {show(margin)} (certified {show(certified)})")
