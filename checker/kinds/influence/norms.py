"""Rigorous norms from the stored weights: each function returns an exact upper (or lower) bound.

Weights enter the backend exactly (float16/32/64 values are binary rationals), every product is an
interval enclosure, and only an enclosure's end is returned, so each result bounds the real-number
quantity. Matrices are numpy arrays of stored weights or interval matrices (IMat) built from them.
"""

from fractions import Fraction

import numpy as np

ROWS_PER_BLOCK = 64   # rows per blockwise Gram product (bounds memory, not the result)
VECTOR_ROWS = 1024    # rows per blockwise product with a few columns (min_centred_norms)
EXACT_DTYPES = (np.float16, np.float32)


def as_mat(B, a):
    """An interval matrix: `a` itself if it is one, else the exact matrix of a stored array."""
    return a if hasattr(a, "backend") else B.array(a)


def _row_blocks(B, arr):
    """The rows of `arr` (stored array or IMat) in blocks of ROWS_PER_BLOCK, as interval matrices."""
    if hasattr(arr, "backend"):
        rows = arr.rows()
        return [B.matrix(rows[s:s + ROWS_PER_BLOCK]) for s in range(0, len(rows), ROWS_PER_BLOCK)]
    arr = np.asarray(arr)
    return [B.array(arr[s:s + ROWS_PER_BLOCK]) for s in range(0, arr.shape[0], ROWS_PER_BLOCK)]


def max_row_dists(B, arr, centers) -> list:
    """Upper bounds of max_r ||arr[r] - c||_2 for each centre c in `centers` (None: the zero vector; else a
    list of exact numbers or interval scalars), in one pass over the rows: ||x - c||^2 = ||x||^2 - 2 x.c +
    ||c||^2 with blockwise products."""
    width = arr.shape[1]
    cs = [[Fraction(0)] * width if c is None else c for c in centers]
    cols = B.matrix([[B.num(x) if isinstance(x, (int, Fraction)) else x for x in c] for c in cs]).T
    c_sq = [row[j] for j, row in enumerate((cols.T @ cols).rows())]
    best = [Fraction(0)] * len(cs)
    for blk in _row_blocks(B, arr):
        g, x = (blk @ blk.T).rows(), (blk @ cols).rows()
        for j in range(len(cs)):
            best[j] = max([best[j]] + [B.upper(g[i][i] - 2 * x[i][j] + c_sq[j]) for i in range(blk.shape[0])])
    return [B.upper(B.sqrt(B.num(max(b, Fraction(0))))) for b in best]


def row_dists(B, arr, center) -> list:
    """Upper bounds of ||arr[r] - center||_2 for every row r of an interval matrix (center: a list of interval
    scalars): the differences first, so a row near the centre keeps its relative accuracy."""
    diff, out = arr - B.matrix([list(center)] * arr.shape[0]), []
    for blk in _row_blocks(B, diff):
        g = (blk @ blk.T).rows()
        out += [B.upper(B.sqrt(B.num(max(B.upper(g[i][i]), Fraction(0))))) for i in range(blk.shape[0])]
    return out


def max_row_dist(B, arr, center=None) -> Fraction:
    """Upper bound of max_r ||arr[r] - center||_2 (center None: 0) over the rows of a 2-D array (a stored
    float16/32 array's row norms by `row_squares`, VECTOR_ROWS rows at a time)."""
    if center is None and not hasattr(arr, "backend") and np.asarray(arr).dtype in EXACT_DTYPES:
        arr = np.asarray(arr)
        top = max(B.upper(g) for s in range(0, arr.shape[0], VECTOR_ROWS) for g in row_squares(B, arr[s:s + VECTOR_ROWS]))
        return B.upper(B.sqrt(B.num(max(top, Fraction(0)))))
    return max_row_dists(B, arr, [center])[0]


def row_squares(B, arr) -> list:
    """||arr[r]||^2 for each row r of a stored array, as interval scalars: for float16/32 weights the float64
    squares are exact (<= 48-bit significands, within float64's normal range) and one product with a column
    of ones sums each row; otherwise the diagonal of the Gram matrix."""
    a = np.asarray(arr)
    if a.dtype in EXACT_DTYPES:
        return [r[0] for r in (B.array(a.astype(np.float64) ** 2) @ B.array(np.ones((a.shape[1], 1)))).rows()]
    g = (B.array(a) @ B.array(a).T).rows()
    return [g[i][i] for i in range(len(g))]


