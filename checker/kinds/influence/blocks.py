"""The constants block by block (docs/influence.md gives each formula and its proof).

Each function asks the ledger for its constants in dependency order and returns the claimed values,
which the next formula uses: every formula is non-decreasing in its inputs, so recomputing from the
claimed (larger) predecessors is sound. `Induction` is the hypothesis carried from block to block.
"""

from fractions import Fraction
from functools import cache
from typing import NamedTuple

import numpy as np

from tcert.checker.kinds.influence.norms import (abs_dot, max_abs, max_row_dist, max_row_dists, operator_norm,
                                                 product_norm, vector_norm)
from tcert.checker.kinds.influence.rates import cap_factor


class Induction(NamedTuple):
    """The hypothesis after k blocks (steps 1, 6, 7): every residual norm is <= bound (B_k), the changed
    position moves by <= changed (D_k), a position m != i by <= elsewhere rho_k(m) (E_k) and by <= spread
    at all; cap >= max_m 1/rho_k(m) (cap_k; None before the first block)."""

    bound: Fraction
    changed: Fraction
    elsewhere: Fraction
    spread: Fraction
    cap: Fraction | None


# --- embedding and unembedding ------------------------------------------------------------------

def embedding(B, ld, model, n_max: int, embed_center) -> Induction:
    """Step 1 and the base of step 6: B_0 = max ||W_E[t]|| (+ max ||W_pos[p]|| for learned positions),
    D_0 = 2 max ||W_E[t] - c_E||, E_0 = spread_0 = 0."""
    t = model.tensors

    @cache   # one pass over W_E gives both of its row bounds, and only when a constant asks for one
    def w_e_dists():
        return max_row_dists(B, t["embed.W_E"], [None, embed_center])
    token = ld.const("embed.token_norm", lambda: w_e_dists()[0])
    position = Fraction(0) if model.config.positional_embedding_type != "standard" else ld.const(
        "embed.pos_norm", lambda: max_row_dist(B, t["pos_embed.W_pos"][:n_max]))
    bound = ld.const("B0", lambda: token + position)
    changed = ld.const("D0", lambda: 2 * w_e_dists()[1])
    return Induction(bound, changed, Fraction(0), Fraction(0), None)


def unembedding(B, ld, model, unembed_center) -> tuple:
    """Step 8: (Lipschitz constant of the final LN, max_k ||W_U[:,k] - c_U||)."""
    cfg, t = model.config, model.tensors
    lip_final = Fraction(1)
    if cfg.final_ln:
        lip_final = ld.const("ln_final.lip", lambda: B.upper(B.num(max_abs(B, t["ln_final.w"])) /
                                                             B.sqrt(B.num(cfg.eps))))
    radius = ld.const("unembed.radius", lambda: max_row_dist(B, np.asarray(t["unembed.W_U"]).T, unembed_center))
    return lip_final, radius


# --- sublayers ----------------------------------------------------------------------------------

def layer_norm(B, ld, model, prefix, name, bound) -> tuple:
    """(Lipschitz constant, output-norm bound), constants `name`.lip/.out, of LN `prefix` on inputs of
    norm <= bound (identity if prefix is None)."""
    if prefix is None:
        return Fraction(1), bound
    w, b, eps = model.tensors[prefix + ".w"], model.tensors[prefix + ".b"], model.config.eps
    wmax, sqrt_d = max_abs(B, w), B.upper(B.sqrt(B.num(Fraction(model.config.d_model))))
    lip = ld.const(name + ".lip", lambda: B.upper(B.num(wmax) / B.sqrt(B.num(eps))))
    out = ld.const(name + ".out", lambda: vector_norm(B, b) + wmax * min(sqrt_d, B.upper(
        B.num(bound) / B.sqrt(B.num(eps)))))
    return lip, out


def act_lipschitz(B, act_fn: str) -> Fraction:
    """A Lipschitz constant of the MLP nonlinearity (docs/influence.md, 'MLP')."""
    if act_fn == "relu":
        return Fraction(1)
    if act_fn == "gelu":  # max |gelu'| = gelu'(sqrt 2) = Phi(sqrt 2) + sqrt 2 phi(sqrt 2)
        return B.upper((1 + B.erf(B.num(1))) / 2 + B.exp(B.num(-1)) / B.sqrt(B.pi()))
    return Fraction(3, 2)  # gelu_new: 1 + sup_u (u + 0.0527 u^3) e^(-u) < 3/2


def mlp(B, ld, model, layer, U, lip_ln, power) -> tuple:
    """(output-norm bound, radius about b_out, Lipschitz constant) of block `layer`'s MLP on LN outputs of
    norm <= U from an LN with Lipschitz constant lip_ln."""
    t, p, name = model.tensors, f"blocks.{layer}.mlp.", f"L{layer}.mlp."
    s_in = ld.const(name + "W_in", lambda: operator_norm(B, [t[p + "W_in"]], power))
    s_out = ld.const(name + "W_out", lambda: operator_norm(B, [t[p + "W_out"]], power))
    radius = ld.const(name + "radius", lambda: s_out * (s_in * U + vector_norm(B, t[p + "b_in"])))
    out = ld.const(name + "out", lambda: radius + vector_norm(B, t[p + "b_out"]))
    lip = ld.const(name + "lip", lambda: s_out * act_lipschitz(B, model.config.act_fn) * s_in * lip_ln)
    return out, radius, lip


