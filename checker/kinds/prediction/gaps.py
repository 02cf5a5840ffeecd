"""The last position's logit gaps by the exact layer, in Python integers: no Arb entry and no Fraction per logit.

With x the final (normalised) state, a ball of centre c (float64 parts, their exact sum) and l2 radius e,
logit_j = x . w_j + b_j (w_j = W_U[:, j]) and, for every exact x in the ball,

    logit_k - logit_j = (c . w_k + b_k) - (c . w_j + b_j) + (x - c) . (w_k - w_j),
    |(x - c) . (w_k - w_j)| <= e ||w_k - w_j||_2 <= e (n_k + n_j)         for n_j >= ||w_j||_2.

c W_U is an exact product (`exact_backend.parts_times_point`), read as one integer per logit on a common
power of two (`exact_rounding.row_integers`); the stored b_U and n_j (`column_norms`) are integers on powers
of two as well, and e is rounded up to one. So every gap's lower and upper bound is an exact integer times
2^exp (`GapTable`), and a Fraction is made only for the few bounds a caller reads.
"""

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from tcert.checker import exact_backend
from tcert.checker.exact_products import Slices, _require, bits_for, cut_rows, exact_matrix
from tcert.checker.exact_rounding import row_integers
from tcert.checker.interval import EXACT_MAX_PREC

NORM_SHIFT = 20          # n_j = ceil(sqrt(N_j 4^NORM_SHIFT)) 2^-NORM_SHIFT: >= 40 significant bits
COLUMN_CHUNK = 256       # columns per block when summing squares (cache-sized temporaries)
SCREEN_BLOCK = 2048      # columns of W_U per block of the first-digit screen (cache-sized copies)


class GapTable(Sequence):
    """Exact bounds (lows[j] 2^exp, highs[j] 2^exp) of logit_k - logit_j for the token indices `index`;
    item i is the pair of Fractions for j = index[i]."""

    def __init__(self, lows: list, highs: list, exp: int, index=None):
        self.lows, self.highs, self.exp = lows, highs, exp
        self.index = range(len(lows)) if index is None else index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        j = self.index[i]
        return self.value(self.lows[j]), self.value(self.highs[j])

    def value(self, v: int) -> Fraction:
        return Fraction(v << self.exp) if self.exp >= 0 else Fraction(v, 1 << -self.exp)

    def without(self, k: int) -> "GapTable":
        """The same bounds for every j but k."""
        return GapTable(self.lows, self.highs, self.exp, [j for j in self.index if j != k])

    def extremes(self):
        """(least lower bound, its j, least upper bound), compared as integers (one power of two)."""
        j = min(self.index, key=self.lows.__getitem__)
        return self.value(self.lows[j]), j, self.value(min(self.highs[i] for i in self.index))

    def below(self, margin: Fraction) -> list:
        """The (lower, upper) pairs whose lower bound is below `margin` (integer comparisons)."""
        num, den = margin.numerator, margin.denominator
        lhs = (lambda v: (v << self.exp) * den) if self.exp >= 0 else (lambda v: v * den)
        rhs = num if self.exp >= 0 else num << -self.exp
        return [(self.value(self.lows[j]), self.value(self.highs[j])) for j in self.index if lhs(self.lows[j]) < rhs]


