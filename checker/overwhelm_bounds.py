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

import math
from fractions import Fraction

from .errors import BadInput, Rejected
from .forward import Weights, attn_divisor, layer_norm, rotary_angles, rotary_pairs, rotate

MAX_TABLE_ENTRIES = 1 << 25   # allowed tokens x d_vocab x heads for the exact value table


def supported(cfg):
    """Raise BadInput unless the model has the shape the overwhelm argument needs."""
    positions_ok = cfg.rotary or cfg.positional_embedding_type == "none"   # LN rows position-independent
    if cfg.n_layers != 1 or not positions_ok or not (cfg.attn_only or cfg.parallel_attn_mlp):
        raise BadInput("overwhelm: needs a 1-layer rotary (or position-free) model whose MLP (if any) is parallel to attention "
                       "(neox1l, GPT-NeoX/Pythia use_parallel_residual); a sequential (GPT-2 style) MLP is not supported")


CHUNK = 2048   # allowed tokens processed at a time (bounds memory on vocabulary-sized free sets)


class HeadData:
    """Per head: the query's own score lq, the fixed mass alpha_fix = sum_fixed exp(l_p - lq), the
    value mean u; per free column the extreme scores (score_lo/hi); the score rows of the LP's tokens
    (lp_rows); and per logit j the extremes (value_lo/hi) of ((x_t - u) W_O W_U)_j over allowed t."""

    __slots__ = ("lq", "alpha_fix", "u", "qcols", "bias", "score_lo", "score_hi", "lp_rows", "value_lo", "value_hi")


def ln_rows(B, model, W: Weights, tokens: list):
    """The LN'd embedding rows of `tokens` (LN is position-independent with rotary positions)."""
    cfg = model.config
    ln1 = "blocks.0.ln1" if cfg.has_ln else None
    return layer_norm(B, B.array(model.tensors["embed.W_E"][tokens]), W, ln1, cfg.eps)


def prepare(B, model, prefix: list, query: int, allowed: list, n_free: int, mode: str,
            lp_tokens=(), W: Weights | None = None) -> list:
    """Enclosures of everything the bound needs that does not depend on hints: one HeadData per head.

    `allowed` are the distinct tokens a free position may hold (free position c is n_fix + c);
    `lp_tokens` those whose score rows the assignment LP needs; `mode` the value bound (table|norm).
    """
    cfg = model.config
    if mode == "table" and len(allowed) * cfg.d_vocab * cfg.n_heads > MAX_TABLE_ENTRIES:
        raise BadInput(f"overwhelm: value_bound 'table' would need more than {MAX_TABLE_ENTRIES} entries; use 'norm'")
    W = W or Weights(B, model)
    n_fix, P, dh = len(prefix), len(prefix) + n_free, cfg.d_head
    pre = "blocks.0.attn."
    fixed = sorted(set(prefix) | {query})
    Xfix = ln_rows(B, model, W, fixed)
    K = dict(zip(fixed, (Xfix @ W.heads_concat(pre + "W_K")).rows()))
    Vfix = dict(zip(fixed, (Xfix @ W.heads_concat(pre + "W_V")).rows()))
    Q = (B.matrix([Xfix.rows()[fixed.index(query)]]) @ W.heads_concat(pre + "W_Q")).rows()[0]
    div = attn_divisor(B, cfg)
    pairs = rotary_pairs(cfg)
    offsets = sorted({P - p for p in range(n_fix)} | set(range(n_free + 1)))
    angles = rotary_angles(B, cfg, offsets)
    heads = []
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
        # free column c has offset n_free - c: score(t) = (X_t W_K^h + b_K^h) . qrot
        cols = B.matrix([qrot[n_free - c] for c in range(n_free)]).T
        hd.qcols = W.mat(pre + "W_K", h) @ cols
        hd.bias = (B.matrix([bk]) @ cols).rows()[0]
        hd.score_lo, hd.score_hi, hd.lp_rows = None, None, {}
        hd.value_lo, hd.value_hi = None, None
        heads.append(hd)
    qrows = [hd.qcols.rows() for hd in heads]
    stacked = B.matrix([sum((r[i] for r in qrows), []) for i in range(cfg.d_model)])
    WU = W.mat("unembed.W_U")
    for start in range(0, len(allowed), CHUNK):
        chunk = allowed[start:start + CHUNK]
        X = ln_rows(B, model, W, chunk)
        S = (X @ stacked).rows()
        V = (X @ W.heads_concat(pre + "W_V")).rows()
        projected = []
        for h, hd in enumerate(heads):
            scores = B.matrix([[row[h * n_free + c] + hd.bias[c] for c in range(n_free)] for row in S])
            hd.lp_rows.update((t, r) for t, r in zip(chunk, scores.rows()) if t in lp_tokens)
            hd.score_lo, hd.score_hi = merge(hd.score_lo, hd.score_hi, *scores.col_bounds())
            values = B.matrix([[x - c for x, c in zip(row[h * dh:(h + 1) * dh], hd.u)] for row in V])
            if mode == "table":
                projected += (values @ W.mat(pre + "W_O", h)).rows()
            else:
                r = max(norm_upper(B, row) for row in values.rows())
                hd.value_lo, hd.value_hi = merge(hd.value_lo, hd.value_hi, [-r], [r])
        if mode == "table":   # one product for all heads: rows are (head, token) pairs
            for hd, (lo, hi) in zip(heads, (B.matrix(projected) @ WU).col_bounds(cfg.n_heads)):
                hd.value_lo, hd.value_hi = merge(hd.value_lo, hd.value_hi, lo, hi)
    if mode == "norm":   # |D_tj| <= max_t ||x_t - u||_2 * ||(W_O^h W_U)[:, j]||_2  (Cauchy-Schwarz)
        for h, hd in enumerate(heads):
            norms = [norm_upper(B, col) for col in (W.mat(pre + "W_O", h) @ WU).T.rows()]
            hd.value_lo, hd.value_hi = [hd.value_lo[0] * n for n in norms], [hd.value_hi[0] * n for n in norms]
    return heads


