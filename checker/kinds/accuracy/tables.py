"""Rigorous tables of a 1-layer attention-only Max-of-K model, as exact integer bounds.

With the query at the last position n-1 (token q) and a key token t at position i, the last position's
logits of a 1-layer, 1-head, attention-only model without LayerNorm are exactly

    score(q; t, i) = EQKE[q, t] + EQKP[q, i]                       (divided by the attention scale)
    logit(x)       = EU[q, x] + sum_i a_i (EVOU[t_i, x] + PVOU[i, x]),  a = softmax over all n keys

    EQKE = Q K^T / s,  EQKP = Q (P W_K + b_K)^T / s,  Q = (E + P[n-1]) W_Q + b_Q,  K = E W_K,
    EU = (E + P[n-1]) W_U + b_U + (b_V W_O + b_O) W_U,  EVOU = E W_V W_O W_U,  PVOU = P W_V W_O W_U

(E = W_E, P = W_pos; sum_i a_i = 1 moves the value and output biases into EU). The checker encloses these
with interval matrix products, then leaves the interval world once per entry: every table becomes a pair
of numpy object arrays of Python ints (lo, hi) with lo <= 2^SHIFT * value <= hi. All later work is exact
integer arithmetic on those bounds (the helpers at the end of this module), so a verdict never rests on a
rounded operation.
"""

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.forward import Weights, attn_divisor
from tcert.checker.numbers import show

SHIFT = 64          # fixed-point bits of the integer bounds
MAX_BITS = 4096     # refuse bounds whose integers would be absurdly large (hostile weights or hints)
TINY = 2.0 ** -1074  # the least positive float64: > e^d for every d <= -MAX_BITS


def require_maxofk(model):
    """The accuracy kind only speaks about 1-layer, 1-head, attention-only models with learned positions."""
    c = model.config
    problems = []
    if c.n_layers != 1 or c.n_heads != 1:
        problems.append("needs n_layers = n_heads = 1")
    if not c.attn_only or c.has_norm or c.final_ln or c.n_key_value_heads is not None:
        problems.append("needs an attention-only model without normalization or grouped-query attention")
    if c.positional_embedding_type != "standard":   # rotary or none: no W_pos table to read
        problems.append("needs learned (standard) positional embeddings")
    if c.n_ctx < 2 or c.d_vocab < 2:
        problems.append("needs n_ctx >= 2 and d_vocab >= 2")
    if problems:
        raise BadInput("accuracy: model architecture: " + "; ".join(problems))


# ------------------------------------------------------------------------------------- interval tables

def interval_tables(B, model, eqke: bool = True) -> dict:
    """Interval matrices EQKE (v x v; only when `eqke`), EQKP (v x n), EU (v x v), EVOU (v x v), PVOU (n x v),
    and the factors Q (v x d_head), K = E W_K (v x d_head) and 1/s (s the attention scale)."""
    c = model.config
    W = Weights(B, model)
    p = "blocks.0.attn."
    E, P = W.mat("embed.W_E"), W.mat("pos_embed.W_pos")
    n, v = c.n_ctx, c.d_vocab
    last = B.matrix([P.rows()[n - 1]] * v)
    X = E + last
    inv = 1 / attn_divisor(B, c)
    Q = X @ W.mat(p + "W_Q", 0) + B.matrix([W.vec(p + "b_Q", 0)] * v)
    K_E = E @ W.mat(p + "W_K", 0)
    K_P = P @ W.mat(p + "W_K", 0) + B.matrix([W.vec(p + "b_K", 0)] * n)
    OU = W.mat(p + "W_O", 0) @ W.mat("unembed.W_U")
    const = (W.mat(p + "b_V", 0) @ W.mat(p + "W_O", 0) + W.mat(p + "b_O")) @ W.mat("unembed.W_U") \
        + W.mat("unembed.b_U")
    return {
        "Q": Q, "K": K_E, "inv_scale": inv,
        "EQKE": (Q @ K_E.T).scale(inv) if eqke else None,
        "EQKP": (Q @ K_P.T).scale(inv),
        "EU": X @ W.mat("unembed.W_U") + B.matrix(const.rows() * v),
        "EVOU": E @ W.mat(p + "W_V", 0) @ OU,
        "PVOU": P @ W.mat(p + "W_V", 0) @ OU,
    }


