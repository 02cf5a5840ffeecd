"""The corollary on one input x: its greedy next token k survives ANY change of at most R of the
positions 0..n-2, because R G lip_final min(C r(n), C_abs) < margin (docs/influence.md, 'Corollary')."""

from fractions import Fraction

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_int, parse_number, show
from tcert.checker.kinds.influence.ledger import Claim
from tcert.checker.kinds.influence.norms import max_row_dist
from tcert.checker.kinds.influence.rates import rate
from tcert.checker.kinds.prediction import check_claim as check_prediction
from tcert.checker.kinds.prediction import parse_claim as parse_prediction

WHERE = "claim.corollary"


def gap_movement(substitutions: int, gap_lipschitz: Fraction, lip_final: Fraction, bounds: dict, rate_name: str,
                 n: int, n_layers: int) -> Fraction:
    """R G lip_final min(C r(n), C_abs): how far R changed non-final tokens of a length-n input can move any
    logit gap l_k - l_j, given the certified bounds (C, C_abs) and the final LN's Lipschitz constant."""
    return substitutions * gap_lipschitz * lip_final * min(bounds["C"] * rate(rate_name, n, n_layers),
                                                           bounds["C_abs"])


def parse_corollary(cfg, corollary: dict, claim: Claim) -> tuple:
    """Validate the corollary's shape (BadInput on any defect); return (tokens, k, margin, R, G)."""
    fields(corollary, WHERE, {"prediction", "substitutions", "gap_lipschitz"})
    tokens, k, margin = parse_prediction(corollary["prediction"], cfg, f"{WHERE}.prediction")
    n = len(tokens)
    if not claim.n_min <= n <= claim.n_max:
        raise BadInput(f"{WHERE}: input length {n} outside [n_min, n_max] = [{claim.n_min}, {claim.n_max}]")
    R = parse_int(corollary["substitutions"], f"{WHERE}.substitutions", 1, n - 1)
    G = parse_number(corollary["gap_lipschitz"], f"{WHERE}.gap_lipschitz")
    return tokens, k, margin, R, G


def check_corollary(model, B, ob, corollary: dict, claim: Claim, lip_final: Fraction, M) -> str:
    """Obligations "influence corollary: ...": the prediction on x, G >= max_j ||M[:,k] - M[:,j]|| (M the
    unembedding with the final LN's gain folded in, d x V, an interval matrix), and the movement of R changes
    below the margin. Returns the summary clause."""
    tokens, k, margin, R, G = parse_corollary(model.config, corollary, claim)
    check_prediction(B, model, corollary["prediction"], ob, f"{WHERE}.prediction",
                     name="influence corollary: prediction logit gap")
    with ob.step("influence corollary: gap_lipschitz") as fig:
        columns = M.T
        need = fig[f"{WHERE}.gap_lipschitz"] = max_row_dist(B, columns, columns.rows()[k])
        ob.require(G >= need, f"claimed {show(G)} is below {show(need)}")
    with ob.step("influence corollary: R changes cannot close the gap") as fig:
        move = fig[f"{WHERE}.movement"] = gap_movement(R, G, lip_final, claim.bounds, claim.rate, len(tokens),
                                                       model.config.n_layers)
        ob.require(move < margin, f"R*G*lip*min(C r(n), C_abs) = {show(move)} is not < margin {show(margin)}")
    return (f"; on input of length {len(tokens)} the next token {k} (margin {show(margin)}) survives ANY change "
            f"of <= {R} non-final tokens (total logit-gap movement <= {show(move)})")
