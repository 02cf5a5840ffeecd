"""Rigorous upper bounds of norms of stored weight matrices, in exact integer arithmetic.

The rigorous forward pass (`tcert.checker.error_balls`) multiplies each row's l2 error radius by the
spectral norm ||W||_2 of the matrix it passes through, and the logits' radii by the l2 norms of the
unembedding's columns. This module returns exact rationals >= those norms.

How, and why no operation rounds. A stored matrix `a` is put on an integer grid: with e chosen so
that max|a| 2^e < 2^b, Q = rint(a 2^e) holds integers of magnitude <= 2^b and |a 2^e - Q| <= 1/2 in
every entry (`_grid`). Products of such integer matrices are computed with float64 BLAS only when
every term and every partial sum of every entry is an integer of magnitude <= 2^53: an entry is a sum
of k products of magnitude <= 2^(2b), so all its partial sums, in any order, grouped in any way, with
or without fused multiply-add, are integers of magnitude <= k 2^(2b), and `_exact_product` asserts
k 2^(2b) <= 2^53 before it multiplies. Every integer of magnitude <= 2^53 is a float64, and an IEEE
operation whose exact result is a float64 returns it, so nothing rounds (this needs a classical
product, each entry a sum of its k terms, as numpy's matmul on OpenBLAS, BLIS, MKL or the reference
BLAS computes; no Strassen-type algorithm). The float64 ops used to build the grid are exact too:
widening float16/32 to float64; scaling by a power of two (`ldexp`) that does not overflow (the only
possible rounding is of results below 2^-1022 in magnitude, and those round to 0 under rint with an
error below 1/2, so |a 2^e - Q| <= 1/2 still holds); rint of a float64 (its result is an integer
float64). Everything else is Python integers and Fractions.
"""

import math
from fractions import Fraction

import numpy as np

SAFE = 1 << 53          # every integer of magnitude <= 2^53 is a float64
SQUARINGS = 4           # trace powers: ||W||_2 <= tr(G^(2^SQUARINGS))^(1/2^(SQUARINGS+1))
COLUMN_CHUNK = 4096     # columns per block in column_norms (bounds memory, not the result)


def _require(holds: bool, what: str):
    """Stop with a checker bug (exit 3, never a verdict) if a bound the exactness proof needs fails."""
    if not holds:
        raise ArithmeticError(f"operator norms: {what}")


def ceil_sqrt(n: int) -> int:
    """The least integer >= sqrt(n), for an integer n >= 0."""
    r = math.isqrt(n)
    return r if r * r == n else r + 1


def grid_bits(k: int) -> int:
    """The largest b with k 2^(2b) <= 2^53: integers of magnitude <= 2^b have exact length-k dot products."""
    b = 0
    while k << (2 * b + 2) <= SAFE:
        b += 1
    return b


def _exponent(a, bits: int) -> int:
    """The e with max|a| 2^e < 2^bits <= 2 max|a| 2^e (0 for an all-zero or empty array)."""
    top = float(np.max(np.abs(a))) if a.size else 0.0      # abs and max of stored floats are exact
    _require(math.isfinite(top), "a non-finite weight")     # the model reader refuses them before
    return bits - math.frexp(top)[1] if top else 0         # top < 2^frexp(top)[1]


def _grid(a, bits: int, e: int | None = None):
    """(Q, e, exact): Q = rint(a 2^e) as a float64 array of integers with |Q| <= 2^bits and |a 2^e - Q| <= 1/2
    entrywise (module docstring); e from `_exponent` unless given (then max|a| 2^e < 2^bits is required);
    exact when a 2^e = Q (checked only for e >= 0, where a 2^e is computed exactly)."""
    e = _exponent(a, bits) if e is None else e
    scaled = np.ldexp(np.asarray(a, dtype=np.float64), e)         # exact widening, then the grid
    q = np.rint(scaled)
    _require(float(np.max(np.abs(q), initial=0.0)) <= 2.0 ** bits, "grid entry above 2^bits")
    return q, e, bool(e >= 0 and np.array_equal(scaled, q))


def _exact_product(x, y, k: int, bits: int):
    """x @ y for integer float64 matrices with |entries| <= 2^bits and inner dimension k: exact, since
    k 2^(2 bits) <= 2^53 is asserted first (module docstring)."""
    _require(x.shape[1] == y.shape[0] == k and (k << (2 * bits)) <= SAFE, "k 2^(2 bits) > 2^53")
    _require(max(float(np.max(np.abs(x), initial=0.0)), float(np.max(np.abs(y), initial=0.0))) <= 2.0 ** bits,
             "factor entry above 2^bits")
    return x @ y


def _rescale(a, bits: int):
    """(P, s): P = rint(a / 2^s) with |P| <= 2^bits, s >= 0 the least such shift, for an integer float64
    matrix `a` with |entries| < 2^53: a = 2^s P + E with |E| <= 2^(s-1) entrywise (E = 0 when s = 0).
    Dividing an integer of magnitude < 2^53 by 2^s, s <= 53, is exact; rint is exact."""
    top = int(np.max(np.abs(a), initial=0.0))
    s = max(0, top.bit_length() - bits)
    p = np.rint(np.ldexp(a, -s)) if s else a
    _require(float(np.max(np.abs(p), initial=0.0)) <= 2.0 ** bits, "rescaled entry above 2^bits")
    return p, s


