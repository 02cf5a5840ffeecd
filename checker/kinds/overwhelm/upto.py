"""Free kind "upto" (every free string of every length L = 0..N, Definition 1.1): the evidence per length,
the length-0 obligation, and the tables shared by all lengths.

evidence {"lengths": [e_0, ..., e_N]}: e_0 is a prediction claim on prefix + [query] predicting k; e_L
(L >= 1) is exactly the evidence of the any:L certificate for the same prefix, query and k, checked by
the kind's check_fixed_length under the names "overwhelm upto: length L, <method>: ...". For method
naive the length-independent enclosures come from UptoTables, computed once for all lengths
(shared_tables). All lengths must pass; the claim is their conjunction.
"""

from fractions import Fraction

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.exact_backend import fractions, merge_extremes
from tcert.checker.kinds.overwhelm.claim import Question
from tcert.checker.kinds.overwhelm.tables import (ATTN, CHUNK, MAX_TABLE_ENTRIES, FixedSide, HeadData, column_norms,
                                                  ln_rows, merge, score_map, side_by_side, sqrt_upper,
                                                  table_fits)
from tcert.checker.kinds.prediction import check_claim, parse_claim as parse_prediction


def parse_lengths(evidence, n: int) -> list:
    """evidence.lengths: one evidence object per length 0..n."""
    fields(evidence, "evidence", {"lengths"})
    lengths = evidence["lengths"]
    if not isinstance(lengths, list) or len(lengths) != n + 1:
        got = len(lengths) if isinstance(lengths, list) else "no list"
        raise BadInput(f"evidence.lengths: must list evidence for each length 0..{n} ({n + 1} entries), got {got}")
    return lengths


def check_length_zero(B, model, W, q: Question, sample, ob) -> None:
    """Length 0: the sample is exactly prefix + [query] and predicts k (a prediction claim)."""
    tokens, predicted, _ = parse_prediction(sample, model.config, "evidence.lengths[0]")
    with ob.step("overwhelm upto: length 0: sample is prefix + query"):
        ob.require(tokens == q.prefix + [q.query], f"evidence.lengths[0].tokens is not the {len(q.prefix)}-token "
                   f"prefix + query {q.query} ({len(tokens)} tokens, last {tokens[-1]})")
    with ob.step("overwhelm upto: length 0: prediction"):
        ob.require(predicted == q.predicted, f"length 0 predicts {predicted}, the claim says {q.predicted}")
    check_claim(B, model, sample, ob, "evidence.lengths[0]", W, "overwhelm upto: length 0: margin")


def shared_tables(B, model, prefix, query, lengths, W, ob) -> dict:
    """value mode -> UptoTables covering every length whose evidence uses that mode (method naive;
    tight evidence is checked per length). Each length's own part is computed later."""
    need = {}
    for L, e in enumerate(lengths[1:], 1):
        if isinstance(e, dict) and e.get("method") == "naive" and e.get("value_bound") in ("table", "norm"):
            need[e["value_bound"]] = L
    if "table" in need and not table_fits(model.config, model.config.d_vocab):
        raise BadInput(f"evidence.lengths: value_bound 'table' would need more than {MAX_TABLE_ENTRIES} entries; use 'norm'")
    out = {}
    for mode, n_max in sorted(need.items()):
        with ob.step(f"overwhelm upto: lengths 1..{n_max}: LN'd rows, score table for offsets 1..{n_max}, "
                     f"value extremes ({mode})"):
            out[mode] = UptoTables(B, model, prefix, query, n_max, mode, list(range(model.config.d_vocab)), W)
    return out


