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

import numpy as np

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.forward import Weights, attn_divisor, layer_norm, rotary_angles, rotary_pairs, rotate

MAX_TABLE_ENTRIES = 1 << 25   # allowed tokens x d_vocab x heads for the exact value table


def supported(cfg):
    """Raise BadInput unless the model has the shape the overwhelm argument needs."""
    positions_ok = cfg.rotary or cfg.positional_embedding_type == "none"   # LN rows position-independent
    if cfg.n_layers != 1 or not positions_ok or not (cfg.attn_only or cfg.parallel_attn_mlp):
        raise BadInput("overwhelm: needs a 1-layer rotary (or position-free) model whose MLP (if any) is parallel to attention "
                       "(neox1l, GPT-NeoX/Pythia use_parallel_residual); a sequential (GPT-2 style) MLP is not supported")
    if cfg.llama_pieces():
        raise BadInput(f"overwhelm: {', '.join(cfg.llama_pieces())} not supported (the prediction kind covers them)")


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


class FixedSide:
    """The query and the fixed tokens (prefix + query), per head: the query vector rotated to each of
    `offsets` and divided by the model's divisor (qrot[h][offset]), the fixed tokens' keys (with b_K)
    and values, and the query's own score lq[h]. Nothing here depends on the free length; a prefix
    position's weight exp(l - lq) depends only on (token, offset) and is cached, so lengths that see a
    token at the same offset share it."""

    def __init__(self, B, model, W: Weights, prefix: list, query: int, offsets):
        cfg = model.config
        pre, dh = "blocks.0.attn.", cfg.d_head
        self.B, self.prefix, self.query = B, list(prefix), query
        self.fixed = fixed = sorted(set(prefix) | {query})
        Xfix = ln_rows(B, model, W, fixed)
        K = dict(zip(fixed, (Xfix @ W.heads_concat(pre + "W_K")).rows()))
        V = dict(zip(fixed, (Xfix @ W.heads_concat(pre + "W_V")).rows()))
        Q = (B.matrix([Xfix.rows()[fixed.index(query)]]) @ W.heads_concat(pre + "W_Q")).rows()[0]
        div, pairs = attn_divisor(B, cfg), rotary_pairs(cfg)
        angles = rotary_angles(B, cfg, offsets)
        self.qrot, self.keys, self.vals, self.lq, self.cache = [], [], [], [], []
        for h in range(cfg.n_heads):
            sl = slice(h * dh, (h + 1) * dh)
            bq, bk = W.vec(pre + "b_Q", h), W.vec(pre + "b_K", h)
            q = [a + b for a, b in zip(Q[sl], bq)]
            keys = {t: [a + b for a, b in zip(K[t][sl], bk)] for t in fixed}
            qrot = {d: [x / div for x in rotate(q, angles[d], pairs)] for d in offsets}
            self.qrot.append(qrot)
            self.keys.append(keys)
            self.vals.append(B.matrix([V[t][sl] for t in fixed]))
            self.lq.append(B.fsum(a * b for a, b in zip(qrot[0], keys[query])))
            self.cache.append({})

    def weight(self, h: int, t: int, offset: int):
        """exp(l - lq) for fixed token t at `offset` before the query (head h)."""
        key = (t, offset)
        if key not in self.cache[h]:
            B, qrot = self.B, self.qrot[h][offset]
            self.cache[h][key] = B.exp(B.fsum(a * b for a, b in zip(qrot, self.keys[h][t])) - self.lq[h])
        return self.cache[h][key]

    def mass(self, h: int, P: int):
        """(alpha_fix, u) of head h with the query at position P: alpha_fix = 1 + sum_prefix exp(l_p - lq)
        and u the exp(l)-weighted mean of the fixed values (accumulated per distinct token)."""
        B = self.B
        tok_weight = {self.query: B.num(1)}
        for p, t in enumerate(self.prefix):
            e = self.weight(h, t, P - p)
            tok_weight[t] = tok_weight[t] + e if t in tok_weight else e
        alpha_fix = B.fsum(tok_weight.values())
        wrow = B.matrix([[tok_weight[t] for t in self.fixed]])
        return alpha_fix, (wrow @ self.vals[h]).scale(1 / alpha_fix).rows()[0]


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
    offsets = sorted({P - p for p in range(n_fix)} | set(range(n_free + 1)))
    fs = FixedSide(B, model, W, prefix, query, offsets)
    heads = []
    for h in range(cfg.n_heads):
        hd = HeadData()
        hd.lq = fs.lq[h]
        hd.alpha_fix, hd.u = fs.mass(h, P)
        # free column c has offset n_free - c: score(t) = (X_t W_K^h + b_K^h) . qrot
        cols = B.matrix([fs.qrot[h][n_free - c] for c in range(n_free)]).T
        hd.qcols = W.mat(pre + "W_K", h) @ cols
        hd.bias = (B.matrix([W.vec(pre + "b_K", h)]) @ cols).rows()[0]
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


