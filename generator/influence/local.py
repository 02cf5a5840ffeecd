"""The local certificate on one input (claim form {"local": ...}): the checker's own local derivation,
and the largest R whose movement stays below the certified prediction margin."""

from fractions import Fraction

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence.local import local_parts, movement, supported
from tcert.checker.kinds.influence.norms import max_row_dist

from tcert.generator import certificate
from tcert.generator.influence.ledger import round_up
from tcert.generator.prediction import prediction_claim


def local_certificate(model, tokens, substitutions: int | None = None, backend: str = "flint"):
    """(certificate or None, info). substitutions None: the largest R the local bound allows (R = 0 still
    certifies the single-change bounds); None when the prediction is a near-tie or the requested R fails."""
    supported(model.config)
    B, n = make_backend(backend), len(tokens)
    pclaim, p = prediction_claim(model, tokens)
    info = {"n": n, "predicted": p["predicted"], "gap": p["gap"]}
    if pclaim is None:
        return None, dict(info, reason="near-tie")
    margin = Fraction(float.fromhex(pclaim["margin"]))
    base = local_parts(B, model, tokens)
    columns = base["unembed"].T
    G = round_up(max_row_dist(B, columns, columns.rows()[p["predicted"]]))

    def fits(R):   # exactly what the checker computes for this R
        return R == 0 or G * movement(base, R) < margin
    lo, hi = 0, n - 1   # movement grows with R: binary search for the largest R that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    R = lo if substitutions is None else substitutions
    info.update(change=float(base["change"]), change_prob=float(base["change_prob"]), max_R=lo)
    if R > lo:
        return None, dict(info, reason=f"R = {R} is not certifiable locally; the largest is {lo}")
    local = {"prediction": pclaim, "change": certificate.num(float(round_up(base["change"]))),
             "change_prob": certificate.num(float(round_up(base["change_prob"]))), "substitutions": R,
             "gap_lipschitz": certificate.num(float(G))}
    info["R"] = R
    return certificate.envelope("influence", model, {"local": local}, {}), info