class UptoTables:
    """Enclosures for every free length L = 1..n_max at once (free kind upto), for one value mode.

    Computed once and shared by all lengths:
    - the fixed side (FixedSide over offsets 0..n_fix + n_max, every offset some length needs; the
      query's own score lq is at offset 0 for every length);
    - the free score table for offsets 1..n_max. Only queries and keys rotate, and a score depends on
      the offset only, so with the query at n_fix + L free column c (position n_fix + c) has offset
      L - c: length L uses offsets L, L-1, ..., 1, i.e. the last L columns of the table (column i has
      offset n_max - i);
    - the LN'd rows and value vectors x_t of all allowed tokens (they depend on the token only), and
      table: the extremes of the uncentred EVOU entries (x_t W_O^h W_U)_j over t (one product for all
             heads);
      norm:  per head and length, an upper bound of max_t (||x_t||^2 - 2 x_t . u_hL) (one product with
             every length's u), and the column norms ||(W_O^h W_U)[:, j]||_2.
    Per length (n_fix cached exponentials and d_vocab numbers per head): alpha_fix and u_hL, and
      table: the centred EVOU entry ((x_t - u) W_O^h W_U)_j = (x_t W_O^h W_U)_j - (u W_O^h W_U)_j, so
             [lo_hj - upper((u W_O^h W_U)_j), hi_hj - lower(...)] encloses it for every t;
      norm:  ||x_t - u||^2 = ||x_t||^2 - 2 x_t . u + ||u||^2 (an identity), so
             r = sqrt(max_t (||x_t||^2 - 2 x_t . u) + ||u||^2) >= max_t ||x_t - u||.
    The resulting HeadData are enclosures of exactly the reals `head_tables` encloses for that length.
    For mode table the caller has checked the table's size (table_fits)."""

    def __init__(self, B, model, prefix: list, query: int, n_max: int, mode: str, allowed: list, W):
        cfg = model.config
        self.B, self.mode, self.n_max, n_fix = B, mode, n_max, len(prefix)
        self.fs = FixedSide(B, model, W, prefix, query, range(n_fix + n_max + 1))
        self.masses = {L: [self.fs.mass(h, n_fix + L) for h in range(cfg.n_heads)] for L in range(1, n_max + 1)}
        score_map = self.score_map(B, model, W)
        self.means = [B.matrix([self.masses[L][h][1] for L in range(1, n_max + 1)]).T   # d_head x n_max
                      for h in range(cfg.n_heads)]
        self.score_lo = self.score_hi = None
        self.evou_raw, self.sq_spread = ([None] * cfg.n_heads for _ in range(2))
        for start in range(0, len(allowed), CHUNK):
            self.add_chunk(B, model, W, allowed[start:start + CHUNK], score_map)
        if mode == "table":
            self.evou_raw_lo, self.evou_raw_hi = zip(*((fractions(lo), fractions(hi)) for lo, hi in self.evou_raw))
            self.mean_evou = self.mean_evou_rows(B, model, W)
        else:
            self.colnorms = column_norms(B, model)

    def score_map(self, B, model, W):
        """(d_model x heads*n_max, 1 x heads*n_max): x_t times the first plus the second is the score row
        of token t, all heads side by side, column i of each head at offset n_max - i."""
        maps = [score_map(B, W, self.fs, h, [self.n_max - i for i in range(self.n_max)])
                for h in range(model.config.n_heads)]
        return side_by_side(B, [cols for cols, _ in maps]), B.matrix([sum((bias for _, bias in maps), [])])

    def add_chunk(self, B, model, W, chunk: list, score_map) -> None:
        """Merge the scores and value extremes of the tokens in `chunk` into the tables."""
        H, dh = model.config.n_heads, model.config.d_head
        X = ln_rows(B, model, W, chunk)
        ones = B.array(np.ones((len(chunk), 1)))
        S = X @ score_map[0] + ones @ score_map[1]
        self.score_lo, self.score_hi = merge(self.score_lo, self.score_hi, *S.col_bounds())
        V = (X @ W.heads_concat(ATTN + "W_V")).rows()
        values = [B.matrix([row[h * dh:(h + 1) * dh] for row in V]) for h in range(H)]
        if self.mode == "table":   # uncentred EVOU rows x_t W_O^h W_U of every (head, token) pair
            evo = [r for h in range(H) for r in (values[h] @ W.mat(ATTN + "W_O", h)).rows()]
            for h, ext in enumerate((B.matrix(evo) @ W.mat("unembed.W_U")).col_extremes(H)):
                self.evou_raw[h] = merge_extremes(self.evou_raw[h], ext)
            return
        N = self.n_max
        for h, Vh in enumerate(values):   # ||x_t||^2 - 2 x_t . u_hL for every t in the chunk and every L
            n2 = B.matrix([[B.fsum(x * x for x in row)] for row in Vh.rows()])
            spread = n2 @ B.array(np.ones((1, N))) - (Vh @ self.means[h]).scale(B.num(2))
            hi = spread.col_bounds()[1]
            self.sq_spread[h] = hi if self.sq_spread[h] is None else [max(a, b) for a, b in zip(self.sq_spread[h], hi)]

    def mean_evou_rows(self, B, model, W) -> dict:
        """(L, h) -> u_hL W_O^h W_U, the fixed positions' mean value through the OV circuit (one product)."""
        H, N = model.config.n_heads, self.n_max
        rows = [(B.matrix([self.masses[L][h][1]]) @ W.mat(ATTN + "W_O", h)).rows()[0]
                for L in range(1, N + 1) for h in range(H)]
        out = (B.matrix(rows) @ W.mat("unembed.W_U")).rows()
        return {(L, h): out[(L - 1) * H + h] for L in range(1, N + 1) for h in range(H)}

    def heads(self, L: int) -> list:
        """The HeadData of free length L (1 <= L <= n_max), as `head_tables` would give (without the score map)."""
        B, N, out = self.B, self.n_max, []
        for h, (alpha_fix, u) in enumerate(self.masses[L]):
            hd, cols = HeadData(self.fs.lq[h], alpha_fix, u), slice(h * N + N - L, h * N + N)
            hd.score_lo, hd.score_hi = self.score_lo[cols], self.score_hi[cols]
            if self.mode == "table":
                mean = self.mean_evou[L, h]
                hd.evou_lo = [lo - B.upper(x) for lo, x in zip(self.evou_raw_lo[h], mean)]
                hd.evou_hi = [hi - B.lower(x) for hi, x in zip(self.evou_raw_hi[h], mean)]
            else:
                r = sqrt_upper(B, max(B.upper(B.num(self.sq_spread[h][L - 1]) + B.fsum(x * x for x in u)), Fraction(0)))
                hd.evou_hi = [r * n for n in self.colnorms[h]]
                hd.evou_lo = [-x for x in hd.evou_hi]
            out.append(hd)
        return out
