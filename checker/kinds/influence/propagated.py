"""The local claim for L >= 2 layers: one input x, one changed non-final token, bounded by propagating each
position's movement block by block through x's own forward pass (docs/influence.md, "Local certificates for
L layers").

For a change at position j, every other position i carries a bound delta_i >= ||x'_i - x_i|| on how far its
residual moved (0 before block 0; in a causal model 0 for i < j at every block); position j itself is only
known to lie somewhere: after its LayerNorm ||g|| <= sqrt(d), so its key has norm <= key_max and its value lies
in ball(c0, rv) (block 0 without a position table: the V token keys and values themselves). Per block, head h
at query i != j moves by at most (`head_move`)

  min(W, max over E in {0, E_max} of (N + e_j dist_j + E W) / (Z_low + E)),

from Z' (o' - o) = sum_(r != j) [E'_r (v'_r - v_r) + (E'_r - e_r)(v_r - o)] + E'_j (v'_j - o) - e_j (v_j - o)
(sum_r e_r (v_r - o) = 0), e_r x's own exp-scores, |s'_r - s_r| <= eps_r, so E'_r in e_r [e^-eps_r, e^eps_r]:
N = sum_(r != j) up(e_r) (e^eps_r dv_r + (e^eps_r - 1) dist_r), Z_low = sum_(r != j) low(e_r) e^-eps_r, dist_r >=
||v_r - o||, W = rv + ||c0 - o|| >= ||v'_j - o|| (and >= ||o' - o||: o' averages values in the ball), E_max the
largest exp-score position j can have. The LayerNorm's Lipschitz factor at an unchanged position is
1/sqrt(max(0, ||P x_i|| - delta_i)^2/d + eps), from x_i's own centred norm (the segment to x'_i stays that far
from 0). The MLP moves by <= ||W_out|| Lip(act) ||M_in|| times its input's LN move, and by <= its diameter over
the LN ball (`sublayers.mlp_diameter`).
"""

from fractions import Fraction

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.forward import (Weights, act_lipschitz, attn_divisor, layer_norm, ln_names, mlp, rotary_angles,
                                   rotary_pairs, rotate)
from tcert.checker.kinds.influence.norms import max_row_dist, operator_norm, row_dists, vector_norm
from tcert.checker.kinds.influence.sublayers import SPLIT_ACTS, LNMap, finite_inputs, fold, fold_norm, mlp_diameter, shift

POWER = 6   # trace-power squarings per operator norm: overestimates by at most rank^(1/128), cheap at head sizes


def supported_layers(cfg):
    """One line of refusal for what the propagated rule does not cover."""
    if not cfg.has_ln:
        raise BadInput("claim.local: L-layer models need LayerNorm (the changed position is bounded through ||g|| "
                       "<= sqrt(d)); docs/influence.md, 'Local certificates for L layers'")
    if cfg.llama_pieces():
        raise BadInput(f"claim.local: {', '.join(cfg.llama_pieces())} not covered by the local rule (the global claim covers them)")


def up_norm(B, row) -> Fraction:
    """Upper bound of the Euclidean norm of a list of interval scalars."""
    return B.upper(B.sqrt(B.num(max(B.upper(B.fsum(x * x for x in row)), Fraction(0)))))


def centred_low(B, row) -> Fraction:
    """Lower bound of ||P x|| (P the centring projection) for an interval row x."""
    mean = B.fsum(row) / len(row)
    return B.lower(B.sqrt(B.num(max(B.lower(B.fsum((x - mean) * (x - mean) for x in row)), Fraction(0)))))


