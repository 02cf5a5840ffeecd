"""The sublayers' changes added as one vector (docs/influence.md, step 6, "The changes added as one vector").

At an unchanged position the residual after block k has moved by y - y' = sum_j z_j A_j over the sublayer terms j
of blocks 0..k, each a row z_j with ||z_j|| <= zeta_j times a fixed matrix A_j (A_j = I for a ball). For any
weights c_j > 0, Cauchy-Schwarz gives ||sum_j z_j A_j|| = max_|u|=1 sum_j z_j A_j u <= max_u sum_j zeta_j ||A_j u||
<= sqrt(sum_j zeta_j^2 / c_j) ||sum_j c_j A_j^T A_j||^(1/2), which does not add every term's largest direction.
The weights are a fixed rule of the claimed constants, c_j = zeta_j / (a bound of ||A_j||). A term is a function
returning (c_j, A_j^T A_j or None for A_j = I, a bound of zeta_j^2 / c_j), called only when the optional constant
`spread<k>.joint` is stated. Scaling one group's weights by t divides its shares by t (each share is zeta^2 / c, the
MLP's a sum of such); the bound is the smallest over MLP_SCALES for the MLP terms' weights.
"""

import functools
from fractions import Fraction

import numpy as np

from tcert.checker.forward import act_lipschitz, kv_head
from tcert.checker.modelfile import kv_names
from tcert.checker.kinds.influence.norms import gram_norm, operator_norm, vector_norm
from tcert.checker.kinds.influence.sublayers import fold, shift

MLP_SCALES = (Fraction(1), Fraction(3, 4), Fraction(1, 2))   # the MLP terms' weights times each (measured: 3/4 or 1/2 best)


def ball_term(zeta: Fraction) -> list:
    """A change of norm <= zeta in any direction (A = I): weight c = zeta, share zeta^2 / c = zeta."""
    return [lambda: (zeta, None, zeta, False)] if zeta > 0 else []


def head_terms(B, model, layer, ln, radii: list) -> list:
    """Block `layer`'s heads reading the LN ball |g| <= R: head h's output moves by (g_h - g_h') N_h, N_h = Mv_h W_O,h
    (its kv head's W_V folded), ||g_h - g_h'|| <= 2R (step 1, the heads stacked). zeta = 2R and ||N_h|| <= r_h / R
    (r_h its claimed value radius >= ||N_h|| R): weight c = 2R^2 / r_h, share 2 r_h."""
    cfg, t, p, R = model.config, model.tensors, f"blocks.{layer}.attn.", ln.radius

    def term(h, r):
        N = fold(B, ln, t[p + kv_names(cfg)["W_V"]][kv_head(cfg, h)]) @ B.array(t[p + "W_O"][h])
        return 2 * R * R / r, N.T @ N, 2 * r, False
    return [functools.cache(functools.partial(term, h, r)) for h, r in enumerate(radii) if r > 0 and R > 0]


def mlp_terms(B, model, layer, ln, s_in: Fraction, s_out: Fraction, power) -> list:
    """The split MLP (step 6, the MLP's diameter): f(g) - f(g') = v (M W_out) + z_e W_out with |v| <= R (v = (g -
    g')/2, s = (g + g')/2, |s|^2 + |v|^2 <= R^2) and ||z_e|| <= e min(||a||, ||b||) <= e (m min(|v|, |s|) + z)
    (m = s_in >= ||M||, z = ||z0||). Weights c_l = R / mu (mu >= ||M W_out||), c_e = e m R / w (w = s_out): with
    P = 1/c_l, Q = e^2 m^2 / c_e (before MLP_SCALES), the largest |v|^2 P + Q min(|v|, |s|)^2 is R^2 max(P, (P + Q)/2), and squaring
    m min + z adds at most (e^2 / c_e)(2 m z R + z^2) = e w (2z + z^2 / (m R)). One function gives both terms."""
    t, p, R = model.tensors, f"blocks.{layer}.mlp.", ln.radius
    e = 2 * act_lipschitz(B, model.config.act_fn) - 1
    if R <= 0 or s_in <= 0 or s_out <= 0:
        return []

    @functools.cache
    def both():
        MW, W_out = fold(B, ln, t[p + "W_in"]) @ B.array(t[p + "W_out"]), B.array(t[p + "W_out"])
        mu, z = operator_norm(B, [MW], power), vector_norm(B, shift(B, ln, t[p + "W_in"], t[p + "b_in"]))
        P, Q = mu / R, e * s_in * s_out / R
        share = R * R * max(P, (P + Q) / 2) + e * s_out * (2 * z + z * z / (s_in * R))
        linear = (R / mu, MW.T @ MW, Fraction(0), True) if mu > 0 else (Fraction(0), None, Fraction(0), True)   # c = 0: none
        return (e * s_in * R / s_out, W_out.T @ W_out, share, True), linear
    return [lambda: both()[0], lambda: both()[1]]


def mlp_choice(B, model, layer, ln, m, moved: Fraction, diameter: Fraction, power) -> list:
    """An MLP's terms: its split (`mlp_terms`) where its move is its diameter and the split holds, else a ball of
    radius `moved` (the block's own bound of that move, e.g. lip times its input's move)."""
    if m.norms is None or moved < diameter:
        return ball_term(moved)
    return mlp_terms(B, model, layer, ln, *m.norms, power)


def joint_bound(B, variants, d: int, power) -> Fraction:
    """The smallest `scaled_bound` over `variants`, each a list of terms bounding the same moves (block 0's attention
    with finite value sets: as a ball, or as its heads reading the LN ball)."""
    return min(scaled_bound(B, [make() for make in terms], d, power) for terms in variants)


def scaled_bound(B, made: list, d: int, power) -> Fraction:
    """The smallest over t in MLP_SCALES of sqrt(sum_j zeta_j^2 / c_j) ||sum_j c_j A_j^T A_j||^(1/2) over the made
    terms, the MLP terms' weights c_j times t (their shares divided by t); the norm by the trace-power bound."""
    best = None
    for t in MLP_SCALES:
        gram, total = None, Fraction(0)
        for c, g, share, mlp in made:
            if c > 0:
                term = (g if g is not None else B.array(np.eye(d))).scale(B.num(c * t if mlp else c))
                gram, total = term if gram is None else gram + term, total + (share / t if mlp else share)
        if gram is not None:
            bound = B.upper(B.sqrt(B.num(total))) * gram_norm(B, gram, power)
            best = bound if best is None else min(best, bound)
    return Fraction(0) if best is None else best
