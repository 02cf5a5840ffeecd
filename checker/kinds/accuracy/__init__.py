"""`accuracy`: a 1-layer attention-only Max-of-K model answers at least N of its d_vocab^K inputs correctly.

claim    {"task": "max-of-k", "d_vocab": v, "n_ctx": K, "inputs": v^K, "correct_at_least": N}
         An input (t_0..t_{K-1}) is answered correctly when the last position's logit of max(t) is strictly
         larger than every other logit (exact real arithmetic on the stored weights; a tie is wrong).
         Optional "distribution" (`distribution.py`: exact weights per token position and/or "max_at_least")
         with "total_weight", its total: then N (an exact number) is a weight, not a count.
evidence {"strategy": "brute" | "cubic" | "subcubic" | "refine", ...}: the strategy's module states its fields.

The check, top to bottom: the architecture (`tables.require_maxofk`), the claim (`parse_claim`), the
strategy named by evidence.strategy certifies a weight of inputs certainly correct (`brute.certified`,
`cubic.certified`, `subcubic.certified`, `refine.certified`: rigorous tables from `tables.integer_tables`,
then exact integer comparisons; a count under uniform counting), and the count obligation compares that
number with N (`count_obligation`).

Rules for the two ways to fail: a field that is malformed, or outside a limit that can be decided from the
certificate and the model's config alone, is BadInput (exit 2). Everything established by arithmetic on
the weights and hints is an obligation, Rejected (exit 1) when it cannot be confirmed: a table enclosure
beyond 2^4032, a hint whose normaliser (y . x, det) may be 0, an exp argument beyond the exp range, a case
whose bound is not negative, a count below the claim. docs/accuracy.md states each argument.
"""

from fractions import Fraction

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.kinds.accuracy import brute, cubic, refine, subcubic
from tcert.checker.kinds.accuracy.distribution import parse_distribution
from tcert.checker.kinds.accuracy.tables import require_maxofk
from tcert.checker.numbers import parse_int, parse_number, show

CERTIFIED = {"brute": brute.certified, "cubic": cubic.certified, "subcubic": subcubic.certified,
             "refine": refine.certified}


def check(model, claim, evidence, B, ob):
    """Verify an accuracy certificate."""
    require_maxofk(model)
    claimed, dist = parse_claim(claim, model.config)
    weight, method = strategy(evidence)(B, model, evidence, dist, ob)
    total = dist.value(dist.total()) if "distribution" in claim else None
    count_obligation(claimed, dist.value(weight), method, model.config, total, ob)


def parse_claim(claim, cfg) -> tuple:
    """Validate the claim against the model config; return (N, the input distribution)."""
    weighted = "distribution" in claim
    fields(claim, "claim", {"task", "d_vocab", "n_ctx", "inputs", "correct_at_least"}
           | ({"total_weight"} if weighted else set()), {"distribution"})
    if claim["task"] != "max-of-k":
        raise BadInput("claim.task: must be \"max-of-k\"")
    parse_int(claim["d_vocab"], "claim.d_vocab", cfg.d_vocab, cfg.d_vocab)
    parse_int(claim["n_ctx"], "claim.n_ctx", cfg.n_ctx, cfg.n_ctx)
    total = cfg.d_vocab ** cfg.n_ctx
    parse_int(claim["inputs"], "claim.inputs", total, total)
    dist = parse_distribution(claim, cfg.n_ctx, cfg.d_vocab)
    if not weighted:
        return parse_int(claim["correct_at_least"], "claim.correct_at_least", 0, total), dist
    weight = dist.value(dist.total())
    if parse_number(claim["total_weight"], "claim.total_weight") != weight:
        raise BadInput(f"claim.total_weight: the distribution's total weight is {show(weight)}")
    claimed = parse_number(claim["correct_at_least"], "claim.correct_at_least")
    if not 0 <= claimed <= weight:
        raise BadInput(f"claim.correct_at_least: {show(claimed)} outside [0, {show(weight)}]")
    return claimed, dist


def strategy(evidence):
    """The `certified(B, model, evidence, dist, ob) -> (weight, method)` function evidence.strategy names:
    `weight` is the summed integer weight numerators (`Distribution.value` gives the weight; a count under
    uniform counting)."""
    if not isinstance(evidence, dict) or "strategy" not in evidence:
        raise BadInput("evidence: missing field 'strategy'")
    name = evidence["strategy"]
    if not isinstance(name, str) or name not in CERTIFIED:
        raise BadInput(f"evidence.strategy: unknown strategy {str(name)[:30]!r}")
    return CERTIFIED[name]


def count_obligation(claimed, count, method: str, cfg, total, ob):
    """"accuracy: count": the certified count (or weight, when the claim has a distribution of total weight
    `total`) is at least the claimed N (recorded as claim.correct_at_least)."""
    n, v = cfg.n_ctx, cfg.d_vocab
    what = "correct inputs" if total is None else "weight of correct inputs"
    with ob.step("accuracy: count") as fig:
        fig["claim.correct_at_least"] = count
        ob.require(count >= claimed, f"{method} certifies {show(count)} {what}, {show(claimed - count)} "
                                     f"fewer than the claimed {show(claimed)}")
    if total is not None:
        ob.summary = (f"Max-of-{n} model: the inputs it answers correctly weigh >= {show(claimed)} of "
                      f"{show(total)} under the claim's distribution "
                      f"({show(Fraction(claimed) / total) if total else 'n/a'}; {method} certifies {show(count)})")
    else:
        ob.summary = (f"Max-of-{n} model is correct on >= {claimed} of {v ** n} inputs "
                      f"({show(Fraction(claimed, v ** n))}; {method} certifies {count})")
