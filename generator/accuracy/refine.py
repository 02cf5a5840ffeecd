"""Refined Max-of-K certificates (float generator side): the cubic proof, then its undecided cases split further.

The checker (`tcert.checker.kinds.accuracy.refine`) re-verifies three kinds of entries; this module finds
them in float64 and claims only what the rigorous rules confirm with room to spare:

* the cubic sets, each (m, q, c) with a token set K: the checker derives them itself (`checker_cubic_sets`
  runs its code), so the certificate does not carry them;
* "mixed": a case (m, q, c) with bad tokens (outside K) split by their identity and number: b of the c
  non-max positions hold tokens of a set S, the others tokens of K, any order; one O(1) bound each;
* "patterns": a case split by position pattern P; rule "d" counts the inputs whose top-2 bound A + sum_i D
  is negative (a sorted count), rule "e" also decides each input that bound leaves.

Every refinement is an action with a gain (weight newly credited) and a counted cost in FLOPs; per case the
actions form a chain (mixed, then patterns "d", then "e" per pattern), and a heap orders all chains by gain
per FLOP. That order does not depend on the budget, and a budget takes its longest affordable prefix, so the
certified bound can only grow with the budget.
"""

import heapq
import itertools
import math

import numpy as np

from tcert.checker.interval import make_backend
from tcert.checker.kinds.accuracy.refine import cubic_weight
from tcert.checker.kinds.accuracy import tables as checker_tables
from tcert.checker.obligations import Obligations

from tcert.generator.accuracy.cubic import cubic_flops, value_bounds
from tcert.generator.accuracy.tables import SLACK, TINY, attention_weights, float_tables, position_sums

PATTERN_SLACK = 2.0 ** -20      # relative to a pattern group's scale: covers the checker's int64 rounding
MAX_PATTERN_POSITIONS = 3       # the checker's limit


def parse_budget(text):
    """The budget of `refine[:BUDGET]`: None (no limit: refine until every input is decided) or a FLOP count
    (a number, e.g. 2e7, or a multiple of the cubic proof's FLOPs, e.g. 2x)."""
    if text in (None, "", "max"):
        return None
    try:
        return ("x", float(text[:-1])) if text.endswith("x") else ("flops", float(text))
    except ValueError:
        raise ValueError(f"unknown refine budget {text!r} (a FLOP count such as 2e7, a multiple of the cubic "
                         f"proof such as 2x, or max)") from None


# ------------------------------------------------------------------------------------------------- costs

def mixed_cost(v, S, K) -> int:
    """Counted FLOPs of one mixed bound: beta_S (a max over S per competitor), beta_K (2 per token of K),
    and four corners of 3 v operations each (W beta_S, the sum with the case's u Mx + Qx, the max over x)."""
    return (len(S) - 1) * v + 2 * len(K) + 12 * v + 8


def keys_cost(v, keys) -> int:
    """Counted FLOPs of one case's key bounds: the centred rows and e times them (3 v each) for the max token,
    the query and `keys` other tokens, and u Mx + Qx at both ends of u (4 v)."""
    return 3 * v * (keys + 2) + 4 * v


def query_cost(v, n) -> int:
    """Counted FLOPs of one query's int64 tables: V sums, w products, the top-2 bound, alignment."""
    return 7 * n * v * v


def pattern_cost(v, n, m, c, k) -> int:
    """Counted FLOPs of a pattern group with rule "d": the fixed part (3 v per fixed row and a max over v),
    aligning the free bounds, and the sorted count (m^(c-1) partial sums searched in the sorted last
    position), again on the cubic set of size k when it is not empty."""
    def count(size):
        if c == 0:
            return 1
        lg = max(1, math.ceil(math.log2(max(size, 2))))
        return size ** (c - 1) * (c - 1 + lg) + size * lg
    return (n - c) * 3 * v + v + c * m + count(m) + (count(k) if k else 0)


def decide_cost(v, n) -> int:
    """Counted FLOPs of the full test of one input (rule "e"), as brute force counts it."""
    return v * (n + 2)


# ------------------------------------------------------------------------------------------ float rules

