"""`accuracy` by refinement: the cubic proof first, then the cases it leaves undecided split further and, at
the bottom, decided input by input.

evidence {"strategy": "refine",
          "mixed":    [[m, q, c, hexmask, b], ...]    case (m, q, c) split by the identity of its tokens: the
                                                      inputs with exactly b of the c non-max positions holding
                                                      tokens of S = hexmask (S disjoint from K), the other c - b
                                                      tokens of K, in any order (`mixed_bound`)
          "patterns": [[m, q, posmask, "d"], [m, q, posmask, "e", unclaimed], ...]}
                                                      case (m, q, c = |P|) split by position: the inputs with
                                                      the non-max tokens at the positions P = posmask (bit i =
                                                      position i), settled by rule "d" (`pattern_credit`: the
                                                      decoupled count) or "e" (each input "d" leaves decided
                                                      exactly by `rows.decide` / `rows.exact_correct`, except
                                                      the fillings `unclaimed` lists: `parse_unclaimed`)

The cubic proof is not read but derived (`cubic_weight`): per case (m, q, c) its set K, every non-max token
whose cubic bound (cubic.py) the int64 screen proves negative. A case is split one way or the other, not
both, and every entry is listed once (so the inputs each entry credits are disjoint from the other entries'
and from the cubic cases'). Credited: every filling of each case's c non-max positions from its K, every input of each confirmed mixed entry (an entry that cannot be confirmed is rejected), and for
each pattern entry the inputs outside K^P that its rule proves correct (a count: inputs it cannot prove are
simply not credited). A rule "e" entry's `unclaimed` fillings are the generator's statement of the inputs it
does not claim (the model's errors, lrat-style): they are not credited and get no test at all, which is sound
because the count is only what is proved, never what the hint says; a hint that leaves out a wrong input only
costs its full test, one that lists a correct input only lowers the count.

Obligations: "accuracy refine: rigorous tables", "accuracy refine: cubic sets" (the cubic rule, derived),
"accuracy refine: mixed cases", "accuracy refine: pattern groups".
"""

import math
from itertools import chain
from typing import NamedTuple

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import Rejected
from tcert.checker.kinds.accuracy import cubic
from tcert.checker.kinds.accuracy.cases import case_name
# the evidence's readers and limits (refine_parse.py), also read here as refine.<name>
from tcert.checker.kinds.accuracy.refine_parse import (MAX_PATTERN_POSITIONS, MAX_PATTERN_WORK,  # noqa: F401
                                                        MAX_UNCLAIMED_DIGITS, mixed_fields, parse_mixed,
                                                        parse_patterns, parse_unclaimed, pattern_fields)
from tcert.checker.kinds.accuracy.rows import (Rows, coupled, decide, exact_correct, fixed_part,
                                                stacked_fixed_terms, stacked_view, value_tables)
from tcert.checker.kinds.accuracy.screen import cubic_sets, screen_tables, upper, weights
from tcert.checker.kinds.accuracy.tables import SHIFT, float_tables, mul_upper, position_sums
from tcert.checker.numbers import show

GRID_ELEMENTS = 1 << 22       # pattern grids (`coupled_groups`): elements per chunk of groups
GRID_BANDS = 4               # chunks of groups per pattern batch, by max token (`coupled_groups`)
QUERY_ELEMENTS = 1 << 20      # query rows stacked at once (`rows.stacked_view`): n d_vocab^2 per query and table
QUERY_BANDS = 2               # stacks of queries at least, by their groups' largest max token (`pattern_weight`)


def certified(B, model, evidence, dist, ob) -> tuple:
    """(weight of the inputs credited, "refined proof") for a refine certificate."""
    fields(evidence, "evidence", {"strategy", "mixed", "patterns"})
    n, v = model.config.n_ctx, model.config.d_vocab
    mixed = parse_mixed(evidence["mixed"], n, v)
    patterns = parse_patterns(evidence["patterns"], mixed, n, v)
    with ob.step("accuracy refine: rigorous tables (EQKE, EQKP, EU, EVOU, PVOU)"):
        tables = float_tables(B, model, library=True)
    values = {}                  # cubic's per-max-token value bounds, for the mixed entries' exact evaluation
    cases, weight = cubic_weight(tables, dist, ob)
    weight += mixed_weight(tables, cases, mixed, dist, values, ob)
    weight += pattern_weight(tables, cases, patterns, dist, ob)
    return weight, "refined proof"


# ------------------------------------------------------------------------------------------ cubic sets

