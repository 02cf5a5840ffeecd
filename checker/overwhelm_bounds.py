"""Rigorous bounds behind `overwhelm` certificates (the computational core of the kind).

Setting: a 1-layer model with rotary positions, no final LN, and an MLP that is parallel to attention
(or absent). The input is s + t + q: n_fix prefix tokens, n_free free tokens t from a designed set,
and the query q at position P = n_fix + n_free. Everything at the last position except attention is
a function of q alone (paper Lemma 4.12), so only the attention output varies with t.

Per head h, with scores l_p = rot(q_h) . rot(k_p) / divisor (the model's own divisor) and weights
a_p = softmax(l)_p, the head's contribution to the logits is sum_p a_p x_p M_h, where x_p is the
position's LN'd embedding times W_V^h (b_V adds a constant, since the weights sum to 1) and
M_h = W_O^h W_U. The fixed positions' weights are all proportional to exp(l_p) with fixed l_p, so
sum_fixed a_p x_p = A_fix * u_h with u_h their exp(l)-weighted mean, and A_fix = 1 - A_free. Hence

    contribution = u_h M_h + sum_free a_p (x_p - u_h) M_h.

With A_free in [beta_min, beta_max] and every entry of D_h = (x_t - u_h) M_h for allowed free tokens
t in [lo_hj, hi_hj], logit j of head h moves within an interval of width
    width_hj = (beta_max hi if hi >= 0 else beta_min hi) - (beta_max lo if lo <= 0 else beta_min lo),
and the whole logit vector moves by at most W = max_j sum_h width_hj in every coordinate (heads ADD).

Scores are handled relative to the query's own score l_q, so alpha_fix = 1 + sum_prefix exp(l_p - l_q)
and the free positions' masses alpha_free = sum_free exp(l_p - l_q) are bounded naively (per-position
extremes over the allowed tokens, paper Algorithms 4/5) and, for permutations, by the assignment LP
of Algorithm 3 through a dual solution checked in exact rationals (weak duality).
"""

from fractions import Fraction

from .errors import BadInput, Rejected
from .forward import Weights, attn_divisor, layer_norm, rotary_angles, rotary_pairs, rotate

MAX_TABLE_ENTRIES = 1 << 25   # allowed tokens x d_vocab x heads for the exact value table


def supported(cfg):
    """Raise BadInput unless the model has the shape the overwhelm argument needs."""
    if cfg.n_layers != 1 or not cfg.rotary or cfg.final_ln or not (cfg.attn_only or cfg.parallel_attn_mlp):
        raise BadInput("overwhelm: needs a 1-layer rotary model without final LN whose MLP (if any) "
                       "is parallel to attention (neox1l)")


class HeadData:
    """Per head: the query's own score, the fixed mass, the free score table and the value table."""

    __slots__ = ("lq", "alpha_fix", "free_scores", "u", "values")


def prepare(B, model, prefix: list, query: int, allowed: list, n_free: int, W: Weights | None = None) -> list:
    """Enclosures of everything the bound needs that does not depend on hints: one HeadData per head.

    `allowed` are the distinct tokens a free position may hold; free_scores[h] has one row per
    allowed token and one column per free position (n_fix .. n_fix + n_free - 1).
    """
    cfg = model.config
    W = W or Weights(B, model)
    n_fix, P, dh = len(prefix), len(prefix) + n_free, cfg.d_head
    tokens = sorted(set(prefix) | {query} | set(allowed))
    index = {t: i for i, t in enumerate(tokens)}
    ln1 = "blocks.0.ln1" if cfg.has_ln else None
    X = layer_norm(B, B.array(model.tensors["embed.W_E"][tokens]), W, ln1, cfg.eps)
    Xrows = X.rows()
    fixed = sorted(set(prefix) | {query})
    Xfix = B.matrix([Xrows[index[t]] for t in fixed])
    Xfree = X if len(allowed) == len(tokens) else B.matrix([Xrows[index[t]] for t in allowed])
    pre = "blocks.0.attn."
    K = dict(zip(fixed, (Xfix @ W.heads_concat(pre + "W_K")).rows()))
    Vfix = dict(zip(fixed, (Xfix @ W.heads_concat(pre + "W_V")).rows()))
    Vfree = (Xfree @ W.heads_concat(pre + "W_V")).rows()
    Q = (B.matrix([Xrows[index[query]]]) @ W.heads_concat(pre + "W_Q")).rows()[0]
    div = attn_divisor(B, cfg)
    pairs = rotary_pairs(cfg)
    offsets = sorted({P - p for p in range(n_fix)} | set(range(n_free + 1)))
    angles = rotary_angles(B, cfg, offsets)
    heads, wcols, consts = [], [], []
    for h in range(cfg.n_heads):
        sl = slice(h * dh, (h + 1) * dh)
        bq, bk = W.vec(pre + "b_Q", h), W.vec(pre + "b_K", h)
        q = [a + b for a, b in zip(Q[sl], bq)]
        keys = {t: [a + b for a, b in zip(K[t][sl], bk)] for t in fixed}
        qrot = {d: [x / div for x in rotate(q, angles[d], pairs)] for d in offsets}
        hd = HeadData()
        hd.lq = B.fsum(a * b for a, b in zip(qrot[0], keys[query]))
        # exp(l_p - l_q) per prefix position, accumulated per distinct token for the value mean
        tok_weight = {query: B.num(1)}
        for p, t in enumerate(prefix):
            e = B.exp(B.fsum(a * b for a, b in zip(qrot[P - p], keys[t])) - hd.lq)
            tok_weight[t] = tok_weight[t] + e if t in tok_weight else e
        hd.alpha_fix = B.fsum(tok_weight.values())
        wrow = B.matrix([[tok_weight[t] for t in fixed]])
        hd.u = (wrow @ B.matrix([Vfix[t][sl] for t in fixed])).scale(1 / hd.alpha_fix).rows()[0]
        hd.values = B.matrix([[x - c for x, c in zip(row[sl], hd.u)] for row in Vfree])
        # free position c (offset n_free - c): score(t) = (X_t W_K^h + b_K^h) . qrot / div
        cols = B.matrix([qrot[n_free - c] for c in range(n_free)]).T
        wcols.append(W.mat(pre + "W_K", h) @ cols)
        consts.append((B.matrix([bk]) @ cols).rows()[0])
        heads.append(hd)
    stacked = B.matrix([sum((w.rows()[i] for w in wcols), []) for i in range(cfg.d_model)])
    S = (Xfree @ stacked).rows()
    for h, hd in enumerate(heads):
        c0 = h * n_free
        hd.free_scores = B.matrix([[row[c0 + c] + consts[h][c] for c in range(n_free)] for row in S])
    return heads