# -------------------------------------------------------------------------------------- integer tables

def integer_tables(B, model, eqke: bool = True, eqke_bounds: bool = True) -> dict:
    """Integer bounds of EU, EVOU, PVOU (and of EQKE itself when `eqke_bounds`) and of the attention
    numerators (e from EQKE only when `eqke`), from one rigorous pass ("intervals" keeps the interval
    matrices, for the subcubic score splits), and the float64 ends of `float_tables` (the int64 work reads them).

    e[q, t] = exp(EQKE[q, t] - sE[q]),  pw[q, i] = exp(EQKP[q, i] - sP[q]): numerators scaled per query
    by a positive constant, which changes neither a softmax nor the sign of sum_i w_i (...). Value tables
    use 2^SHIFT, e and pw their own 2^e_shift, 2^pw_shift: every comparison the strategies make is between
    sums of products with the same total scale, so only signs matter.
    """
    out = float_tables(B, model, eqke)
    out.exact(eqke_bounds)
    return out


EXACT_KEYS = frozenset(("e_lo", "e_hi", "e_shift", "pw_lo", "pw_hi", "pw_shift", "EQKE_lo", "EQKE_hi")
                       + tuple(f"{k}_{e}" for k in ("EU", "EVOU", "PVOU") for e in ("lo", "hi")))


class Tables(dict):
    """The tables of one model: "n", "v", the interval matrices ("intervals"), their float64 ends ("ends",
    `float_tables`: what the int64 work reads) and, on the first read of one of EXACT_KEYS, the exact integer
    bounds (`exact`): only the strategies' exact fallbacks read them."""

    def __missing__(self, key):
        if key not in EXACT_KEYS or "exact" in self:
            raise KeyError(key)
        self.exact(False)
        return self[key]

    def exact(self, eqke_bounds: bool):
        """Add the exact integer bounds (`integer_tables`' docstring) from the interval matrices."""
        B, intervals = self.backend, self["intervals"]
        self["exact"] = True
        parts = self["numerators"]              # those `float_tables` built entry by entry, if any
        if intervals["EQKE"] is not None:
            self["e_lo"], self["e_hi"], self["e_shift"] = numerator_bounds(B, intervals["EQKE"], parts.get("EQKE"))
            if eqke_bounds:
                self["EQKE_lo"], self["EQKE_hi"] = integer_bounds(B, intervals["EQKE"], "EQKE")
        self["pw_lo"], self["pw_hi"], self["pw_shift"] = numerator_bounds(B, intervals["EQKP"], parts.get("EQKP"))
        for name in ("EU", "EVOU", "PVOU"):
            self[name + "_lo"], self[name + "_hi"] = integer_bounds(B, intervals[name], name)


def float_tables(B, model, eqke: bool = True, library: bool = False) -> Tables:
    """The tables as float64 ends: "ends" {EU, EVOU, PVOU, e (only when `eqke`), pw: (lo, hi)} with lo <= each
    entry <= hi (`Backend.float_ends`; e and pw the numerators of `integer_tables`, lower ends clipped at 0);
    Rejected when an end is beyond the float64 range (hostile weights; as `integer_bounds` beyond 2^(MAX_BITS -
    SHIFT)). The exact integer bounds come on demand. With `library` (brute force, refine: tables that only
    leave as float64 ends), every product is the backend library's own (Arb's, at B's precision; the exact
    product layer off: its results' conversions into Arb for the sums and exps cost more than it saves here)."""
    B = type(B)(B.prec, False) if library and B.exact else B
    intervals = interval_tables(B, model, eqke)
    out = Tables(n=model.config.n_ctx, v=model.config.d_vocab, intervals=intervals)
    out.backend = B
    ends, out["numerators"] = {name: B.float_ends(intervals[name]) for name in ("EU", "EVOU", "PVOU")}, {}
    for name, key in (("EQKE", "e"), ("EQKP", "pw")) if eqke else (("EQKP", "pw"),):
        ends[key] = numerator_ends(B, intervals[name], out["numerators"], name)
    for name, (lo, hi) in ends.items():
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            out.exact(False)            # Rejected with the failing numbers beyond 2^(MAX_BITS - SHIFT)
            raise Rejected("", f"accuracy: a bound of {name} is beyond the float64 range (hostile weights)")
    out["ends"] = ends
    return out


