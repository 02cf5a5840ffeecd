"""The corollary on one input: the largest R whose movement bound (the checker's own `gap_movement`)
stays below the certified prediction margin."""

from fractions import Fraction

from tcert.checker.kinds.influence.corollary import gap_movement
from tcert.checker.kinds.influence.norms import max_row_dist

from tcert.generator import certificate
from tcert.generator.influence.constants import DEFAULT_POWER, influence_parts
from tcert.generator.influence.ledger import round_up
from tcert.generator.prediction import prediction_claim


def gap_lipschitz(M, k: int) -> Fraction:
    """max_j ||M[:,k] - M[:,j]||_2 (M the folded unembedding, an interval matrix), rounded up."""
    columns = M.T
    return round_up(max_row_dist(columns.backend, columns, columns.rows()[k]))


def largest_substitutions(n: int, movement, margin: Fraction) -> int:
    """The largest R <= n - 1 with movement(R) < margin (0 if none; movement grows with R)."""
    best = 0
    while best + 1 <= n - 1 and movement(best + 1) < margin:
        best += 1
    return best


def corollary_certificate(model, tokens, substitutions: int | None = None, n_min: int = 2,
                          n_max: int | None = None, power: int = DEFAULT_POWER):
    """(certificate or None, info): influence certificate whose claim adds the robustness corollary.

    substitutions None: the largest R the bounds allow. Returns None when the prediction is a near-tie
    or the requested R is not certifiable (info says why and what the largest certifiable R is).
    """
    n = len(tokens)
    n_max = model.config.n_ctx if n_max is None else n_max
    claim, evidence, needs = influence_parts(model, min(n_min, n), n_max, power)
    pclaim, p = prediction_claim(model, tokens)
    info = {"n": n, "predicted": p["predicted"], "gap": p["gap"]}
    if pclaim is None:
        return None, dict(info, reason="near-tie")
    G, margin = gap_lipschitz(needs["unembed"](), p["predicted"]), Fraction(float.fromhex(pclaim["margin"]))

    def movement(R):   # exactly what the checker will compute from the claim written below
        return gap_movement(R, G, needs["lip_final"], needs, claim["rate"], n, model.config.n_layers)
    best = largest_substitutions(n, movement, margin)
    info.update(per_change=float(movement(1)), margin=float(margin), max_R=best)
    R = best if substitutions is None else substitutions
    if R < 1 or R > best:
        why = (f"one substitution may move the logit gap by up to {info['per_change']:.4g} >= margin "
               f"{float(margin):.4g}" if best == 0 else
               f"R = {R} is not certifiable; the largest certifiable R is {best}")
        return None, dict(info, reason=why)
    claim["corollary"] = {"prediction": pclaim, "substitutions": R, "gap_lipschitz": certificate.num(float(G))}
    info["R"] = R
    return certificate.envelope("influence", model, claim, evidence), info
