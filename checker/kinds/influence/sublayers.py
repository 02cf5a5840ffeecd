"""The sublayers' constants (docs/influence.md, steps 1-5): LayerNorm maps, attention heads, MLPs.

A sublayer reads its LayerNorm's output u = w * g + b, g = P x / sigma(x) (P the centring projection,
sigma(x) = sqrt(|P x|^2 / d + eps)), so every matrix W that reads u is used folded, u W = g (P diag(w) W) +
b W: the gain enters the operator norms and the bias b only shifts a centre. Without normalisation g = x,
the fold is W itself and the shift is 0. Each function asks the ledger for its constants in dependency
order and returns the claimed values.
"""

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from tcert.checker.forward import Weights, act_lipschitz, activation, kv_head, layer_norm
from tcert.checker.modelfile import kv_names
from tcert.checker.kinds.influence.norms import (abs_dot, centred_scaled, folded_norm, gram_norm, min_centred_norms,
                                                 operator_norm, product_norm, row_dists, scaled_rows, vector_norm)


class LNMap(NamedTuple):
    """A LayerNorm as its readers see it: g has norm <= radius and moves by <= lip ||x - x'|| between two
    reachable inputs; w, b: its gain and bias (None without normalisation)."""

    lip: Fraction
    radius: Fraction
    w: np.ndarray | None
    b: np.ndarray | None
    centred: bool = True   # False: RMSNorm (g = x / sigma(x), no centring, no bias)


def fold(B, ln: LNMap, W):
    """P diag(w) W for a LayerNorm with gain w, diag(w) W for an RMSNorm (W itself without normalisation)."""
    if ln.w is None:
        return B.array(W)
    return centred_scaled(B, ln.w, W) if ln.centred else scaled_rows(B, ln.w, W)


def fold_norm(B, ln: LNMap, W, power) -> Fraction:
    """Upper bound of ||fold(ln, W)||_2 (a LayerNorm's wide reader, e.g. W_in, by its Gram matrix alone)."""
    if ln.w is not None and ln.centred:
        return folded_norm(B, ln.w, W, power)
    return operator_norm(B, [fold(B, ln, W)], power)


def shift(B, ln: LNMap, W, bias):
    """The row b W + bias: what a reader of the LN output adds besides g (P diag(w) W)."""
    out = B.array(np.asarray(bias).reshape(1, -1))
    return out if ln.b is None else out + B.array(np.asarray(ln.b).reshape(1, -1)) @ B.array(W)


def layer_norm_map(B, ld, model, prefix, name, bound, reach) -> LNMap:
    """Constants `name`.lip and `name`.radius of LN `prefix` (None: no normalisation) whose inputs have norm
    <= bound and lie in e_t + ball(reach.centre, reach.radius) for some token t (step 1): |P x| >=
    min_t |P(e_t + centre)| - radius =: s, so sigma(x) >= sqrt(s^2/d + eps) =: sigma_min, and ||g - g'|| <=
    ||P(x - x')|| / sqrt(sigma(x) sigma(x')) <= ||x - x'|| / sigma_min; |g| < sqrt(d) and |g| <= bound/sqrt(eps).
    RMSNorm: the same with P = I (g = x / sigma(x), Jacobian (I - g g^T/d) / sigma, sigma = sqrt(|x|^2/d + eps))."""
    if prefix is None:
        return LNMap(Fraction(1), bound, None, None)
    cfg, t = model.config, model.tensors
    d, eps, centred = cfg.d_model, B.num(cfg.eps), not cfg.has_rms

    def lip():
        low = (reach.embeds.min_centred_norm(reach.centre, centred) if reach.embeds is not None
               else min_centred_norms(B, t["embed.W_E"], [reach.centre], centred)[0]) - reach.radius
        return B.upper(1 / B.sqrt(B.num(max(low, Fraction(0)) ** 2 / d) + eps))
    lip = ld.const(name + ".lip", lip)
    radius = ld.const(name + ".radius", lambda: min(B.upper(B.sqrt(B.num(d))), B.upper(B.num(bound) / B.sqrt(eps))))
    return LNMap(lip, radius, t[prefix + ".w"], t[prefix + ".b"] if centred else None, centred)


