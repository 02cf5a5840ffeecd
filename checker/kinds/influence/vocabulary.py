"""Sets over the whole vocabulary, by blocks of tokens: block 0's value sets and the unembedding's radius.

Block 0 of a model without a position table reads the normalised embeddings themselves, so a head's values
are the finite set {LN1(W_E[t]) W_V W_O + b_V W_O : t}; the unembedding's columns are the finite set
{P diag(w) W_U[:, t] : t}. At d_vocab 50304 an interval table of either is 38.6M Python balls. Here each
block of VOCAB_ROWS tokens is made, multiplied by point matrices (the exact layer where the backend has it:
every product exact, rounded outward once), reduced and dropped. Two passes: the bounding box of the set
(its midpoint, rounded to two float64 parts p1 + p2, is the centre c: any centre is sound), then every
member's distance from c, computed as one more product, 2 v - (p1 + p2) = [y, 1, 1] [[2 W], [-p1], [-p2]]
for v = y W, so no table of differences is built (`centred_balls`). Block 0 of a LayerNorm model with
float16/32 weights on the exact layer keeps its tokens' LN scale 1/(d sigma) out of every product and
reads it per row in the radius' quadratic form (`scaled_value_sets`, `head_ball`).
"""

from fractions import Fraction

import numpy as np

from tcert.checker import exact_backend
from tcert.checker.errors import Rejected
from tcert.checker.interval import EXACT_MAX_PREC, IMat
from tcert.checker.forward import Weights, kv_head, norm_row
from tcert.checker.kinds.influence.sublayers import finite_inputs
from tcert.checker.kinds.influence.norms import (EXACT_DTYPES, VECTOR_ROWS, RowTerms, max_row_dist, operator_norm,
                                                 vector_norm)
from tcert.checker.modelfile import kv_names

VOCAB_ROWS = VECTOR_ROWS   # tokens per block (bounds memory, not the result; the blocks of norms.RowTerms)
# Up to this many entries (d_vocab x d_model) the sets are interval tables, as before this module: at 64 bits
# their products round below float64's ulp, so their radii are a few ulps tighter than the blockwise ones
# (which round each product to float64 once), and certificates made before stay byte-identical.
TABLE_ENTRIES = 1 << 20
ERR_POWER = 6   # the trace power of ||W_O||_2 in a value set's error term (64 x 64 Gram matrices: cheap)


def max_norm(B, D) -> Fraction:
    """Upper bound of max_r ||D[r]||_2 over the rows of D (float64 ends, or an interval matrix): exact
    squares from the ends (`exact_backend.max_row_square`) where there are ends, else blockwise Gram matrices."""
    if not hasattr(D, "backend"):
        D = IMat(B, None, D[0][0].shape, D)
    top = exact_backend.max_row_square(D.ends) if D.ends is not None else None
    if top is None:
        return max_row_dist(B, D)
    return B.upper(B.sqrt(B.num(top)))


def centre_parts(lo, hi) -> np.ndarray:
    """Two float64 rows p1, p2 with p1 = float(a + b) (nearest) and p2 = float(a + b - p1), per column
    with bounds (a, b) (exact Fractions); the centre is (p1 + p2) / 2, within about 2^-106 of the midpoint."""
    try:
        s = [a + b for a, b in zip(lo, hi)]
        p1 = [float(x) for x in s]
        p2 = [float(x - Fraction(v)) for x, v in zip(s, p1)]
    except OverflowError:
        raise Rejected("finite enclosure", "a bounding box beyond the float range") from None
    return np.array([p1, p2], dtype=np.float64)


def bounding_box(extremes):
    """Per column (exact Fraction lower bound, upper bound) from merged `col_extremes`."""
    return exact_backend.fractions(extremes[0]), exact_backend.fractions(extremes[1])


