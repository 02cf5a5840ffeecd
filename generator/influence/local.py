"""The local certificate on one input (claim form {"local": ...}): the checker's own local derivation,
the competitors it must check along their own gap direction, and the largest R whose every gap stays > 0."""

from fractions import Fraction

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.local import (exact_gaps, gap_floor, gaps, local_parts, movement, multi_floors,
                                                 projections, propagated_floors, safety_radius, supported, unscreened)
from tcert.checker.kinds.influence.norms import max_row_dist

from tcert.generator import certificate
from tcert.generator.influence.ledger import round_up
from tcert.generator.prediction import prediction_claim

# Past this many exactly evaluated single changes (R = 1) the search stops: each costs d x (heads + V)
# interval operations.
MAX_EXACT = 20000


def fits_one(B, model, base, gs, k):
    """(holds, changes) for R = 1: the single changes the safety radius does not screen, evaluated exactly."""
    changes = unscreened(base, safety_radius(B, base, gs, k))
    if len(changes) > MAX_EXACT:
        return False, None
    return all(g > 0 for g in exact_gaps(B, model, base, k, changes)), changes


class Directions:
    """For R >= 2: the projections of every competitor b != k (`projections`, computed once, on first use)."""

    def __init__(self, B, model, base, k):
        self.B, self.model, self.base, self.k, self.w = B, model, base, k, None

    def fits(self, gs, G, R):
        """(holds, competitors): exactly what the checker computes, listing every competitor whose gap the
        coarse rule G lip_f D cannot keep positive."""
        B, base, k = self.B, self.base, self.k
        move = G * movement(base, R)
        cands = [b for b in range(len(gs)) if b != k and gap_floor(B, base, gs[b], Fraction(0), 0) - move <= 0]
        if not cands:
            return True, []
        if self.w is None:
            self.w = projections(B, self.model, base, k, [b for b in range(len(gs)) if b != k])
        at = [b - (b > k) for b in cands]   # b's index among the competitors b != k
        w = [([mins[i] for i in at], [[row[i] for i in at] for row in rows]) for mins, rows in self.w[0]]
        deltas = multi_floors(B, base, w, [self.w[1][i] for i in at], R)
        return all(gap_floor(B, base, gs[b], d, R) > 0 for b, d in zip(cands, deltas)), cands


def largest(holds, lo: int, hi: int) -> int:
    """The largest R in [lo, hi] with holds(R) (lo - 1 when none), for holds decreasing in R: hi first (saturated
    heads often certify every position), then a binary search."""
    if lo <= hi and holds(hi):
        return hi
    hi -= 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid + 1
        else:
            hi = mid - 1
    return hi


def local_certificate(model, tokens, substitutions: int | None = None, backend: str = "flint"):
    """(certificate or None, info). substitutions None: the largest R the local bound allows (R >= 2 by the
    direction rule, searched first since it implies R = 1; else R = 1 by exact single changes; R = 0 still
    certifies the single-change bounds); None when the prediction is a near-tie or the requested R fails."""
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
    if model.config.n_layers >= 2:   # propagated through the blocks: R <= 1, no hints
        fits = n > 1 and all(gap - move > 0 for _, gap, move in propagated_floors(B, base, gs, k, 1))
        R = (1 if fits else 0) if substitutions is None else substitutions
        info["max_R"] = 1 if fits else 0
        if R > (1 if fits else 0):
            return None, dict(info, reason=f"R = {R} is not certifiable locally (L-layer rule: R <= 1)")
        return envelope(model, pclaim, base, R, G, []), dict(info, R=R, competitors=0, exact_changes=0)
    directions, found = Directions(B, model, base, k), {}

    def attempt(R):
        if R not in found:
            found[R] = (fits_one(B, model, base, gs, k) if R == 1 else directions.fits(gs, G, R) if 2 <= R <= n - 1
                        else (R == 0, []))
        return found[R]
    if substitutions is None:
        R = largest(lambda R: attempt(R)[0], 2, n - 1)
        if R < 2:
            R = 1 if n > 1 and attempt(1)[0] else 0
        info["max_R"] = R
    else:
        R = substitutions
    ok, listed = attempt(R)
    if not ok:
        return None, dict(info, reason=f"R = {R} is not certifiable locally")
    cert = envelope(model, pclaim, base, R, G, listed)
    local = cert["claim"]["local"]
    info.update(R=R, competitors=len(local["competitors"]), exact_changes=len(local["exact_changes"]))
    return cert, info


def envelope(model, pclaim, base, R, G, listed):
    """The local certificate: the recomputed numbers rounded up, the hints the rule for R needs."""
    local = {"prediction": pclaim, "change": certificate.num(float(round_up(base["change"]))),
             "change_prob": certificate.num(float(round_up(base["change_prob"]))), "substitutions": R,
             "gap_lipschitz": certificate.num(float(G)), "competitors": listed if R >= 2 else [],
             "exact_changes": listed if R == 1 else []}
    return certificate.envelope("influence", model, {"local": local}, {})