def block_constants(B, model, layer: int) -> dict:
    """Block `layer`'s weight constants: per head ||Mq||, ||Mk||, ||Mv W_O|| (folded by LN1), key_max >= the norm
    of any key, the value ball (c0, rv); the MLP's ||W_out|| Lip(act) ||M_in|| (M_in folded by LN2) and the
    diameter of its outputs over the LN ball (`sublayers.mlp_diameter`)."""
    cfg, t, p = model.config, model.tensors, f"blocks.{layer}.attn."
    root = B.upper(B.sqrt(B.num(cfg.d_model)))
    ln1, ln2 = ln_names(cfg, layer)
    first = LNMap(Fraction(1), root, t[ln1 + ".w"], t[ln1 + ".b"])
    finite = finite_inputs(B, model) if layer == 0 and cfg.positional_embedding_type != "standard" else None
    heads = []
    for h in range(cfg.n_heads):
        W_Q, W_K, W_V, W_O = (t[p + m][h] for m in ("W_Q", "W_K", "W_V", "W_O"))
        Mk, Mv = fold(B, first, W_K), fold(B, first, W_V)
        k_norm, ov = operator_norm(B, [Mk], POWER), operator_norm(B, [Mv, W_O], POWER)
        c = {"q": operator_norm(B, [fold(B, first, W_Q)], POWER), "k": k_norm, "ov": ov,
             "key_max": k_norm * root + vector_norm(B, shift(B, first, W_K, t[p + "b_K"][h])),
             "c0": (shift(B, first, W_V, t[p + "b_V"][h]) @ B.array(W_O)).rows()[0], "rv": ov * root}
        if finite is not None:   # block 0, position-free: the V tokens' own keys and values
            ones = B.array(np.ones((finite.shape[0], 1)))
            vals = finite @ (B.array(W_V) @ B.array(W_O)) + ones @ (B.array(t[p + "b_V"][h]) @ B.array(W_O))
            lo, hi = vals.col_bounds()
            c0 = [B.num((a + b) / 2) for a, b in zip(lo, hi)]
            c.update(c0=c0, rv=max_row_dist(B, vals, c0),
                     key_max=max_row_dist(B, finite @ B.array(W_K) + ones @ B.array(t[p + "b_K"][h])))
        heads.append(c)
    lip = diameter = None
    if not cfg.attn_only:
        second = LNMap(Fraction(1), root, t[ln2 + ".w"], t[ln2 + ".b"])
        q = f"blocks.{layer}.mlp."
        s_out, s_in = operator_norm(B, [t[q + "W_out"]], POWER), fold_norm(B, second, t[q + "W_in"], POWER)
        lip = s_out * act_lipschitz(B, cfg.act_fn) * s_in
        diameter = mlp_diameter(B, model, layer, second, s_in, s_out, POWER) if cfg.act_fn in SPLIT_ACTS else 2 * lip * root
    return {"heads": heads, "mlp": lip, "diameter": diameter, "root": root}


def actual_pass(B, model, tokens) -> list:
    """x's own forward pass in interval arithmetic, per block: the centred norms of its LN inputs (nu1, nu2) and
    per head and query i the data `head_move` reads (query and key norms, exp-scores, distances of the values
    from the head's output)."""
    cfg, t, n = model.config, model.tensors, len(tokens)
    W, div, pairs = Weights(B, model), attn_divisor(B, cfg), rotary_pairs(cfg)
    X = B.array(t["embed.W_E"][tokens])
    if cfg.positional_embedding_type == "standard":
        X = X + B.array(t["pos_embed.W_pos"][:n])
    ang = rotary_angles(B, cfg, range(n)) if pairs else None
    out = []
    for layer in range(cfg.n_layers):
        ln1, ln2 = ln_names(cfg, layer)
        consts = block_constants(B, model, layer)
        A, p, ones = layer_norm(B, X, W, ln1, cfg.eps), f"blocks.{layer}.attn.", B.array(np.ones((n, 1)))
        attn, heads = ones @ B.array(t[p + "b_O"].reshape(1, -1)), []
        for h, c in enumerate(consts["heads"]):
            Q, K = ((A @ B.array(t[p + m][h]) + ones @ B.array(t[p + b][h])).rows() for m, b in (("W_Q", "b_Q"), ("W_K", "b_K")))
            vals = (A @ B.array(t[p + "W_V"][h]) + ones @ B.array(t[p + "b_V"][h])) @ B.array(t[p + "W_O"][h])
            if pairs:
                Q, K = ([rotate(r, ang[i], pairs) for i, r in enumerate(M)] for M in (Q, K))
            per_query, weights = query_rows(B, cfg, c, Q, (B.matrix(Q) @ B.matrix(K).T).rows(), vals, div)
            attn = attn + B.matrix(weights) @ vals
            heads.append({"kn": [up_norm(B, k) for k in K], "rows": per_query, "Q": Q, "K": K, "vals": vals.rows()})
        mid = X + attn
        nu1 = [centred_low(B, r) for r in X.rows()]
        if cfg.attn_only:
            X, nu2 = mid, None
        elif cfg.parallel_attn_mlp:
            m_in = layer_norm(B, X, W, ln2, cfg.eps)
            X, nu2 = mid + mlp(B, W, cfg, layer, m_in), nu1 if ln2 == ln1 else [centred_low(B, r) for r in X.rows()]
        else:
            X, nu2 = mid + mlp(B, W, cfg, layer, layer_norm(B, mid, W, ln2, cfg.eps)), [centred_low(B, r) for r in mid.rows()]
        out.append({"consts": consts, "heads": heads, "nu1": nu1, "nu2": nu2, "div": div})
    return out