def dyadic_up(x: Fraction) -> tuple:
    """(n, e) with n 2^e >= x >= 0 exactly (x itself when dyadic; else >= 64 significant bits, rounded up)."""
    num, den = x.numerator, x.denominator
    if den & (den - 1) == 0:
        return num, -(den.bit_length() - 1)
    s = max(0, 64 + den.bit_length() - num.bit_length())
    return -(-(num << s) // den), -s


def float_integers(a) -> tuple:
    """(v, e): Python ints v_j with a_j = v_j 2^e for a float64 vector a, exactly: a = f 2^E (frexp) with
    f 2^53 an integer below 2^53 (float64 has 53 bits), so a = (f 2^53) 2^(E - 53), shifted to the least E."""
    frac, ex = np.frexp(a)
    low = int(ex.min(initial=0)) - 53
    mant = np.ldexp(frac, 53).astype(np.int64).tolist()
    return [m << s for m, s in zip(mant, (ex - 53 - low).tolist())], low


def column_norms(w):
    """(r, h): Python ints with ||w[:, j]||_2 <= r_j 2^h_j for stored float16/32 weights w (d x n); None for
    wider ones. Squares of p-bit mantissas (p <= 24) are exact in float64 (2p <= 53 bits; a float32 square
    lies within 2^-298 .. 2^256). On column j's unit 2^g_j (g_j = top_j - q, every square < 2^top_j,
    d 2^(q+1) <= 2^53) a square s counts ceil(fl(s 2^-g_j)) + 1 units (+0 for s = 0): where s >= 2^g_j the
    product by the power of two is exact (a normal result in [1, 2^q)), elsewhere s 2^-g_j < 1 and any
    rounding of it lies in [0, 1]; so each count is an integer in [s 2^-g_j, 2^q + 1] and the column sums N_j
    are integers <= d (2^q + 1) <= 2^53, which float64 sums exactly. Then ||w_j||^2 <= N_j 2^g_j, and
    (g_j made even) n_j = ceil(sqrt(N_j 4^S)) 2^(g_j/2 - S) in integers."""
    w = np.asarray(w)
    if w.dtype not in (np.float16, np.float32) or w.ndim != 2 or not w.shape[0]:
        return None
    q = 52 - (w.shape[0] - 1).bit_length()
    _require(q >= 24, "a column too long for exact sums of squares")
    r, h = [], []
    for start in range(0, w.shape[1], COLUMN_CHUNK):
        sq = np.square(w[:, start:start + COLUMN_CHUNK], dtype=np.float64)
        g = np.frexp(sq.max(axis=0))[1].astype(np.int64) - q
        _require(-1022 <= (-g).min(initial=0) and (-g).max(initial=0) <= 1023, "a column's unit out of range")
        sums = np.ceil(sq * np.ldexp(1.0, -g)).sum(axis=0) + np.count_nonzero(sq, axis=0)
        for n, e in zip(sums.astype(np.int64).tolist(), g.tolist()):
            n, e = (n << 1, e - 1) if e & 1 else (n, e)
            t = n << 2 * NORM_SHIFT
            root = math.isqrt(t)
            r.append(root if root * root == t else root + 1)
            h.append(e // 2 - NORM_SHIFT)
    return r, h


def unembedding_cut(w, bits: int) -> Slices:
    """W_U (d x V, finite) cut as a right factor, one scale per column, from the row cut of its transpose: the
    same digits, lines, scales and bounds as `cut_cols` (a column of W is a row of W^T, and cutting works on
    each line's own scale), made on contiguous rows (W^T's blocks of rows join as one copy, not a gather)."""
    r = cut_rows(np.ascontiguousarray(w.T, dtype=np.float64), bits)
    return Slices([d.T for d in r.digits], r.index, r.scale, bits, 1, r.shape[::-1], list(zip(r.line_max, r.line_sum)))


def top_digit(w, bits: int):
    """(hi, tops): W_U's first digit on each column's own scale, hi_ij = trunc(w_ij 2^(bits - top_j)) (exact: a
    scaling by a power of two that leaves a normal float64 -- |w| < 2^top, top >= -148 for float16/32 -- and
    trunc), so w_ij = 2^(top_j - bits) (hi_ij + f_ij) with |f_ij| < 1; as Slices of one digit (a right factor).
    Its statistics: the column maxima of |hi| are trunc(max_i |w_ij| 2^(bits - top_j)) (trunc is monotone), and
    d times them bound the column sums (`Slices` needs upper bounds: they enter only the exactness bound)."""
    peak = np.maximum(w.max(axis=0, initial=0), -w.min(axis=0, initial=0)).astype(np.float64)
    tops = np.frexp(peak)[1].astype(np.int64)
    _require(-1022 <= bits - tops.max(initial=0) and bits - tops.min(initial=0) <= 1023, "a column's scale out of range")
    scale = np.ldexp(1.0, bits - tops)
    hi = np.multiply(w, scale[None, :], dtype=np.float64)     # w widened exactly, then scaled: one float64 pass
    np.trunc(hi, out=hi)
    line_max = np.trunc(peak * scale)
    cut = Slices([hi], [np.arange(w.shape[1])], tops, bits, 1, w.shape, [(line_max, line_max * w.shape[0])])
    return cut, tops


def _on(values: list, exp: int, to: int) -> list:
    """Integers v 2^exp rewritten on the lower power 2^to (to <= exp; the same list when to = exp)."""
    return values if exp == to else [v << (exp - to) for v in values]


def exact_columns(parts, w, cols: list, bias, e):
    """(logits, radii, exp): for the columns `cols` of W_U, the exact c . w_j + b_j and e n_j (`column_norms`),
    Python ints on one power of two 2^exp (e = (n, t) is the ball radius n 2^t)."""
    sub = w[:, cols]
    centre, ce = row_integers(exact_backend.parts_times_point(parts, unembedding_cut(sub, bits_for(w.shape[0]))))
    bv, be = float_integers(bias[cols])
    (r, h), (en, ee) = column_norms(sub), e
    exp = min(ce, be, ee + min(h))
    logit = [a + b for a, b in zip(_on(centre, ce, exp), _on(bv, be, exp))]
    return logit, [(en * v) << (s + ee - exp) for v, s in zip(r, h)], exp


def screened_centre(parts, w, bits: int):
    """(v, exp, tops): the exact c . w^_j = v_j 2^exp for W_U's first digit w^ on each column's scale 2^tops_j
    (`top_digit`), by blocks of SCREEN_BLOCK columns (cache-sized float64 copies, not one of all of W_U), each
    block's integers put on the least power of two of all blocks (`_on`: exact)."""
    vals, exps, tops = [], [], []
    for start in range(0, w.shape[1], SCREEN_BLOCK):
        cut, t = top_digit(w[:, start:start + SCREEN_BLOCK], bits)
        v, e = row_integers(exact_backend.parts_times_point(parts, cut))
        vals, exps, tops = vals + [v], exps + [e], tops + [t]
    low = min(exps, default=0)
    return [x for v, e in zip(vals, exps) for x in _on(v, e, low)], low, np.concatenate(tops)


def screened_columns(parts, w, bias, e):
    """(logits, slack, exp): every column's c . w^_j + b_j for W_U's first digit w^ (`screened_centre`) and a
    slack with |logit_j(x) - that| <= slack_j for every x in the ball: |c . (w_j - w^_j)| < ||c||_1 2^(top_j - bits)
    and |(x - c) . w_j| <= e ||w_j|| <= e ceil(sqrt(d)) 2^top_j (|w_ij| < 2^top_j)."""
    d, bits = w.shape[0], bits_for(w.shape[0])
    centre, ce, tops = screened_centre(parts, w, bits)
    bv, be = float_integers(bias)
    l1, le = float_integers(np.concatenate([np.abs(p).reshape(-1) for p in parts]))
    (en, ee), root, low = e, math.isqrt(d - 1) + 1, int(tops.min(initial=0))
    exp = min(ce, be, le + low - bits, ee + low)
    total, tops = sum(l1), tops.tolist()
    slack = {t: (total << (t - bits + le - exp)) + ((en * root) << (t + ee - exp)) for t in set(tops)}  # per top
    sc, sb = ce - exp, be - exp          # both >= 0: centre and bias rewritten on 2^exp (`_on`), in one pass
    return [(a << sc) + (b << sb) for a, b in zip(centre, bv)], [slack[t] for t in tops], exp


def contenders(lows: list, highs: list, k: int) -> list:
    """The j != k with lows[j] - (highs[j] - lows[j]) <= T = min_(i != k) highs[i] (`exact_gap_table`'s screen)."""
    top = min((h for j, h in enumerate(highs) if j != k), default=0)
    return [j for j in range(len(lows)) if j != k and 2 * lows[j] - highs[j] <= top]


def exact_gap_table(B, W, x, k: int):
    """The `GapTable` of every j at the final state x (Rows of one row) for the predicted token k, by the
    exact layer (module docstring); None where it does not apply (the layer off, x's centre not a point
    of float64 parts, W_U not float16/32, a part beyond the float range).

    Screen. Column k is exact; every other column first gets bounds from W_U's first digit (`screened_columns`:
    lo'_j <= lo_j <= hi_j <= hi'_j). Exact bounds replace them for the contenders: every j with
    lo'_j - (hi'_j - lo'_j) <= T = min_i hi'_i. The rest keep lo'_j > T and lo'_j - (hi'_j - lo'_j) > T, so for
    i with hi'_i = T (a contender): lo_j >= lo'_j > T >= hi_i >= lo_i, and hi_j > T >= hi_i, and
    lo_j - (hi_j - lo_j) >= lo'_j - (hi'_j - lo'_j) > T >= lo_i - (hi_i - lo_i): the least lower and upper
    bound, the least lo - width and the set of gaps below any margin <= T are those of the all-exact table
    (a margin above T is refuted by hi_i)."""
    if not (B.exact and B.prec <= EXACT_MAX_PREC):
        return None
    parts = exact_backend.point_parts(x.centre, B)
    w = np.asarray(W.model.tensors["unembed.W_U"])
    if parts is None or w.dtype not in (np.float16, np.float32) or not all(np.isfinite(p).all() for p in parts):
        return None
    if not np.isfinite(w).all():
        return None
    bias, e = exact_matrix(W.model.tensors["unembed.b_U"])[0], dyadic_up(x.eps[0])
    (lk,), (rk,), kexp = exact_columns(parts, w, [k], bias, e)
    logit, slack, sexp = screened_columns(parts, w, bias, e)
    exp = min(kexp, sexp)
    lk, rk, s = lk << (kexp - exp), rk << (kexp - exp), sexp - exp     # y, z on 2^exp: y << s, z << s
    lows = [lk - rk - ((y + z) << s) for y, z in zip(logit, slack)]
    highs = [lk + rk - ((y - z) << s) for y, z in zip(logit, slack)]
    lows[k] = highs[k] = 0
    open_gaps = contenders(lows, highs, k)
    if open_gaps:
        cl, cr, cexp = exact_columns(parts, w, open_gaps, bias, e)
        low = min(exp, cexp)
        lows, highs, lk, rk = _on(lows, exp, low), _on(highs, exp, low), lk << (exp - low), rk << (exp - low)
        cl, cr, exp = _on(cl, cexp, low), _on(cr, cexp, low), low
        for j, y, z in zip(open_gaps, cl, cr):
            lows[j], highs[j] = lk - y - rk - z, lk - y + rk + z
    return GapTable(lows, highs, exp)
