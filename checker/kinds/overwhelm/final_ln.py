"""The final LayerNorm in overwhelm method tight (docs/overwhelm.md, "Real blocks").

Setting of `tight`: the last position's residual before the final LN is r(t) = f + sum_h R_h(t), f fixed
(embedding, b_O, the heads' fixed-position means with b_V through W_O, the MLP of ln2(E[q]) with b_out)
and R_h(t) = sum_i b_hi(t_i) EVO_h(t_i) / (alpha_fix_h + sum_i b_hi(t_i)), EVO_h(t) = (x_t - u_h) W_O^h
the centred EVO row. With P the centring projection, w/b the final LN's gain and bias and
sigma(r) = sqrt(|P r|^2 / d + eps),

    logit_j - logit_k = (u_jk . r) / sigma(r) + e_jk,   u_jk = P (w * (W_U[:, j] - W_U[:, k])),
                                                         e_jk = b . (W_U[:, j] - W_U[:, k]) + b_U[j] - b_U[k].

u_jk . r = (r P diag(w)) . d_jk, so the tight machinery runs unchanged on rows transformed by
M_w = P diag(w) and gives U_jk >= max over T of u_jk . r. For sigma in [s_lo, s_hi], U/sigma + e is
linear in 1/sigma, so max(U/s_lo, U/s_hi) + e < 0 proves logit_j < logit_k (`decide`).

The certificate carries s_lo, s_hi and a hint vector g; the checker only confirms them:
- s_hi: with D = sum_h P R_h(t), |D| <= S = sum_h beta_max_h max_t |P EVO_h(t)| (R_h(t) is beta(t) <=
  beta_max_h times a convex combination of the EVO_h(t_i)), and |P r|^2 = |P f|^2 + 2 P f . D + |D|^2,
  where P f . D = sum_h (P f) . R_h(t) is a linear functional bounded by per-head Dinkelbach lambdas (the
  certificate's `cross_term`; the direction P f is computed by the checker). So |P r|^2 <=
  min((|P f| + S)^2, |P f|^2 + 2 Lambda + S^2) (`residual_sq_upper`), and s_hi^2 >= that / d + eps in
  exact rationals.
- s_lo: with v = P g, Cauchy-Schwarz gives |P r| >= (v . r) / |v| whenever v . r >= 0, and
  m <= min over T of v . r comes from the same per-head Dinkelbach bound for the direction -v (the
  certificate's `variance` lambdas); s_lo^2 <= eps + max(m, 0)^2 / (d |v|^2) (`sigma_sq_lower`) in exact
  rationals. Nothing about g is trusted: a poor g only gives a weak (still sound) bound, down to sqrt(eps).
"""

from fractions import Fraction

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.kinds.overwhelm.tables import sqrt_upper
from tcert.checker.numbers import on_grid, parse_number, parse_vector


def parse(raw, cfg, where: str = "evidence.final_ln") -> dict:
    """evidence.final_ln -> {"g": [Fractions], "variance", "cross_term": raw entries, "sigma_lo", "sigma_hi"}
    (BadInput on shape errors; the {lambdas[, duals]} entries are parsed by the caller)."""
    fields(raw, where, {"variance_direction", "variance", "cross_term", "sigma_lo", "sigma_hi"})
    g = parse_vector(raw["variance_direction"], f"{where}.variance_direction", cfg.d_model, "d_model")
    return {"g": [on_grid(x, False) for x in g],   # any g is valid: on the grid, its mean stays small
            "variance": raw["variance"], "cross_term": raw["cross_term"],
            "sigma_lo": parse_number(raw["sigma_lo"], f"{where}.sigma_lo"),
            "sigma_hi": parse_number(raw["sigma_hi"], f"{where}.sigma_hi")}


def centred(B, X, w=None):
    """X P for P = I - 11^T/d the centring (d = X's columns), or X M_w = X P diag(w) given the final LN's
    gain w (row r M_w = (P r) * w, so (r M_w) . d_jk = u_jk . r): X (d I - 11^T) [diag(w)] scaled by 1/d.
    The integer matrix (entries d - 1 and -1) and diag(w) are exact points, so both products take the exact
    layer's point path and only the scale rounds; the scaled result is native, so a product with it
    enters the exact layer as a ball (`exact_backend.ball_times_point`: a third of the ends' digit products)."""
    d = X.shape[1]
    Y = X @ B.array(d * np.eye(d) - 1.0)
    if w is not None:
        Y = Y @ B.array(np.diag(np.asarray(w, dtype=np.float64)))
    return Y.scale(B.num(Fraction(1, d)))


def offsets(B, W, k: int, Wd) -> list:
    """Upper bounds (Fractions) of e_jk = b . (W_U[:, j] - W_U[:, k]) + b_U[j] - b_U[k] for all j (Wd =
    W_U - W_U[:, k], d_model x d_vocab)."""
    bU = W.vec("unembed.b_U")
    row = (W.mat("ln_final.b") @ Wd).rows()[0]
    return [B.upper(x + bU[j] - bU[k]) for j, x in enumerate(row)]


def decide(U: Fraction, e: Fraction, s_lo: Fraction, s_hi: Fraction) -> Fraction:
    """An upper bound of U'/sigma + e over U' <= U and sigma in [s_lo, s_hi] (s_lo > 0): the larger
    endpoint of a function linear in 1/sigma."""
    return max(U / s_lo, U / s_hi) + e


def sq_norms_upper(B, X) -> list:
    """Per row of the interval matrix X, an exact upper bound of |P x|^2 (P the centring)."""
    C = centred(B, X)
    ones = B.array(np.ones((X.shape[1], 1)))
    return [max(B.upper(r[0]), Fraction(0)) for r in (C.map(lambda x: x * x) @ ones).rows()]


def residual_sq_upper(B, cfg, Pf, evo_all, beta: list, cross: Fraction):
    """(N2, |P f|^2 bound, S): N2 >= |P r|^2 for every reachable residual r. With Pf = P f (1 x d), S =
    sum_h beta_max_h max_t |P EVO_h(t)| >= |P r - P f| (evo_all: the heads' EVO rows stacked by head) and
    cross >= max over T of P f . (r - f) (certified by the caller), N2 = min((|P f| + S)^2, |P f|^2 +
    2 cross + S^2)."""
    ones = B.array(np.ones((cfg.d_model, 1)))
    pf2 = max(B.upper((Pf.map(lambda x: x * x) @ ones).rows()[0][0]), Fraction(0))
    sq = sq_norms_upper(B, evo_all)
    n = len(sq) // len(beta)
    S = sum((bmax * sqrt_upper(B, max(sq[h * n:(h + 1) * n])) for h, (_, bmax) in enumerate(beta)), Fraction(0))
    return min((sqrt_upper(B, pf2) + S) ** 2, pf2 + 2 * cross + S * S), pf2, S


def centred_direction(g: list):
    """(v, |v|^2) for v = P g, in exact rationals."""
    mean = sum(g, Fraction(0)) / len(g)
    v = [x - mean for x in g]
    return v, sum((x * x for x in v), Fraction(0))


def sigma_sq_lower(cfg, m: Fraction, vv: Fraction) -> Fraction:
    """A lower bound of sigma(r)^2 for every reachable r, given m <= min over T of v . r and vv = |v|^2:
    eps + max(m, 0)^2 / (d vv) (Cauchy-Schwarz; only eps when vv = 0)."""
    return cfg.eps + (max(m, Fraction(0)) ** 2 / (cfg.d_model * vv) if vv > 0 else 0)