class MLPBounds(NamedTuple):
    """An MLP sublayer: its output lies in ball(centre, radius) (centre a row of interval scalars), its norm
    is <= out, and it moves by <= lip ||x - x'|| and by <= 2 radius (and by <= diameter unless None); norms: the
    claimed (||M||, ||W_out||) where the split of `mlp_diameter` holds (None for a gated MLP or another act)."""

    centre: list
    radius: Fraction
    out: Fraction
    lip: Fraction
    diameter: Fraction | None = None
    norms: tuple | None = None


SPLIT_ACTS = ("relu", "gelu", "gelu_new", "silu")   # act(z) - act(-z) = z: the split in `mlp_diameter` holds


def mlp_diameter(B, model, layer, ln: LNMap, s_in, s_out, power) -> Fraction:
    """Upper bound of ||f(g) - f(g')|| over |g|, |g'| <= R = radius(ln), f(g) = act(g M + z0) W_out + b_out.
    act(z) - act(-z) = z gives act = (id + h)/2 with h(z) = act(z) + act(-z) even; act' + act'(-.) = 1 and
    |act'| <= Lip put act' in [1 - Lip, Lip], so |h'| <= e = 2 Lip - 1 and, h being even, |h(a) - h(b)| <=
    e ||a| - |b||. With s = (g + g')/2, v = (g - g')/2 (|s|^2 + |v|^2 <= R^2) and a = s M + z0, b = v M:
    f(g) - f(g') = v M W_out + (h(a + b) - h(a - b)) W_out / 2, and ||a + b| - |a - b|| <= 2 min(|a|, |b|)
    per unit, so with m1 = ||M W_out|| / 2, c = e ||W_out|| ||M|| / 2 the change is <= 2 m1 |v| + 2 c
    min(|v|, |s| + |z0| / ||M||) <= min((m1 + c) 2R, 2R sqrt(m1^2 + c^2) + e ||W_out|| |z0|)."""
    t, p = model.tensors, f"blocks.{layer}.mlp."
    m1 = operator_norm(B, [fold(B, ln, t[p + "W_in"]) @ B.array(t[p + "W_out"])], power) / 2
    e = 2 * act_lipschitz(B, model.config.act_fn) - 1
    c, R = e * s_out * s_in / 2, ln.radius
    z0 = vector_norm(B, shift(B, ln, t[p + "W_in"], t[p + "b_in"]))
    return min((m1 + c) * 2 * R, 2 * R * B.upper(B.sqrt(B.num(m1 * m1 + c * c))) + e * s_out * z0)


def mlp(B, ld, model, layer, ln: LNMap, power) -> MLPBounds:
    """Block `layer`'s MLP on the output of `ln`: with z = g M + z0 (M = P diag(w) W_in, z0 = b W_in + b_in)
    and |act(z) - act(z0)| <= Lip(act) |z - z0|, the output lies within Lip(act) ||W_out|| ||M|| radius(ln)
    of b_out + act(z0) W_out."""
    t, p, name = model.tensors, f"blocks.{layer}.mlp.", f"L{layer}.mlp."
    if model.config.gated_mlp:
        return gated_mlp(B, ld, model, layer, ln, power)
    s_in = ld.const(name + "W_in", lambda: fold_norm(B, ln, t[p + "W_in"], power))
    s_out = ld.const(name + "W_out", lambda: operator_norm(B, [t[p + "W_out"]], power))
    act = act_lipschitz(B, model.config.act_fn)
    z0 = shift(B, ln, t[p + "W_in"], t[p + "b_in"])
    centre = (z0.map(activation(B, model.config)) @ B.array(t[p + "W_out"]) + B.array(t[p + "b_out"])).rows()[0]
    radius = ld.const(name + "radius", lambda: act * s_out * s_in * ln.radius)
    out = ld.const(name + "out", lambda: vector_norm(B, B.matrix([centre])) + radius)
    lip = ld.const(name + "lip", lambda: s_out * act * s_in * ln.lip)
    diameter = (ld.optional(name + "diameter", lambda: mlp_diameter(B, model, layer, ln, s_in, s_out, power))
                if model.config.act_fn in SPLIT_ACTS else None)
    split = model.config.act_fn in SPLIT_ACTS
    return MLPBounds(centre, radius, out, lip, diameter, (s_in, s_out) if split else None)