def min_centred_norms(B, arr, offsets, centred: bool = True) -> list:
    """For each offset row c (a list of interval scalars), a lower bound of min_r ||P (arr[r] + c)||_2, P the
    centring projection I - 11^T/d (centred False: P = I, for RMSNorm): ||P z||^2 = ||z||^2 - (sum z)^2 / d
    with z = arr[r] + c (arr: a stored array), blockwise."""
    return centred_minima(B, RowTerms(B, arr).blocks(), offsets, centred)


def centred_minima(B, blocks, offsets, centred: bool) -> list:
    """`min_centred_norms` from the array's blocks (part, ||rows||^2, row sums) as `RowTerms.blocks` makes them."""
    d = blocks[0][0].shape[1]
    cols = B.matrix([list(c) for c in offsets]).T
    c_sq, c_sum = [r[j] for j, r in enumerate((cols.T @ cols).rows())], (cols.T @ B.array(np.ones((d, 1)))).rows()
    best = [None] * len(offsets)
    for part, g, s in blocks:
        x = (B.array(part) @ cols).rows()
        for j in range(len(offsets)):
            low = min(B.lower(g[i] + 2 * x[i][j] + c_sq[j] - ((s[i] + c_sum[j][0]) ** 2 / d if centred else 0))
                      for i in range(part.shape[0]))
            best[j] = low if best[j] is None else min(best[j], low)
    return [B.lower(B.sqrt(B.num(max(b, Fraction(0))))) for b in best]


class RowTerms:
    """What `min_centred_norms` reads of a stored array alone, made on first use and kept: per block of
    VECTOR_ROWS rows, (the block, its rows' squared norms by `row_squares`, its rows' sums), interval scalars.
    Every LayerNorm map of the influence derivation bounds min_t ||P (W_E[t] + c)|| for the same W_E and its
    own offset c, and block 0's value sets need the same squares and sums: a reuse is the same computation on
    the same numbers (a function of the array and the backend only), so it gives the same bound. A minimum
    is kept per offset object too (a parallel block's two LayerNorms read the same reach)."""

    def __init__(self, B, arr):
        self.B, self.arr, self._blocks, self._minima = B, np.asarray(arr), None, {}

    def blocks(self) -> list:
        """[(part, squares, sums)] per block of VECTOR_ROWS rows."""
        if self._blocks is None:
            B, ones = self.B, self.B.array(np.ones((self.arr.shape[1], 1)))
            self._blocks = [(part, row_squares(B, part), [r[0] for r in (B.array(part) @ ones).rows()])
                            for part in (self.arr[s:s + VECTOR_ROWS] for s in range(0, self.arr.shape[0], VECTOR_ROWS))]
        return self._blocks

    def max_norm(self) -> Fraction:
        """max_r ||arr[r]||_2 from the kept squares (`max_row_dist`'s route for float16/32 arrays)."""
        top = max(self.B.upper(g) for _, squares, _ in self.blocks() for g in squares)
        return self.B.upper(self.B.sqrt(self.B.num(max(top, Fraction(0)))))

    def min_centred_norm(self, offset, centred: bool) -> Fraction:
        """min_centred_norms(B, arr, [offset], centred)[0], computed once per offset object."""
        key = (id(offset), centred)
        if key not in self._minima:    # the offset is kept with its minimum, so its id is not reused
            self._minima[key] = (offset, centred_minima(self.B, self.blocks(), [offset], centred)[0])
        return self._minima[key][1]


def vector_norm(B, v) -> Fraction:
    """Upper bound of the Euclidean norm of a vector (stored array or 1 x d interval matrix)."""
    m = as_mat(B, np.asarray(v).reshape(1, -1) if not hasattr(v, "backend") else v)
    return B.upper(B.sqrt(B.num(max(B.upper((m @ m.T).rows()[0][0]), Fraction(0)))))


def product_norm(B, v, M) -> Fraction:
    """Upper bound of ||v M||_2 for a vector v and a matrix M (stored arrays or interval matrices)."""
    v = as_mat(B, np.asarray(v).reshape(1, -1) if not hasattr(v, "backend") else v)
    return vector_norm(B, v @ as_mat(B, M))