class UptoTables:
    """Enclosures for every free length L = 1..n_max at once (free kind upto), for one value mode.

    Computed once and shared by all lengths:
    - the fixed side (FixedSide over offsets 0..n_fix + n_max, every offset some length needs; the
      query's own score lq is at offset 0 for every length);
    - the free score table for offsets 1..n_max. Only queries and keys rotate, and a score depends on
      the offset only, so with the query at P = n_fix + L free column c (position n_fix + c) has offset
      L - c: length L uses offsets L, L-1, ..., 1, i.e. the last L columns of the table (column i has
      offset n_max - i);
    - the LN'd rows and value vectors x_t of all allowed tokens (they depend on the token only), and
      table: lo_hj <= min_t (x_t M_h)_j, hi_hj >= max_t (x_t M_h)_j (one product for all heads);
      norm:  per head and length, an upper bound of max_t (||x_t||^2 - 2 x_t . u_hL) (one product with
             every length's u), and the column norms ||M_h[:, j]||_2.
    Per length (n_fix cached exponentials and d_vocab numbers per head): alpha_fix and u_hL, and
      table: ((x_t - u) M_h)_j = (x_t M_h)_j - (u M_h)_j, so [lo_hj - upper((u M_h)_j), hi_hj - lower(...)]
             encloses it for every t;
      norm:  ||x_t - u||^2 = ||x_t||^2 - 2 x_t . u + ||u||^2 (an identity), so
             r = sqrt(max_t (||x_t||^2 - 2 x_t . u) + ||u||^2) >= max_t ||x_t - u||.
    The resulting HeadData are enclosures of exactly the reals `prepare` encloses for that length."""

    def __init__(self, B, model, prefix: list, query: int, n_max: int, mode: str, allowed: list, W: Weights):
        cfg = model.config
        if mode == "table" and len(allowed) * cfg.d_vocab * cfg.n_heads > MAX_TABLE_ENTRIES:
            raise BadInput(f"overwhelm: value_bound 'table' would need more than {MAX_TABLE_ENTRIES} entries; use 'norm'")
        self.B, self.mode, self.n_max, H, N, dh = B, mode, n_max, cfg.n_heads, n_max, cfg.d_head
        pre, n_fix = "blocks.0.attn.", len(prefix)
        self.fs = fs = FixedSide(B, model, W, prefix, query, range(n_fix + N + 1))
        self.masses = {L: [fs.mass(h, n_fix + L) for h in range(H)] for L in range(1, N + 1)}
        qrows, bias = [], []
        for h in range(H):
            cols = B.matrix([fs.qrot[h][N - i] for i in range(N)]).T
            qrows.append((W.mat(pre + "W_K", h) @ cols).rows())
            bias += (B.matrix([W.vec(pre + "b_K", h)]) @ cols).rows()[0]
        stacked = B.matrix([sum((r[i] for r in qrows), []) for i in range(cfg.d_model)])
        bias_row, WU = B.matrix([bias]), W.mat("unembed.W_U")
        us = [B.matrix([self.masses[L][h][1] for L in range(1, N + 1)]).T for h in range(H)]   # d_head x N
        self.score_lo = self.score_hi = None
        self.raw_lo, self.raw_hi, self.sq = [None] * H, [None] * H, [None] * H
        for start in range(0, len(allowed), CHUNK):
            chunk = allowed[start:start + CHUNK]
            X = ln_rows(B, model, W, chunk)
            ones = B.array(np.ones((len(chunk), 1)))
            S = X @ stacked + ones @ bias_row
            self.score_lo, self.score_hi = merge(self.score_lo, self.score_hi, *S.col_bounds())
            V = (X @ W.heads_concat(pre + "W_V")).rows()
            values = [B.matrix([row[h * dh:(h + 1) * dh] for row in V]) for h in range(H)]
            if mode == "table":
                projected = [r for h in range(H) for r in (values[h] @ W.mat(pre + "W_O", h)).rows()]
                for h, (lo, hi) in enumerate((B.matrix(projected) @ WU).col_bounds(H)):
                    self.raw_lo[h], self.raw_hi[h] = merge(self.raw_lo[h], self.raw_hi[h], lo, hi)
                continue
            for h, Vh in enumerate(values):   # ||x_t||^2 - 2 x_t . u_hL for every t in the chunk and every L
                n2 = B.matrix([[B.fsum(x * x for x in row)] for row in Vh.rows()])
                D = n2 @ B.array(np.ones((1, N))) - (Vh @ us[h]).scale(B.num(2))
                hi = D.col_bounds()[1]
                self.sq[h] = hi if self.sq[h] is None else [max(a, b) for a, b in zip(self.sq[h], hi)]
        if mode == "table":
            rows = [(B.matrix([self.masses[L][h][1]]) @ W.mat(pre + "W_O", h)).rows()[0]
                    for L in range(1, N + 1) for h in range(H)]
            uM = (B.matrix(rows) @ WU).rows()
            self.uM = {(L, h): uM[(L - 1) * H + h] for L in range(1, N + 1) for h in range(H)}
        else:
            self.colnorms = column_norms(B, model)

    def heads(self, L: int) -> list:
        """The HeadData of free length L (1 <= L <= n_max), as `prepare` would give (without qcols)."""
        B, N, out = self.B, self.n_max, []
        for h, (alpha_fix, u) in enumerate(self.masses[L]):
            hd = HeadData()
            hd.lq, hd.alpha_fix, hd.u = self.fs.lq[h], alpha_fix, u
            cols = slice(h * N + N - L, h * N + N)
            hd.score_lo, hd.score_hi = self.score_lo[cols], self.score_hi[cols]
            hd.qcols, hd.bias, hd.lp_rows = None, None, {}
            if self.mode == "table":
                uM = self.uM[L, h]
                hd.value_lo = [lo - B.upper(x) for lo, x in zip(self.raw_lo[h], uM)]
                hd.value_hi = [hi - B.lower(x) for hi, x in zip(self.raw_hi[h], uM)]
            else:
                sq = max(B.upper(B.num(self.sq[h][L - 1]) + B.fsum(x * x for x in u)), Fraction(0))
                r = B.upper(B.sqrt(B.num(sq)))
                hd.value_hi = [r * n for n in self.colnorms[h]]
                hd.value_lo = [-x for x in hd.value_hi]
            out.append(hd)
        return out


def column_norms(B, model) -> list:
    """Per head h, exact upper bounds of ||(W_O^h W_U)[:, j]||_2 for every logit j: one product of all
    heads' W_O stacked ((heads * d_head) x d_model) with W_U, in column chunks of W_U (memory)."""
    cfg = model.config
    dh = cfg.d_head
    WO = B.array(np.concatenate(list(model.tensors["blocks.0.attn.W_O"]), axis=0))
    WU = model.tensors["unembed.W_U"]
    out = [[] for _ in range(cfg.n_heads)]
    for start in range(0, cfg.d_vocab, CHUNK):
        for row in (WO @ B.array(WU[:, start:start + CHUNK])).T.rows():
            for h in range(cfg.n_heads):
                out[h].append(norm_upper(B, row[h * dh:(h + 1) * dh]))
    return out


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