def columns(B, m, cols):
    """The columns `cols` (a list of indices) of the interval matrix m (its ends sliced, if it has them)."""
    if m.ends is None:
        return B.matrix([[row[j] for j in cols] for row in m.rows()])
    lo, hi = (tuple(p[:, cols] for p in exact_backend._parts(e)) for e in m.ends)
    return IMat(B, None, (m.shape[0], len(cols)), (lo, lo if m.ends[0] is m.ends[1] else hi))


def product(B, y, cols, W):
    """y[:, cols] W for an interval matrix y and a float64 array W of exact values: as float64 ends by
    `exact_backend.point_bounds` when y is a point and the backend has the exact layer, else an IMat."""
    if B.exact and B.prec <= EXACT_MAX_PREC and exact_backend.is_point(y):
        return exact_backend.point_bounds(y.ends[0][0][:, cols], W)
    return columns(B, y, cols) @ B.array(W)


def row_norm(B, y, cols, W, gram) -> Fraction:
    """Upper bound of max_r ||y_r[cols] W|| for a block y. For a point y with the exact layer and gram =
    (Q, e) (Q the float64 lower ends of W W^T, e >= ||W W^T - Q||_F; None: not used), as the quadratic form
    y_r Q y_r^T (`exact_backend.max_quadratic`) + ||y_r||^2 e: an n x n product per block instead of the
    n x d_model one (for a narrow y[:, cols]); else from the product itself (`max_norm`)."""
    if gram is not None and exact_backend.is_point(y):
        part = np.ascontiguousarray(y.ends[0][0][:, cols])
        top = exact_backend.max_quadratic(part, exact_backend.point_bounds(part, gram[0]))
        size = exact_backend.max_row_square(((part,), (part,)))
        if top is not None and size is not None:
            return B.upper(B.sqrt(B.num(max(top + size * gram[1], Fraction(0)))))
    return max_norm(B, product(B, y, cols, W))


def gram_point(B, W):
    """(Q, e): Q the float64 lower ends of the exact W W^T, e >= ||W W^T - Q||_F (`row_norm`)."""
    ends = (B.array(W) @ B.array(W.T)).ends
    if ends is None:
        return None
    return exact_backend.outer_floats(ends)[0], vector_norm(B, exact_backend.widths(ends).ravel())


def centred_balls(B, blocks, maps) -> list:
    """Per (cols, W) in `maps`: (centre, radius) of the rows of y[:, cols] W over the blocks of `blocks()`,
    pairs (y, err): an interval matrix y (the last two of `cols` select two columns of ones) whose every row
    is within l2 distance err of the true row (0: y encloses it), and W a float64 array of exact values.
    The bounding box of y W, then max ||2 y W - (p1 + p2)|| / 2 (the product with [[2 W], [-p1], [-p2]]) plus
    err ||W||_F. Point blocks are kept for the second pass; others are made again."""
    plain = [np.vstack([W, np.zeros((2, W.shape[1]))]) for _, W in maps]
    extremes, kept, err = [None] * len(maps), [], Fraction(0)
    for y, e in blocks():
        for i, (cols, _) in enumerate(maps):
            vals = product(B, y, cols, plain[i])
            found = vals.col_extremes() if hasattr(vals, "backend") else exact_backend.column_extremes(vals, 1)[0]
            extremes[i] = exact_backend.merge_extremes(extremes[i], found)
        kept.append((y, e) if exact_backend.is_point(y) else None)
        err = max(err, e)
    parts = [centre_parts(*bounding_box(e)) for e in extremes]
    shifted = [np.vstack([2 * W, -q]) for (_, W), q in zip(maps, parts)]
    radius = [Fraction(0)] * len(maps)
    quadratic = B.exact and B.prec <= EXACT_MAX_PREC
    grams = [gram_point(B, W) if quadratic and 4 * len(cols) <= W.shape[1] else None
             for (cols, _), W in zip(maps, shifted)]
    for y, _ in kept if all(k is not None for k in kept) else blocks():
        for i, (cols, _) in enumerate(maps):
            radius[i] = max(radius[i], row_norm(B, y, cols, shifted[i], grams[i]))
    moved = [err * vector_norm(B, W.ravel()) if err else Fraction(0) for _, W in maps]
    return [([B.num((Fraction(a) + Fraction(b)) / 2) for a, b in zip(*q)], r / 2 + m)
            for q, r, m in zip(parts, radius, moved)]