def gated_mlp(B, ld, model, layer, ln: LNMap, power) -> MLPBounds:
    """The gated MLP (act(z_g) * z_i + b_in) W_out + b_out, z_g = g Mg + zg0, z_i = g Mi + zi0 (folded; no
    gate bias): per hidden unit |z_g| <= G_k = |Mg[:,k]| R + |zg0_k|, |z_i| <= I_k likewise (R = radius(ln)),
    |act(z)| <= |z| (relu, gelu, silu), so the output lies within ||W_out|| |(G_k I_k)_k| of b_in W_out + b_out;
    act(z_g) z_i - act(z_g') z_i' = act(z_g)(z_i - z_i') + z_i'(act(z_g) - act(z_g')) moves by <= (max G ||Mi||
    + Lip(act) max I ||Mg||) ||g - g'|| (the g-ball is convex)."""
    t, p, name = model.tensors, f"blocks.{layer}.mlp.", f"L{layer}.mlp."
    Mg, Mi = fold(B, ln, t[p + "W_gate"]), fold(B, ln, t[p + "W_in"])
    zeros = np.zeros(t[p + "W_in"].shape[1])   # b_in is added after the product
    zg0, zi0 = shift(B, ln, t[p + "W_gate"], zeros), shift(B, ln, t[p + "W_in"], zeros)
    s_g = ld.const(name + "W_gate", lambda: operator_norm(B, [Mg], power))
    s_in = ld.const(name + "W_in", lambda: operator_norm(B, [Mi], power))
    s_out = ld.const(name + "W_out", lambda: operator_norm(B, [t[p + "W_out"]], power))
    reach = [[c * ln.radius + B.abs_upper(z) for c, z in zip(row_dists(B, M.T, [B.num(0)] * M.shape[0]), z0.rows()[0])]
             for M, z0 in ((Mg, zg0), (Mi, zi0))]
    G, I = ld.const(name + "gate_max", lambda: max(reach[0])), ld.const(name + "in_max", lambda: max(reach[1]))
    centre = (B.array(t[p + "b_in"].reshape(1, -1)) @ B.array(t[p + "W_out"]) + B.array(t[p + "b_out"])).rows()[0]
    radius = ld.const(name + "radius", lambda: s_out * B.upper(B.sqrt(B.num(sum((a * b) ** 2 for a, b in zip(*reach))))))
    out = ld.const(name + "out", lambda: vector_norm(B, B.matrix([centre])) + radius)
    act = act_lipschitz(B, model.config.act_fn)
    lip = ld.const(name + "lip", lambda: s_out * (G * s_in + act * I * s_g) * ln.lip)
    return MLPBounds(centre, radius, out, lip)


class Head(NamedTuple):
    """One head's constants (steps 2-5): its values lie in ball(centre, value_radius); every weight in a row
    of M <= n_max keys is <= kappa / M (kappa_row / M * H_M^k for the changed key, see step 7); vl: value
    Lipschitz constant; k_query, k_key: score-change constants."""

    centre: list
    value_radius: Fraction
    kappa: Fraction
    kappa_row: Fraction
    vl: Fraction
    k_query: Fraction
    k_key: Fraction