def key_terms(T, e, eq, q: int, m: int):
    """Float mirror of the checker's `key_bounds`: (Mx, Qx, Bk) over the competitors x != m."""
    n, v = T["n"], T["v"]
    keep = np.arange(v) != m
    EU = (T["EU"][q] - T["EU"][q, m])[keep]
    EV = (T["EVOU"] - T["EVOU"][:, [m]])[:, keep]
    PV = (T["PVOU"] - T["PVOU"][:, [m]])[:, keep]
    Pn = PV[: n - 1].max(axis=0)
    return e[q, m] * (EU + EV[m] + Pn), eq[q] * (EU + EV[q] + PV[n - 1]), e[q, :m, None] * (EU + EV[:m] + Pn)


def mixed_ok(T, e, sums, vb, keys, case, K, S, b) -> bool:
    """Float mirror of the checker's `mixed_bound`, with room for its rounding."""
    m, q, c = case
    smallest, largest, P = sums
    _, _, Sk = vb
    Mx, Qx, Bk = keys
    beta_S = Bk[S].max(axis=0)
    r = T["n"] - 1 - c
    U = (smallest[q, r], largest[q, r])
    if b == c:
        vals = [u * Mx + (P[q] - u) * beta_S + Qx for u in U]
        mag = P[q] * (np.abs(Mx).max() + np.abs(beta_S).max()) + np.abs(Qx).max()
        return max(x.max() for x in vals) < -SLACK * mag - TINY
    beta_K = max(e[q, t] * Sk[q, t] for t in K)
    corners = [(u * Mx + w * beta_S + Qx).max() - (u + w) * beta_K for u in U for w in (smallest[q, b], largest[q, b])]
    mag = P[q] * (np.abs(Mx).max() + np.abs(beta_S).max() + 3 * abs(beta_K)) + np.abs(Qx).max()
    return max(corners) + P[q] * beta_K < -SLACK * mag - TINY


def query_terms(T, q: int):
    """(H, w, |H|): float H[i, t, x] = w_i[t] (EU[q,x] + EVOU[t,x] + PVOU[i,x]) of query q, w, and the largest
    |H[i, t, x]| of each row (i, t)."""
    s = T["EQKE"][q][None, :] + T["EQKP"][q][:, None]
    w = np.exp(s - s.max())
    H = w[:, :, None] * (T["EU"][q][None, None, :] + T["EVOU"][None, :, :] + T["PVOU"][:, None, :])
    return H, w, np.abs(H).max(axis=2)


def value_scale(T) -> float:
    """The largest |V| = |EU + EVOU + PVOU| can reach: the checker's int64 values share this one scale."""
    return float(np.abs(T["EU"]).max() + np.abs(T["EVOU"]).max() + np.abs(T["PVOU"]).max())


def pattern_inputs(T, Hw, group):
    """For group (m, q, P): every filling of the free positions (rows of tokens), whether the top-2 bound
    passes with room for the checker's int64 rounding (rule "d": its scale is the largest weight of the
    group's rows times the common value scale), and whether the input is correct with room (the full test,
    rule "e"; computed only where "d" fails)."""
    (H, w, Habs), (m, q, P) = Hw, group
    n = T["n"]
    M = [i for i in range(n - 1) if i not in P]
    fixed = [(i, m) for i in M] + [(n - 1, q)]
    F = sum(H[i, t] - H[i, t, m] for i, t in fixed)
    A = np.max(np.delete(F, m))
    chi = H[:, :m, :] - H[:, :m, [m]]                          # (i, t, x) for the free tokens t < m
    chi[:, :, m] = -np.inf
    D = chi.max(axis=2)                                        # (i, t)
    scale = n * max(w[: n - 1, : m + 1].max(), w[n - 1, q]) * T["value_scale"]
    grid = np.stack(np.meshgrid(*[np.arange(m)] * len(P), indexing="ij"), axis=-1).reshape(-1, len(P)) \
        if P else np.zeros((1, 0), dtype=np.int64)
    bound = A + sum((D[i, grid[:, j]] for j, i in enumerate(P)), np.zeros(len(grid)))
    d_ok = bound < -PATTERN_SLACK * scale
    e_ok = d_ok.copy()
    rest = np.nonzero(~d_ok)[0]
    if len(rest):
        sub = grid[rest]
        full = F[None, :] + sum((chi[i, sub[:, j]] for j, i in enumerate(P)), np.zeros((len(sub), len(F))))
        full[:, m] = -np.inf
        own = Habs[n - 1, q] + sum(Habs[i, m] for i in M) + sum((Habs[i, sub[:, j]] for j, i in enumerate(P)),
                                                                np.zeros(len(sub)))
        e_ok[rest] = full.max(axis=1) < -SLACK * own - TINY
    return grid, d_ok, e_ok