def value_inputs(model):
    """(W_V, b_V) of block 0's heads side by side, d_model x (n_heads d_head) and n_heads d_head (each query
    head's key/value head; float64 copies, exact)."""
    cfg, t, p = model.config, model.tensors, "blocks.0.attn."
    names, heads = kv_names(cfg), [kv_head(cfg, h) for h in range(cfg.n_heads)]
    W_V = np.concatenate([np.asarray(t[p + names["W_V"]][k], dtype=np.float64) for k in heads], axis=1)
    b_V = np.concatenate([np.asarray(t[p + names["b_V"]][k], dtype=np.float64) for k in heads])
    return W_V, b_V


def token_blocks(B, model):
    """[u W_V + b_V, 1, 1] for the LN1 outputs u of every token (the embeddings without normalisation) and
    the heads' W_V, b_V side by side, VOCAB_ROWS tokens at a time, from the LN1 rows as interval scalars
    (`norm_row`) times [[W_V, 0, 0], [b_V, 1, 1]] (where `scaled_value_sets` does not apply)."""
    cfg, W_E = model.config, model.tensors["embed.W_E"]
    W_V, b_V = value_inputs(model)
    F = np.zeros((W_V.shape[0] + 1, W_V.shape[1] + 2))
    F[:-1, :-2], F[-1, :-2], F[-1, -2:] = W_V, b_V, 1
    F, weights, one = B.array(F), Weights(B, model), B.num(1)
    for start in range(0, W_E.shape[0], VOCAB_ROWS):
        rows = B.array(W_E[start:start + VOCAB_ROWS]).rows()
        if cfg.has_norm:
            rows = [norm_row(B, weights, row, "blocks.0.ln1", cfg.eps) for row in rows]
        yield B.matrix([row + [one] for row in rows]) @ F, Fraction(0)


def exact_layernorm(B, model) -> bool:
    """Whether `scaled_value_sets` applies: a LayerNorm with float16/32 W_E and gain, d_model < 2^29, on a
    backend with the exact layer at its precision."""
    cfg, t = model.config, model.tensors
    return bool(B.exact and B.prec <= EXACT_MAX_PREC and cfg.has_norm and not cfg.has_rms and cfg.d_model < 2 ** 29
                and t["embed.W_E"].dtype in EXACT_DTYPES and np.asarray(t["blocks.0.ln1.w"]).dtype in EXACT_DTYPES)


