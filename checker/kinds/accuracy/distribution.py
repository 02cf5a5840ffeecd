"""The input distribution an accuracy claim counts under: uniform counting, or exact rational weights per token
position, optionally restricted to the inputs whose maximum is at least m0.

claim.distribution (optional) {"position_weights": [[w_0(0), .., w_0(v-1)], .., [w_{n-1}(0), ..]],  exact, >= 0
                               "max_at_least": m0}                                    each field optional
The weight of input t is [max(t) >= m0] * w_0(t_0) * ... * w_{n-1}(t_{n-1}) (every w = 1 without
position_weights); a claim is about the total weight of the inputs answered correctly. Without a
distribution every input weighs 1 and weights are counts.

Every sum is exact and integer: position i's weights are integers a_i(t) over one common denominator d_i, so
the weight of input t is prod_i a_i(t_i) / prod_i d_i; the strategies sum the integer numerators and
`value` divides once.
"""

import math
from fractions import Fraction

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_int, parse_vector

MAX_DENOMINATOR_BITS = 256     # per position: bounds the integers the strategies' sums build


class Distribution:
    """Integer weight numerators a[i][t] per position i and token t, their denominators d[i], and m0."""

    def __init__(self, a: list, d: list, m0: int = 0):
        self.a, self.d, self.m0 = a, d, m0
        self.n, self.v = len(a), len(a[0])
        self.unit = all(x == 1 for row in a for x in row)       # every weight 1: sums are counts
        self.arrays = [np.array(row, dtype=object) for row in a]

    def value(self, total: int):
        """The weight an integer sum of numerators stands for (an int when every denominator is 1)."""
        scale = math.prod(self.d)
        return total if scale == 1 else Fraction(total, scale)

    def total(self) -> int:
        """The summed numerators of every input of weight > 0 (all inputs whose max is at least m0)."""
        return math.prod(sum(row) for row in self.a) - math.prod(sum(row[: self.m0]) for row in self.a)

    def tokens(self, i: int, tokens) -> int:
        """sum of a_i(t) over `tokens`."""
        return len(tokens) if self.unit else sum(self.a[i][t] for t in tokens)

    def case(self, m: int, q: int, classes: list) -> int:
        """Summed numerators of the inputs with max m, query token q at position n-1, and among the n-1 other
        positions exactly b positions holding tokens of S for each class (S, b) (classes disjoint and below
        m) and the rest holding m. A product over positions, coefficient of prod_j z_j^b_j (exact DP)."""
        if m < self.m0:
            return 0
        want = tuple(b for _, b in classes)
        if self.unit:
            ways, left = math.comb(self.n - 1, sum(want)), sum(want)
            for (S, b) in classes:
                ways, left = ways * math.comb(left, b) * len(S) ** b, left - b
            return ways
        poly = {(0,) * len(classes): 1}
        for i in range(self.n - 1):
            sums, new = [self.tokens(i, S) for S, _ in classes], {}
            for key, val in poly.items():
                new[key] = new.get(key, 0) + val * self.a[i][m]
                for j, s in enumerate(sums):
                    if key[j] < want[j]:
                        up = key[:j] + (key[j] + 1,) + key[j + 1:]
                        new[up] = new.get(up, 0) + val * s
            poly = new
        return self.a[self.n - 1][q] * poly.get(want, 0)

    def group_sum(self, mask, q: int, ms, M, P) -> int:
        """Summed numerators of the inputs of a position pattern marked in `mask` (axes: the max token ms[k],
        then one token axis per free position P[j]; the positions M hold the max, n-1 holds q)."""
        if self.unit:
            return int(np.count_nonzero(mask))
        total = mask.astype(object)
        for i in reversed(P):                         # contract the last token axis with its weights
            total = total @ self.arrays[i][: total.shape[-1]]
        fixed = [math.prod(self.a[i][m] for i in M) for m in ms]
        return int(sum(f * t for f, t in zip(fixed, total))) * self.a[self.n - 1][q]


def parse_distribution(claim: dict, n: int, v: int) -> Distribution:
    """claim.distribution (uniform counting when absent); BadInput on a malformed field."""
    if "distribution" not in claim:
        return Distribution([[1] * v for _ in range(n)], [1] * n)
    dist = claim["distribution"]
    if not isinstance(dist, dict):
        raise BadInput("claim.distribution: must be an object")
    fields(dist, "claim.distribution", set(), {"position_weights", "max_at_least"})
    m0 = parse_int(dist.get("max_at_least", 0), "claim.distribution.max_at_least", 0, v - 1)
    rows = dist.get("position_weights", [["1"] * v for _ in range(n)])
    if not isinstance(rows, list) or len(rows) != n:
        raise BadInput(f"claim.distribution.position_weights: must be a list of n_ctx = {n} weight lists")
    a, d = [], []
    for i, row in enumerate(rows):
        w = parse_vector(row, f"claim.distribution.position_weights[{i}]", v, "d_vocab")
        den = math.lcm(*(x.denominator for x in w))
        if any(x < 0 for x in w) or den.bit_length() > MAX_DENOMINATOR_BITS:
            raise BadInput(f"claim.distribution.position_weights[{i}]: weights must be >= 0 with a common "
                           f"denominator below 2^{MAX_DENOMINATOR_BITS}")
        a.append([int(x * den) for x in w])
        d.append(den)
    return Distribution(a, d, m0)
