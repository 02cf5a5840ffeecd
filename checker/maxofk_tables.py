"""Rigorous tables of a 1-layer attention-only Max-of-K model, as exact integer bounds.

With the query at the last position n-1 (token q) and a key token t at position i, the last position's
logits of a 1-layer, 1-head, attention-only model without LayerNorm are exactly

    score(q; t, i) = EQKE[q, t] + EQKP[q, i]                       (divided by the attention scale)
    logit(x)       = EU[q, x] + sum_i a_i (EV[t_i, x] + PV[i, x]),  a = softmax over all n keys

    EQKE = Q (E W_K)^T / s,  EQKP = Q (P W_K + b_K)^T / s,  Q = (E + P[n-1]) W_Q + b_Q,
    EU = (E + P[n-1]) W_U + b_U + (b_V W_O + b_O) W_U,  EV = E W_V W_O W_U,  PV = P W_V W_O W_U

(sum_i a_i = 1 moves the value and output biases into EU). The checker encloses these with interval
matrix products, then leaves the interval world once per entry: every table becomes a pair of numpy
object arrays of Python ints (lo, hi) with lo <= 2^SHIFT * value <= hi. All later work is exact
integer arithmetic on those bounds, so a verdict never rests on a rounded operation.
"""

from fractions import Fraction

import numpy as np

from .errors import BadInput, Rejected
from .forward import Weights, attn_divisor

SHIFT = 64          # fixed-point bits of the integer bounds
MAX_BITS = 4096     # refuse bounds whose integers would be absurdly large (hostile weights)


def require_maxofk(model):
    """The accuracy kind only speaks about 1-layer, 1-head, attention-only models with learned positions."""
    c = model.config
    problems = []
    if c.n_layers != 1 or c.n_heads != 1:
        problems.append("needs n_layers = n_heads = 1")
    if not c.attn_only or c.has_ln or c.final_ln:
        problems.append("needs an attention-only model without LayerNorm")
    if c.rotary:
        problems.append("needs learned (standard) positional embeddings")
    if c.n_ctx < 2 or c.d_vocab < 2:
        problems.append("needs n_ctx >= 2 and d_vocab >= 2")
    if problems:
        raise BadInput("accuracy: model architecture: " + "; ".join(problems))


def to_ints(q: Fraction, up: bool, shift: int = SHIFT) -> int:
    """floor (or ceil when `up`) of q * 2^shift, exactly."""
    num = q.numerator << shift
    return -((-num) // q.denominator) if up else num // q.denominator


def bounds(B, mat, shift: int = SHIFT) -> tuple:
    """(lo, hi) object arrays of Python ints bounding 2^shift times each entry of the interval matrix."""
    lo = np.empty(mat.shape, dtype=object)
    hi = np.empty(mat.shape, dtype=object)
    limit = Fraction(2) ** (MAX_BITS - SHIFT)
    for r, row in enumerate(mat.rows()):
        for c, x in enumerate(row):
            a, b = B.lower(x), B.upper(x)
            if max(abs(a), abs(b)) > limit:
                raise Rejected("table range", f"an enclosure exceeds 2^{MAX_BITS - SHIFT} in magnitude")
            lo[r, c], hi[r, c] = to_ints(a, False, shift), to_ints(b, True, shift)
    return lo, hi


def interval_tables(B, model) -> dict:
    """Interval matrices EQKE (v x v), EQKP (v x n), EU (v x v), EV (v x v), PV (n x v)."""
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
        "EQKE": (Q @ K_E.T).scale(inv),
        "EQKP": (Q @ K_P.T).scale(inv),
        "EU": X @ W.mat("unembed.W_U") + B.matrix(const.rows() * v),
        "EV": E @ W.mat(p + "W_V", 0) @ OU,
        "PV": P @ W.mat(p + "W_V", 0) @ OU,
    }


def row_shifts(B, mat) -> list:
    """Per row, an exact rational >= every entry's upper end (softmax numerators get divided by it)."""
    return [max(B.upper(x) for x in row) for row in mat.rows()]


def exp_bounds(B, mat, shifts) -> tuple:
    """Integer bounds of exp(entry - shift[row]) (all in (0, 1]) and the scale exponent used.

    The fixed-point exponent grows with the dynamic range (by up to MAX_BITS bits) so that even the
    smallest numerator keeps ~SHIFT significant bits; lower ends are clipped at 0 (exp > 0).
    """
    rows = [[B.exp(x - B.num(s)) for x in row] for row, s in zip(mat.rows(), shifts)]
    smallest = min(B.upper(x) for row in rows for x in row)
    extra = 0 if smallest <= 0 else max(0, smallest.denominator.bit_length() - smallest.numerator.bit_length())
    shift = SHIFT + min(extra, MAX_BITS - 2 * SHIFT)
    lo, hi = bounds(B, B.matrix(rows), shift)
    return np.maximum(lo, 0), hi, shift


def value_tables(B, model) -> dict:
    """Integer bounds of EU, EV, PV and of the attention numerators, from one rigorous pass.

    e[q, t] = exp(EQKE[q, t] - sE[q]),  pw[q, i] = exp(EQKP[q, i] - sP[q]): numerators scaled per query
    by a positive constant, which changes neither a softmax nor the sign of sum_i w_i (...). Value tables
    use 2^SHIFT, e and pw their own 2^e_shift, 2^pw_shift: every comparison the strategies make is between
    sums of products with the same total scale, so only signs matter.
    """
    I = interval_tables(B, model)
    sE, sP = row_shifts(B, I["EQKE"]), row_shifts(B, I["EQKP"])
    out = {"n": model.config.n_ctx, "v": model.config.d_vocab, "intervals": I}
    out["e_lo"], out["e_hi"], out["e_shift"] = exp_bounds(B, I["EQKE"], sE)
    out["pw_lo"], out["pw_hi"], out["pw_shift"] = exp_bounds(B, I["EQKP"], sP)
    for name in ("EU", "EV", "PV"):
        out[name + "_lo"], out[name + "_hi"] = bounds(B, I[name])
    return out


def mul_upper(w_lo, w_hi, x):
    """Upper bound of w * x over w in [w_lo, w_hi] for an exact x (elementwise; any signs; ints)."""
    x, w_lo, w_hi = (np.asarray(a, dtype=object) for a in (x, w_lo, w_hi))
    return np.where(x >= 0, _obj(w_hi * x), _obj(w_lo * x))


def interval_mul(a_lo, a_hi, b_lo, b_hi):
    """Exact bounds of a * b for a in [a_lo, a_hi] with a_lo >= 0 and b in [b_lo, b_hi] (any sign)."""
    a_lo, a_hi, b_lo, b_hi = (np.asarray(x, dtype=object) for x in (a_lo, a_hi, b_lo, b_hi))
    return (np.where(b_lo >= 0, _obj(a_lo * b_lo), _obj(a_hi * b_lo)),
            np.where(b_hi >= 0, _obj(a_hi * b_hi), _obj(a_lo * b_hi)))


def _obj(a):
    """`a` as an object array (a product of 0-d object arrays is a bare Python int)."""
    return np.asarray(a, dtype=object)


def centred_upper(lo, hi, m: int):
    """Upper bounds of T[r, x] - T[r, m] (each row centred at column m), as ints."""
    return hi - lo[:, [m]]