def candidates(B, model, states, j: int, cache: dict) -> list:
    """Position j's possible rows after a change there, per block, as each head's V keys (rotated to j) and values:
    before block 0 the V embeddings (+ W_pos[j]); in a causal model every later block too, since position j reads
    only positions < j, which do not move: block l's output at j for each token t, from x's own keys and values
    there. None where it is not known (bidirectional, after block 0). `cache` keeps what does not depend on j."""
    cfg, t, V = model.config, model.tensors, model.config.d_vocab
    W, pairs, out, fixed = Weights(B, model), rotary_pairs(cfg), [], cfg.positional_embedding_type != "standard"
    C, ones = B.array(t["embed.W_E"]), B.array(np.ones((V, 1)))
    if not fixed:
        C = C + ones @ B.array(t["pos_embed.W_pos"][j:j + 1])
    ang = rotary_angles(B, cfg, [j])[j] if pairs else None
    for layer, st in enumerate(states):
        if layer > 0 and cfg.attention_dir != "causal":
            out.append(None)
            continue
        ln1, ln2 = ln_names(cfg, layer)
        keep = cache if layer == 0 and fixed else {}   # block 0 without positions: the same V rows for every j
        A, p, heads = remember(keep, "A", lambda: layer_norm(B, C, W, ln1, cfg.eps)), f"blocks.{layer}.attn.", []
        attn = ones @ B.array(t[p + "b_O"].reshape(1, -1))
        for h, hd in enumerate(st["heads"]):
            Q, K, vals, sq, kn = remember(keep, h, lambda: head_rows(B, model, layer, h, A))
            if pairs:
                Q, K = ([rotate(r, ang, pairs) for r in M] for M in (Q, K))
            heads.append({"keys": B.matrix(K), "vals": vals, "sq": sq, "kn": kn})
            if layer < len(states) - 1:
                attn = attn + own_rows(B, hd, Q, K, vals, j, st["div"])
        out.append(heads)
        if layer < len(states) - 1:
            mid = C + attn
            if not cfg.attn_only:
                mid = mid + (remember(keep, "mlp", lambda: mlp(B, W, cfg, layer, layer_norm(B, C, W, ln2, cfg.eps)))
                             if cfg.parallel_attn_mlp else mlp(B, W, cfg, layer, layer_norm(B, mid, W, ln2, cfg.eps)))
            C = mid
    return out


def remember(cache: dict, key, make):
    if key not in cache:
        cache[key] = make()
    return cache[key]


def head_rows(B, model, layer, h, A) -> tuple:
    """Head h's queries, keys (unrotated rows), values, ||v||^2 and upper ||k|| for the LN1 output rows A."""
    t, p, ones = model.tensors, f"blocks.{layer}.attn.", B.array(np.ones((A.shape[0], 1)))
    Q, K = ((A @ B.array(t[p + m][h]) + ones @ B.array(t[p + b][h])).rows() for m, b in (("W_Q", "b_Q"), ("W_K", "b_K")))
    vals = (A @ B.array(t[p + "W_V"][h]) + ones @ B.array(t[p + "b_V"][h])) @ B.array(t[p + "W_O"][h])
    sq = [r[0] for r in (vals.map(lambda x: x * x) @ B.array(np.ones((A.shape[1], 1)))).rows()]
    kn = [B.upper(B.sqrt(B.num(max(B.upper(r[0]), Fraction(0))))) for r in
          (B.matrix(K).map(lambda x: x * x) @ B.array(np.ones((len(K[0]), 1)))).rows()]
    return Q, K, vals, sq, kn


