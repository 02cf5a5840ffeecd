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

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.forward import Weights, attn_divisor

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
    if c.positional_embedding_type != "standard":   # rotary or none: no W_pos table to read
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


def interval_tables(B, model, eqke: bool = True) -> dict:
    """Interval matrices EQKE (v x v; only when `eqke`), EQKP (v x n), EU (v x v), EV (v x v), PV (n x v),
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


def value_tables(B, model, eqke: bool = True) -> dict:
    """Integer bounds of EU, EV, PV and of the attention numerators, from one rigorous pass.

    e[q, t] = exp(EQKE[q, t] - sE[q]),  pw[q, i] = exp(EQKP[q, i] - sP[q]): numerators scaled per query
    by a positive constant, which changes neither a softmax nor the sign of sum_i w_i (...). Value tables
    use 2^SHIFT, e and pw their own 2^e_shift, 2^pw_shift: every comparison the strategies make is between
    sums of products with the same total scale, so only signs matter.
    """
    I = interval_tables(B, model, eqke)
    out = {"n": model.config.n_ctx, "v": model.config.d_vocab, "intervals": I}
    if eqke:
        out["e_lo"], out["e_hi"], out["e_shift"] = exp_bounds(B, I["EQKE"], row_shifts(B, I["EQKE"]))
        out["EQKE_lo"], out["EQKE_hi"] = bounds(B, I["EQKE"])
    out["pw_lo"], out["pw_hi"], out["pw_shift"] = exp_bounds(B, I["EQKP"], row_shifts(B, I["EQKP"]))
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


def max_excl(M):
    """X[r, m] = max_{x != m} M[r, x] for an object-int matrix (the top two of each row)."""
    X = np.empty(M.shape, dtype=object)
    for r, row in enumerate(M.tolist()):
        best = max(range(len(row)), key=row.__getitem__)
        second = max(row[:best] + row[best + 1:])
        X[r, :] = [row[best]] * len(row)
        X[r, best] = second
    return X


def prefix_max(M):
    """P[r, j] = max_{k <= j} M[r, k] (object ints)."""
    P = np.empty(M.shape, dtype=object)
    for r, row in enumerate(M.tolist()):
        best = row[0]
        for j, x in enumerate(row):
            best = max(best, x)
            P[r, j] = best
    return P


def value_bounds(T, groups=None) -> dict:
    """Subcubic value tables (exact upper bounds at 2^SHIFT; x ranges over x != m):

    Tm[q, m]  >= max_x EU[q,x]-EU[q,m] + EV[m,x]-EV[m,m] + Pn[m,x]  (mean+diff: EU = mu + d)
    Tq[q, m]  >= max_x F[q,x] - F[q,m],  F = EU + EV + PV[n-1]
    EUp[q, m] >= max_x EU[q,x] - EU[q,m]
    Rpre[m, j] >= max_{k <= j} (max_x EV[k,x] - EV[k,m]) + max_x Pn[m,x]
    with Pn[m, x] >= max_{i < n-1} PV[i,x] - PV[i,m]. O(n d_vocab^2) work. With `groups` (a group id per
    query token, the EU option), Tm is also bounded with one centre row per group (`grouped_tm`) and the
    smaller bound is kept: O(groups d_vocab^2) more.
    """
    n, v = T["n"], T["v"]
    EU_lo, EU_hi, EV_lo, EV_hi = T["EU_lo"], T["EU_hi"], T["EV_lo"], T["EV_hi"]
    PV_lo, PV_hi = T["PV_lo"], T["PV_hi"]
    Pn = PV_hi[0][None, :] - PV_lo[0][:, None]
    for i in range(1, n - 1):
        Pn = np.maximum(Pn, PV_hi[i][None, :] - PV_lo[i][:, None])
    G = EV_hi - np.diag(EV_lo)[:, None] + Pn
    Tm = centred_tm(EU_lo, EU_hi, G, range(v))
    if groups is not None:
        Tm = np.minimum(Tm, grouped_tm(EU_lo, EU_hi, G, groups))
    F_hi = EU_hi + EV_hi + PV_hi[n - 1][None, :]
    F_lo = EU_lo + EV_lo + PV_lo[n - 1][None, :]
    R = (max_excl(EV_hi) - EV_lo).T + np.diag(max_excl(Pn))[:, None]
    return {"Tm": Tm, "Tq": max_excl(F_hi) - F_lo, "EUp": max_excl(EU_hi) - EU_lo, "Rpre": prefix_max(R)}


def centred_tm(EU_lo, EU_hi, G, rows):
    """Tm[q, m] >= max_{x != m} EU[q,x] - EU[q,m] + G[m,x] for the query rows `rows`, by the mean+diff
    trick with centre mu = floor of the mean of those rows' lower bounds (any centre is valid):
    max_x (EU[q,x] + G[m,x]) <= max_x (mu[x] + G[m,x]) + max_x (EU[q,x] - mu[x]). O(d_vocab^2)."""
    rows = list(rows)
    lo, hi = EU_lo[rows], EU_hi[rows]
    mu = np.array([sum(col) // len(rows) for col in lo.T.tolist()], dtype=object)
    Amax = np.diag(max_excl(mu[None, :] + G)) - mu
    return Amax[None, :] + (hi - mu[None, :]).max(axis=1)[:, None] - (lo - mu[None, :])


def grouped_tm(EU_lo, EU_hi, G, groups):
    """The EU option: the mean+diff bound of Tm with one centre per group of query tokens (groups[q] is
    q's group; the certificate's hint, never trusted: every grouping gives a valid bound)."""
    Tm = np.empty(EU_lo.shape, dtype=object)
    for g in sorted(set(groups)):
        rows = [q for q, h in enumerate(groups) if h == g]
        Tm[rows] = centred_tm(EU_lo, EU_hi, G, rows)
    return Tm


def rank1_scores(B, T, x: list, y: list) -> dict:
    """EQKE = a b^T + Rem with a = Q x / s, b = K y' (y' = y / (y.x)), Rem = A B'^T / s for
    A = Q - (Q x) y'^T, B' = K - (K y') x^T (exact, as y'.x = 1). Returns integer bounds of a b^T at
    2^(2 SHIFT) ("ab_lo", "ab_hi") and eps[q] >= max_{k,k'} Rem[q,k] - Rem[q,k'] (max row-diff trick:
    sum_d |A[q,d]| (max_k B'[k,d] - min_k B'[k,d]) / s), at the same scale. O(d_vocab d_head) work.
    """
    xs, ys = B.matrix([[B.num(t)] for t in x]), B.matrix([[B.num(t)] for t in y])
    yx = (ys.T @ xs).rows()[0][0]
    if B.lower(yx) <= 0 <= B.upper(yx):
        raise Rejected("rank-1 hint", "y . x may be 0: the hint vectors do not define a projection")
    return low_rank_scores(B, T, xs, ys.scale(1 / yx))


def exact_scores(T) -> dict:
    """The exact-EQKE variant in the same shape as `rank1_scores` (eps = 0, scale 2^SHIFT)."""
    return {"ab_lo": T["EQKE_lo"], "ab_hi": T["EQKE_hi"], "eps": np.zeros(T["v"], dtype=object),
            "shift": SHIFT}


def rank2_scores(B, T, X: list, Y: list) -> dict:
    """Rank-2 analogue of `rank1_scores`: X = [x1, x2], Y = [y1, y2] hint vectors in d_head space.

    With G = Y^T X (2 x 2; rejected when det G may be 0) and Y' = Y G^-T, Y'^T X = I exactly, so
    Pr = X Y'^T is a projection and EQKE = a b^T + A B'^T / s with a = Q X / s, b = K Y' (v x 2),
    A = Q - (Q X) Y'^T, B' = K - (K Y') X^T. Returns the same fields as `rank1_scores`: bounds of
    a_q . b_k at 2^(2 SHIFT) (sum of the two rank-1 terms' corner bounds) and the max-row-diff eps.
    O(d_vocab d_head) interval work plus O(d_vocab^2) integer work for the a . b table.
    """
    dh = len(X[0])
    xs = B.matrix([[B.num(X[0][d]), B.num(X[1][d])] for d in range(dh)])
    ys = B.matrix([[B.num(Y[0][d]), B.num(Y[1][d])] for d in range(dh)])
    (g11, g12), (g21, g22) = (ys.T @ xs).rows()
    det = g11 * g22 - g12 * g21
    if B.lower(det) <= 0 <= B.upper(det):
        raise Rejected("rank-2 hint", "det(Y^T X) may be 0: the hint vectors do not define a projection")
    ginv_t = B.matrix([[g22 / det, -g21 / det], [-g12 / det, g11 / det]])     # (G^-1)^T
    return low_rank_scores(B, T, xs, ys @ ginv_t)


def low_rank_scores(B, T, xs, yp) -> dict:
    """The rank-r split shared by rank-1 and rank-2: xs, yp are d_head x r with yp^T xs = I.

    Bounds of a_q . b_k = sum_r (Q xs / s)[q, r] (K yp)[k, r] at 2^(2 SHIFT) by interval corners per
    rank-one term, and the max-row-diff eps of the remainder A B'^T / s, A = Q - (Q xs) yp^T,
    B' = K - (K yp) xs^T.
    """
    I = T["intervals"]
    Q, K, inv = I["Q"], I["K"], I["inv_scale"]
    Qx, Ky = Q @ xs, K @ yp
    return split_scores(B, Qx.scale(inv), Ky, Q - Qx @ yp.T, K - Ky @ xs.T, inv)


def deflated_scores(B, T, X: list, Y: list) -> dict:
    """Recursive rank-1 deflation (the svd-rec variant): hint pairs (x_i, y_i), i = 1..r, in d_head space.

    Starting from Q_1 = Q, K_1 = K, each step sets y_i' = y_i / (y_i . x_i) (rejected when y_i . x_i may
    be 0), so P_i = x_i y_i'^T is a projection, and splits exactly
        Q_i K_i^T = (Q_i x_i)(K_i y_i')^T + Q_{i+1} K_{i+1}^T,  Q_{i+1} = Q_i - (Q_i x_i) y_i'^T,
                                                               K_{i+1} = K_i - (K_i y_i') x_i^T
    (Q_i (I - P_i) K_i^T = Q_i (I - P_i)(I - P_i) K_i^T). So EQKE = sum_i a_i b_i^T + Q_{r+1} K_{r+1}^T / s
    with a_i = Q_i x_i / s, b_i = K_i y_i'; the rank-r part is bounded entrywise and the final remainder by
    the max-row-diff trick, as in `rank1_scores`. Any hints give a valid bound. O(r d_vocab d_head)
    interval work plus O(r d_vocab^2) integer work for the score table.
    """
    I = T["intervals"]
    Q, K, inv = I["Q"], I["K"], I["inv_scale"]
    a_cols, b_cols = [], []
    for i, (x, y) in enumerate(zip(X, Y)):
        xs, ys = B.matrix([[B.num(t)] for t in x]), B.matrix([[B.num(t)] for t in y])
        yx = (ys.T @ xs).rows()[0][0]
        if B.lower(yx) <= 0 <= B.upper(yx):
            raise Rejected("deflation hint", f"y_{i} . x_{i} may be 0: hint pair {i} does not define a projection")
        yp = ys.scale(1 / yx)
        Qx, Ky = Q @ xs, K @ yp
        a_cols.append([row[0] for row in Qx.scale(inv).rows()])
        b_cols.append([row[0] for row in Ky.rows()])
        Q, K = Q - Qx @ yp.T, K - Ky @ xs.T
    a = B.matrix([list(r) for r in zip(*a_cols)])
    b = B.matrix([list(r) for r in zip(*b_cols)])
    return split_scores(B, a, b, Q, K, inv)


def split_scores(B, a, b, A, Bp, inv) -> dict:
    """EQKE = a b^T + A Bp^T * inv (interval matrices; a, b: d_vocab x r). Returns integer bounds of
    a_q . b_k at 2^(2 SHIFT) ("ab_lo", "ab_hi"; corner bounds per rank-one term, summed) and
    eps[q] >= max_{k,k'} Rem[q,k] - Rem[q,k'] for Rem = A Bp^T * inv, by the max-row-diff trick
    sum_d |A[q,d]| (max_k Bp[k,d] - min_k Bp[k,d]) * inv, at the same scale.
    """
    A_lo, A_hi = bounds(B, A)
    B_lo, B_hi = bounds(B, Bp)
    absA = np.maximum(-A_lo, A_hi)
    spread = B_hi.max(axis=0) - B_lo.min(axis=0)
    inv_hi = to_ints(B.upper(inv), True)
    eps = [-((-sum(absA[q] * spread) * inv_hi) >> SHIFT) for q in range(A.shape[0])]
    a_lo, a_hi = bounds(B, a)
    b_lo, b_hi = bounds(B, b)
    lo = hi = 0
    for r in range(a.shape[1]):
        corners = [np.multiply.outer(p, q) for p in (a_lo[:, r], a_hi[:, r]) for q in (b_lo[:, r], b_hi[:, r])]
        lo_r, hi_r = corners[0], corners[0]
        for c in corners[1:]:
            lo_r, hi_r = np.minimum(lo_r, c), np.maximum(hi_r, c)
        lo, hi = lo + lo_r, hi + hi_r
    return {"ab_lo": lo, "ab_hi": hi, "eps": np.array(eps, dtype=object), "shift": 2 * SHIFT}
