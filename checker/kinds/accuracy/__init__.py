"""`accuracy`: a 1-layer attention-only Max-of-K model answers at least N of its d_vocab^K inputs correctly.

claim    {"task": "max-of-k", "d_vocab": v, "n_ctx": K, "inputs": v^K, "correct_at_least": N}
         An input (t_0..t_{K-1}) is answered correctly when the last position's logit of max(t) is strictly
         larger than every other logit (exact real arithmetic on the stored weights; a tie is wrong).
evidence {"strategy": "brute" | "cubic" | "subcubic", ...}: the strategy's module states its fields.

The check, top to bottom: the architecture (`tables.require_maxofk`), the claim (`parse_claim`), the
strategy named by evidence.strategy certifies a number of inputs certainly correct (`brute.certified`,
`cubic.certified`, `subcubic.certified`: rigorous tables from `tables.integer_tables`, then exact integer
comparisons), and the count obligation compares that number with N (`count_obligation`).

Rules for the two ways to fail: a field that is malformed, or outside a limit that can be decided from the
certificate and the model's config alone, is BadInput (exit 2). Everything established by arithmetic on
the weights and hints is an obligation, Rejected (exit 1) when it cannot be confirmed: a table enclosure
beyond 2^4032, a hint whose normaliser (y . x, det) may be 0, an exp argument beyond the exp range, a case
whose bound is not negative, a count below the claim. docs/accuracy.md states each argument.
"""

from fractions import Fraction

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.kinds.accuracy import brute, cubic, subcubic
from tcert.checker.kinds.accuracy.tables import require_maxofk
from tcert.checker.numbers import parse_int, show

CERTIFIED = {"brute": brute.certified, "cubic": cubic.certified, "subcubic": subcubic.certified}


def check(model, claim, evidence, B, ob):
    """Verify an accuracy certificate."""
    require_maxofk(model)
    claimed = parse_claim(claim, model.config)
    count, method = strategy(evidence)(B, model, evidence, ob)
    count_obligation(claimed, count, method, model.config, ob)


def parse_claim(claim, cfg) -> int:
    """Validate the claim against the model config; return N."""
    fields(claim, "claim", {"task", "d_vocab", "n_ctx", "inputs", "correct_at_least"})
    if claim["task"] != "max-of-k":
        raise BadInput("claim.task: must be \"max-of-k\"")
    parse_int(claim["d_vocab"], "claim.d_vocab", cfg.d_vocab, cfg.d_vocab)
    parse_int(claim["n_ctx"], "claim.n_ctx", cfg.n_ctx, cfg.n_ctx)
    total = cfg.d_vocab ** cfg.n_ctx
    parse_int(claim["inputs"], "claim.inputs", total, total)
    return parse_int(claim["correct_at_least"], "claim.correct_at_least", 0, total)


def strategy(evidence):
    """The `certified(B, model, evidence, ob) -> (count, method)` function evidence.strategy names."""
    if not isinstance(evidence, dict) or "strategy" not in evidence:
        raise BadInput("evidence: missing field 'strategy'")
    name = evidence["strategy"]
    if not isinstance(name, str) or name not in CERTIFIED:
        raise BadInput(f"evidence.strategy: unknown strategy {str(name)[:30]!r}")
    return CERTIFIED[name]


def count_obligation(claimed: int, count: int, method: str, cfg, ob):
    """"accuracy: count": the certified count is at least the claimed N (recorded as claim.correct_at_least)."""
    n, v = cfg.n_ctx, cfg.d_vocab
    with ob.step("accuracy: count") as fig:
        fig["claim.correct_at_least"] = count
        ob.require(count >= claimed, f"{method} certifies {show(count)} correct inputs, {show(claimed - count)} "
                                     f"fewer than the claimed {show(claimed)}")
    ob.summary = (f"Max-of-{n} model is correct on >= {claimed} of {v ** n} inputs ({show(Fraction(claimed, v ** n))}; "
                  f"{method} certifies {count})")