def own_rows(B, hd, Q, K, vals, j, div):
    """Head hd's output at position j for each candidate row: softmax over x's keys before j and its own."""
    before = (B.matrix(Q) @ B.matrix(hd["K"][:j]).T).rows() if j else [[] for _ in Q]
    weights, own = [], []
    for q, k, s in zip(Q, K, before):
        s = [x / div for x in s] + [B.dot(q, k) / div]
        top = B.num(max(B.upper(x) for x in s))
        e = [B.exp(x - top) for x in s]
        Z = B.fsum(e)
        weights.append([x / Z for x in e[:j]])
        own.append(e[j] / Z)
    mine = B.matrix([[w * x for x in row] for w, row in zip(own, vals.rows())])
    return mine + B.matrix(weights) @ B.matrix(hd["vals"][:j]) if j else mine


def token_rule(B, c, hd, cand, q, row, j, dq, moves, div) -> list:
    """Per token t at position j: ||o'_h - o_h|| at query i <= min(W, the largest corner of (a + E_w W + E_t D_t) /
    (Z_low + E_w + E_t)) over E_w in {0, wild exp(top)}, E_t in {0, exp(s_t + dq ||k_t|| / div)}: key j's value is
    v_t itself (D_t >= ||v_t - o||), its score against the moved query <= q.k_t + dq ||k_t||; a linear-fractional
    function's largest value on a box is at a corner."""
    num, low, wild, top = others(B, c, hd, q, j, dq, moves, div)
    if low <= 0 or (wild and B.upper(top) > 700):
        return [q["W"]] * cand["keys"].shape[0]
    a, Wb, Ew = B.num(B.upper(num + q["e"][j] * B.num(q["dist"][j]))), B.num(q["W"]), wild * B.exp(top) if wild else B.num(0)
    (scores, dots), o_sq, out = row, B.fsum(x * x for x in q["o"]), []   # row: q_i . k_t and v_t . o for every t
    for s, d2, kn, dot in zip(scores, cand["sq"], cand["kn"], dots):
        x = (s + B.num(dq * kn)) / div - q["shift"]
        if B.upper(x) > 700:
            out.append(q["W"])
            continue
        E, D = B.exp(x), B.sqrt(B.num(max(B.upper(d2 - 2 * dot + o_sq), Fraction(0))))
        corners = (a / B.num(low), (a + Ew * Wb) / (B.num(low) + Ew), (a + E * D) / (B.num(low) + E),
                   (a + Ew * Wb + E * D) / (B.num(low) + Ew + E))
        out.append(min(q["W"], max(B.upper(g) for g in corners)))
    return out


def products(B, hd, cand, queries) -> tuple:
    """For the queries' rows: every candidate's score q_i . k_t and v_t . o_i, one product each for all queries."""
    scores = (B.matrix([hd["Q"][i] for i in queries]) @ cand["keys"].T).rows()
    dots = (B.matrix([hd["rows"][i]["o"] for i in queries]) @ cand["vals"].T).rows()
    return scores, dots


def query_rows(B, cfg, c, Q, S, vals, div) -> tuple:
    """Per query i of one head (scores S = Q K^T): x's exp-scores e (shifted by the row's largest upper end), the
    head output o, ||q_i||, dist_r >= ||v_r - o|| and W = rv + ||c0 - o||; and the attention weights (n x n)."""
    n, rows, weights, out = len(Q), vals.rows(), [], []
    for i in range(n):
        seen = i + 1 if cfg.attention_dir == "causal" else n
        s = [S[i][r] / div for r in range(seen)]
        shift_i = B.num(max(B.upper(x) for x in s))
        e = [B.exp(x - shift_i) for x in s]
        Z = B.fsum(e)
        weights.append([x / Z for x in e] + [B.num(0)] * (n - seen))
        o = (B.matrix(weights[-1:]) @ vals).rows()[0]
        out.append({"e": e, "shift": shift_i, "qn": up_norm(B, Q[i]), "o": o, "dist": row_dists(B, B.matrix(rows[:seen]), o),
                    "W": c["rv"] + up_norm(B, [a - b for a, b in zip(c["c0"], o)])})
    return out, weights


def ln_lip(B, cfg, nu: Fraction, delta: Fraction) -> Fraction:
    """1 / sqrt(max(0, nu - delta)^2 / d + eps): the LayerNorm's Lipschitz factor on ball(x_i, delta), ||P x_i|| >= nu."""
    low = max(nu - delta, Fraction(0))
    return B.upper(1 / B.sqrt(B.num(low * low / cfg.d_model) + B.num(cfg.eps)))


WILD = 2   # a key whose score may move by more than this is bounded like the changed one (any choice is sound)