class Head(NamedTuple):
    """One head's constants (steps 2-5): ||W_V W_O||, ||b_V W_O||, softmax cap kappa, K_query, K_key."""

    ov: Fraction
    b_vo: Fraction
    kappa: Fraction
    k_query: Fraction
    k_key: Fraction


def qk_bounds(B, ld, w, name, U, s_q, s_k, power, rotary: bool) -> tuple:
    """Steps 2 and 3 before the score scale: (bound of |q.k|, query-change factor, key-change factor) of the
    head with weights w and constant-name prefix `name`, on LN outputs of norm <= U, given ||W_Q|| <= s_q and
    ||W_K|| <= s_k. The norm-product forms hold for any positions; without rotary embeddings the score is
    bilinear in (u, u') through the QK circuit W_Q W_K^T (learned positions or none), and the smaller
    form is used."""
    query = ld.const(name + "query", lambda: s_q * U + vector_norm(B, w["b_Q"]))
    key = ld.const(name + "key", lambda: s_k * U + vector_norm(B, w["b_K"]))
    score, per_query, per_key = query * key, s_q * key, query * s_k
    if not rotary:
        qk = ld.const(name + "QK", lambda: operator_norm(B, [w["W_Q"], w["W_K"].T], power))
        w_k_b_q = ld.const(name + "W_K.b_Q", lambda: product_norm(B, w["b_Q"], w["W_K"].T))
        w_q_b_k = ld.const(name + "W_Q.b_K", lambda: product_norm(B, w["b_K"], w["W_Q"].T))
        score = min(score, qk * U * U + (w_k_b_q + w_q_b_k) * U + abs_dot(B, w["b_Q"], w["b_K"]))
        per_query, per_key = min(per_query, qk * U + w_q_b_k), min(per_key, qk * U + w_k_b_q)
    return score, per_query, per_key


