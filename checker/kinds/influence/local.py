"""The local claim: one input x of a 1-layer model, certified with x's own attention pattern
(docs/influence.md, "Local certificates").

claim {"local": {"prediction": prediction claim for x, "change": D, "change_prob": D', "substitutions": R,
                 "gap_lipschitz": G}}, evidence {}.
Statement: changing any ONE non-final token of x moves the last residual by <= D and the next-token
distribution (L1) by <= D'; changing ANY R (or fewer) non-final tokens leaves the greedy token k.
Head h's output o at the last position moves, for a set S of changed keys, by exactly
o' - o = (sum_(j in S) E'_j (v'_j - o) - e_j (v_j - o)) / (Z_out + U') (the unchanged keys' part cancels:
sum_i e_i (v_i - o) = 0), so by <= sum_(j in S) (e_j |v_j - o| + E'_j |v'_j - o|) / Z_out, computed per
position and token (the actual values and scores of x, every token's score at every position); also by
<= 2 r_h max(a_S, a'_S) (step 5's bracket: a_S is S's weight on x, a'_S <= T' / (rest + T') with T' the
largest R of the keys' best possible exp(score), rest the smallest n-1-R of the other positions'). One layer, parallel or
attention-only blocks, no position table: the last position's query, MLP input and the other keys are those
of x, so nothing else moves.
"""

from fractions import Fraction

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.exact_backend import difference_minima
from tcert.checker.forward import Weights, attn_divisor, final_residual, rotary_angles, rotary_pairs, rotate
from tcert.checker.kinds.influence.norms import centred_scaled, max_row_dist, row_dists
from tcert.checker.kinds.influence.propagated import propagated_change, supported_layers
from tcert.checker.kinds.influence.sublayers import finite_inputs
from tcert.checker.kinds.prediction import check_claim as check_prediction
from tcert.checker.kinds.prediction import parse_claim as parse_prediction
from tcert.checker.numbers import parse_int, parse_number, show

WHERE = "claim.local"


def supported(cfg):
    """One line of refusal for what the local rule does not cover."""
    if cfg.n_layers >= 2:
        return supported_layers(cfg)
    if not (cfg.parallel_attn_mlp or cfg.attn_only) or cfg.positional_embedding_type == "standard":
        raise BadInput("claim.local: 1-layer models need parallel or attention-only blocks and rotary or no "
                       "positions (docs/influence.md, 'Local certificates')")
    if cfg.llama_pieces():
        raise BadInput(f"claim.local: {', '.join(cfg.llama_pieces())} not covered by the local rule (the global claim covers them)")


def head_view(B, model, tokens, h, X_all, div) -> dict:
    """Head h at the last query of `tokens` (X_all: the LN1 output of every token, V x d): r (radius of the V
    token values about their box midpoint), x's exp-scores e (shifted; interval ends), the keys and rotated
    queries `position_bounds` scores with, and dist[t] >= ||v_t - o|| for o the head's actual output on x."""
    t, p, n = model.tensors, "blocks.0.attn.", len(tokens)
    vals = X_all @ (B.array(t[p + "W_V"][h]) @ B.array(t[p + "W_O"][h])) + B.matrix(
        [(B.array(t[p + "b_V"][h]) @ B.array(t[p + "W_O"][h])).rows()[0]] * X_all.shape[0])
    lo, hi = vals.col_bounds()
    r = max_row_dist(B, vals, [B.num((a + b) / 2) for a, b in zip(lo, hi)])
    keys = X_all @ B.array(t[p + "W_K"][h]) + B.matrix([B.array(t[p + "b_K"][h]).rows()[0]] * X_all.shape[0])
    last = B.array(np.eye(X_all.shape[0])[[tokens[-1]]]) @ X_all    # the last token's row (a one-hot product)
    q = (last @ B.array(t[p + "W_Q"][h]) + B.array(t[p + "b_Q"][h])).rows()[0]
    cfg, pairs = model.config, rotary_pairs(model.config)
    if pairs:   # q R_(n-1) . R_j k = (R_(-j) R_(n-1) q) . k: rotate the query, not the V keys
        ang = rotary_angles(B, cfg, [n - 1] + [-j for j in range(n)])
        q = rotate(q, ang[n - 1], pairs)
    qs = [rotate(q, ang[-j], pairs) if pairs else q for j in range(n)]
    key_rows, val_rows = keys.rows(), vals.rows()
    actual = [B.dot(qs[j], key_rows[tokens[j]]) / div for j in range(n)]
    shift = B.num(max(B.upper(s) for s in actual))
    e = [B.exp(s - shift) for s in actual]
    Z = B.fsum(e)
    o = [B.fsum(e[i] * val_rows[tokens[i]][c] for i in range(n)) / Z for c in range(len(val_rows[0]))]
    return {"r": r, "e_lo": [B.lower(x) for x in e], "e_hi": [B.upper(x) for x in e], "keys": keys, "qs": qs,
            "shift": shift, "div": div, "dist_fixed": [(x * (1 << SCALE)).__ceil__() for x in row_dists(B, vals, o)],
            "e": e, "Z": Z, "vals": vals, "o": o}


