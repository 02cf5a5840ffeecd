"""The constants block by block (docs/influence.md gives each formula and its proof).

Each function asks the ledger for its constants in dependency order and returns the claimed values,
which the next formula uses: every formula is non-decreasing in its inputs, so recomputing from the
claimed (larger) predecessors is sound. `Induction` is the hypothesis carried from block to block.
"""

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from tcert.checker.forward import attn_divisor, kv_head
from tcert.checker.modelfile import kv_names
from tcert.checker.kinds.influence.norms import EXACT_DTYPES, RowTerms, max_row_dist, max_row_dists
from tcert.checker.kinds.influence.rates import cap_factor, rest_cap, row_cap
from tcert.checker.kinds.influence.vocabulary import unembedding_ball
from tcert.checker.kinds.influence.joint import ball_term, head_terms, joint_bound, mlp_choice
from tcert.checker.kinds.influence.sublayers import (Head, LNMap, fold, layer_norm_map, mlp,
                                                     score_bounds, shift, stacked_radius, value_ball)


class Reach(NamedTuple):
    """Where a residual can be: e_t + z with z in ball(centre, radius) for some token t (step 1); embeds: the
    RowTerms of W_E (the e_t), shared by every LayerNorm map (None: computed per map)."""

    centre: list
    radius: Fraction
    embeds: RowTerms | None = None


class Induction(NamedTuple):
    """The hypothesis after k blocks (steps 1, 6, 7): every residual norm is <= bound (B_k) and lies in
    `reach`; a position m != i moves by <= elsewhere rho_k(m) (E_k) and by <= spread at all;
    cap >= max_m 1/rho_k(m) (cap_k; None before the first block); terms: that move's sublayer terms for
    `joint.joint_bound`, in one or more variants."""

    bound: Fraction
    reach: Reach
    elsewhere: Fraction
    spread: Fraction
    cap: Fraction | None
    terms: tuple = ((),)


def add_ball(B, reach: Reach, centre: list, radius: Fraction) -> Reach:
    """The reach after adding a sublayer output from ball(centre, radius)."""
    return Reach([a + b for a, b in zip(reach.centre, centre)], reach.radius + radius, reach.embeds)


# --- embedding and unembedding ------------------------------------------------------------------

def embedding(B, ld, model, n_max: int) -> Induction:
    """Step 1 and the base of step 6: B_0 = max ||W_E[t]|| (+ max ||W_pos[p]|| for learned positions);
    residuals e_t (+ W_pos[p], within pos_radius of the table's bounding-box midpoint); E_0 = spread_0 = 0."""
    cfg, t = model.config, model.tensors
    centre, radius, embeds = [B.num(0)] * cfg.d_model, Fraction(0), RowTerms(B, t["embed.W_E"])
    exact = np.asarray(t["embed.W_E"]).dtype in EXACT_DTYPES   # max_row_dist's route by the squares
    token = ld.const("embed.token_norm", lambda: embeds.max_norm() if exact else max_row_dist(B, t["embed.W_E"]))
    position = Fraction(0)
    if cfg.positional_embedding_type == "standard":
        table = B.array(t["pos_embed.W_pos"][:n_max])
        lo, hi = table.col_bounds()
        centre = [B.num((a + b) / 2) for a, b in zip(lo, hi)]
        norm, radius = max_row_dists(B, table, [None, centre])
        position = ld.const("embed.pos_norm", lambda: norm)
        radius = ld.const("embed.pos_radius", lambda: radius)
    bound = ld.const("B0", lambda: token + position)
    return Induction(bound, Reach(centre, radius, embeds), Fraction(0), Fraction(0), None)


def unembedding(B, ld, model, final: Induction) -> tuple:
    """Step 8: (the final LN as its reader sees it, max_k ||M[:,k] - c|| for M = P diag(w) W_U (W_U
    without a final LN; c the bounding-box midpoint of its columns), a function returning M (d x V)).
    By blocks of the vocabulary where the fold is exact (`vocabulary.unembedding_ball`), else from M."""
    cfg, t = model.config, model.tensors
    ln = layer_norm_map(B, ld, model, "ln_final" if cfg.final_ln else None, "ln_final", final.bound, final.reach)
    ball = unembedding_ball(B, model, ln)
    if ball is not None:
        radius = ld.const("unembed.radius", lambda: ball[1])
    else:
        M = fold(B, ln, t["unembed.W_U"]).T
        lo, hi = M.col_bounds()
        radius = ld.const("unembed.radius", lambda: max_row_dist(B, M, [B.num((a + b) / 2) for a, b in zip(lo, hi)]))
    return ln, radius, lambda: fold(B, ln, t["unembed.W_U"])