def gram_lambda_bound(g, squarings: int = SQUARINGS) -> int:
    """An integer U >= lambda_max(G) for a symmetric positive semidefinite integer matrix G (float64, entries
    of magnitude < 2^53, n x n).

    Proof. Put A_0 = G. For j = 0..k-1 (k = squarings): A_j = 2^s_j P_j + E_j with P_j = rint(A_j / 2^s_j)
    (`_rescale`), so P_j and E_j are symmetric and |E_j| <= 2^(s_j - 1) entrywise, and A_(j+1) = P_j^2,
    computed exactly. For symmetric matrices the spectral radius rho is the spectral norm, so
    rho(A_j) <= 2^s_j rho(P_j) + ||E_j||_2 <= 2^s_j sqrt(rho(A_(j+1))) + n 2^(s_j - 1), using
    rho(P^2) = rho(P)^2 and ||E||_2 <= ||E||_F <= n max|E|. Last, rho(A_k) <= ||A_k||_F. As G is positive
    semidefinite, lambda_max(G) = rho(A_0). (P_j^2 is computed as P_j P_j^T, the same matrix since P_j is
    exactly symmetric: numpy then uses BLAS's syrk, whose entries are the same classical sums of n products;
    and for any P, rho(A_j) <= ||A_j||_2 <= 2^s_j ||P_j||_2 + ||E_j||_2 with ||P_j||_2^2 = rho(P_j P_j^T).) Each step rounds up to an integer, so U_j >= rho(A_j) by
    induction from U_k >= ||A_k||_F, itself bounded through one more rescaling A_k = 2^s P + E:
    ||A_k||_F <= 2^s ||P||_F + n 2^(s-1), with the n^2 squares of P summed exactly. (The bound is
    tr(G^(2^(k+1)))^(1/2^(k+1)) up to the rescaling terms: within a factor n^(1/2^(k+1)) of lambda_max,
    much less for a spread-out spectrum.)
    """
    n = g.shape[0]
    bits = grid_bits(n)
    shifts, a = [], g
    for _ in range(squarings):
        p, s = _rescale(a, bits)
        shifts.append(s)
        a = _exact_product(p, p.T, n, bits)     # = P P (P is exactly symmetric); numpy then calls syrk, the same sums
    p, s = _rescale(a, grid_bits(n * n))     # ||A_k||_F <= 2^s ||P||_F + n 2^(s-1); n^2 squares sum exactly
    u = (ceil_sqrt(int(np.sum(p * p))) << s) + (n << (s - 1) if s else 0)
    for s in reversed(shifts):
        u = (ceil_sqrt(u) << s) + (n << (s - 1) if s else 0)
    return u


def operator_norm(a, squarings: int = SQUARINGS) -> Fraction:
    """An exact rational >= ||a||_2, the largest singular value of a stored 2-D array.

    Proof. With (Q, e) = _grid(a, b): a 2^e = Q + D with |D| <= 1/2 entrywise (D = 0 when the grid is
    exact), so ||a||_2 <= 2^-e (||Q||_2 + ||D||_F) <= 2^-e (sqrt(lambda_max(G)) + sqrt(m n)/2), G the smaller Gram
    matrix (Q^T Q or Q Q^T, whose largest eigenvalue is ||Q||_2^2), computed exactly with b chosen for its
    inner dimension, and lambda_max(G) <= gram_lambda_bound(G)."""
    a = np.asarray(a)
    m, n = a.shape
    if m == 0 or n == 0:
        return Fraction(0)
    inner, small = max(m, n), min(m, n)
    bits = grid_bits(inner)
    q, e, exact = _grid(a, bits)
    g = _exact_product(q, q.T, inner, bits) if m == small else _exact_product(q.T, q, inner, bits)
    root = ceil_sqrt(gram_lambda_bound(g, squarings)) if small > 1 else ceil_sqrt(int(g[0, 0]))
    return (root + (0 if exact else Fraction(ceil_sqrt(m * n), 2))) / Fraction(2) ** e


def column_norms(a) -> list:
    """Exact rationals >= ||a[:, j]||_2 for every column j of a stored 2-D array.

    Proof. With (Q, e) = _grid(a, b), ||a[:, j]||_2 <= 2^-e (||Q[:, j]||_2 + sqrt(m)/2) (no second term when
    the grid is exact), and the sum of
    squares of a column of Q is a sum of m integers of magnitude <= 2^(2b) with m 2^(2b) <= 2^53, so numpy's
    float64 sum of it is exact whatever its order."""
    a = np.asarray(a)
    m = a.shape[0]
    bits = grid_bits(max(m, 1))
    e = _exponent(a, bits)
    half_root_m, scale = Fraction(ceil_sqrt(m), 2), Fraction(2) ** e
    out = []
    for s in range(0, a.shape[1], COLUMN_CHUNK):
        q, _, exact = _grid(a[:, s:s + COLUMN_CHUNK], bits, e)
        sums = np.sum(q * q, axis=0)                       # m squares of integers <= 2^b: exact
        out += [(ceil_sqrt(int(v)) + (0 if exact else half_root_m)) / scale for v in sums.tolist()]
    return out


def max_abs(a) -> Fraction:
    """max |a_i| of a stored array, exactly (0 for an empty one)."""
    a = np.asarray(a)
    return Fraction(float(np.max(np.abs(a)))) if a.size else Fraction(0)
