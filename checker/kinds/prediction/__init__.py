"""`prediction`: on token sequence x, model M's greedy next token is k, ahead of every other by >= m.

claim    {"tokens": [int, ...], "predicted": int, "margin": exact number > 0}
evidence {}  (nothing to hint: the checker runs the forward pass itself)

Obligation "prediction: logit gap": the logit enclosures of the last position satisfy
lower(logit_k - logit_j) >= m for every j != k. When they do not at the backend's precision, the
checker first tries a coarse pass at 48 bits and then raises the precision itself (`precision.py`: to at
most 1024 bits and 24 first-pass equivalents of work) and recomputes, and answers REJECTED only when the claim is refuted or the raise stops. Figures:
"claim.margin" (the certified min gap, at the precision that decided), "claim.precision" (that precision,
bits) and "claim.margin.upper" (an upper bound of the true min gap: a claim above it is false). Other
kinds reuse `check_claim` for their sample inputs (figures "<where>.margin", ..., e.g.
"evidence.sample.margin").
"""

from fractions import Fraction
from typing import NamedTuple

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.forward import Weights, last_logits, unembed_input
from tcert.checker.interval import EXACT_MAX_PREC, make_backend
from tcert.checker.kinds.prediction.gaps import GapTable, exact_gap_table
from tcert.checker.kinds.prediction.precision import COARSE_PREC, COARSE_SQUARINGS, MAX_PREC, WORK_LIMIT, next_precision, pass_cost
from tcert.checker.numbers import parse_int, parse_number, show


class Gap(NamedTuple):
    """The decisive result: the certified min gap `lower` (to runner-up j), an upper bound of the true min
    gap, the precision it was computed at, and why the raise stopped ("" when the margin holds)."""

    lower: Fraction
    j: int
    upper: Fraction
    prec: int
    stop: str


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


def gap_bounds(B, model, tokens: list, k: int, W=None):
    """(lower, upper) exact bounds of logit_k - logit_j at the last position, for every j (j = k gives 0):
    a `GapTable` by the exact layer where it applies (`gaps.py`), else a list from the logit enclosures."""
    W = W or Weights(B, model)
    x = unembed_input(B, model, tokens, W)
    table = exact_gap_table(B, W, x, k)
    if table is not None:
        return table
    logits = last_logits(B, model, tokens, W, x)
    diffs = [logits[k] - y for y in logits]
    return [(Fraction(0), Fraction(0)) if j == k else (B.lower(d), B.upper(d)) for j, d in enumerate(diffs)]


def logit_gaps(B, model, tokens: list, k: int, W=None) -> list:
    """Exact lower bounds of logit_k - logit_j at the last position, for every j (j = k gives 0)."""
    return [lo for lo, _ in gap_bounds(B, model, tokens, k, W)]


def gap_at(B, model, tokens: list, k: int, W) -> tuple:
    """(lower, j, upper, bounds) at B's precision: the certified min gap and its runner-up j, an upper bound
    of the true min gap, and the (lower, upper) bounds of every gap j != k (a sequence of Fraction pairs)."""
    with B.precision():
        table = gap_bounds(B, model, tokens, k, W)
    if isinstance(table, GapTable):
        table = table.without(k)
        return (*table.extremes(), table)
    bounds = [g for j, g in enumerate(table) if j != k]
    lower, j = min((lo, j + (j >= k)) for j, (lo, _) in enumerate(bounds))
    return lower, j, min(hi for _, hi in bounds), bounds


def coarse_gap(B, model, tokens: list, k: int, margin: Fraction, W) -> Gap | None:
    """The min gap at COARSE_PREC bits when it proves `margin` (precision.py: a whole rigorous pass at the lower
    precision, where the exact layer keeps fewer digits, with looser norms, COARSE_SQUARINGS), else None; None at once unless B's exact layer is on
    at a precision above COARSE_PREC (and at most EXACT_MAX_PREC)."""
    if not (B.exact and COARSE_PREC < B.prec <= EXACT_MAX_PREC):
        return None
    C = make_backend(B.name, COARSE_PREC)
    lower, j, upper, _ = gap_at(C, model, tokens, k, Weights(C, model, W.norms, COARSE_SQUARINGS))
    return Gap(lower, j, upper, COARSE_PREC, "") if lower >= margin else None


def certify_gap(B, model, tokens: list, k: int, margin: Fraction, W=None) -> Gap:
    """The min gap certified by the coarse pass (`coarse_gap`), else at B's precision and at higher precisions
    (precision.py) while it is below `margin` and the claim is neither refuted nor out of budget."""
    W, start, spent = W or Weights(B, model), B.prec, pass_cost(B.prec)
    coarse = coarse_gap(B, model, tokens, k, margin, W)
    if coarse is not None:
        return coarse
    while True:
        lower, j, upper, bounds = gap_at(B, model, tokens, k, W)
        if lower >= margin:
            return Gap(lower, j, upper, B.prec, "")
        short = bounds.below(margin) if isinstance(bounds, GapTable) else bounds   # only these raise the precision
        nxt = next_precision(B.prec, short, margin)
        stop = ("refuted" if upper < margin else "cap" if nxt > max(MAX_PREC, start)
                else "work" if spent + pass_cost(nxt) > WORK_LIMIT * pass_cost(start) else None)
        if stop is not None:
            return Gap(lower, j, upper, B.prec, stop)
        spent += pass_cost(nxt)
        B = make_backend(B.name, nxt)
        W = Weights(B, model, W.norms)


def stop_note(gap: Gap, margin: Fraction) -> str:
    """Why more precision was not tried, for a rejection message."""
    if gap.stop == "refuted":
        return f"; the claim is false: the min gap is <= {show(gap.upper)} < {show(margin)}"
    if gap.stop == "cap":
        return f"; {gap.prec} bits is the precision cap ({MAX_PREC}): higher precision might still help"
    return (f"; the next precision would pass the work limit ({WORK_LIMIT} passes at the starting precision): "
            f"higher precision might still help")


def check_claim(B, model, claim: dict, ob, where: str = "claim", W=None, name: str | None = None) -> Fraction:
    """Obligation `name` (default "prediction: logit gap", "prediction: logit gap at <where>" for a sample
    inside another kind): the certified margin min_j lower(logit_k - logit_j) is >= the claimed one, at B's
    precision or a raised one. Records figures f"{where}.margin", f"{where}.precision" and
    f"{where}.margin.upper"; returns the certified margin."""
    tokens, k, margin = parse_claim(claim, model.config, where)
    with ob.step(name or ("prediction: logit gap" if where == "claim" else f"prediction: logit gap at {where}")) as fig:
        gap = certify_gap(B, model, tokens, k, margin, W)
        fig[f"{where}.margin"], fig[f"{where}.precision"], fig[f"{where}.margin.upper"] = gap.lower, gap.prec, gap.upper
        ob.require(gap.lower >= margin, f"logit[{k}] - logit[{gap.j}] >= {show(gap.lower)} is not >= claimed margin "
                                        f"{show(margin)} (at {gap.prec} bits{stop_note(gap, margin)})")
    return gap.lower


def check(model, claim, evidence, B, ob):
    """Verify a prediction certificate."""
    fields(evidence, "evidence", set())
    certified = check_claim(B, model, claim, ob)
    tokens, k, margin = parse_claim(claim, model.config)
    ob.summary = (f"on {len(tokens)} input tokens the next token is {k}, ahead of every other token "
                  f"by >= {show(margin)} (certified {show(certified)} at {ob.figure('claim.precision')} bits)")