# --- attention ---------------------------------------------------------------------------------------

def head(B, ld, model, layer, h, ln: LNMap, n_max, power, finite) -> Head:
    """Head h of block `layer` reading `ln`: its constants (steps 2-5)."""
    cfg, t, p = model.config, model.tensors, f"blocks.{layer}.attn."
    scale = B.lower(attn_divisor(B, cfg))
    name = f"L{layer}.h{h}."
    kv = {m: t[p + name_][kv_head(cfg, h)] for m, name_ in kv_names(cfg).items()}   # grouped-query: h's kv head
    Mq, Mk = fold(B, ln, t[p + "W_Q"][h]), fold(B, ln, kv["W_K"])
    q0, k0 = shift(B, ln, t[p + "W_Q"][h], t[p + "b_Q"][h]), shift(B, ln, kv["W_K"], kv["b_K"])
    score, spread, per_query, per_key = score_bounds(B, ld, name, ln, Mq, Mk, q0, k0, power, cfg.rotary)
    A = ld.const(name + "A", lambda: score / scale)
    width = ld.const(name + "width", lambda: min(2 * A, spread / scale))
    causal = cfg.attention_dir == "causal"
    kappa_row = ld.const(name + "kappa_row", lambda: row_cap(B, n_max, width, layer, causal))
    kappa = ld.const(name + "kappa", lambda: rest_cap(B, n_max, width)) if causal and layer > 0 else None
    Mv = fold(B, ln, kv["W_V"])
    c0 = shift(B, ln, kv["W_V"], kv["b_V"]) @ B.array(t[p + "W_O"][h])
    values = None if finite is None else finite[h]
    centre, radius, vo = value_ball(B, ld, name, ln, [Mv, t[p + "W_O"][h]], c0, power, values)
    vl = ld.const(name + "vl", lambda: vo * ln.lip) if vo is not None else Fraction(0)   # block 0: E_0 = 0
    k_query = ld.const(name + "K_query", lambda: ln.lip * per_query / scale)
    k_key = ld.const(name + "K_key", lambda: ln.lip * per_key / scale)
    return Head(centre, radius, kappa, kappa_row, vl, k_query, k_key)


class AttentionBounds(NamedTuple):
    """A block's attention sublayer: output ball (centre, radius), output-norm bound, the scaled change
    at a position m != i (E_att), and the heads' value radii."""

    centre: list
    radius: Fraction
    out: Fraction
    elsewhere: Fraction
    radii: list


def head_change(hd: Head, E: Fraction, cap: Fraction, causal_late: bool) -> Fraction:
    """Steps 5-7: a head's change at a query m != i, times 1/rho(m): the changed key's step kappa_row 2r (its
    weight <= kappa_row rho(m), both outputs in a ball of radius r), plus the other positions' step: values
    vl S, weights 2r (K_query E + K_key S) with S = E (bidirectional) or kappa E (causal, after block 1),
    each capped: a head output moves by <= 2r <= 2r cap rho(m), and ||a - a'||_1 <= 2 <= 2 cap rho(m)."""
    r2 = 2 * hd.value_radius
    S = hd.kappa * E if causal_late else E
    return min(r2 * cap, hd.kappa_row * r2 + hd.vl * S + r2 * min(cap, hd.k_query * E + hd.k_key * S))