class CubicSets(NamedTuple):
    """The cubic sets `screen.cubic_sets` derives, read as a mapping {(m, q, c): K}: `get` gives the tokens of
    K (a list, [] when empty or c = 0), `in` whether a case has a non-empty K or (c = 0) a proved all-max
    input."""

    K: np.ndarray
    all_max: np.ndarray

    def get(self, case, default=None) -> list:
        return self.K[case].nonzero()[0].tolist()

    def __contains__(self, case) -> bool:
        return bool(self.all_max[case[:2]] if case[2] == 0 else self.K[case].any())


def cubic_weight(tables, dist, ob) -> tuple:
    """The cubic proof on every case (obligation "accuracy refine: cubic sets"), derived here, not read: per
    case (m, q, c) its cubic set K, every non-max token whose cubic bound the int64 screen proves negative
    (`screen.cubic_sets`; every filling of the c positions from K is correct), and the all-max input where
    its bound is. Returns (the sets as `CubicSets`, the summed weight numerators of the inputs they cover)."""
    n = tables["n"]
    with ob.step("accuracy refine: cubic sets") as fig:
        sets = CubicSets(*cubic_sets(tables))
        sizes = sets.K.sum(axis=3)
        sizes[:, :, 0] = sets.all_max                   # c = 0: the one all-max input where proved
        count = sum(math.comb(n - 1, c) * sum(int(h) * s ** max(c, 1) for s, h in
                                              enumerate(np.bincount(sizes[:, :, c].ravel()))) for c in range(n))
        weight = count if dist.unit and not dist.m0 else sum(     # counting: = count
            dist.case(m, q, [(sets.get((m, q, c)), c)] if c else []) for m, q, c in zip(*np.nonzero(sizes)))
        fig["cases with a cubic set"] = int(np.count_nonzero(sizes))
        fig["inputs covered by cubic sets"] = count
    return sets, weight


# ------------------------------------------------------------------------------------------ mixed cases

def mixed_weight(tables, cases, mixed, dist, values, ob) -> int:
    """Confirm every mixed entry (obligation "accuracy refine: mixed cases"): its set disjoint from the
    case's cubic set, its bound negative by the int64 screen, else exactly (`require_mixed`); their summed
    weight numerators (under counting, the inputs covered: C(n-1, c) C(c, b) |S|^b |K|^(c-b))."""
    n = tables["n"]
    with ob.step("accuracy refine: mixed cases") as fig:
        flat, proved, meets, sizes = mixed_screened(tables, cases, mixed)
        for (m, q, c), S, _ in (flat[j] for j in np.nonzero(meets)[0][:1]):
            K = cases.get((m, q, c))
            raise Rejected("", f"{case_name(m, q, c)}: the mixed set {S[:8]} meets the case's cubic set "
                               f"{K[:8]} (in both: {sorted(set(S) & set(K))[:8]})")
        for case, S, b in (flat[j] for j in np.nonzero(~proved)[0].tolist()):
            require_mixed(tables, values, case, cases.get(case), S, b)
        covered = [math.comb(n - 1, c) * math.comb(c, b) * len(S) ** b * k ** (c - b)
                   for ((_, _, c), S, b), k in zip(flat, sizes)]
        weight = sum(covered) if dist.unit and not dist.m0 else sum(      # counting: the inputs covered
            dist.case(m, q, [(cases.get((m, q, c)), c - b), (S, b)] if b < c else [(S, b)]) for (m, q, c), S, b in flat)
        fig["mixed entries confirmed"] = len(flat)
        fig["mixed entries confirmed in int64"] = int(np.count_nonzero(proved))
        fig["inputs covered by mixed entries"] = sum(covered)
    return weight


def require_mixed(tables, values, case, K, S, b):
    """Reject unless the exact `mixed_bound` of the entry is negative."""
    m, q, c = case
    if m not in values:
        values[m] = cubic.value_bounds(tables, m)
    Mx, Qx, Bk = key_bounds(tables, q, m, S)
    ends = [(u, u * Mx + Qx) for u in max_weights(tables, q, c)]
    bound = mixed_bound(tables, Bk, ends, key_bound(tables, values[m], q, K), case, S, b)
    if not bound < 0:
        raise Rejected("", f"{case_name(m, q, c)}, {b} of tokens {S[:8]}: numerator bound "
                           f"{show(bound * bound_scale(tables))} >= 0")