def score_bounds(B, ld, name, ln: LNMap, Mq, Mk, q0, k0, power, rotary: bool) -> tuple:
    """Steps 2 and 3 before the score scale: (bound of |q.k|, bound of a row's score spread, query-change
    factor, key-change factor) for q = g Mq + q0, k = g' Mk + k0 with |g|, |g'| <= R = radius(ln)."""
    R = ln.radius
    s_q = ld.const(name + "Q", lambda: operator_norm(B, [Mq], power))
    s_k = ld.const(name + "K", lambda: operator_norm(B, [Mk], power))
    query = ld.const(name + "query", lambda: s_q * R + vector_norm(B, q0))
    key = ld.const(name + "key", lambda: s_k * R + vector_norm(B, k0))
    score, per_query, per_key = query * key, s_q * key, query * s_k
    spread = 2 * score     # rotary: keys at different positions are rotated differently
    if not rotary:         # bilinear: q.k = g Mq Mk^T g'^T + g Mq k0^T + q0 Mk^T g'^T + q0.k0
        qk = ld.const(name + "QK", lambda: operator_norm(B, [Mq, Mk.T], power))
        q_k0 = ld.const(name + "Q.k0", lambda: product_norm(B, k0, Mq.T))
        k_q0 = ld.const(name + "K.q0", lambda: product_norm(B, q0, Mk.T))
        score = min(score, qk * R * R + (q_k0 + k_q0) * R + abs_dot(B, q0, k0))
        spread = min(2 * score, 2 * R * (qk * R + k_q0))   # s_r - s_r' = q (Mk^T) (g_r - g_r')^T
        per_query, per_key = min(per_query, qk * R + q_k0), min(per_key, qk * R + k_q0)
    return score, spread, per_query, per_key


def value_ball(B, ld, name, ln: LNMap, M, c0, power, finite) -> tuple:
    """(centre, radius, ||M|| or None) of the set of a head's values w = u W_V W_O + b_V W_O: the image c0 + g M
    of the g-ball (M = P diag(w) W_V W_O, c0 = b W_V W_O + b_V W_O), or with `finite` (block 0, position-free
    residuals: the normalised embeddings) the set itself, `finite` its (centre, radius) from
    `vocabulary.value_sets`."""
    if finite is None:
        ov = ld.const(name + "VO", lambda: operator_norm(B, M, power))
        return c0.rows()[0], ld.const(name + "value_radius", lambda: ov * ln.radius), ov
    centre, radius = finite
    return centre, ld.const(name + "value_radius", lambda: radius), None


def stacked_radius(B, model, layer, ln: LNMap, power) -> Fraction:
    """Upper bound of ||sum_h g_h N_h|| over |g_h| <= R = radius(ln), N_h = Mv_h W_O,h (Mv_h: W_V of h's key/value
    head, folded): the row [g_1 ... g_H] has norm <= sqrt(H) R and multiplies the stacked [N_1; ...; N_H], whose
    norm is the square root of that of its Gram matrix sum_h N_h^T N_h: sqrt(H) R ||[N_1; ...; N_H]||."""
    cfg, t, p = model.config, model.tensors, f"blocks.{layer}.attn."
    gram = None
    for h in range(cfg.n_heads):
        N = fold(B, ln, t[p + kv_names(cfg)["W_V"]][kv_head(cfg, h)]) @ B.array(t[p + "W_O"][h])
        gram = N.T @ N if gram is None else gram + N.T @ N
    return B.upper(B.sqrt(B.num(cfg.n_heads))) * ln.radius * gram_norm(B, gram, power)


def finite_inputs(B, model):
    """The LN1 outputs of every token (V x d_model): block 0's inputs are the embeddings when the model has
    no position table (rotary or no positions)."""
    cfg = model.config
    X = B.array(model.tensors["embed.W_E"])
    return layer_norm(B, X, Weights(B, model), "blocks.0.ln1", cfg.eps) if cfg.has_norm else X