# ---------------------------------------------------------------------------------------- the actions

def refine_evidence(model, budget=None, T=None, dist=None):
    """(evidence, certified weight numerators, info) of `refine` with `budget` (parse_budget's value)."""
    T = dict(T or float_tables(model))
    T["value_scale"] = value_scale(T)
    c = model.config
    n, v = T["n"], T["v"]
    K, base = checker_cubic_sets(model, dist)
    base_flops = cubic_flops(v, n, c.d_model, c.d_head)
    chains = case_chains(T, K, dist)
    limit = None if budget is None else budget[1] * (base_flops if budget[0] == "x" else 1)
    chosen, flops, weight = select(chains, limit, base_flops, v, n)
    evidence = {"strategy": "refine", "mixed": [], "patterns": []}
    for action in chosen:
        for kind, entry in action["entries"]:
            evidence[kind].append(entry)
    split = {(m, q, bin(P).count("1")) for m, q, P, *_ in evidence["patterns"]}
    evidence["mixed"] = sorted(e for e in evidence["mixed"] if tuple(e[:3]) not in split)   # patterns replace them
    evidence["patterns"] = sorted({tuple(e[:3]): e for e in evidence["patterns"]}.values())   # "e" replaces "d"
    info = {"flops": flops, "checker_flops": flops, "base": "cubic", "budget": limit,
            "complexity": "O(d_vocab^3 * n_ctx^2) + refinements (counted)"}
    return evidence, base + weight, info


def checker_cubic_sets(model, dist) -> tuple:
    """The cubic sets the checker derives ({(m, q, c): K}, `tcert.checker.kinds.accuracy.refine.cubic_weight`)
    and their summed weight numerators: computed by the checker's own code on its rigorous tables, so that
    the mixed and pattern entries refine exactly the sets the checker will credit."""
    tables = checker_tables.float_tables(make_backend("flint"), model, library=True)    # as refine.certified
    return cubic_weight(tables, dist, Obligations())


def case_chains(T, K, dist) -> list:
    """Per undecided case (m, q, c): its chain of actions, each {"gain", "cost", "entries", "query"}."""
    n, v = T["n"], T["v"]
    e, pw, eq = attention_weights(T)
    sums = position_sums(pw, n)
    chains, H, vbs = [], {}, {}
    for m in range(v):
        for q in range(m + 1):
            for cc in range(0, (n - 1 if q == m else n - 2) + 1):
                if cc and len(K.get((m, q, cc), [])) == m or (not cc and (m, q, 0) in K):
                    continue
                if m not in vbs:
                    vbs[m] = value_bounds(T, m)
                chain = []
                mixed = mixed_action(T, e, sums, vbs[m], key_terms(T, e, eq, q, m), (m, q, cc), K.get((m, q, cc), []),
                                     dist) if cc else None
                if mixed:
                    chain.append(mixed)
                if n - 1 <= MAX_PATTERN_POSITIONS:       # longer inputs: too many patterns, too few inputs each
                    if q not in H:
                        H[q] = query_terms(T, q)
                    chain += pattern_actions(T, H[q], (m, q, cc), K.get((m, q, cc), []), dist,
                                             mixed["gain"] if mixed else 0)
                if chain:
                    chains.append(merged(chain))
    return chains


def mixed_action(T, e, sums, vb, keys, case, K, dist):
    """The mixed entries of one case: per bad token k (outside K) the numbers b of its copies (1, 2, ...
    until one fails) whose entry ({k}, b) holds; per b those tokens as one set if that holds too, else one
    entry each. Cost: the key bounds of the bad tokens and every bound tried."""
    m, q, c = case
    v = T["v"]
    bad = [k for k in range(m) if k not in K]
    passed, cost = {}, keys_cost(v, len(bad))
    for k in bad:
        for b in range(1, c + 1) if K else [c]:
            cost += mixed_cost(v, [k], K)
            if not mixed_ok(T, e, sums, vb, keys, case, K, [k], b):
                break
            passed.setdefault(b, []).append(k)
    entries, gain = [], 0
    for b, good in sorted(passed.items()):
        single = [[k] for k in good]
        if len(good) > 1:
            cost += mixed_cost(v, good, K)
            if mixed_ok(T, e, sums, vb, keys, case, K, good, b):
                single = [good]
        for S in single:
            entries.append(("mixed", [m, q, c, format(sum(1 << k for k in S), "x"), b]))
            gain += dist.case(m, q, [(K, c - b), (S, b)] if b < c else [(S, b)])
    return {"gain": gain, "cost": cost, "entries": entries, "query": None} if entries else None


