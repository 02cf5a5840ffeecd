"""The hint-independent enclosures behind every overwhelm method: the fixed side and the per-head tables.

Setting: a 1-layer model with rotary positions (or none), no final LN for naive/lp, and an MLP that is
parallel to attention (or absent). The input is s + t + q: n_fix prefix tokens, n_free free tokens t from
the designed set, and the query q at position q_pos = n_fix + n_free. Everything at the last position
except attention is a function of q alone (paper Lemma 4.12), so only the attention output varies with t.

Per head h, with scores l_p = rot(q_h) . rot(k_p) / divisor (the model's own divisor) and weights
a_p = softmax(l)_p, the head's contribution to the logits is sum_p a_p x_p W_O^h W_U, where x_p is the
position's LN'd embedding times W_V^h (b_V adds a constant, since the weights sum to 1). The fixed
positions' weights are all proportional to exp(l_p) with fixed l_p, so sum_fixed a_p x_p = A_fix u_h with
u_h their exp(l)-weighted mean, and A_fix = 1 - A_free. Hence

    contribution = u_h W_O^h W_U + sum_free a_p (x_p - u_h) W_O^h W_U.

(x_t - u_h) W_O^h W_U is the centred EVOU row of token t: the OV circuit into the logits (EVOU, with
E = the LN'd embedding) minus the fixed positions' mean. Scores are handled relative to the query's own
score l_q, so alpha_fix = 1 + sum_prefix exp(l_p - l_q) and the free masses are
alpha_free = sum_free exp(l_p - l_q).
"""

from fractions import Fraction

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.exact_backend import fractions, merge_extremes
from tcert.checker.forward import Weights, attn_divisor, layer_norm, rotary_angles, rotary_pairs, rotate

MAX_TABLE_ENTRIES = 1 << 25   # allowed tokens x d_vocab x heads for the exact centred EVOU table
CHUNK = 2048   # allowed tokens processed at a time (bounds memory on vocabulary-sized free sets)
ATTN = "blocks.0.attn."


def supported(cfg):
    """Raise BadInput unless the model has the shape the overwhelm argument needs."""
    positions_ok = cfg.rotary or cfg.positional_embedding_type == "none"   # LN rows position-independent
    if cfg.n_layers != 1 or not positions_ok or not (cfg.attn_only or cfg.parallel_attn_mlp):
        raise BadInput("overwhelm: needs a 1-layer rotary (or position-free) model whose MLP (if any) is parallel to attention "
                       "(neox1l, GPT-NeoX/Pythia use_parallel_residual); a sequential (GPT-2 style) MLP is not supported")
    if cfg.llama_pieces():
        raise BadInput(f"overwhelm: {', '.join(cfg.llama_pieces())} not supported (the prediction kind covers them)")


def table_fits(cfg, n_allowed: int) -> bool:
    """Whether the exact centred EVOU table (allowed tokens x d_vocab x heads) stays within the limit."""
    return n_allowed * cfg.d_vocab * cfg.n_heads <= MAX_TABLE_ENTRIES