def scaled_value_sets(B, model, embeds=None) -> list:
    """`value_sets` through the exact layer (where `exact_layernorm`). For an embedding row x, head h's value
    is v = s z_h W_O + k_h: z = x G with G = F W_V (F = (d I - 1 1^T) diag(w), exact in float64 as in
    `norms.folded_norm`; the heads' W_V side by side), z_h its head's columns, s = 1 / (d sigma(x)) from the
    row's exact sum and squared norm (|P x|^2 = |x|^2 - (sum x)^2 / d), k_h = c0_h W_O, c0 = b W_V + b_V.
    Per block of tokens z enters as the point Z, the lower ends of x G_lo (G_lo: G's lower ends; an exact
    product rounded once), each row within err = (its width) + ||x|| ||G - G_lo||_F of x G; so no entry is
    ever scaled by s. Blocks, squares and sums: `embeds` (norms.RowTerms of W_E, shared with the LayerNorm
    maps; made here if None). The radius about each head's centre: `head_ball`."""
    cfg, t = model.config, model.tensors
    W_E, w, d, dh = t["embed.W_E"], t["blocks.0.ln1.w"], cfg.d_model, cfg.d_head
    W_V, b_V = value_inputs(model)
    G = B.array((d * np.eye(d) - 1) * np.asarray(w, dtype=np.float64)[None, :]) @ B.array(W_V)
    G_lo = exact_backend.outer_floats(G.ends)[0]
    moved = vector_norm(B, exact_backend.widths(G.ends).ravel())   # >= ||G - G_lo||_F
    c0 = B.array(np.append(t["blocks.0.ln1.b"], 1.0)[None, :]) @ B.array(np.vstack([W_V, b_V]))
    eps, kept, err = B.num(cfg.eps), [], Fraction(0)
    for x, squares, sums in (embeds or RowTerms(B, W_E)).blocks():
        s = [1 / (d * B.sqrt(max_zero(B, q - m * m / d) / d + eps)) for q, m in zip(squares, sums)]
        ends = exact_backend.point_bounds(x.astype(np.float64), G_lo)
        width = exact_backend.max_row_square(((np.zeros_like(ends[0][0]),), (exact_backend.widths(ends),)))
        if width is None or not all(B.lower(v) > 0 for v in s):
            raise Rejected("finite enclosure", "block 0's value sets: an entry beyond the exact layer's range")
        # a row's enclosure is within its width of its lower ends; x G moves from x G_lo by <= ||x|| ||G - G_lo||_F
        err = max(err, B.upper(B.sqrt(B.num(width))) + B.upper(B.sqrt(B.num(max(B.upper(q) for q in squares)))) * moved)
        kept.append((ends[0][0], s, [v * v for v in s], np.array([float(B.lower(v)) for v in s])))
    heads = []
    for h in range(cfg.n_heads):
        cols = list(range(h * dh, (h + 1) * dh))
        W_O = np.asarray(t["blocks.0.attn.W_O"][h], dtype=np.float64)
        heads.append(head_ball(B, kept, cols, W_O, (columns(B, c0, cols) @ B.array(W_O)).rows()[0], err))
    return heads


def head_ball(B, kept, cols, W_O, k, err) -> tuple:
    """(centre, radius) of {s_r Z_r[cols] W_O + k + e : (Z, s, s^2, float estimates of s) in kept, r, ||e|| <=
    s_r err ||W_O||_2} (k an interval row; ||W_O||_2 by `norms.operator_norm` at ERR_POWER). The centre c: the bounding-box midpoint of float estimates of the values, rounded anyhow (any centre
    is sound: the radius is certified about c as it is). With m = k - c, q = Z_r[cols] and Q = W_O W_O^T,
    ||s q W_O + m||^2 = s^2 q Q q^T + 2 s q (W_O m^T) + ||m||^2; q Q q^T <= q Q_lo q^T + ||q||^2 ||Q - Q_lo||_F
    (`gram_point`), the form bounded per row through the exact layer (`exact_backend.quadratic_rows`), the
    rest per row in interval arithmetic."""
    k_est = np.array([float(B.lower(v)) for v in k])
    lo = hi = None
    for Z, _, _, s_est in kept:
        est = s_est[:, None] * (Z[:, cols] @ W_O)
        lo = est.min(axis=0) if lo is None else np.minimum(lo, est.min(axis=0))
        hi = est.max(axis=0) if hi is None else np.maximum(hi, est.max(axis=0))
    c = (lo + hi) / 2 + k_est
    if not np.isfinite(c).all():
        raise Rejected("finite enclosure", "block 0's value sets: a bounding box beyond the float range")
    centre = [B.num(Fraction(x)) for x in c.tolist()]
    m = B.matrix([[a - b for a, b in zip(k, centre)]])
    m_sq, Wm = (m @ m.T).rows()[0][0], B.array(W_O) @ m.T
    Q_lo, q_err = gram_point(B, W_O)
    best, s_top = Fraction(0), Fraction(0)
    for Z, s, s_sq, _ in kept:
        q = np.ascontiguousarray(Z[:, cols])
        quad = exact_backend.quadratic_rows(q, exact_backend.point_bounds(q, Q_lo))
        size = exact_backend.max_row_square(((q,), (q,)))
        if quad is None or size is None:
            raise Rejected("finite enclosure", "block 0's value sets: an entry beyond the exact layer's range")
        lin = (B.array(q) @ Wm).rows()
        for s_r, s2, a, b in zip(s, s_sq, quad.tolist(), lin):
            best = max(best, B.upper(s2 * B.num(Fraction(a) + size * q_err) + 2 * s_r * b[0] + m_sq))
        s_top = max(s_top, max(B.upper(v) for v in s))
    return centre, B.upper(B.sqrt(B.num(best))) + s_top * err * operator_norm(B, [W_O], ERR_POWER)