def pattern_actions(T, H, case, K, dist, replaced: int) -> list:
    """Rule "d" on every pattern of the case (one action, replacing its mixed entries: gain net of theirs),
    then rule "e" per pattern."""
    m, q, c = case
    n, v = T["n"], T["v"]
    inK = np.zeros(max(m, 1), dtype=bool)
    inK[K] = True
    d_entries, d_gain, d_cost, upgrades = [], 0, 0, []
    for P in itertools.combinations(range(n - 1), c):
        grid, d_ok, e_ok = pattern_inputs(T, H, (m, q, P))
        outside = ~np.all(inK[grid], axis=1) if P else np.ones(1, dtype=bool)
        weights = input_weights(dist, (m, q, P), grid)
        gain = int(weights[d_ok & outside].sum())
        d_entries.append(("patterns", [m, q, sum(1 << i for i in P), "d"]))
        d_gain, d_cost = d_gain + gain, d_cost + pattern_cost(v, n, m, c, len(K))
        extra = ~d_ok & e_ok & outside
        if extra.any():
            upgrades.append({"gain": int(weights[extra].sum()), "query": q, "entries": [
                ("patterns", [m, q, sum(1 << i for i in P), "e", unclaimed(grid[~e_ok & outside], v)])],
                "cost": int(np.count_nonzero(~d_ok & outside)) * decide_cost(v, n)})
    return [{"gain": d_gain - replaced, "cost": d_cost, "entries": d_entries, "query": q}] + upgrades


def unclaimed(fillings, v: int) -> str:
    """Rule "e"'s hint: the fillings the generator does not claim (its full test fails: the model's errors and
    near ties), lowercase hex, each token in as many digits as v - 1 needs; the checker skips them."""
    w = len(format(v - 1, "x"))
    return "".join(format(int(t), f"0{w}x") for t in fillings.ravel())


def input_weights(dist, group, grid) -> np.ndarray:
    """The weight numerator of each input of a pattern group (object ints; 1 each under uniform counting)."""
    m, q, P = group
    n = dist.n
    if m < dist.m0:
        return np.zeros(len(grid), dtype=object)
    fixed = math.prod(dist.a[i][m] for i in range(n - 1) if i not in P) * dist.a[n - 1][q]
    out = np.full(len(grid), fixed, dtype=object)
    for j, i in enumerate(P):
        out = out * dist.arrays[i][grid[:, j]]
    return out


def merged(chain) -> list:
    """The chain with every action of non-positive gain merged into its successor (trailing ones dropped), so
    that each prefix of the order adds weight."""
    out, carry = [], None
    for action in chain:
        if carry:
            action = {"gain": carry["gain"] + action["gain"], "cost": carry["cost"] + action["cost"],
                      "entries": carry["entries"] + action["entries"], "query": action["query"] or carry["query"]}
        if action["gain"] > 0:
            out.append(action)
            carry = None
        else:
            carry = action
    return out


def select(chains, limit, base_flops, v, n) -> tuple:
    """(chosen actions, counted FLOPs, weight gained): the chains' actions in order of gain per FLOP (each
    chain in its own order; a query's int64 tables counted once, with its first pattern action), the longest
    prefix within `limit` (None: all)."""
    heap = [(-a[0]["gain"] / max(a[0]["cost"], 1), j, 0) for j, a in enumerate(chains) if a]
    heapq.heapify(heap)
    chosen, flops, weight, active = [], base_flops, 0, set()
    while heap:
        _, j, k = heapq.heappop(heap)
        action = chains[j][k]
        cost = action["cost"] + (query_cost(v, n) if action["query"] is not None and action["query"] not in active else 0)
        if limit is not None and flops + cost > limit:
            break
        chosen.append(action)
        flops, weight = flops + cost, weight + action["gain"]
        if action["query"] is not None:
            active.add(action["query"])
        if k + 1 < len(chains[j]):
            nxt = chains[j][k + 1]
            heapq.heappush(heap, (-nxt["gain"] / max(nxt["cost"], 1), j, k + 1))
    return chosen, flops, weight