def attention(B, ld, model, layer, ln: LNMap, before: Induction, cap, n_max, power, finite) -> AttentionBounds:
    """Steps 1 and 4-7 for block `layer`'s attention reading `ln` (constants L<layer>.attn.*). cap: a
    number with 1 <= cap rho(m) for every position m <= n_max, rho the block's output weight."""
    cfg, t = model.config, model.tensors
    causal_late = cfg.attention_dir == "causal" and layer > 0
    centre = B.array(t[f"blocks.{layer}.attn.b_O"]).rows()[0]
    radius, elsewhere, radii = Fraction(0), Fraction(0), []
    for h in range(cfg.n_heads):
        hd = head(B, ld, model, layer, h, ln, n_max, power, finite)
        centre = [a + b for a, b in zip(centre, hd.centre)]
        radius += hd.value_radius
        radii.append(hd.value_radius)
        elsewhere += head_change(hd, before.elsewhere, cap, causal_late)
    if finite is None:   # every head's values are c0_h + g N_h over the LN ball: stack the heads (optional)
        stacked = ld.optional(f"L{layer}.attn.stacked", lambda: stacked_radius(B, model, layer, ln, power))
        radius = radius if stacked is None else min(radius, stacked)
    radius = ld.const(f"L{layer}.attn.radius", lambda: radius)
    out = ld.const(f"L{layer}.attn.out", lambda: max_row_dist(B, B.matrix([centre])) + radius)
    elsewhere = ld.const(f"L{layer}.attn.E", lambda: elsewhere)
    return AttentionBounds(centre, radius, out, elsewhere, radii)


# --- the residual stream: x -> x + attn (+ mlp), and the block's induction step -------------------

def block(B, ld, model, layer, before: Induction, n_max, power, finite) -> Induction:
    """Block `layer`: the induction hypothesis after it from the one before it (constants B, spread, E and
    cap of index layer + 1). A position m != i moves by <= delta before the block; its attention output by
    <= 2 r_att, its MLP output by <= min(2 r_mlp, diameter_mlp, lip_mlp * (its input's move)) (step 6); the
    optional spread<k>.joint adds those moves as one vector (`joint.joint_bound`)."""
    cfg = model.config
    ln1 = layer_norm_map(B, ld, model, f"blocks.{layer}.ln1" if cfg.has_norm else None, f"L{layer}.ln1",
                         before.bound, before.reach)
    cap = ld.const(f"cap{layer + 1}", lambda: cap_factor(B, n_max, layer + 1, cfg.attention_dir == "causal"))
    attn = attention(B, ld, model, layer, ln1, before, cap, n_max, power, finite if layer == 0 else None)
    E, spread = before.elsewhere + attn.elsewhere, before.spread + 2 * attn.radius
    heads = tuple(head_terms(B, model, layer, ln1, attn.radii))   # finite value sets: also as a ball
    ways = (tuple(ball_term(2 * attn.radius)), heads) if layer == 0 and finite is not None else (heads,)
    terms = tuple(v + w for v in before.terms for w in ways)
    bound, reach = before.bound + attn.out, add_ball(B, before.reach, attn.centre, attn.radius)
    if not cfg.attn_only:
        if cfg.parallel_attn_mlp:   # the MLP reads the block's input: it moves as much as the input did
            moved_in, E_in, ln2_bound, ln2_reach = before.spread, before.elsewhere, before.bound, before.reach
        else:
            moved_in, E_in, ln2_bound, ln2_reach = spread, E, ld.const(f"L{layer}.B_mid", lambda: bound), reach
        ln2 = ln1 if cfg.parallel_attn_mlp and (cfg.shared_ln or not cfg.has_norm) else layer_norm_map(
            B, ld, model, (f"blocks.{layer}.ln1" if cfg.shared_ln else f"blocks.{layer}.ln2") if cfg.has_norm else None,
            f"L{layer}.ln2", ln2_bound, ln2_reach)
        m = mlp(B, ld, model, layer, ln2, power)
        diameter = 2 * m.radius if m.diameter is None else min(2 * m.radius, m.diameter)
        E += min(m.lip * E_in, diameter * cap)
        spread += min(diameter, m.lip * moved_in)
        more = tuple(mlp_choice(B, model, layer, ln2, m, min(diameter, m.lip * moved_in), diameter, power))
        terms = tuple(v + more for v in terms)
        bound, reach = bound + m.out, add_ball(B, reach, m.centre, m.radius)
    bound = ld.const(f"B{layer + 1}", lambda: bound)
    joint = ld.optional(f"spread{layer + 1}.joint", lambda: joint_bound(B, terms, cfg.d_model, power))
    spread = ld.const(f"spread{layer + 1}", lambda: spread if joint is None else min(spread, joint))
    elsewhere = ld.const(f"E{layer + 1}", lambda: min(E, spread * cap))
    return Induction(bound, reach, elsewhere, spread, cap, terms)

