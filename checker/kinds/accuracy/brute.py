"""`accuracy` by brute force: every one of the d_vocab^n_ctx inputs is decided.

evidence {"strategy": "brute"}

Per query q and position pattern P (the non-query positions holding a token other than the max m; the others
hold m), for every m at once (`rows`): an input passes the top-2 bound when A[m] + sum_{i in P}
D[i, t_i, m] < 0, A[m] the fixed positions' part of the logit gap (coupled over x) and D the top-2 bound of
each free position, all aligned to one exponent per m: a proof that it is correct (the maximum of a sum is at
most the sum of the maxima), which settles almost every input with O(n) work. The others get the full test
over every x (`rows.decide`), and the few int64 cannot decide the exact one on the integer tables
(`rows.exact_correct`). An input counts only when certainly correct; with a distribution, its weight.

Obligations: "accuracy brute: rigorous tables", "accuracy brute: every input".
"""

import itertools

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.kinds.accuracy.rows import decide, exact_correct, fixed_part, query_view, value_tables
from tcert.checker.kinds.accuracy.tables import float_tables

MAX_BRUTE_INPUTS = 1 << 26


def certified(B, model, evidence, dist, ob) -> tuple:
    """(weight of the inputs certainly correct, "brute force") for a brute-force certificate."""
    fields(evidence, "evidence", {"strategy"})
    n, v = model.config.n_ctx, model.config.d_vocab
    if v ** n > MAX_BRUTE_INPUTS:
        raise BadInput(f"evidence: brute force over {v}^{n} inputs exceeds the limit {MAX_BRUTE_INPUTS}")
    with ob.step("accuracy brute: rigorous tables (EQKE, EQKP, EU, EVOU, PVOU)"):
        tables = float_tables(B, model, library=True)
    with ob.step("accuracy brute: every input") as fig:
        total, tally = correct_weight(tables, dist)
        fig["inputs decided"] = v ** n
        fig["inputs certainly correct"] = tally[0]
        fig["inputs settled by the top-2 bound"] = tally[1]
        fig["inputs decided by the exact test"] = tally[2]
    return total, "brute force"


def correct_weight(tables, dist) -> tuple:
    """(summed weight numerators of the inputs certainly correct, (their number, how many of them the top-2
    bound settled, how many inputs only the exact test on the integer tables decided))."""
    n, v = tables["n"], tables["v"]
    values = value_tables(tables)
    total, tally = 0, np.zeros(3, dtype=np.int64)
    for q in range(v):
        rows, Eq, Dal = query_view(tables, values, q)          # Dal[i][t, m] at Eq[m]
        for c in range(n):
            for P in itertools.combinations(range(n - 1), c):
                w, t = pattern_inputs(tables, rows, Eq, Dal, q, P, dist)
                total, tally = total + w, tally + t
    return total, tuple(int(x) for x in tally)


def pattern_inputs(tables, rows, Eq, Dal, q: int, P: tuple, dist) -> tuple:
    """(summed weight numerators, tallies) of the certainly correct inputs of query q whose non-max tokens sit
    at the positions P, for every max token m at once (m >= q; m = q when no other position holds m)."""
    n, v = tables["n"], tables["v"]
    M = [i for i in range(n - 1) if i not in P]
    lo = max(q, dist.m0, 1 if P else 0)
    ms = np.arange(lo, v) if M else np.arange(q, q + 1 if q >= lo else q)
    if len(ms) == 0:
        return 0, np.zeros(3, dtype=np.int64)
    S = fixed_part(rows, Eq, q, M, ms).reshape((-1,) + (1,) * len(P))        # axes: m, then each t_i, i in P
    valid = np.ones((len(ms),) + (v,) * len(P), dtype=bool)
    for j, i in enumerate(P):
        along = (len(ms),) + (1,) * j + (v,) + (1,) * (len(P) - j - 1)
        S = S + Dal[i][:, ms].T.reshape(along)
        valid &= np.arange(v).reshape((1,) + along[1:]) < ms.reshape((-1,) + (1,) * len(P))
    correct = valid & (S < 0)
    by_top2 = int(np.count_nonzero(correct))
    rest = np.nonzero(valid & ~correct)
    tok = np.empty((len(rest[0]), n), dtype=np.int64)
    tok[:, M], tok[:, n - 1] = ms[rest[0]][:, None], q
    for j, i in enumerate(P):
        tok[:, i] = rest[j + 1]
    verdict = decide(rows, tok, ms[rest[0]])
    undecided = np.nonzero(verdict == 0)[0]
    for j in undecided:
        verdict[j] = 1 if exact_correct(tables, q, tok[j, :-1].tolist()) else -1
    correct[rest] = verdict == 1
    return dist.group_sum(correct, q, ms, M, P), np.array([np.count_nonzero(correct), by_top2, len(undecided)])
