"""The case list the cubic and subcubic certificates carry: its parser and the inputs a case covers.

Every input (t_0..t_{n-1}) has a max token m, a query token q = t_{n-1} <= m and a number c of non-query
positions holding a token other than m (c <= n-2 when q < m, since one non-query position then holds m).
The cases (m, q, c) partition all inputs. A certificate claims, per listed case, a set of c-fillings:
cubic a set of non-max tokens (every filling from it), subcubic every filling with tokens <= a cutoff.
"""

import math

from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_int


def parse_cases(evidence, n: int, v: int, last: str, parse_last) -> dict:
    """evidence.cases, a list of [m, q, c, <last>], as {(m, q, c): parse_last(value, where, v, m, c)}
    (BadInput on any malformed entry, an (m, q, c) outside the partition, or a case listed twice)."""
    cases = evidence["cases"]
    if not isinstance(cases, list) or len(cases) > v * v * n:
        raise BadInput(f"evidence.cases: must be a list of at most {v * v * n} cases")
    out = {}
    for j, case in enumerate(cases):
        where = f"evidence.cases[{j}]"
        if not isinstance(case, list) or len(case) != 4:
            raise BadInput(f"{where}: must be [m, q, c, {last}]")
        m = parse_int(case[0], where + ".m", 0, v - 1)
        q = parse_int(case[1], where + ".q", 0, m)
        c = parse_int(case[2], where + ".c", 0, n - 1 if q == m else n - 2)
        value = parse_last(case[3], where, v, m, c)
        if (m, q, c) in out:
            raise BadInput(f"{where}: case (m={m}, q={q}, c={c}) is listed twice")
        out[(m, q, c)] = value
    return out


def case_inputs(n: int, c: int, tokens: int) -> int:
    """Inputs of one (m, q, c) case whose c non-max non-query tokens come from a set of `tokens` tokens:
    C(n-1, c) choices of their positions times tokens^c fillings (c = 0: the one all-max input)."""
    return math.comb(n - 1, c) * tokens ** c if c else 1


def case_name(m: int, q: int, c: int) -> str:
    """How a rejection names a case."""
    return f"case (m={m}, q={q}, c={c})"