def others(B, c, hd, q, j, dq, moves, div) -> tuple:
    """At one query, for a change at j (module docstring), the keys r != j: (N + sum over wild r of e_r dist_r,
    low(Z_low), the number of wild keys, top) with q the query's data, hd the head's key norms, dq >= the query's
    move, moves[r] >= ||g'_r - g_r|| (LN1 outputs). A key whose score may move by > WILD is "wild": its term is
    <= E'_r W + e_r dist_r with E'_r <= exp(top), top from ||q'|| key_max."""
    num, den, wild = B.num(0), B.num(0), 0
    for r, e in enumerate(q["e"]):
        dk = c["k"] * moves[r]
        if r == j:
            continue
        if dq == 0 and dk == 0:
            den = den + e
            continue
        eps = B.num(dq * (hd["kn"][r] + dk) + q["qn"] * dk) / div
        if B.upper(eps) > WILD:
            num, wild = num + e * B.num(q["dist"][r]), wild + 1
            continue
        grow = B.exp(eps)
        num = num + e * (grow * B.num(c["ov"] * moves[r]) + (grow - 1) * B.num(q["dist"][r]))
        den = den + e / grow
    return num, B.lower(den), wild, B.num((q["qn"] + dq) * c["key_max"]) / div - q["shift"]


def head_move(B, c, hd, q, j, dq, moves, div) -> Fraction:
    """Upper bound of ||o'_h - o_h|| at one query with key j wild too (its row anywhere in the LN ball)."""
    num, low, wild, top = others(B, c, hd, q, j, dq, moves, div)
    if low <= 0 or B.upper(top) > 700:   # (N + E W) / (Z_low + E) only approaches W from below as E grows
        return q["W"]
    E, num = (wild + 1) * B.exp(top), num + q["e"][j] * B.num(q["dist"][j])
    return min(q["W"], max(B.upper(num) / low, B.upper((num + E * B.num(q["W"])) / (B.num(low) + E))))


def moved_last(B, cfg, states, j: int, n: int, cands) -> list:
    """For a change at j: per block the largest movement of the positions it computes (the last block: the last
    position only), then the last position's movement after every block: the bound D_j on ||y - y'||."""
    delta, causal, out = [Fraction(0)] * n, cfg.attention_dir == "causal", []
    for layer, st in enumerate(states):
        root = st["consts"]["root"]   # an LN output moves by <= lip delta and by <= 2 sqrt(d)
        moves = [min(ln_lip(B, cfg, nu, d) * d, 2 * root) for nu, d in zip(st["nu1"], delta)]
        queries = [n - 1] if layer == len(states) - 1 else [i for i in range(n) if i != j and (i > j or not causal)]
        new, pairs = list(delta), list(zip(st["consts"]["heads"], st["heads"]))
        rows = [products(B, hd, cand, queries) for hd, cand in zip(st["heads"], cands[layer])] if cands[layer] else None
        for at, i in enumerate(queries):
            move = sum(head_move(B, c, hd, hd["rows"][i], j, c["q"] * moves[i], moves, st["div"]) for c, hd in pairs)
            if rows is not None:   # position j's rows known: the same token t in every head
                per = [token_rule(B, c, hd, cand, hd["rows"][i], (r[0][at], r[1][at]), j, c["q"] * moves[i], moves,
                                  st["div"]) for (c, hd), cand, r in zip(pairs, cands[layer], rows)]
                move = min(move, max(sum(col) for col in zip(*per)))
            mid = delta[i] + move
            if st["consts"]["mlp"] is not None:   # and its output stays in a ball of radius lip sqrt(d)
                into, lip = delta[i] if cfg.parallel_attn_mlp else mid, st["consts"]["mlp"]
                mid += min(lip * min(ln_lip(B, cfg, st["nu2"][i], into) * into, 2 * root), st["consts"]["diameter"])
            new[i] = mid
        delta = new
        out.append(max((delta[i] for i in queries), default=Fraction(0)))
    out.append(delta[n - 1])
    return out


def propagated_change(B, model, tokens) -> tuple:
    """(change = max_j D_j, per position j its per-block movements and D_j)."""
    states, n = actual_pass(B, model, tokens), len(tokens)
    cache = {}
    per = [moved_last(B, model.config, states, j, n, candidates(B, model, states, j, cache)) for j in range(n - 1)]
    return (max(p[-1] for p in per) if per else Fraction(0)), per
