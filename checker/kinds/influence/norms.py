"""Rigorous norms from the stored weights: each function returns an exact upper (or lower) bound.

Weights enter the backend exactly (float32 values are binary rationals), every product is an interval
enclosure, and only an enclosure's end is returned, so each result bounds the real-number quantity.
"""

from fractions import Fraction

import numpy as np

ROWS_PER_BLOCK = 64   # rows per blockwise Gram product in max_row_dists (bounds memory, not the result)


def max_row_dists(B, arr, centers) -> list:
    """Upper bounds of max_r ||arr[r] - c||_2 for each centre c in `centers` (None: the zero vector),
    in one pass over the rows: ||x - c||^2 = ||x||^2 - 2 x.c + ||c||^2 with blockwise products."""
    arr = np.asarray(arr)
    cs = [[Fraction(0)] * arr.shape[1] if c is None else c for c in centers]
    cols = B.matrix([[B.num(x) for x in c] for c in cs]).T
    c_sq = [B.num(B.upper(row[j])) for j, row in enumerate((cols.T @ cols).rows())]
    best = [Fraction(0)] * len(cs)
    for s in range(0, arr.shape[0], ROWS_PER_BLOCK):
        blk = B.array(arr[s:s + ROWS_PER_BLOCK])
        g, x = (blk @ blk.T).rows(), (blk @ cols).rows()
        for j in range(len(cs)):
            best[j] = max([best[j]] + [B.upper(g[i][i] - 2 * x[i][j] + c_sq[j]) for i in range(blk.shape[0])])
    return [B.upper(B.sqrt(B.num(max(b, Fraction(0))))) for b in best]


def max_row_dist(B, arr, center=None) -> Fraction:
    """Upper bound of max_r ||arr[r] - center||_2 (center None: 0) over the rows of a 2-D array."""
    return max_row_dists(B, arr, [center])[0]


def vector_norm(B, v) -> Fraction:
    """Upper bound of the Euclidean norm of a stored vector."""
    return max_row_dist(B, np.asarray(v).reshape(1, -1))


def max_abs(B, v) -> Fraction:
    """max_i |v_i| of a stored vector, exactly."""
    return max(B.abs_upper(B.num(float(x))) for x in np.asarray(v).reshape(-1))


def product_norm(B, v, M) -> Fraction:
    """Upper bound of ||v M||_2 for a stored vector v and matrix M."""
    r = B.array(v) @ B.array(M)
    return B.upper(B.sqrt((r @ r.T).rows()[0][0]))


def abs_dot(B, u, v) -> Fraction:
    """Upper bound of |u . v| for two stored vectors."""
    return B.abs_upper(B.dot(B.array(u).rows()[0], B.array(v).rows()[0]))


def operator_norm(B, factors, power: int) -> Fraction:
    """Upper bound of the spectral norm of the product of `factors` (one or two stored matrices).

    With P the smaller Gram matrix (W W^T or W^T W; for the OV circuit W_V W_O it is (W_V^T W_V)(W_O W_O^T),
    whose eigenvalues are the non-zero eigenvalues of (W_V W_O)^T (W_V W_O)), all eigenvalues are >= 0, so
    lambda_max^m <= tr(P^m) for m = 2^power, and ||.||_2 <= tr(P^m)^(1/(2m)).
    """
    if len(factors) == 1:
        M = B.array(factors[0])
        gram = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    else:
        first, second = B.array(factors[0]), B.array(factors[1])
        gram = (first.T @ first) @ (second @ second.T)
    for _ in range(power):
        gram = gram @ gram
    rows = gram.rows()
    trace = B.upper(B.fsum(rows[i][i] for i in range(len(rows))))
    if trace <= 0:
        return Fraction(0)
    return B.upper(B.exp(B.log(B.num(trace)) / (2 ** (power + 1))))