def numerator_ends(B, mat, parts: dict, name: str) -> tuple:
    """Float64 ends (lower ends clipped at 0) of the numerators exp(entry - c_row) of `numerators`, with the same
    c_row: from the backend's one pass per row (`Backend.exp_ends`) where it has one and every result is finite,
    else from `numerators`' matrix (kept in parts[name] for `Tables.exact`; deep entries: 0 and TINY)."""
    fast = B.exp_ends(mat)
    if fast is not None:
        return np.maximum(fast[0], 0.0), fast[1]
    E, below, _ = parts[name] = numerators(B, mat)
    lo, hi = B.float_ends(E)
    deep = np.array(below if below is not None else False, dtype=bool)
    return np.where(deep, 0.0, np.maximum(lo, 0.0)), np.where(deep, TINY, hi)


def fixed_point(q: Fraction, up: bool, shift: int = SHIFT) -> int:
    """floor (or ceil when `up`) of q * 2^shift, exactly."""
    num = q.numerator << shift
    return -((-num) // q.denominator) if up else num // q.denominator


def integer_bounds(B, mat, name: str, shift: int = SHIFT) -> tuple:
    """(lo, hi) object arrays of Python ints bounding 2^shift times each entry of the interval matrix
    `name` (`B.fixed_ends`). Rejected (the enclosure cannot be confirmed within range) beyond
    2^(MAX_BITS - SHIFT)."""
    lo, hi = (np.array(e, dtype=object).reshape(mat.shape) for e in B.fixed_ends(mat, shift))
    limit = 1 << (MAX_BITS - SHIFT + shift)     # |entry| <= 2^(MAX_BITS - SHIFT) iff both ends are within it
    if mat.shape[0] and mat.shape[1] and max(-lo.min(), hi.max()) > limit:
        r, c = next((r, c) for r, c in np.ndindex(*mat.shape) if -lo[r, c] > limit or hi[r, c] > limit)
        raise Rejected("", f"{name}[{r}, {c}] in [{show(Fraction(lo[r, c], 1 << shift))}, "
                           f"{show(Fraction(hi[r, c], 1 << shift))}] exceeds 2^{MAX_BITS - SHIFT} in magnitude "
                           f"(hostile weights or hints)")
    return lo, hi


def numerator_bounds(B, mat, parts=None) -> tuple:
    """Integer bounds of exp(entry - c_row) (all in (0, 1]; c_row an exact rational >= every entry's upper
    end in its row: `numerators`, or `parts` when given, as it returns) and the scale exponent used.

    The fixed-point exponent grows with the dynamic range (by up to MAX_BITS bits) so that even the
    smallest numerator keeps ~SHIFT significant bits (any exponent is sound; this one is chosen from the
    deepest d = entry - c_row, so the ends are read once); lower ends are clipped at 0 (exp > 0).
    """
    E, below, extra = parts or numerators(B, mat)
    shift = SHIFT + min(extra, MAX_BITS - 2 * SHIFT)
    lo, hi = B.fixed_ends(E, shift)
    if below is not None:       # e^d < 2^-MAX_BITS where d <= -MAX_BITS: ends 0 and 1 at every shift used
        hi = [[1 if b else h for h, b in zip(row, flags)] for row, flags in zip(hi, below)]
    return (np.array([[max(a, 0) for a in row] for row in lo], dtype=object), np.array(hi, dtype=object),
            shift)


def numerators(B, mat) -> tuple:
    """(E, below, extra): the interval matrix of exp(entry - c_row) (c_row an exact rational >= every entry's
    upper end in its row), per entry whether it lies at or below -MAX_BITS (`deep_entries`: E holds 0 there;
    None when no entry can), and the bits below 2^0 the smallest numerator may need (MAX_BITS when deep)."""
    lows, highs = mat.T.col_bounds()            # per row: <= every entry's lower end, >= every upper end
    depth = max(c - a for a, c in zip(lows, highs))             # every d >= -depth
    D = B.matrix([[x - c for x in row] for row, c in zip(mat.rows(), map(B.num, highs))])
    below = deep_entries(B, D) if depth >= MAX_BITS else None
    if below is None:
        tiny = B.upper(B.exp(B.num(-depth)))    # <= every numerator's upper end (exp(-depth) <= e^d)
        return D.map(B.exp), None, max(0, tiny.denominator.bit_length() - tiny.numerator.bit_length())
    return B.matrix([[B.num(0) if b else B.exp(x) for x, b in zip(row, flags)]
                     for row, flags in zip(D.rows(), below)]), below, MAX_BITS


def deep_entries(B, D) -> list:
    """Per entry of D: whether it lies entirely at or below -MAX_BITS (hostile weights: Arb's exp of
    [-2^2000, -2^12] is not finite, so those numerators are bounded without evaluating exp)."""
    return [[h <= -MAX_BITS for h in row] for row in B.fixed_ends(D, 0)[1]]


class PositionSums(NamedTuple):
    """For one query: smallest[r] <= the sum of the r smallest non-query positional weights pw[q, i],
    largest[r] >= the sum of the r largest, total_lo <= their total <= total_hi (r = 0..n-1)."""

    smallest: list
    largest: list
    total_lo: int
    total_hi: int


def position_sums(tables, q: int) -> PositionSums:
    """The positional weight sums of query q (integers at 2^pw_shift)."""
    n = tables["n"]
    lo = sorted(tables["pw_lo"][q][: n - 1])
    hi = sorted(tables["pw_hi"][q][: n - 1], reverse=True)
    return PositionSums([sum(lo[:r]) for r in range(n)], [sum(hi[:r]) for r in range(n)], sum(lo), sum(hi))


# ------------------------------------------------------------------------- exact integer bound arithmetic

def mul_upper(w_lo, w_hi, x):
    """Upper bound of w * x over w in [w_lo, w_hi] for an exact x (elementwise; any signs; ints)."""
    if type(x) is int and type(w_lo) is int and type(w_hi) is int:
        return w_hi * x if x >= 0 else w_lo * x
    x, w_lo, w_hi = (np.asarray(a, dtype=object) for a in (x, w_lo, w_hi))
    return np.where(x >= 0, as_objects(w_hi * x), as_objects(w_lo * x))


def product_bounds(a_lo, a_hi, b_lo, b_hi):
    """Exact bounds of a * b for a in [a_lo, a_hi] with a_lo >= 0 and b in [b_lo, b_hi] (any sign)."""
    a_lo, a_hi, b_lo, b_hi = (np.asarray(x, dtype=object) for x in (a_lo, a_hi, b_lo, b_hi))
    return (np.where(b_lo >= 0, as_objects(a_lo * b_lo), as_objects(a_hi * b_lo)),
            np.where(b_hi >= 0, as_objects(a_hi * b_hi), as_objects(a_lo * b_hi)))


def as_objects(a):
    """`a` as an object array (a product of 0-d object arrays is a bare Python int)."""
    return np.asarray(a, dtype=object)


def centred_upper(lo, hi, m: int):
    """Upper bounds of M[r, x] - M[r, m] (each row of the table M = [lo, hi] centred at column m), as ints."""
    return hi - lo[:, [m]]


def max_excluding(M):
    """X[r, m] = max_{x != m} M[r, x] for an object-int matrix (the top two of each row)."""
    X = np.empty(M.shape, dtype=object)
    for r, row in enumerate(M.tolist()):
        best = max(range(len(row)), key=row.__getitem__)
        second = max(row[:best] + row[best + 1:])
        X[r, :] = [row[best]] * len(row)
        X[r, best] = second
    return X


def prefix_max(M):
    """X[r, j] = max_{k <= j} M[r, k] (object ints)."""
    X = np.empty(M.shape, dtype=object)
    for r, row in enumerate(M.tolist()):
        best = row[0]
        for j, x in enumerate(row):
            best = max(best, x)
            X[r, j] = best
    return X
