"""The local certificate on one input (claim form {"local": ...}): the checker's own local derivation,
the competitors it must check along their own gap direction, and the largest R whose every gap stays > 0."""

from fractions import Fraction

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.local import (exact_gaps, gap_floor, gaps, local_parts, movement, multi_floors,
                                                 projections, safety_radius, supported, unscreened)
from tcert.checker.kinds.influence.norms import max_row_dist

from tcert.generator import certificate
from tcert.generator.influence.ledger import round_up
from tcert.generator.prediction import prediction_claim

# Past this many competitors (R >= 2) or exactly evaluated single changes (R = 1) the search stops: each costs
# V x heads (a competitor) or d x (heads + V) (a change) interval operations.
MAX_COMPETITORS = 512
MAX_EXACT = 20000


def fits_one(B, model, base, gs, k):
    """(holds, changes) for R = 1: the single changes the safety radius does not screen, evaluated exactly."""
    changes = unscreened(base, safety_radius(B, base, gs, k))
    if len(changes) > MAX_EXACT:
        return False, None
    return all(g > 0 for g in exact_gaps(B, model, base, k, changes)), changes


def fits(B, model, base, gs, k, G, R):
    """(holds, competitors) for R >= 2: exactly what the checker computes, listing every competitor whose gap
    the coarse rule G lip_f D cannot keep positive (None when there are more than MAX_COMPETITORS)."""
    move = G * movement(base, R)
    cands = [b for b in range(len(gs)) if b != k and gap_floor(B, base, gs[b], Fraction(0), 0) - move <= 0]
    if len(cands) > MAX_COMPETITORS:
        return False, None
    if not cands:
        return True, []
    w, unorms = projections(B, model, base, k, cands)
    deltas = multi_floors(B, base, w, unorms, R)
    return all(gap_floor(B, base, gs[b], d, R) > 0 for b, d in zip(cands, deltas)), cands


def local_certificate(model, tokens, substitutions: int | None = None, backend: str = "flint"):
    """(certificate or None, info). substitutions None: the largest R the local bound allows, trying R = 1, 2,
    ... until one fails (R = 0 still certifies the single-change bounds); None when the prediction is a
    near-tie or the requested R fails."""
    supported(model.config)
    B, n = make_backend(backend), len(tokens)
    pclaim, p = prediction_claim(model, tokens)
    info = {"n": n, "predicted": p["predicted"], "gap": p["gap"]}
    if pclaim is None:
        return None, dict(info, reason="near-tie")
    k, base = p["predicted"], local_parts(B, model, tokens)
    columns = base["unembed"].T
    G = round_up(max_row_dist(B, columns, columns.rows()[k]))
    gs = gaps(B, model, base, k)
    info.update(change=float(base["change"]), change_prob=float(base["change_prob"]))
    one, changes = fits_one(B, model, base, gs, k) if n > 1 else (False, None)

    def attempt(R):
        if R == 1:
            return one, []
        return fits(B, model, base, gs, k, G, R) if 2 <= R <= n - 1 else (R == 0, [])
    if substitutions is None:
        R, competitors = 0, []
        while R < n - 1:
            ok, cands = attempt(R + 1)
            if not ok:
                break
            R, competitors = R + 1, cands
        info["max_R"] = R
    else:
        R = substitutions
        ok, competitors = attempt(R)
        if not ok:
            return None, dict(info, reason=f"R = {R} is not certifiable locally")
    local = {"prediction": pclaim, "change": certificate.num(float(round_up(base["change"]))),
             "change_prob": certificate.num(float(round_up(base["change_prob"]))), "substitutions": R,
             "gap_lipschitz": certificate.num(float(G)), "competitors": competitors,
             "exact_changes": changes if R == 1 else []}
    info.update(R=R, competitors=len(competitors), exact_changes=len(local["exact_changes"]))
    return certificate.envelope("influence", model, {"local": local}, {}), info
