"""The assignment problem in floats (scipy) and exact dual hints from it: the checker confirms every
dual in exact rationals (`tcert.checker.assignment`), so these only need to be feasible and tight."""

from fractions import Fraction

import numpy as np

from tcert.generator.overwhelm.tables import round_down, round_up


def solve_assignment(C, sense):
    """Optimum and optimal duals (u, v) of the assignment problem with cost C (rows x columns).

    The optimal permutation comes from scipy's linear_sum_assignment; the duals are potentials of the
    difference constraints v_c - v_pi(i) <= C_ic - C_i,pi(i) (shortest paths by Bellman-Ford, feasible
    because an optimal assignment has no negative cycle), then u_i = C_i,pi(i) - v_pi(i). For "max",
    the same on -C with the signs flipped: u_i + v_c >= C_ic.
    """
    from scipy.optimize import linear_sum_assignment
    sign = 1.0 if sense == "min" else -1.0
    A = sign * np.asarray(C, dtype=np.float64)
    n = A.shape[0]
    rows, cols = linear_sum_assignment(A)
    pi = np.empty(n, dtype=int)
    pi[rows] = cols
    # edge pi(i) -> c with weight A[i, c] - A[i, pi(i)]; w[a, b] = min over rows i with pi(i) = a
    w = np.full((n, n), np.inf)
    w[pi, :] = A - A[np.arange(n), pi][:, None]
    dist = np.zeros(n)
    for _ in range(n):
        new = np.minimum(dist, (dist[:, None] + w).min(axis=0))
        if np.array_equal(new, dist):
            break
        dist = new
    v = dist
    u = A[np.arange(n), pi] - v[pi]
    return sign * float(A[np.arange(n), pi].sum()), sign * u, sign * v


def repair(v, bounds, sense):
    """Exact, tight duals from float ones: keep v (as doubles), set each u_i to its best feasible
    double against `bounds`, then each v_c likewise given u (so every row and column has a constraint
    tight to one ulp).

    min: u_i + v_c <= L_ic (rounding down); max: u_i + v_c >= U_ic (rounding up).
    """
    L = [[Fraction(b) for b in row] for row in bounds]
    n = len(L)
    best, rnd = (min, round_down) if sense == "min" else (max, round_up)
    v = [float(x) for x in v]
    u = [rnd(best(L[i][c] - Fraction(v[c]) for c in range(n))) for i in range(n)]
    v = [rnd(best(L[i][c] - Fraction(u[i]) for i in range(n))) for c in range(n)]
    return u, v, sum(Fraction(x) for x in u) + sum(Fraction(x) for x in v)


def float_repair(bound, v):
    """Duals (u, v) as doubles with u_r + v_c >= bound[r, c] exactly: v from the assignment solver,
    u_r = max_c (bound - v_c) plus a pad far above float rounding, then v tightened likewise."""
    pad = 2.0 ** -48 * (1.0 + np.abs(bound).max() + np.abs(v).max())
    u = (bound - v[None, :]).max(axis=1) + pad
    v = (bound - u[:, None]).max(axis=0) + pad
    return u, v
