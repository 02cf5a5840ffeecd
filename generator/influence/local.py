"""The local certificate on one input (claim form {"local": ...}): the checker's own local derivation,
the competitors it must check along their own gap direction, and the largest R whose every gap stays > 0."""

from fractions import Fraction

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.local import (gap_floor, gaps, local_parts, movement, multi_floors, projections,
                                                 single_floors, supported)
from tcert.checker.kinds.influence.norms import max_row_dist

from tcert.generator import certificate
from tcert.generator.influence.ledger import round_up
from tcert.generator.prediction import prediction_claim

# Past this many competitors the per-direction rule costs |C| x V per head and position; the search stops there.
MAX_COMPETITORS = 512


def fits(B, base, gs, k, G, R):
    """(holds, competitors): exactly what the checker computes for R changes, listing every competitor whose gap
    the coarse rule G lip_f D cannot keep positive (None when there are more than MAX_COMPETITORS)."""
    if R == 0:
        return True, []
    move = G * movement(base, R)
    cands = [b for b in range(len(gs)) if b != k and gap_floor(B, base, gs[b], Fraction(0), 0) - move <= 0]
    if len(cands) > MAX_COMPETITORS:
        return False, None
    if not cands:
        return True, []
    w, unorms = projections(B, base, k, cands)
    deltas = single_floors(B, base, w, len(cands)) if R == 1 else multi_floors(B, base, w, unorms, R)
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
    if substitutions is None:
        R, competitors = 0, []
        while R < n - 1:
            ok, cands = fits(B, base, gs, k, G, R + 1)
            if not ok:
                break
            R, competitors = R + 1, cands
        info["max_R"] = R
    else:
        R = substitutions
        ok, competitors = fits(B, base, gs, k, G, R) if R <= n - 1 else (False, None)
        if not ok:
            return None, dict(info, reason=f"R = {R} is not certifiable locally")
    local = {"prediction": pclaim, "change": certificate.num(float(round_up(base["change"]))),
             "change_prob": certificate.num(float(round_up(base["change_prob"]))), "substitutions": R,
             "gap_lipschitz": certificate.num(float(G)), "competitors": competitors}
    info.update(R=R, competitors=len(competitors))
    return certificate.envelope("influence", model, {"local": local}, {}), info
