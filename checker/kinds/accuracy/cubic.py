"""`accuracy` by the cubic (pure-sequence) proof: claimed (m, q, c) cases with a set of non-max tokens.

evidence {"strategy": "cubic", "cases": [[m, q, c, hexmask], ...]}
         hexmask: bit k set = every filling of the c non-max positions from the set {k} is claimed
         (c = 0: mask 1, the all-max input)

Per case, centre every table at column m and bound the numerator of max_{x != m} logit_x - logit_m by
G(u) = e[q,m] u Tm + e[q,k] (P - u) S_k + e_q Tq with u the positional weight of the max-token positions
(P the non-query total). G is affine in u and a mixed filling is a positive combination of pure ones, so
G < 0 at both ends of u's range for every claimed k covers every ordering and every mixture
(docs/accuracy.md states the argument).

Obligations: "accuracy cubic: rigorous tables", "accuracy cubic: claimed cases".
"""

from fractions import Fraction
import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.kinds.accuracy.cases import case_inputs, case_name, parse_cases
from tcert.checker.kinds.accuracy.screen import cubic_sets
from tcert.checker.kinds.accuracy.tables import (SHIFT, centred_upper, float_tables, mul_upper, position_sums,
                                                  product_bounds)
from tcert.checker.numbers import show


def certified(B, model, evidence, dist, ob) -> tuple:
    """(weight of the inputs the confirmed cases cover, "cubic proof") for a cubic certificate."""
    fields(evidence, "evidence", {"strategy", "cases"})
    cases = parse_cases(evidence, model.config.n_ctx, model.config.d_vocab, "hexmask", parse_mask)
    with ob.step("accuracy cubic: rigorous tables (EQKE, EQKP, EU, EVOU, PVOU)"):
        tables = float_tables(B, model)
    return confirmed_count(tables, cases, dist, ob), "cubic proof"


HEX = frozenset("0123456789abcdef")
BYTE_BITS = [[b for b in range(8) if x >> b & 1] for x in range(256)]     # the set bits of each byte value


