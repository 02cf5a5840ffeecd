"""Weak duality for the assignment problem, checked in exact rationals (overwhelm methods lp and tight).

An assignment of n rows to n columns is a permutation pi; its cost is sum_i cost[i][pi(i)]. The LP
relaxation of min (max) over permutations has the dual max (min) sum_i u_i + sum_c v_c subject to
u_i + v_c <= cost[i][c] (>= for max) for every i, c. Any dual-feasible (u, v) bounds the optimum:
summing the constraints along any permutation gives sum u + sum v <= (>=) its cost. The checker never
solves the LP; it only confirms feasibility of the certificate's duals, entry by entry, in exact rationals.
"""

from fractions import Fraction

from tcert.checker.envelope import fields
from tcert.checker.errors import Rejected
from tcert.checker.numbers import on_grid, parse_vector, show


def parse_duals(entry, where: str, n: int, sense: str) -> tuple:
    """{"u": [n exact numbers], "v": [n exact numbers]} -> (u, v) as Fractions (BadInput on any other shape),
    each rounded outward to the grid of `on_grid` in the loosening direction of `sense` (down for "min", up
    for "max"): duals feasible as written stay feasible, and their sum stays small however many there are."""
    fields(entry, where, {"u", "v"})
    return tuple([on_grid(x, sense == "max") for x in parse_vector(entry[vec], f"{where}.{vec}", n, "the free length")]
                 for vec in ("u", "v"))


def assignment_bound(u: list, v: list, costs: list, sense: str, label: str = "") -> Fraction:
    """sum u + sum v, a bound on the assignment optimum of `costs` (rows x columns, exact rationals):
    sense "min": a lower bound of the minimum, given u_i + v_c <= costs[i][c] for all i, c;
    sense "max": an upper bound of the maximum, given u_i + v_c >= costs[i][c].
    Rejected (named by the caller's step; `label` opens the detail) at the first (i, c) where the
    constraint fails."""
    for i, row in enumerate(costs):
        for c, cost in enumerate(row):
            s = u[i] + v[c]
            if (s > cost) if sense == "min" else (s < cost):
                rel = "<=" if sense == "min" else ">="
                raise Rejected("", f"{label + ': ' if label else ''}dual feasibility: u[{i}] + v[{c}] = {show(s)} "
                                   f"is not {rel} the certified cost bound {show(cost)}")
    return sum(u) + sum(v)