def head(B, ld, model, layer, h, U, lip_ln, n_max, power) -> Head:
    """Head h of block `layer` on LN outputs of norm <= U (LN Lipschitz constant lip_ln): its constants.
    OV is the d_model x d_model circuit W_V W_O (without W_E or W_U)."""
    cfg, t, p = model.config, model.tensors, f"blocks.{layer}.attn."
    scale = Fraction(cfg.attn_scale) if cfg.attn_scale is not None else B.lower(B.sqrt(B.num(Fraction(cfg.d_head))))
    w = {m: t[p + m][h] for m in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")}
    name = f"L{layer}.h{h}."
    s_q = ld.const(name + "W_Q", lambda: operator_norm(B, [w["W_Q"]], power))
    s_k = ld.const(name + "W_K", lambda: operator_norm(B, [w["W_K"]], power))
    ov = ld.const(name + "OV", lambda: operator_norm(B, [w["W_V"], w["W_O"]], power))
    b_vo = ld.const(name + "b_VO", lambda: product_norm(B, w["b_V"], w["W_O"]))
    score, per_query, per_key = qk_bounds(B, ld, w, name, U, s_q, s_k, power, cfg.rotary)
    A = ld.const(name + "A", lambda: score / scale)
    kappa = ld.const(name + "kappa", lambda: B.upper(n_max / (1 + (n_max - 1) * B.exp(B.num(-2 * A)))))
    k_query = ld.const(name + "K_query", lambda: lip_ln * per_query / scale)
    k_key = ld.const(name + "K_key", lambda: lip_ln * per_key / scale)
    return Head(ov, b_vo, kappa, k_query, k_key)


class AttentionBounds(NamedTuple):
    """A block's attention sublayer: output-norm bound, change at the changed position (D_att), scaled
    change elsewhere (E_att)."""

    out: Fraction
    at_changed: Fraction
    elsewhere: Fraction


def attention(B, ld, model, layer, U, lip_ln, before: Induction, cap, n_max, power) -> AttentionBounds:
    """Steps 1 and 4-7 for block `layer`'s attention on LN outputs of norm <= U (constants L<layer>.attn.*).
    cap: a number with 1 <= cap rho(m) for every position m <= n_max, rho the block's output weight."""
    cfg, t = model.config, model.tensors
    causal = cfg.attention_dir == "causal"
    D, E = before.changed, before.elsewhere
    out = ld.const(f"L{layer}.attn.b_O", lambda: vector_norm(B, t[f"blocks.{layer}.attn.b_O"]))
    at_changed, elsewhere = Fraction(0), Fraction(0)
    for h in range(cfg.n_heads):
        hd = head(B, ld, model, layer, h, U, lip_ln, n_max, power)
        value_radius = hd.ov * U                 # values lie within this of their centre b_V W_O
        out += value_radius + hd.b_vo
        S = hd.kappa * (D + E) if causal else hd.kappa * D + E   # n * (attention-weighted input change)
        at_changed += 2 * value_radius
        # the head output moves by <= 2 value_radius at any query, and ||a - a'||_1 <= 2; both are <= (.) cap rho(m)
        elsewhere += min(2 * value_radius * cap,
                         hd.ov * lip_ln * S + 2 * value_radius * min(cap, hd.k_query * E + hd.k_key * S))
    out = ld.const(f"L{layer}.attn.out", lambda: out)
    at_changed = ld.const(f"L{layer}.attn.D", lambda: at_changed)
    elsewhere = ld.const(f"L{layer}.attn.E", lambda: elsewhere)
    return AttentionBounds(out, at_changed, elsewhere)


# --- the residual stream: x -> x + attn (+ mlp), and the block's induction step -------------------

def attention_only(before: Induction, attn: AttentionBounds) -> tuple:
    """x + attn(LN1 x): (B, D, E before the spread cap, MLP radius 0)."""
    bound = before.bound + attn.out
    return bound, min(before.changed + attn.at_changed, 2 * bound), before.elsewhere + attn.elsewhere, Fraction(0)


def parallel(B, ld, model, layer, before: Induction, attn: AttentionBounds, ln1: tuple, power) -> tuple:
    """x + attn(LN1 x) + mlp(LN2 x), ln1 = (Lipschitz, output bound) of LN1: (B, D, E before the spread
    cap, MLP radius)."""
    cfg, D, E = model.config, before.changed, before.elsewhere
    lip2, U2 = ln1 if cfg.shared_ln or not cfg.has_ln else layer_norm(
        B, ld, model, f"blocks.{layer}.ln2", f"L{layer}.ln2", before.bound)
    m_out, m_radius, m_lip = mlp(B, ld, model, layer, U2, lip2, power)
    bound = before.bound + attn.out + m_out
    changed = min(D + attn.at_changed + min(m_lip * D, 2 * m_radius), 2 * bound)
    return bound, changed, E + attn.elsewhere + m_lip * E, m_radius


def sequential(B, ld, model, layer, before: Induction, attn: AttentionBounds, power) -> tuple:
    """x' = x + attn(LN1 x), x' + mlp(LN2 x'): (B, D, E before the spread cap, MLP radius)."""
    cfg = model.config
    mid = ld.const(f"L{layer}.B_mid", lambda: before.bound + attn.out)
    changed_mid, elsewhere_mid = min(before.changed + attn.at_changed, 2 * mid), before.elsewhere + attn.elsewhere
    ln2 = (f"blocks.{layer}.ln1" if cfg.shared_ln else f"blocks.{layer}.ln2") if cfg.has_ln else None
    lip2, U2 = layer_norm(B, ld, model, ln2, f"L{layer}.ln2", mid)
    m_out, m_radius, m_lip = mlp(B, ld, model, layer, U2, lip2, power)
    bound = mid + m_out
    changed = min(changed_mid + min(m_lip * changed_mid, 2 * m_radius), 2 * bound)
    return bound, changed, elsewhere_mid * (1 + m_lip), m_radius


def block(B, ld, model, layer, before: Induction, n_max, power) -> Induction:
    """Block `layer`: the induction hypothesis after it from the one before it (constants B, D, spread, E
    and cap of index layer + 1)."""
    cfg = model.config
    ln1 = layer_norm(B, ld, model, f"blocks.{layer}.ln1" if cfg.has_ln else None, f"L{layer}.ln1", before.bound)
    cap = ld.const(f"cap{layer + 1}", lambda: cap_factor(B, n_max, layer + 1, cfg.attention_dir == "causal"))
    attn = attention(B, ld, model, layer, ln1[1], ln1[0], before, cap, n_max, power)
    if cfg.attn_only:
        bound, changed, elsewhere, m_radius = attention_only(before, attn)
    elif cfg.parallel_attn_mlp:
        bound, changed, elsewhere, m_radius = parallel(B, ld, model, layer, before, attn, ln1, power)
    else:
        bound, changed, elsewhere, m_radius = sequential(B, ld, model, layer, before, attn, power)
    bound = ld.const(f"B{layer + 1}", lambda: bound)
    changed = ld.const(f"D{layer + 1}", lambda: changed)
    # a position m != i has the same embedding in both inputs, and each sublayer output lies in a fixed ball
    # (attention: radius D_att/2; MLP: its radius), so delta_m <= spread <= spread cap rho(m)
    spread = ld.const(f"spread{layer + 1}", lambda: before.spread + attn.at_changed + 2 * m_radius)
    elsewhere = ld.const(f"E{layer + 1}", lambda: min(elsewhere, spread * cap))
    return Induction(bound, changed, elsewhere, spread, cap)