def parse_mask(mask, where: str, v: int, m: int, c: int) -> list:
    """The non-max tokens a case's hexmask claims ([] for c = 0, whose mask must be 1)."""
    if not isinstance(mask, str) or not 1 <= len(mask) <= v // 4 + 2 or not HEX.issuperset(mask):
        raise BadInput(f"{where}.mask: must be a lowercase hex string")
    bits = int(mask, 16)
    if (c == 0 and bits != 1) or (c > 0 and not 0 < bits < (1 << m)):
        raise BadInput(f"{where}.mask: must be 1 for c = 0, else a non-empty subset of tokens below m")
    return [8 * j + b for j, byte in enumerate(bits.to_bytes((m + 7) // 8, "little")) for b in BYTE_BITS[byte]] \
        if c else []                                                  # bit k from the right; bits < 2^m


def confirmed_count(tables, cases, dist, ob) -> int:
    """Confirm every claimed case (obligation "accuracy cubic: claimed cases"); return the summed weight
    numerators of the inputs they cover (their number under uniform counting)."""
    n = tables["n"]
    scale = Fraction(1, 1 << (tables["e_shift"] + tables["pw_shift"] + SHIFT))
    values, sums = {}, {}                            # per max token, per query
    with ob.step("accuracy cubic: claimed cases") as fig:
        proved = screened(tables, cases)
        for (m, q, c), ks in sorted(cases.items()):
            if (m, q, c) not in proved:
                values[m] = values[m] if m in values else value_bounds(tables, m)
                sums[q] = sums[q] if q in sums else position_sums(tables, q)
                require_case(tables, values[m], sums[q], (m, q, c), ks, scale)
        count = sum(case_inputs(n, c, len(ks)) for (_, _, c), ks in cases.items())
        weight = count if dist.unit and not dist.m0 else \
            sum(dist.case(m, q, [(ks, c)] if c else []) for (m, q, c), ks in cases.items())    # counting: = count
        fig["cases confirmed"] = len(cases)
        fig["cases confirmed in int64"] = len(proved)
        fig["inputs covered"] = count
    return weight


def require_case(tables, values, sums, case, ks, scale):
    """Reject unless the exact `numerator_bound` of the case is negative for every claimed token."""
    m, q, c = case
    bound = np.atleast_1d(numerator_bound(tables, values, sums, m, q, c, ks))
    bad = [(k, b) for k, b in zip(ks if c else ["-"], bound) if not b < 0]
    if bad:
        raise Rejected("", f"{case_name(m, q, c)}: not certainly correct for non-max token(s) "
                           f"{[k for k, _ in bad[:8]]}; token {bad[0][0]}: numerator bound "
                           f"{show(bad[0][1] * scale)} >= 0 (a positive multiple of max_(x != m) "
                           f"logit_x - logit_m)")


def value_bounds(tables, m: int):
    """Exact upper bounds, for max token m (x ranges over x != m; every table centred at column m):

    Tm[q] >= max_x EU[q,x] + EVOU[m,x] + Pn[x]       a max-token key at a non-query position
    Tq[q] >= max_x EU[q,x] + EVOU[q,x] + PVOU[n-1,x]   the query key (token q at position n-1)
    EUp[q] + R[k] >= max_x EU[q,x] + max_x EVOU[k,x] + Pn[x]    a non-max key k at a non-query position
    with Pn[x] = max_{i < n-1} PVOU[i,x].
    """
    n, v = tables["n"], tables["v"]
    keep = np.arange(v) != m
    EU = centred_upper(tables["EU_lo"], tables["EU_hi"], m)[:, keep]
    EVOU = centred_upper(tables["EVOU_lo"], tables["EVOU_hi"], m)[:, keep]
    PVOU = centred_upper(tables["PVOU_lo"], tables["PVOU_hi"], m)[:, keep]
    Pn = PVOU[: n - 1].max(axis=0)
    Tm = (EU + (EVOU[m] + Pn)[None, :]).max(axis=1)
    Tq = (EU + EVOU + PVOU[n - 1][None, :]).max(axis=1)
    return Tm, Tq, EU.max(axis=1), (EVOU + Pn[None, :]).max(axis=1)


def numerator_bound(tables, values, sums, m, q, c, ks):
    """Per k in ks, an exact upper bound (at both ends of u's range, the larger) of the numerator of
    max_{x != m}(logit_x - logit_m) over every input with max m, query q and c non-query copies of non-max
    tokens from {k}; the case holds where it is < 0 (c = 0: ks ignored, one bound for the all-max filling).

    G(u) = e[q,m] u Tm + e[q,k] (P - u) S_k + eq Tq, u = total positional weight of the max-token positions.
    G is affine in u and every ordering has u in [smallest[r], largest[r]] (r = n-1-c), so both ends suffice.
    """
    Tm, Tq, EUp, R = values
    n = tables["n"]
    e_lo, e_hi = tables["e_lo"][q], tables["e_hi"][q]
    eq_lo, eq_hi = e_lo[q] * tables["pw_lo"][q][n - 1], e_hi[q] * tables["pw_hi"][q][n - 1]
    query_term = mul_upper(eq_lo, eq_hi, Tq[q])
    if c == 0:
        return mul_upper(e_lo[m] * sums.total_lo, e_hi[m] * sums.total_hi, Tm[q]) + query_term
    r = n - 1 - c
    ks = np.asarray(ks)
    S = EUp[q] + R[ks]
    ends = []
    for u in (sums.smallest[r], sums.largest[r]):
        max_term = mul_upper(e_lo[m] * u, e_hi[m] * u, Tm[q])
        w_lo, w_hi = product_bounds(e_lo[ks], e_hi[ks], sums.total_lo - u, sums.total_hi - u)
        ends.append(max_term + mul_upper(w_lo, w_hi, S) + query_term)
    return np.maximum(ends[0], ends[1])


# ----------------------------------------------------------------------------------- the int64 screen

def screened(tables, cases) -> set:
    """The cases whose `numerator_bound` the int64 screen proves negative for every claimed token
    (`screen.cubic_sets`); the rest get the exact evaluation."""
    K, all_max = cubic_sets(tables)
    return {(m, q, c) for (m, q, c), ks in cases.items() if (K[m, q, c, ks].all() if c else all_max[m, q])}