def abs_dot(B, u, v) -> Fraction:
    """Upper bound of |u . v| for two vectors (stored arrays or 1 x d interval matrices)."""
    u, v = (as_mat(B, np.asarray(x).reshape(1, -1) if not hasattr(x, "backend") else x) for x in (u, v))
    return B.abs_upper((u @ v.T).rows()[0][0])


def scaled_rows(B, w, W):
    """The interval matrix diag(w) W. For float16/32 weights it enters as a point: each float64 product
    w_i W_ij is exact (significands of <= 24 bits each give <= 48 bits; magnitudes 2^-298 to 2^256 stay in
    float64's normal range); otherwise the product with diag(w)."""
    w, W = np.asarray(w), np.asarray(W)
    if w.dtype in EXACT_DTYPES and W.dtype in EXACT_DTYPES:
        return B.array(w.astype(np.float64)[:, None] * W.astype(np.float64))
    return B.array(np.diag(w)) @ B.array(W)


def centred_scaled(B, w, W):
    """The interval matrix P diag(w) W (P the centring projection): the LayerNorm gain folded into the
    matrix W that reads the LN output, so that u W = g (P diag(w) W) + b W for u = w * g + b, g centred."""
    W = np.asarray(W)
    M = scaled_rows(B, w, W)
    d = W.shape[0]
    col_means = (B.array(np.ones((1, d))) @ M).scale(B.num(Fraction(1, d)))
    return M - B.array(np.ones((d, 1))) @ col_means


def operator_norm(B, factors, power: int) -> Fraction:
    """Upper bound of the spectral norm of the product of `factors` (one or two matrices: stored arrays or
    interval matrices).

    With P the smaller Gram matrix (W W^T or W^T W; for a product F S it is (F^T F)(S S^T), whose
    eigenvalues are the non-zero eigenvalues of (F S)^T (F S)), all eigenvalues are >= 0, so
    lambda_max^m <= tr(P^m) for m = 2^power, and ||.||_2 <= tr(P^m)^(1/(2m)).
    """
    if len(factors) == 1:
        M = as_mat(B, factors[0])
        gram = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    else:
        first, second = as_mat(B, factors[0]), as_mat(B, factors[1])
        gram = (first.T @ first) @ (second @ second.T)
    return gram_norm(B, gram, power)


def gram_norm(B, gram, power: int, divisor: int = 1) -> Fraction:
    """tr(P^m)^(1/(2m)) / divisor (m = 2^power) for P = `gram` (an interval matrix holding a Gram matrix, or
    the product of two Gram matrices as operator_norm builds it): power - 1 squarings Q = P^(m/2), then
    tr(Q Q) = sum_ij Q_ij Q_ji entrywise, which saves the last matrix product (same bound)."""
    for _ in range(power - 1):
        gram = gram @ gram
    rows = gram.rows()
    if power == 0:
        trace = B.upper(B.fsum(rows[i][i] for i in range(len(rows))))
    else:
        trace = B.upper(B.fsum(a * b for r, c in zip(rows, gram.T.rows()) for a, b in zip(r, c)))
    if trace <= 0:
        return Fraction(0)
    return B.upper(B.exp(B.log(B.num(trace)) / (2 ** (power + 1))) / divisor)




def folded_norm(B, w, W, power: int) -> Fraction:
    """Upper bound of ||P diag(w) W||_2 (P the centring projection, W d x m, the LayerNorm gain w) by the
    trace-power bound on its Gram matrix, built without the d x m interval matrix when m > d and the
    weights are float16/32: P diag(w) = F / d with F = (d I - 1 1^T) diag(w), whose entries (d delta_ij - 1)
    w_j are exact in float64 (an integer below 2^29 times a <= 24-bit significand: <= 53 bits), so the Gram
    matrix is F (W W^T) F^T / d^2: three products with a point factor (the exact layer where it runs)."""
    w, W = np.asarray(w), np.asarray(W)
    d, m = W.shape
    if m <= d or w.dtype not in EXACT_DTYPES or W.dtype not in EXACT_DTYPES or d >= 2 ** 29:
        return operator_norm(B, [centred_scaled(B, w, W)], power)
    F = B.array((d * np.eye(d) - 1) * w.astype(np.float64)[None, :])
    stored = B.array(W)
    return gram_norm(B, (F @ (stored @ stored.T)) @ F.T, power, d)