def mixed_screened(tables, sets, mixed) -> tuple:
    """(flat, proved, meets, sizes): the entries flat = [((m, q, c), S, b), ...], per entry whether the int64
    screen (screen.py) proves its `mixed_bound` negative (every entry at once: `key_bounds` and `key_bound` on
    the screen's tables, the latter from `screen.cubic_sets`' "cubic keys" when `sets` are the derived sets;
    the rest get the exact evaluation), whether S meets the case's cubic set K (the sets
    as `CubicSets`) and |K| (ints)."""
    Sc, n, v = screen_tables(tables), tables["n"], tables["v"]
    flat = [((m, q, c), S, b) for (m, q, c), entries in sorted(mixed.items()) for S, b in entries]
    if not flat:
        return flat, np.zeros(0, dtype=bool), np.zeros(0, dtype=bool), []
    (M, Q, C), B = (np.array([e[0][j] for e in flat], dtype=np.int64) for j in range(3)), np.array([e[2] for e in flat])
    groups = {}                                 # the distinct (m, q, S): entries of one case differ in b only
    g = np.array([groups.setdefault((m, q, tuple(S)), len(groups)) for (m, q, _), S, _ in flat], dtype=np.int64)
    Mg, Qg = (np.array([key[j] for key in groups], dtype=np.int64) for j in range(2))
    lens = [len(key[2]) for key in groups]
    R, T = np.repeat(np.arange(len(groups)), lens), np.fromiter(chain(*(key[2] for key in groups)), np.int64)
    Mx, Qx, Bk = query_terms(Sc, n, Mg, Qg, R, T)
    Mx, Qx, beta_S = Mx[g], Qx[g], np.maximum.reduceat(Bk, np.cumsum([0] + lens[:-1]), axis=0)[g]
    K = sets.K[M, Q, C]
    if sets.K is tables.get("cubic sets", (None,))[0]:        # the derived sets: `key_bound` cached (0: K empty)
        beta_K = np.where(K.any(axis=1), tables["cubic keys"][M, Q, C], 0)
    else:
        beta_K = key_bounds_int64(Sc, sets, M, Q, C)
    bound = np.empty(len(flat), dtype=np.int64)
    for j in (np.nonzero(B == C)[0], np.nonzero(B < C)[0]):      # the two forms of `mixed_bound`, each on its own
        bound[j] = screened_bounds(Sc, n, Q[j], C[j], B[j], Mx[j], Qx[j], beta_S[j], beta_K[j])
    inS = np.zeros((len(groups), v), dtype=bool)
    inS[R, T] = True
    return flat, bound < 0, (K & inS[g]).any(axis=1), K.sum(axis=1).tolist()


def screened_bounds(Sc, n: int, Q, C, B, Mx, Qx, beta_S, beta_K):
    """The int64 `mixed_bound` of each entry from its terms (`mixed_screened`'s): every entry has B == C
    (all c keys in S) or every entry has B < C (b keys in S, c - b in K); the caller splits them."""
    P_lo, P_hi = Sc.small[Q, n - 1][:, None], Sc.large[Q, n - 1][:, None]
    pure, corners = [], []
    for u in (Sc.small[Q, n - 1 - C][:, None], Sc.large[Q, n - 1 - C][:, None]):
        base = u * Mx + Qx
        if len(B) and B[0] == C[0]:
            pure.append((base + upper(P_lo - u, P_hi - u, beta_S)).max(axis=1))
        else:
            corners += [(base + w[:, None] * beta_S).max(axis=1) - (u[:, 0] + w) * beta_K
                        for w in (Sc.small[Q, B], Sc.large[Q, B])]
    return np.maximum(*pure) if pure else np.max(corners, axis=0) + upper(P_lo[:, 0], P_hi[:, 0], beta_K)


def query_terms(Sc, n: int, M, Q, R, T) -> tuple:
    """`mixed_screened`'s per-(m, q, S) int64 terms, rows over x != m: Mx and Qx (`key_bounds`' slopes and
    intercepts of the max token's and the query's terms) per group (M, Q), and Bk the key terms of each
    group's tokens T (token j of group R[j])."""
    v = Sc.V["EU"][0].shape[1]
    cols = np.arange(v - 1) + (np.arange(v - 1) >= np.arange(v)[:, None])        # cols[m]: the x != m
    at = lambda A, rows, M: A.take(rows[:, None] * v + cols[M])     # A[rows[j], x] for the x != M[j] (flat)
    (EUl, EUh), (EVl, EVh), (PVl, PVh) = Sc.V["EU"], Sc.V["EVOU"], Sc.V["PVOU"]
    PV = PVh[:, None, :] - PVl[:, :, None]                                      # (i, m, x) centred at m
    Pn = PV[: n - 1].max(axis=0)
    EV = lambda T, M: at(EVh, T, M) - EVl[T, M][:, None]
    e = lambda Q, M, T: [weights(Sc, Q, M, T, up)[:, None] for up in (False, True)]
    EU = at(EUh, Q, M) - EUl[Q, M][:, None]
    EU_Pn = EU + at(Pn, M, M)                                           # per group; rows of it per token below
    Mx = upper(*e(Q, M, M), EU_Pn + EV(M, M))
    eq = [w * Sc.pw[up][Q, n - 1][:, None] for up, w in enumerate(e(Q, M, Q))]
    Qx = upper(*eq, EU + EV(Q, M) + at(PV[n - 1], M, M))
    return Mx, Qx, upper(*e(Q[R], M[R], T), EU_Pn[R] + EV(T, M[R]))