def exp_scores(B, v, j) -> list:
    """Every token's exp-score at non-final position j of head view v (shifted like x's own)."""
    return [B.exp(s / v["div"] - v["shift"]) for s in (B.matrix([v["qs"][j]]) @ v["keys"].T).rows()[0]]


SCALE = 160   # position_bounds works in integers at 2^-SCALE, each rounded outward (floor of a low end, ceiling of a high one)


def position_bounds(B, views, tokens, j, Es) -> tuple:
    """At non-final position j: (the single-change bound max_t sum_h min(old_h, (up(e_j) d_h[x_j] + up(E_t)
    d_h[t]) / (others_j + low(E_t))), per head (up of the best exp-score E, gamma_j = up(e_j) d_h[x_j] +
    max_t up(E_t) d_h[t]), and per token t the bound N_(j,t) before the max, as an integer at 2^-SCALE); E_t (Es:
    per head) the exp-score token t would have at j, old_h = 2 r_h max(a_j, a'_j). Python integers (`fixed_ends`),
    not one Fraction per token: each term is an outward-rounded integer at 2^-SCALE (numerators at 2^-2 SCALE, a
    ratio's ceiling), so every result is >= the exact rational one."""
    total, per_head, one = None, [], 1 << SCALE
    for v, E in zip(views, Es):
        (E_lo,), (E_hi,) = B.fixed_ends(B.matrix([E]), SCALE)
        d, rest, e_j = v["dist_fixed"], sum(v["e_lo"]) - v["e_lo"][j], v["e_hi"][j]
        best = Fraction(max(E_hi), one)
        old = (2 * v["r"] * max(e_j / (rest + e_j), best / (rest + best)) * one).__ceil__()
        others, own = (rest * one).__floor__(), (e_j * one * d[tokens[j]]).__ceil__()   # own: at 2^-2 SCALE
        new = [min(old, -(-(own + hi * dt) // (others + lo))) if others + lo > 0 else old
               for lo, hi, dt in zip(E_lo, E_hi, d)]
        total = new if total is None else [a + b for a, b in zip(total, new)]
        per_head.append((best, Fraction(own + max(hi * dt for hi, dt in zip(E_hi, d)), one * one)))
    return Fraction(max(total), one), per_head, total


def local_parts(B, model, tokens) -> dict:
    """The local derivation on x = tokens: change and change_prob (single substitutions), the per-head
    pattern data for `movement`, the final LN's local Lipschitz rule and the folded unembedding M (d x V)."""
    cfg, n = model.config, len(tokens)
    if cfg.n_layers >= 2:   # propagated block by block (propagated.py)
        change, per = propagated_change(B, model, tokens)
        return {**final_parts(B, model, tokens, change), "per_position": per}
    X_all, div = finite_inputs(B, model), attn_divisor(B, cfg)
    views = [head_view(B, model, tokens, h, X_all, div) for h in range(cfg.n_heads)]
    pos = [position_bounds(B, views, tokens, j, [exp_scores(B, v, j) for v in views]) for j in range(n - 1)]
    change = max(c for c, _, _ in pos) if n > 1 else Fraction(0)
    heads = [(v["r"], v["e_lo"], v["e_hi"], [per[h] for _, per, _ in pos]) for h, v in enumerate(views)]
    return {**final_parts(B, model, tokens, change), "heads": heads, "views": views,
            "pair_moves": [N for _, _, N in pos]}


def final_parts(B, model, tokens, change) -> dict:
    """What the gaps read, given `change`: change_prob, the final LN's local Lipschitz rule and sigma(y')'s ends,
    the folded unembedding M (d x V) and the actual last residual y."""
    cfg, t = model.config, model.tensors
    y = final_residual(B, model, tokens, Weights(B, model))
    M = centred_scaled(B, t["ln_final.w"], t["unembed.W_U"]) if cfg.final_ln else B.array(t["unembed.W_U"])
    mean = B.fsum(y) / cfg.d_model
    py = B.sqrt(B.fsum((v - mean) * (v - mean) for v in y))

    def scale(D, end):   # the final LN's sigma(y') = sqrt(|P y'|^2 / d + eps) for |y' - y| <= D, |P y'| within |P y| +- D
        low = max(B.lower(py) - D, Fraction(0)) if end == "lo" else B.upper(py) + D
        return B.sqrt(B.num(low) ** 2 / cfg.d_model + B.num(cfg.eps))

    def lip_f(D):   # the final LN on ball(y, D): |P y'| >= |P y| - D (step 1's rule, locally)
        return B.upper(1 / scale(D, "lo")) if cfg.final_ln else Fraction(1)
    lo, hi = M.T.col_bounds()
    radius = max_row_dist(B, M.T, [B.num((a + b) / 2) for a, b in zip(lo, hi)])
    return {"change": change, "change_prob": min(radius * lip_f(change) * change, Fraction(2)), "lip_f": lip_f,
            "scale": scale, "unembed": M, "n": len(tokens), "tokens": list(tokens), "y": y,
            **({"ln": True} if cfg.final_ln else {})}


def top(xs, R) -> Fraction:
    """The sum of the R largest of xs."""
    return sum(sorted(xs, reverse=True)[:R])


def head_moves(parts: dict, R: int) -> list:
    """Per head, a bound on how far its output moves over any set of R >= 2 changed non-final keys:
    min(2 r_h min(1, max(a_S, a'_S)), gamma_S / rest), with a_S <= the R largest a_j, a'_S <= T' / (rest + T')
    (T' the R largest best exp-scores), gamma_S the R largest gamma_j, rest the n-1-R smallest exp-scores of
    the other non-final positions plus the last one."""
    moves, n = [], parts["n"]
    for r, e_lo, e_hi, per in parts["heads"]:
        total = sum(e_lo)
        a_S = top([e_hi[j] / (total - e_lo[j] + e_hi[j]) for j in range(n - 1)], R)
        T, gamma = top([b for b, _ in per], R), top([g for _, g in per], R)
        rest = sum(sorted(e_lo[:-1])[:max(n - 1 - R, 0)]) + e_lo[-1]
        old = 2 * r * min(1, max(a_S, T / (rest + T)))
        moves.append(min(old, gamma / rest) if rest > 0 else old)
    return moves


def moved(parts: dict, R: int) -> Fraction:
    """A bound D on ||y - y'|| over any set of <= R changed non-final keys (R = 1: `change`)."""
    return Fraction(0) if R <= 0 else parts["change"] if R == 1 else sum(head_moves(parts, R))


def movement(parts: dict, R: int) -> Fraction:
    """lip_f(D) D: how far the final LN's output moves (D itself without a final LN)."""
    D = moved(parts, R)
    return parts["lip_f"](D) * D


def gaps(B, model, parts, k) -> list:
    """Enclosures (A_b, c_b) with l_k - l_b = A_b / sigma(y) + c_b on x for every b (sigma = 1 without a final
    LN): A_b = y . (M[:, k] - M[:, b]), c_b the bias part (ln_final.b W_U + b_U)."""
    t, V = model.tensors, model.config.d_vocab
    A = (B.matrix([parts["y"]]) @ parts["unembed"]).rows()[0]
    c = B.array(t["unembed.b_U"]).rows()[0] if "unembed.b_U" in t else [B.num(0)] * V
    if model.config.final_ln and "ln_final.b" in t:
        c = [a + b for a, b in zip((B.array(t["ln_final.b"]) @ B.array(t["unembed.W_U"])).rows()[0], c)]
    return [(A[k] - A[b], c[k] - c[b]) for b in range(V)]


def projections(B, model, parts, k, cands) -> tuple:
    """Per head, for each competitor cands[i] with w[t] = u_i . (v_t - o), u_i = M[:, k] - M[:, cands[i]] (a value
    minus the head's actual output, read along the competitor's gap direction): low(min_t w[t]) over every token
    (`exact_backend.difference_minima`: the V values times W_U, through P diag(w_final) first with a final LN, so
    u . v = (v M)[k] - (v M)[b]), and the ends of w[x_j] at x's own tokens (every position). Also up(||u_i||)."""
    t, V = model.tensors, model.config.d_vocab
    W_U, M = np.asarray(t["unembed.W_U"]), parts["unembed"]
    fold = centred_scaled(B, t["ln_final.w"], np.eye(model.config.d_model)) if model.config.final_ln else None
    pick = B.array(np.eye(V)[parts["tokens"]])      # one-hot rows: x's own values as an n x V by V x d product
    out = []
    for v in parts["views"]:
        ou = (B.matrix([v["o"]]) @ M).rows()[0]
        uo = [ou[k] - ou[c] for c in cands]
        reader = v["vals"] if fold is None else v["vals"] @ fold
        lows = difference_minima(reader, W_U, k, B)
        at = [[(B.lower(row[k] - row[c] - d), B.upper(row[k] - row[c] - d)) for c, d in zip(cands, uo)]
              for row in (pick @ v["vals"] @ M).rows()]
        out.append(([lows[c] - B.upper(d) for c, d in zip(cands, uo)], at))
    norms = row_dists(B, M.T, M.T.rows()[k])
    return out, [norms[c] for c in cands]


def multi_floors(B, parts, w, unorms, R) -> list:
    """Per competitor i: a lower bound of u_i . (y' - y) over any R >= 2 substitutions, per head the largest of:
    (a) the identity u . (o' - o) = lam s' + (1 - lam) q, lam = U' / (Z_out + U') <= lam_S = T' / (rest + T'), s' an
    E'-average of w at the new tokens (>= m = min_t w[t]), q = u . (o_out - o) = -sum_S e_j w[x_j] / Z_out, both >=
    m_x = min_i w[x_i] (o_out averages x's unchanged values) and >= -P / rest (P the R largest up(e_j) w[x_j]^+);
    linear in lam, so >= min(q_S, lam_S m + (1 - lam_S) q_S) with q_S = max(m_x, -P / rest): the head saturates;
    (b) -(the R largest d_j) / rest with d_j = up(e_j) w[x_j]^+ + up(E_j) max(-m, 0); (c) -||u_i|| times the
    head's move (`head_moves`)."""
    moves, n = head_moves(parts, R), parts["n"]
    floors = [Fraction(0)] * len(unorms)
    for (r, e_lo, e_hi, per), (mins, at), move in zip(parts["heads"], w, moves):
        rest = sum(sorted(e_lo[:-1])[:max(n - 1 - R, 0)]) + e_lo[-1]
        T = top([b for b, _ in per], R)
        lam = T / (rest + T) if rest > 0 else Fraction(1)
        for i, (m, norm) in enumerate(zip(mins, unorms)):
            pos = [e_hi[j] * max(at[j][i][1], Fraction(0)) for j in range(n - 1)]
            q = min(row[i][0] for row in at)
            best = -move * norm
            if rest > 0:
                q = max(q, -top(pos, R) / rest)
                neg = max(Fraction(0), -m)
                best = max(best, -top([p + b * neg for p, (b, _) in zip(pos, per)], R) / rest)
            floors[i] += max(best, min(q, lam * m + (1 - lam) * q))
    return floors


def safety_radius(B, parts, gs, k) -> Fraction:
    """rho = min_(b != k) low(l_k - l_b) / up(||u_b||): a final-LN output moving by < rho keeps every gap > 0."""
    cols = parts["unembed"].T
    norms, rho = row_dists(B, cols, cols.rows()[k]), None
    for b in (b for b in range(len(gs)) if b != k):
        gap = gap_floor(B, parts, gs[b], Fraction(0), 0)
        if norms[b] > 0 or gap <= 0:   # a zero direction never moves: only its sign matters
            r = gap / norms[b] if norms[b] > 0 else Fraction(0)
            rho = r if rho is None else min(rho, r)
    return max(rho, Fraction(0)) if rho is not None else Fraction(1)


def unscreened(parts, rho) -> list:
    """The single changes (j, t) whose bound N_(j,t) the radius does not cover: lip_f(change) N_(j,t) >= rho."""
    lip = parts["lip_f"](parts["change"])
    cut = rho / lip * (1 << SCALE) if lip > 0 else None     # lip N >= rho with N = N_int 2^-SCALE
    return [[j, t] for j, row in enumerate(parts["pair_moves"]) for t, N in enumerate(row) if cut is None or N >= cut]


def exact_gaps(B, model, parts, k, pairs) -> list:
    """For each single change (j, t): a lower bound of min_(b != k) l_k - l_b on the changed input, from
    y' = y + sum_h (o'_h - o_h), o'_h = (sum_(i != j) e_i v_(x_i) + E_(j,t) v_t) / (sum_(i != j) e_i + E_(j,t)) (exact:
    only key j moves; the sums without key j are formed directly, not as Z - e_j, which loses its relative
    accuracy when key j dominates, and o' directly, not as o plus the identity's ratio)."""
    cfg, tensors, views, x = model.config, model.tensors, parts["views"], parts["tokens"]
    if not pairs or cfg.d_vocab < 2:   # (one token: no competitor, nothing to bound)
        return []
    vals, keys = [v["vals"].rows() for v in views], [v["keys"].rows() for v in views]
    rests = [[B.fsum(e for i, e in enumerate(v["e"]) if i != j) for j in range(len(x))] for v in views]
    sums = [[[B.fsum(v["e"][i] * vr[x[i]][c] for i in range(len(x)) if i != j) for c in range(cfg.d_model)]
             for j in range(len(x) - 1)] for v, vr in zip(views, vals)]
    if cfg.final_ln:
        w = B.array(tensors["ln_final.w"]).rows()[0]
        bias = B.array(tensors["ln_final.b"]).rows()[0] if "ln_final.b" in tensors else [0] * cfg.d_model
    rows = []
    for j, t in pairs:
        y2 = list(parts["y"])
        for v, vr, kr, rest, S in zip(views, vals, keys, rests, sums):
            E = B.exp(B.dot(v["qs"][j], kr[t]) / v["div"] - v["shift"])
            y2 = [y + (s + E * a) / (rest[j] + E) - o for y, s, a, o in zip(y2, S[j], vr[t], v["o"])]
        if cfg.final_ln:
            mean = B.fsum(y2) / cfg.d_model
            cen = [y - mean for y in y2]
            sigma = B.sqrt(B.fsum(c * c for c in cen) / cfg.d_model + B.num(cfg.eps))
            y2 = [c / sigma * g + b for c, g, b in zip(cen, w, bias)]
        rows.append(y2)
    W_U = np.asarray(tensors["unembed.W_U"])   # the bias as one more row, read by a 1 appended to y': [y', 1] [W_U; b_U]
    bU = np.asarray(tensors["unembed.b_U"]) if "unembed.b_U" in tensors else np.zeros(cfg.d_vocab, W_U.dtype)
    return difference_minima(B.matrix([row + [B.num(1)] for row in rows]), np.vstack([W_U, bU[None, :]]), k, B,
                             per_row=True)


def gap_floor(B, parts, gap, delta, R) -> Fraction:
    """A lower bound of l_k - l_b after the changes, from (A_b, c_b) = gap and delta <= u_b . (y' - y):
    (A_b + u_b . (y' - y)) / sigma(y') + c_b with sigma(y') between its ends for ||y' - y|| <= moved(R)
    (linear in 1 / sigma, so an end is the minimum; sigma = 1 without a final LN)."""
    A, c = gap
    N = B.num(B.lower(A) + delta)
    if "ln" not in parts:
        return B.lower(N + c)
    D = moved(parts, R)
    return min(B.lower(N / parts["scale"](D, end) + c) for end in ("lo", "hi"))


def parse_competitors(value, V: int, k: int) -> list:
    """The competitors checked along their own gap direction: distinct token ids, none of them k."""
    where = f"{WHERE}.competitors"
    if not isinstance(value, list):
        raise BadInput(f"{where}: must be a list of token ids")
    out = [parse_int(b, f"{where}[{i}]", 0, V - 1) for i, b in enumerate(value)]
    seen = set()
    for b in out:
        if b in seen or b == k:
            raise BadInput(f"{where}: competitor {b} " + ("listed twice" if b in seen else "is the claimed token"))
        seen.add(b)
    return out


def parse_changes(value, n: int, V: int) -> list:
    """The single changes evaluated exactly: distinct [position j < n - 1, token t] pairs."""
    where = f"{WHERE}.exact_changes"
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise BadInput(f"{where}: must be a list of [position, token] pairs")
    out = [[parse_int(j, f"{where}[{i}][0]", 0, n - 2), parse_int(t, f"{where}[{i}][1]", 0, V - 1)]
           for i, (j, t) in enumerate(value)]
    if len({(j, t) for j, t in out}) < len(out):
        raise BadInput(f"{where}: a change is listed twice")
    return out


def propagated_floors(B, needs, gs, k, R) -> list:
    """L layers, R <= 1: per competitor b, (b, its gap on x, u_b's share ||u_b|| lip_f(D) D of the movement, D =
    change): the final LN's output moves by <= lip_f(D) D, so l_k - l_b moves by <= ||u_b|| times that."""
    cols, move = needs["unembed"].T, movement(needs, R)
    norms = row_dists(B, cols, cols.rows()[k])
    return [(b, gap_floor(B, needs, gs[b], Fraction(0), 0), norms[b] * move) for b in range(len(gs)) if b != k]


def survives_propagated(B, ob, fig, needs, gs, k, R) -> Fraction:
    """Every competitor's gap stays > 0 after any R <= 1 change (`propagated_floors`); returns the smallest."""
    fig[f"{WHERE}.movement"], worst = movement(needs, R), None
    for b, gap, move in propagated_floors(B, needs, gs, k, R):
        ob.require(gap - move > 0, f"competitor {b}: ||u_b||*lip_f*change = {show(move)} is not < its gap {show(gap)}")
        worst = gap - move if worst is None else min(worst, gap - move)
    return worst if worst is not None else Fraction(0)


def survives_one(B, model, ob, fig, needs, k, gs, changes) -> Fraction:
    """R = 1: every single change (j, t) keeps every gap > 0, either screened (lip_f(change) N_(j,t) < rho,
    `safety_radius`) or listed in `changes` and evaluated exactly (`exact_gaps`). Returns the smallest
    certified gap over the listed ones (rho's own margin when none is listed)."""
    rho = fig[f"{WHERE}.safety_radius"] = safety_radius(B, needs, gs, k)
    listed = {(j, t) for j, t in changes}
    for j, t in unscreened(needs, rho):
        ob.require((j, t) in listed, f"change (position {j}, token {t}) not listed: lip_f*N = "
                                     f"{show(needs['lip_f'](needs['change']) * Fraction(needs['pair_moves'][j][t], 1 << SCALE))} is not < rho {show(rho)}")
    floors = exact_gaps(B, model, needs, k, changes)
    for (j, t), floor in zip(changes, floors):
        ob.require(floor > 0, f"change (position {j}, token {t}): the gap after it is >= {show(floor)}, not > 0")
    return min(floors) if floors else rho


def survives(B, model, ob, fig, needs, k, R, G, competitors, changes) -> Fraction:
    """Every competitor b's gap l_k - l_b stays > 0 after any R changes: R = 1 by `survives_one`; R >= 2 a
    listed b along its direction (`multi_floors`, through `gap_floor`), any other by G lip_f D < its gap.
    Records the movement in fig; returns the smallest certified gap after the changes."""
    move, gs = G * movement(needs, R), gaps(B, model, needs, k)
    fig[f"{WHERE}.movement"], listed, worst = move, set(competitors), None
    if R == 1:
        return survives_one(B, model, ob, fig, needs, k, gs, changes)
    for b in range(model.config.d_vocab):
        if b != k and b not in listed:
            floor = gap_floor(B, needs, gs[b], Fraction(0), 0) - move
            ob.require(floor > 0, f"competitor {b} (not listed): G*lip*movement = {show(move)} is not < its gap "
                                  f"{show(floor + move)}")
            worst = floor if worst is None else min(worst, floor)
    if competitors and R >= 2:
        w, unorms = projections(B, model, needs, k, competitors)
        deltas = multi_floors(B, needs, w, unorms, R)
        for b, delta in zip(competitors, deltas):
            floor = gap_floor(B, needs, gs[b], delta, R)
            ob.require(floor > 0, f"competitor {b}: its gap after {R} change(s) is >= {show(floor)}, not > 0")
            worst = floor if worst is None else min(worst, floor)
    return worst


def check_local(model, B, ob, local: dict) -> str:
    """Obligations "influence local: ...": the prediction on x, the single-change bounds, G, and the movement of
    R changes below the margin. Returns the summary line."""
    supported(model.config)
    fields(local, WHERE, {"prediction", "change", "change_prob", "substitutions", "gap_lipschitz"},
           {"competitors", "exact_changes"})
    tokens, k, margin = parse_prediction(local["prediction"], model.config, f"{WHERE}.prediction")
    competitors = parse_competitors(local.get("competitors", []), model.config.d_vocab, k)
    changes = parse_changes(local.get("exact_changes", []), len(tokens), model.config.d_vocab)
    deep = model.config.n_layers >= 2
    R = parse_int(local["substitutions"], f"{WHERE}.substitutions", 0, min(len(tokens) - 1, 1) if deep else max(len(tokens) - 1, 0))
    if deep and (competitors or changes):
        raise BadInput(f"{WHERE}: competitors and exact_changes are 1-layer hints (the L-layer rule takes none)")
    claimed = {key: parse_number(local[key], f"{WHERE}.{key}") for key in ("change", "change_prob", "gap_lipschitz")}
    check_prediction(B, model, local["prediction"], ob, f"{WHERE}.prediction", name="influence local: prediction logit gap")
    needs = local_parts(B, model, tokens)
    for key in ("change", "change_prob"):
        with ob.step(f"influence local: {key}") as fig:
            need = fig[f"{WHERE}.{key}"] = needs[key]
            for block, moves in enumerate(list(zip(*needs.get("per_position", [])))[:-1] if key == "change" else []):
                fig[f"{WHERE}.change.block{block}"] = max(moves)   # L layers: the largest movement after each block
            ob.require(claimed[key] >= need, f"claimed {show(claimed[key])} is below the recomputed {show(need)}")
    with ob.step("influence local: gap_lipschitz") as fig:
        columns = needs["unembed"].T
        need = fig[f"{WHERE}.gap_lipschitz"] = max_row_dist(B, columns, columns.rows()[k])
        ob.require(claimed["gap_lipschitz"] >= need, f"claimed {show(claimed['gap_lipschitz'])} is below {show(need)}")
    with ob.step("influence local: R changes cannot close the gap") as fig:
        floor = fig[f"{WHERE}.gap_floor"] = (
            survives_propagated(B, ob, fig, needs, gaps(B, model, needs, k), k, R) if deep else
            survives(B, model, ob, fig, needs, k, R, claimed["gap_lipschitz"], competitors, changes))
        move = fig[f"{WHERE}.movement"]
    return (f"on this input of length {len(tokens)}: one changed non-final token moves the last residual by <= "
            f"{show(claimed['change'])} and the distribution (L1) by <= {show(claimed['change_prob'])}; the next "
            f"token {k} (margin {show(margin)}) survives ANY change of <= {R} non-final tokens (every gap stays >= "
            f"{show(floor)}; " + (f"propagated through {model.config.n_layers} blocks, each gap moved by <= ||u_b|| lip_f "
            f"change, lip_f change <= {show(move)})" if deep else f"{len(changes)} single change(s) evaluated exactly, "
            f"{len(competitors)} competitor(s) along their own direction, the rest by G*lip*movement <= {show(move)})"))