def max_zero(B, x):
    """x with its enclosure cut at 0 from below (for |P x|^2, a real number >= 0)."""
    return B.interval(Fraction(0), max(B.upper(x), Fraction(0))) if B.lower(x) < 0 else x


def value_sets(B, model, embeds=None) -> list:
    """Per head of block 0: (centre, radius) of its values {LN1(W_E[t]) W_V W_O + b_V W_O : t}, as the rows
    of y[:, head's columns] W_O for the blocks y of `token_blocks` (embeds: norms.RowTerms of W_E, or None)."""
    cfg, W_O = model.config, model.tensors["blocks.0.attn.W_O"]
    if cfg.d_vocab * cfg.d_model <= TABLE_ENTRIES:
        return table_value_sets(B, model)
    n, dh = cfg.n_heads * cfg.d_head, cfg.d_head
    maps = [(list(range(h * dh, (h + 1) * dh)) + [n, n + 1], np.asarray(W_O[h], dtype=np.float64))
            for h in range(cfg.n_heads)]
    if exact_layernorm(B, model):
        return scaled_value_sets(B, model, embeds)
    return centred_balls(B, lambda: token_blocks(B, model), maps)


def table_value_sets(B, model) -> list:
    """`value_sets` from the table of every token's values (V x d_model interval matrices)."""
    cfg, t, p = model.config, model.tensors, "blocks.0.attn."
    finite, names, out = finite_inputs(B, model), kv_names(cfg), []
    for h in range(cfg.n_heads):
        W_V, b_V = (B.array(t[p + names[m]][kv_head(cfg, h)]) for m in ("W_V", "b_V"))
        W_O = B.array(t[p + "W_O"][h])
        vals = finite @ (W_V @ W_O) + B.matrix([(b_V @ W_O).rows()[0]] * finite.shape[0])
        lo, hi = vals.col_bounds()
        centre = [B.num((a + b) / 2) for a, b in zip(lo, hi)]
        out.append((centre, max_row_dist(B, vals, centre)))
    return out


def unembedding_ball(B, model, ln) -> tuple | None:
    """(centre, radius) of the columns of M = P diag(w) W_U (LN ln's gain w, P the centring projection), as
    the rows of M^T = W_U^T F^T / q with F = (d I - 1 1^T) diag(w), q = d: F is exact in float64 for
    float16/32 gains (an integer below 2^29 times a <= 24-bit significand); None for other gains. An RMSNorm
    has F = diag(w), no normalisation F = I (q = 1). None also for a table of at most TABLE_ENTRIES."""
    W_U, d = np.asarray(model.tensors["unembed.W_U"]), model.config.d_model
    if W_U.size <= TABLE_ENTRIES:
        return None
    if ln.w is None:
        Ft, q = np.eye(d), 1
    elif not ln.centred:
        Ft, q = np.diag(np.asarray(ln.w, dtype=np.float64)), 1
    elif np.asarray(ln.w).dtype in EXACT_DTYPES and d < 2 ** 29:
        Ft, q = (d * np.eye(d) - 1) * np.asarray(ln.w, dtype=np.float64)[:, None], d
    else:
        return None

    def blocks():
        for start in range(0, W_U.shape[1], VOCAB_ROWS):
            part = W_U[:, start:start + VOCAB_ROWS].T.astype(np.float64)
            yield B.array(np.hstack([part, np.ones((part.shape[0], 2))])), Fraction(0)
    [(centre, radius)] = centred_balls(B, blocks, [(list(range(d + 2)), Ft)])
    return [c / q for c in centre], radius / q