def key_bounds_int64(Sc, sets, M, Q, C) -> np.ndarray:
    """Per entry (case M, Q, C), `key_bound` on the screen's tables: max_{t in K} e[q,t] (EUp[m, q] + R[m, t])
    over the case's cubic set K (`CubicSets`; 0 when K is empty); every token t < v at once, clamped to at
    most m (a real key of the case) outside K, where it is masked."""
    K = sets.K[M, Q, C]
    T = np.minimum(np.arange(K.shape[1]), M[:, None])
    lo, hi = (weights(Sc, Q[:, None], M[:, None], T, up) for up in (False, True))
    terms = np.where(K, upper(lo, hi, Sc.EUp[M, Q][:, None] + Sc.R[M[:, None], T]), np.iinfo(np.int64).min)
    return np.where(K.any(axis=1), terms.max(axis=1), 0)


def max_weights(tables, q: int, c: int) -> tuple:
    """The ends of u's range: the least and the largest positional weight sum of n-1-c non-query positions."""
    sums = position_sums(tables, q)
    r = tables["n"] - 1 - c
    return sums.smallest[r], sums.largest[r]


def bound_scale(tables):
    """What one unit of a numerator bound is worth (2^-(e_shift + pw_shift + SHIFT))."""
    return 2 ** -(tables["e_shift"] + tables["pw_shift"] + SHIFT)


def key_bounds(tables, q: int, m: int, tokens) -> tuple:
    """Per competitor x != m (every table centred at column m, Pn[x] = max over non-query positions i of
    PVOU[i,x] - PVOU[i,m]; upper bounds, object ints):
        Mx[x] >= e[q,m] (EU[q,x] + EVOU[m,x] + Pn[x])                   a max-token key, per unit of position weight
        Qx[x] >= e[q,q] pw[q,n-1] (EU[q,x] + EVOU[q,x] + PVOU[n-1,x])   the query key
        Bk[k][x] >= e[q,k] (EU[q,x] + EVOU[k,x] + Pn[x])                a key k of `tokens`, per unit of position weight"""
    n, v = tables["n"], tables["v"]
    keep = np.arange(v) != m
    EU = (tables["EU_hi"][q] - tables["EU_lo"][q, m])[keep]
    centred = lambda k: (tables["EVOU_hi"][k] - tables["EVOU_lo"][k, m])[keep]
    PV = (tables["PVOU_hi"] - tables["PVOU_lo"][:, [m]])[:, keep]
    Pn = PV[: n - 1].max(axis=0)
    e_lo, e_hi = tables["e_lo"][q], tables["e_hi"][q]
    eq_lo, eq_hi = e_lo[q] * tables["pw_lo"][q][n - 1], e_hi[q] * tables["pw_hi"][q][n - 1]
    Bk = {k: mul_upper(e_lo[k], e_hi[k], EU + centred(k) + Pn) for k in tokens}
    return mul_upper(e_lo[m], e_hi[m], EU + centred(m) + Pn), mul_upper(eq_lo, eq_hi, EU + centred(q) + PV[n - 1]), Bk


def key_bound(tables, values, q: int, K) -> int:
    """betaK >= max_{t in K} e[q,t] S_t with S_t = EUp[q] + R[t], cubic's per-key bound (0 for K empty)."""
    if not K:
        return 0
    _, _, EUp, R = values
    return max(int(x) for x in mul_upper(tables["e_lo"][q][K], tables["e_hi"][q][K], EUp[q] + R[K]))


def mixed_bound(tables, Bk, ends, beta_K, case, S, b) -> int:
    """An upper bound of the numerator of max_{x != m} logit_x - logit_m over every input of case (m, q, c)
    with b non-max positions holding tokens of S and c - b tokens of the case's K, in any order (`ends`:
    each end u of the max positions' weight range with u Mx + Qx; `beta_K` from `key_bound`).

    With u, W, W_K the positional weight sums of the max, S and K positions (u + W + W_K = P), the numerator
    of logit x is at most u Mx[x] + W betaS[x] + W_K betaK + Qx[x] (`key_bounds`; betaS[x] = max_{k in S}
    Bk[k][x], coupled over x; betaK >= max_{t in K} e[q,t] S_t, the cubic per-key bound). Substituting W_K,
    the max over x is a convex function of (u, W); u and W each lie in their range over all orders, so its
    maximum over the box of those ranges, at a corner, bounds every input. With b = c (no K positions)
    W = P - u: the ends of u's range."""
    m, q, c = case
    sums = position_sums(tables, q)
    beta_S = Bk[S[0]] if len(S) == 1 else np.max([Bk[k] for k in S], axis=0)
    if b == c:
        return max(int(np.max(base + mul_upper(sums.total_lo - u, sums.total_hi - u, beta_S))) for u, base in ends)
    corners = [int(np.max(base + w * beta_S)) - (u + w) * beta_K
               for u, base in ends for w in (sums.smallest[b], sums.largest[b])]
    return max(corners) + int(mul_upper(sums.total_lo, sums.total_hi, beta_K))