class HeadData:
    """Per head: the query's own score lq, the fixed mass alpha_fix = sum_fixed exp(l_p - lq), the fixed
    positions' value mean u; the score map of the free columns (score of token t at free column c =
    x_t score_cols[:, c] + score_bias[c], x_t the LN'd embedding row: the query's EQKE entry at that
    offset); per free column the extreme scores over allowed tokens (score_lo/hi); the score rows of the
    LP's tokens (lp_rows); and per logit j the extremes (evou_lo/hi) of the centred EVOU entry
    ((x_t - u) W_O W_U)_j over allowed t (x_t here the value vector)."""

    __slots__ = ("lq", "alpha_fix", "u", "score_cols", "score_bias", "score_lo", "score_hi", "lp_rows",
                 "evou_lo", "evou_hi")

    def __init__(self, lq, alpha_fix, u, score_cols=None, score_bias=None):
        self.lq, self.alpha_fix, self.u, self.score_cols, self.score_bias = lq, alpha_fix, u, score_cols, score_bias
        self.score_lo = self.score_hi = self.evou_lo = self.evou_hi = None
        self.lp_rows = {}


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
        cfg, dh = model.config, model.config.d_head
        self.B, self.prefix, self.query = B, list(prefix), query
        self.fixed = fixed = sorted(set(prefix) | {query})
        Xfix = ln_rows(B, model, W, fixed)
        K = dict(zip(fixed, (Xfix @ W.heads_concat(ATTN + "W_K")).rows()))
        V = dict(zip(fixed, (Xfix @ W.heads_concat(ATTN + "W_V")).rows()))
        Q = (B.matrix([Xfix.rows()[fixed.index(query)]]) @ W.heads_concat(ATTN + "W_Q")).rows()[0]
        div, pairs = attn_divisor(B, cfg), rotary_pairs(cfg)
        angles = rotary_angles(B, cfg, offsets)
        self.qrot, self.keys, self.vals, self.lq = [], [], [], []
        for h in range(cfg.n_heads):
            sl, bk = slice(h * dh, (h + 1) * dh), W.vec(ATTN + "b_K", h)
            q = [a + b for a, b in zip(Q[sl], W.vec(ATTN + "b_Q", h))]
            self.qrot.append({d: [x / div for x in rotate(q, angles[d], pairs)] for d in offsets})
            self.keys.append({t: [a + b for a, b in zip(K[t][sl], bk)] for t in fixed})
            self.vals.append(B.matrix([V[t][sl] for t in fixed]))
            self.lq.append(B.fsum(a * b for a, b in zip(self.qrot[h][0], self.keys[h][query])))
        self.cache = [{} for _ in range(cfg.n_heads)]

    def weight(self, h: int, t: int, offset: int):
        """exp(l - lq) for fixed token t at `offset` before the query (head h)."""
        key = (t, offset)
        if key not in self.cache[h]:
            B, qrot = self.B, self.qrot[h][offset]
            self.cache[h][key] = B.exp(B.fsum(a * b for a, b in zip(qrot, self.keys[h][t])) - self.lq[h])
        return self.cache[h][key]

    def mass(self, h: int, q_pos: int):
        """(alpha_fix, u) of head h with the query at position q_pos: alpha_fix = 1 + sum_prefix exp(l_p - lq)
        and u the exp(l)-weighted mean of the fixed values (accumulated per distinct token)."""
        B = self.B
        tok_weight = {self.query: B.num(1)}
        for p, t in enumerate(self.prefix):
            e = self.weight(h, t, q_pos - p)
            tok_weight[t] = tok_weight[t] + e if t in tok_weight else e
        alpha_fix = B.fsum(tok_weight.values())
        wrow = B.matrix([[tok_weight[t] for t in self.fixed]])
        return alpha_fix, (wrow @ self.vals[h]).scale(1 / alpha_fix).rows()[0]


def fixed_side(B, model, W: Weights, prefix: list, query: int, n_free: int) -> list:
    """One HeadData per head with the fixed side of free length n_free filled in: lq, alpha_fix, u and
    the free columns' score map (free column c, position n_fix + c, has offset n_free - c)."""
    n_fix, q_pos = len(prefix), len(prefix) + n_free
    fs = FixedSide(B, model, W, prefix, query, sorted({q_pos - p for p in range(n_fix)} | set(range(n_free + 1))))
    return [HeadData(fs.lq[h], *fs.mass(h, q_pos), *score_map(B, W, fs, h, [n_free - c for c in range(n_free)]))
            for h in range(model.config.n_heads)]


def score_map(B, W: Weights, fs: FixedSide, h: int, offsets: list):
    """(score_cols, score_bias) of head h for columns at `offsets` before the query: the score of token t
    in column c is x_t score_cols[:, c] + score_bias[c] = (x_t W_K^h + b_K^h) . qrot[offset c]."""
    cols = B.matrix([fs.qrot[h][d] for d in offsets]).T
    return W.mat(ATTN + "W_K", h) @ cols, (B.matrix([W.vec(ATTN + "b_K", h)]) @ cols).rows()[0]


def side_by_side(B, mats: list):
    """The interval matrices `mats` (same number of rows) concatenated column-wise."""
    rows = [m.rows() for m in mats]
    return B.matrix([sum((r[i] for r in rows), []) for i in range(len(rows[0]))])


def head_tables(B, model, prefix: list, query: int, allowed: list, n_free: int, mode: str,
                lp_tokens=(), W: Weights | None = None) -> list:
    """Enclosures of everything the naive/lp bound needs that does not depend on hints: one HeadData per
    head, the fixed side plus the free tables over `allowed` (the distinct tokens a free position may
    hold); `lp_tokens` are those whose score rows the assignment LP needs; `mode` the value bound
    (table: exact centred EVOU extremes, whose size the caller has checked with table_fits; norm:
    Cauchy-Schwarz)."""
    W = W or Weights(B, model)
    heads = fixed_side(B, model, W, prefix, query, n_free)
    add_free_tables(B, model, W, heads, allowed, n_free, mode, lp_tokens)
    return heads