def naive_alpha(B, hd: HeadData):
    """(lower bound of min alpha_free, upper bound of max alpha_free) from per-position extremes."""
    lo, hi = hd.free_scores.col_bounds()
    amin = B.lower(B.fsum(B.exp(B.num(x) - hd.lq) for x in lo))
    amax = B.upper(B.fsum(B.exp(B.num(x) - hd.lq) for x in hi))
    return amin, amax


def lp_costs(B, hd: HeadData, allowed: list, multiset: list):
    """Exact (lower, upper) bounds of the assignment costs exp(l(t_i at free position c) - l_q)."""
    rows = hd.free_scores.rows()
    where = {t: i for i, t in enumerate(allowed)}
    lo, hi = [], []
    for t in multiset:
        es = [B.exp(s - hd.lq) for s in rows[where[t]]]
        lo.append([B.lower(e) for e in es])
        hi.append([B.upper(e) for e in es])
    return lo, hi


def lp_bound(u: list, v: list, costs: list, sense: str, name: str) -> Fraction:
    """Weak duality for the assignment LP, checked exactly.

    sense "min": u_i + v_c <= lower cost for all i, c gives sum u + sum v <= min over permutations.
    sense "max": u_i + v_c >= upper cost for all i, c gives sum u + sum v >= max over permutations.
    """
    for i, row in enumerate(costs):
        for c, cost in enumerate(row):
            s = u[i] + v[c]
            if (s > cost) if sense == "min" else (s < cost):
                rel = "<=" if sense == "min" else ">="
                raise Rejected(f"{name}: dual feasibility",
                               f"u[{i}] + v[{c}] = {float(s):.9g} is not {rel} the certified cost bound {float(cost):.9g}")
    return sum(u) + sum(v)


def betas(B, hd: HeadData, amin: Fraction, amax: Fraction):
    """(beta_min lower, beta_max upper): bounds of the total attention weight on free positions."""
    fix_lo, fix_hi = B.num(B.lower(hd.alpha_fix)), B.num(B.upper(hd.alpha_fix))
    bmin = B.lower(B.num(amin) / (fix_hi + B.num(amin)))
    bmax = B.upper(B.num(amax) / (fix_lo + B.num(amax)))
    return max(bmin, Fraction(0)), min(bmax, Fraction(1))


def norm_upper(B, xs) -> Fraction:
    """An exact upper bound of the Euclidean norm of a vector of intervals."""
    square = max(B.upper(B.fsum(x * x for x in xs)), Fraction(0))
    return B.upper(B.sqrt(B.num(square)))


def value_bounds(B, model, W: Weights, hd: HeadData, h: int, mode: str):
    """Per logit j, exact (lo, hi) enclosing ((x_t - u_h) W_O^h W_U)_j for every allowed token t.

    mode "table": the table itself (rows = allowed tokens). mode "norm": Cauchy-Schwarz,
    |D_tj| <= max_t ||x_t - u_h||_2 * ||(W_O^h W_U)[:, j]||_2, for when the table is too big.
    """
    WO, WU = W.mat("blocks.0.attn.W_O", h), W.mat("unembed.W_U")
    if mode == "table":
        return ((hd.values @ WO) @ WU).col_bounds()
    M = WO @ WU
    R = max(norm_upper(B, row) for row in hd.values.rows())
    norms = [norm_upper(B, col) for col in M.T.rows()]
    return [-R * n for n in norms], [R * n for n in norms]


def deviation(B, model, W: Weights, heads: list, beta: list, mode: str):
    """Upper bound W on max_j |logit_j(X) - logit_j(X')| over the designed set; also per-head maxima."""
    cfg = model.config
    if mode == "table" and heads and heads[0].values.shape[0] * cfg.d_vocab * cfg.n_heads > MAX_TABLE_ENTRIES:
        raise BadInput(f"overwhelm: value_bound 'table' would need more than {MAX_TABLE_ENTRIES} entries; use 'norm'")
    total = [Fraction(0)] * cfg.d_vocab
    per_head = []
    for h, hd in enumerate(heads):
        bmin, bmax = beta[h]
        lo, hi = value_bounds(B, model, W, hd, h, mode)
        widths = []
        for j in range(cfg.d_vocab):
            top = bmax * hi[j] if hi[j] >= 0 else bmin * hi[j]
            bottom = bmax * lo[j] if lo[j] <= 0 else bmin * lo[j]
            widths.append(top - bottom)
        total = [a + b for a, b in zip(total, widths)]
        per_head.append(max(widths))
    return max(total), per_head