# ----------------------------------------------------------------------------------------- pattern groups

def pattern_weight(tables, cases, patterns, dist, ob) -> int:
    """Credit every pattern entry (obligation "accuracy refine: pattern groups"): the summed weight
    numerators of the inputs outside the cubic set K^P that its rule proves correct. The groups with 1 or 2
    free positions are settled per position pattern for many queries at once (`coupled_groups`, on the
    queries' rows stacked: `rows.stacked_view`, QUERY_ELEMENTS bounds the stack), the others one by one
    (`pattern_credit`); rule "e"'s inputs left of one query are decided together (`decided_weight`)."""
    values, weight, tally = value_tables(tables), 0, np.zeros(2, dtype=np.int64)
    n, v = tables["n"], tables["v"]
    with ob.step("accuracy refine: pattern groups") as fig:
        by_query = {}
        for (m, q, P), (rule, unclaimed) in sorted(patterns.items()):
            if P or (m, q, 0) not in cases:          # else its one input is the cubic case's already
                by_query.setdefault(q, []).append(((m, q, P), rule, unclaimed))
        top = {q: max(g[0][0] for g in groups) for q, groups in by_query.items()}      # no token above it is read
        queries, scratch = sorted(by_query, key=top.get), {}      # scratch: one stack's arrays at a time
        step = max(1, min(QUERY_ELEMENTS // (n * v * v), -(-len(queries) // QUERY_BANDS)))
        starts = sorted(range(0, len(queries), step), key=lambda s: -len(queries[s:s + step]) * top[queries[s:s + step][-1]])
        for s in starts:                                            # the largest stack first (`rows.workspace`)
            stack = stacked_view(tables, values, queries[s:s + step], top[queries[s:s + step][-1]] + 1, scratch)
            views = {q: (Rows(*(a[k] for a in stack[0])), stack[1][k], stack[2][k])
                     for k, q in enumerate(queries[s:s + step])}
            pending, batches = {q: [] for q in views}, {}
            for q in views:
                for (m, _, P), rule, unclaimed in by_query[q]:
                    if 0 < len(P) <= 2:          # K as its row of booleans (`grid_fillings`)
                        batches.setdefault(P, []).append((m, cases.K[m, q, len(P)], fixed_weight(dist, m, q, P),
                                                          rule, unclaimed, q))
                        continue
                    K = cases.get((m, q, len(P)), [])
                    w, counted, left = pattern_credit(tables, views[q], (m, q, P), K, (rule, unclaimed), dist)
                    weight, tally[0] = weight + w, tally[0] + counted
                    pending[q] += [left] if left else []
            for P, batch in batches.items():
                w, counted, left = coupled_groups(stack + ({q: k for k, q in enumerate(views)},), P, batch, dist)
                weight, tally[0] = weight + w, tally[0] + counted
                for q, item in left:
                    pending[q].append(item)
            for q, items in pending.items():
                w, counted, decided = decided_weight(tables, views[q][0], q, items, dist)
                weight, tally = weight + w, tally + (counted, decided)
        fig["pattern groups"] = len(patterns)
        fig["inputs credited by pattern groups"] = int(tally[0])
        fig["inputs decided one by one"] = int(tally[1])
    return weight


def pattern_credit(tables, query, group, K, settlement, dist) -> tuple:
    """(summed weight numerators, number) of the inputs of group (m, q, P) outside K^P that rule "d" proves
    correct: A + sum_{i in P} D[i, t_i, m] < 0 (`rows.fixed_part`, the top-2 bound of each free position; all
    aligned to one exponent); rule "e" adds the inputs `rows.coupled` proves (with |P| <= 2 it tries every
    filling: it is never looser than the top-2 bound) and returns the inputs left outside its unclaimed
    fillings, to be decided one by one (token rows, P, the fixed positions' weight), else None.
    `settlement`: (rule, unclaimed fillings as from `parse_unclaimed`, None for rule "d")."""
    (m, q, P), (rows, Eq, Dal), (rule, unclaimed) = group, query, settlement
    n = tables["n"]
    M = [i for i in range(n - 1) if i not in P]
    fixed_w = fixed_weight(dist, m, q, P)
    if 0 < len(P) <= 2:                      # every filling at once: the top-2 grid, then (rule "e") coupled
        stack = (Rows(*(a[None] for a in rows)), Eq[None], Dal[None], {q: 0})
        inK = np.zeros(tables["v"], dtype=bool)
        inK[K] = True
        w, counted, left = coupled_groups(stack, P, [(m, inK, fixed_w, rule, unclaimed, q)], dist)
        return w, counted, left[0][1] if left else None
    theta = -int(fixed_part(rows, Eq, q, M, np.array([m]))[0])
    fillings = outside_fillings(m, K, len(P))
    passed = sum((Dal[i][fillings[:, j], m] for j, i in enumerate(P)), np.zeros(len(fillings), np.int64)) < theta
    rest = ~passed                           # (rule "e") the claimed fillings the top-2 bound leaves
    if rule == "e" and len(unclaimed):       # never credited, no test
        listed = np.zeros(m ** len(P), dtype=bool)                  # by base-m number (m^3 <= MAX_PATTERN_WORK)
        listed[unclaimed @ m ** np.arange(len(P))] = True
        claimed = ~listed[fillings @ m ** np.arange(len(P))]
        passed &= claimed
        rest &= claimed
    weight, counted = fillings_weight(dist, fillings, passed, P) * fixed_w, int(np.count_nonzero(passed))
    if rule != "e" or not rest.any():
        return weight, counted, None
    w, more, left = coupled_credit(rows, Eq, Dal, group, fillings[rest], dist, fixed_w, n)
    return weight + w, counted + more, left


def outside_fillings(m: int, K, k: int):
    """Every filling of k positions with tokens below m not all in K, each once, as a (N, k) array (k = 0:
    the one empty filling): grouped by the first position j holding a token outside K (a filling outside K^k
    has exactly one such j: the positions before it hold tokens of K, those after it any token below m)."""
    if k == 0:
        return np.zeros((1, 0), dtype=np.int64)
    inK = np.zeros(m, dtype=bool)
    inK[K] = True
    axes = lambda j: [np.nonzero(inK)[0]] * j + [np.nonzero(~inK)[0]] + [np.arange(m)] * (k - j - 1)
    parts = []
    for ax in map(axes, range(k)):             # each group's product, its columns filled by broadcasting
        out = np.empty(tuple(len(a) for a in ax) + (k,), dtype=np.int64)
        for i, a in enumerate(ax):
            out[..., i] = a.reshape((-1,) + (1,) * (k - i - 1))
        parts.append(out.reshape(-1, k))
    return np.concatenate(parts)


def fixed_weight(dist, m: int, q: int, P) -> int:
    """The weight numerator of the positions a group (m, q, P) fixes (m outside P, q at n-1; 0 below m0)."""
    n = dist.n
    if dist.unit or m < dist.m0:
        return int(m >= dist.m0)
    return math.prod(dist.a[i][m] for i in range(n - 1) if i not in P) * dist.a[n - 1][q]


def coupled_groups(stack, P, groups, dist) -> tuple:
    """Rule "d" and "e" for the groups [(m, K, fixed weight, rule, unclaimed fillings, q), ...] (K the cubic set
    as booleans over the tokens, a row of `CubicSets.K`) of one
    position pattern P with |P| <= 2 (stack: a `rows.stacked_view` and each query's index in it), every
    filling of each at once, in brute force's shape (chunks of groups: GRID_ELEMENTS bounds the arrays,
    GRID_BANDS chunks by max token at most): the top-2 bound
    A[m] + sum_{i in P} Dal[i][t_i, m] < 0 (A as in `rows.fixed_part`) on the grid of fillings below m outside
    K^P (each token axis as long as the chunk's largest m: no filling reaches it); then, for rule "e" only,
    the bound of `rows.coupled` on the claimed fillings the top-2 bound leaves (`sparse_coupled`, on those
    fillings only; it is never looser, so the two prove what the coupled bound alone proves). Returns
    (summed weight numerators, number) of the fillings proved and, per rule "e" group with claimed fillings
    neither bound proves, (q, (token rows, P, fixed weight))."""
    v, k = stack[0].E.shape[2], len(P)
    groups = sorted(groups, key=lambda g: g[0])     # by m, in GRID_BANDS chunks: each grid as long as its largest m
    step = max(1, min(GRID_ELEMENTS // v ** max(k, 2), -(-len(groups) // GRID_BANDS)))
    weight, counted, left = 0, 0, []
    for s in range(0, len(groups), step):
        w, c, l = chunk_proofs(stack, P, groups[s:s + step], dist)
        weight, counted, left = weight + w, counted + c, left + l
    return weight, counted, left


def chunk_proofs(stack, P, chunk, dist) -> tuple:
    """`coupled_groups` on one chunk of groups (sorted by m): (summed weight numerators, number) of the fillings
    the top-2 or the coupled bound proves, and the rule "e" groups' fillings neither proves."""
    rows, Eq, Dal, index = stack
    n = rows.E.shape[1]
    M, k = [i for i in range(n - 1) if i not in P], len(P)
    ms, fixed = np.array([g[0] for g in chunk]), [g[2] for g in chunk]
    qs = np.array([g[5] for g in chunk])
    at, top = np.array([index[q] for q in qs.tolist()], dtype=np.int64), int(ms.max())
    valid = grid_fillings(chunk, ms, k, top)
    hints = [(g, u) for g, (_, _, _, rule, u, _) in enumerate(chunk) if rule == "e" and len(u)]
    if hints:                                        # not claimed: never credited, no test
        valid[(np.repeat([g for g, _ in hints], [len(u) for _, u in hints]),)
              + tuple(np.concatenate([u for _, u in hints]).T)] = False
    F = stacked_fixed_terms(rows, Eq, at, qs, M, ms)              # F[g, x], A[g] = max_{x != m} F[g, x]
    A = F.copy()
    A[np.arange(len(ms)), ms] = np.iinfo(np.int64).min
    Dg = [Dal[at, i, :top, ms] for i in P]          # Dal[i][t_i, m], (g, top)
    bad = top_two_fails(A.max(axis=1), Dg, valid)
    good = valid ^ bad                               # valid & ~bad: bad lies within valid
    rule_e = np.array([g[3] == "e" for g in chunk])
    if not rule_e.all():
        bad &= rule_e.reshape(grid_axes(-1, len(ms), k, top))
    flat = np.flatnonzero(bad)                       # the claimed fillings the top-2 bound leaves (rule "e")
    idx = np.unravel_index(flat, bad.shape)          # (np.nonzero(bad), several times faster)
    proved = sparse_coupled((rows, Eq), P, at, ms, F, Dg, idx)
    good.reshape(-1)[flat[proved]] = True
    free = good.reshape(len(ms), -1).sum(axis=1)
    counted = int(free.sum())
    if not dist.unit:                                # the free positions' weights, contracted axis by axis
        free = good.astype(object)
        for i in reversed(P):
            free = free @ dist.arrays[i][:top]
    weight = sum(f * int(t) for f, t in zip(fixed, free))
    return weight, counted, unproved_inputs(n, tuple(a[~proved] for a in idx), ms, qs, fixed, P)


def top_two_fails(A, Dg, valid):
    """The fillings of the grid `valid` (group, t_1, ..., t_k), k = len(Dg) <= 2, whose top-2 bound
    A[g] + sum_j Dg[j][g, t_j] is not negative, as A + Dg[0] >= -Dg[1] (k = 2; terms below 2^62 in magnitude,
    so both sides are exact in int64), straight into booleans."""
    first = A[:, None] + Dg[0]
    if len(Dg) == 1:
        bad = first >= 0
    else:
        bad = first[:, :, None] >= np.negative(Dg[1])[:, None, :]
    bad &= valid
    return bad


def grid_axes(j: int, first: int, k: int, v: int) -> tuple:
    """The shape that lays a length-v axis along free position j of a (first, v, ..., v) grid of k positions."""
    return (first,) + tuple(v if i == j else 1 for i in range(k))


def grid_fillings(chunk, ms, k: int, v: int):
    """Boolean grid (group, x_1, ..., x_k), each x_j below v >= max(ms): the fillings of group g's k free
    positions below its m, not all in its K (those are the group's pattern, counted elsewhere)."""
    inK, below = np.array([g[1] for g in chunk])[:, :v], np.arange(v) < ms[:, None]
    valid, all_K = True, True
    for j in range(k):
        valid = valid & below.reshape(grid_axes(j, len(ms), k, v))
        all_K = all_K & inK.reshape(grid_axes(j, len(ms), k, v))
    valid &= ~all_K
    return valid


def sparse_coupled(stack, P, at, ms, F, Dg, idx):
    """Per filling idx = (group, t_1, ..., t_k) (index arrays): whether the bound of `rows.coupled` proves
    it, coupling one free position p at a time with the fixed rows F[group] (`rows.stacked_fixed_terms`),
    the others by their top-2 bound (Dg[j][group, t], Dal on the grid):
    max_{x != m} (F[x] + H_p[t_p, x] - H_p[t_p, m]) + sum_{j != p} Dal[j][t_j, m] < 0, each term aligned up
    to Eq[m] (group g's query at index at[g] of the stack; shifts >= 0 since t_p < m). The max over x is
    taken once per (group, t_p) row that the fillings not yet proved (by an earlier p) reach."""
    rows, Eq = stack
    proved = np.zeros(len(idx[0]), dtype=bool)
    for j, p in enumerate(P):
        open_ = np.nonzero(~proved)[0]
        g, tj = idx[0][open_], idx[j + 1][open_]
        reach = np.zeros(Dg[j].shape, dtype=bool)
        reach[g, tj] = True
        r, t = np.unravel_index(np.flatnonzero(reach), reach.shape)      # np.nonzero(reach), faster
        ar, mr = at[r], ms[r]
        C = rows.Hh[ar, p, t]                                       # F + align(Hh - Hl[m], s, up): F - ((Hl[m] - Hh) >> s)
        np.subtract(rows.Hl[ar, p, t, mr][:, None], C, out=C)
        np.right_shift(C, np.minimum(Eq[ar, mr] - rows.E[ar, p, t], 63)[:, None], out=C)
        np.subtract(F[r], C, out=C)
        C[np.arange(len(r)), mr] = np.iinfo(np.int64).min          # x != m
        Cmax = np.zeros(Dg[j].shape, dtype=np.int64)               # rows no filling reaches: never read
        Cmax[r, t] = C.max(axis=1)
        proved[open_] = Cmax[g, tj] + sum((D[g, idx[i + 1][open_]] for i, D in enumerate(Dg) if i != j), np.int64(0)) < 0
    return proved


def unproved_inputs(n: int, idx, ms, qs, fixed, P) -> list:
    """Per group with fillings left, idx = (group, t_1, ..., t_k) grid indices (groups ascending, as from
    np.nonzero: one run per group): (its query, (token rows, P, fixed weight)) to decide one by one."""
    tok = np.repeat(ms[idx[0]][:, None], n, axis=1)
    tok[:, n - 1] = qs[idx[0]]
    for j, p in enumerate(P):
        tok[:, p] = idx[j + 1]
    starts = np.flatnonzero(np.diff(idx[0], prepend=-1))
    groups = idx[0][starts]
    return [(int(qs[g]), (t, P, fixed[g])) for g, t in zip(groups.tolist(), np.split(tok, starts[1:]))]


def coupled_credit(rows, Eq, Dal, group, fillings, dist, fixed_w, n) -> tuple:
    """(summed weight numerators, number) of the fillings of group (m, q, P) that `rows.coupled` proves
    correct, and the rest as `pattern_credit`'s inputs left to decide one by one (None if none)."""
    m, q, P = group
    tok = np.full((len(fillings), n), m)
    tok[:, n - 1] = q
    tok[:, list(P)] = fillings
    proved = coupled(rows, Eq, Dal, q, m, P, tok)
    left = (tok[~proved], P, fixed_w) if not np.all(proved) else None
    return fixed_w * rows_weight(dist, tok[proved], P), int(np.count_nonzero(proved)), left


def decided_weight(tables, rows, q: int, pending: list, dist) -> tuple:
    """(summed weight numerators, number, number decided) of the inputs in `pending` (from `pattern_credit`)
    that `rows.decide`, or where it cannot tell `rows.exact_correct`, proves correct."""
    if not pending:
        return 0, 0, 0
    tok = np.concatenate([t for t, _, _ in pending])
    verdict = decide(rows, tok, tok.max(axis=1))
    for j in np.nonzero(verdict == 0)[0]:
        verdict[j] = 1 if exact_correct(tables, q, tok[j, :-1].tolist()) else -1
    weight, start = 0, 0
    for t, P, fixed_w in pending:
        weight += fixed_w * rows_weight(dist, t[verdict[start:start + len(t)] == 1], P)
        start += len(t)
    return weight, int(np.count_nonzero(verdict == 1)), len(tok)


def fillings_weight(dist, fillings, passed, P) -> int:
    """The summed weight numerators of the free positions P over fillings[passed] (`fillings` (N, |P|), `passed`
    booleans; uniformly their number)."""
    if dist.unit or not P:
        return int(np.count_nonzero(passed))
    fillings = fillings[passed]
    return int(math.prod(dist.arrays[p][fillings[:, j]] for j, p in enumerate(P)).sum())


def rows_weight(dist, tok, P) -> int:
    """The summed weight numerators of the free positions P over the inputs tok (their number, uniformly)."""
    return len(tok) if dist.unit else sum(math.prod(dist.a[i][row[i]] for i in P) for row in tok.tolist())