def add_free_tables(B, model, W: Weights, heads: list, allowed: list, n_free: int, mode: str, lp_tokens) -> None:
    """Fill in each head's free score extremes, LP score rows and centred EVOU extremes over `allowed`,
    CHUNK tokens at a time (table: one product with W_U for all heads per chunk)."""
    cfg = model.config
    stacked, WU = side_by_side(B, [hd.score_cols for hd in heads]), W.mat("unembed.W_U")
    evou = [None] * cfg.n_heads   # table: per head, the centred EVOU extremes so far (exact_backend.merge_extremes)
    for start in range(0, len(allowed), CHUNK):
        chunk = allowed[start:start + CHUNK]
        X = ln_rows(B, model, W, chunk)
        S = (X @ stacked).rows()
        V = (X @ W.heads_concat(ATTN + "W_V")).rows()
        evo = []   # table: the centred EVO rows (x_t - u_h) W_O^h of every (head, token) pair
        for h, hd in enumerate(heads):
            scores = B.matrix([[row[h * n_free + c] + hd.score_bias[c] for c in range(n_free)] for row in S])
            hd.lp_rows.update((t, r) for t, r in zip(chunk, scores.rows()) if t in lp_tokens)
            hd.score_lo, hd.score_hi = merge(hd.score_lo, hd.score_hi, *scores.col_bounds())
            values = B.matrix([[x - c for x, c in zip(row[h * cfg.d_head:(h + 1) * cfg.d_head], hd.u)] for row in V])
            if mode == "table":
                evo += (values @ W.mat(ATTN + "W_O", h)).rows()
            else:
                r = max(norm_upper(B, row) for row in values.rows())
                hd.evou_lo, hd.evou_hi = merge(hd.evou_lo, hd.evou_hi, [-r], [r])
        if mode == "table":   # the centred EVOU rows: one product for all heads
            evou = [merge_extremes(a, b) for a, b in zip(evou, (B.matrix(evo) @ WU).col_extremes(cfg.n_heads))]
    if mode == "table":
        for hd, (lo, hi) in zip(heads, evou):
            hd.evou_lo, hd.evou_hi = fractions(lo), fractions(hi)
    if mode == "norm":   # |centred EVOU_tj| <= max_t ||x_t - u||_2 * ||(W_O^h W_U)[:, j]||_2  (Cauchy-Schwarz)
        for h, hd in enumerate(heads):
            norms = [norm_upper(B, col) for col in (W.mat(ATTN + "W_O", h) @ WU).T.rows()]
            hd.evou_lo, hd.evou_hi = [hd.evou_lo[0] * n for n in norms], [hd.evou_hi[0] * n for n in norms]


def beta_bounds(B, hd: HeadData, amin: Fraction, amax: Fraction):
    """(beta_min lower, beta_max upper): bounds of the total attention weight on the free positions,
    beta = alpha_free / (alpha_fix + alpha_free), given alpha_free in [amin, amax] (beta increases with
    alpha_free and decreases with alpha_fix, so the corners suffice). With a point alpha_free the interval
    quotient's ends are those corners; alpha_fix stays an enclosure (exp of sharp scores: a Fraction of it
    could need millions of bits)."""
    bmin = B.lower(B.num(amin) / (hd.alpha_fix + B.num(amin)))
    bmax = B.upper(B.num(amax) / (hd.alpha_fix + B.num(amax)))
    return max(bmin, Fraction(0)), min(bmax, Fraction(1))


def column_norms(B, model) -> list:
    """Per head h, exact upper bounds of ||(W_O^h W_U)[:, j]||_2 for every logit j: one product of all
    heads' W_O stacked ((heads * d_head) x d_model) with W_U, in column chunks of W_U (memory)."""
    cfg, dh = model.config, model.config.d_head
    WO = B.array(np.concatenate(list(model.tensors[ATTN + "W_O"]), axis=0))
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


def norm_upper(B, xs):
    """An exact upper bound (Fraction) of the Euclidean norm of a vector of intervals."""
    return sqrt_upper(B, max(B.upper(B.fsum(x * x for x in xs)), Fraction(0)))


def sqrt_upper(B, q: Fraction) -> Fraction:
    """An exact rational >= sqrt(q) (q >= 0)."""
    return B.upper(B.sqrt(B.num(q)))