def merge(lo, hi, new_lo, new_hi):
    """Elementwise min of lower and max of upper bound lists (None = nothing yet)."""
    if lo is None:
        return list(new_lo), list(new_hi)
    return [min(a, b) for a, b in zip(lo, new_lo)], [max(a, b) for a, b in zip(hi, new_hi)]


def norm_upper(B, xs) -> Fraction:
    """An exact upper bound of the Euclidean norm of a vector of intervals."""
    square = max(B.upper(B.fsum(x * x for x in xs)), Fraction(0))
    return B.upper(B.sqrt(B.num(square)))


def naive_alpha(B, hd: HeadData):
    """(lower bound of min alpha_free, upper bound of max alpha_free) from per-position extremes."""
    amin = B.lower(B.fsum(B.exp(B.num(x) - hd.lq) for x in hd.score_lo))
    amax = B.upper(B.fsum(B.exp(B.num(x) - hd.lq) for x in hd.score_hi))
    return amin, amax


def lp_costs(B, hd: HeadData, multiset: list):
    """Exact (lower, upper) bounds of the assignment costs exp(l(t_i at free position c) - l_q)."""
    lo, hi = [], []
    for t in multiset:
        es = [B.exp(s - hd.lq) for s in hd.lp_rows[t]]
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


def deviation(B, model, heads: list, beta: list):
    """Upper bound W on max_j |logit_j(X) - logit_j(X')| over the designed set; also per-head maxima.

    Exact integer arithmetic: every value bound is written over one common denominator L (a power of
    two, as all interval endpoints are binary), so the d_vocab x n_heads widths are integer operations;
    W = max_j sum_h width_hj / (L * beta denominator)."""
    values = [x for hd in heads for x in hd.value_lo + hd.value_hi]
    L = math.lcm(*{x.denominator for x in values})
    betas_den = math.lcm(*{b.denominator for pair in beta for b in pair})
    total = [0] * model.config.d_vocab
    per_head = []
    for hd, (bmin, bmax) in zip(heads, beta):
        b0, b1 = bmin.numerator * (betas_den // bmin.denominator), bmax.numerator * (betas_den // bmax.denominator)
        widths = []
        for lo, hi in zip(hd.value_lo, hd.value_hi):
            lo, hi = lo.numerator * (L // lo.denominator), hi.numerator * (L // hi.denominator)
            widths.append((b1 * hi if hi >= 0 else b0 * hi) - (b1 * lo if lo <= 0 else b0 * lo))
        total = [a + b for a, b in zip(total, widths)]
        per_head.append(Fraction(max(widths), L * betas_den))
    return Fraction(max(total), L * betas_den), per_head
