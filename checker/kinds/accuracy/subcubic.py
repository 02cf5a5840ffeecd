"""`accuracy` by the subcubic proof: per (m, q, c) case a cutoff j, O(1) work per case after O(d_vocab^2) tables.

evidence {"strategy": "subcubic", "variant": "svd" | "svd2" | "svd-rec" | "exact-eqke",
          "cases": [[m, q, c, cutoff], ...],        every filling of the c non-max positions by tokens <= cutoff
          "x": [...], "y": [...],                    hints in d_head space (not for exact-eqke): svd one vector
                                                     each, svd2 two, svd-rec r (successive rank-1 deflations)
          optional "eu_groups": [g_0, ...]}          the EU option: a group id < 32 per query token

Per case, with everything divided by the max token's numerator alpha, all covered inputs are correct when

    u Tm + rho (P - u) max(Smax, 0) + r Tq < 0   at both ends u of the max positions' weight range,

rho >= exp(-(EQKE[q,m] - max_{k<=j} EQKE[q,k])), Smax = EUp[q,m] + Rpre[m,j], r = e_q / alpha. The EQKE
differences come from a split EQKE = a b^T + remainder (rank-1, rank-2 or deflated hints; the remainder by
the max-row-diff trick) or from EQKE itself (exact-eqke). Hints and groups are never trusted: any hint
that defines a projection, and any grouping, gives a valid bound (docs/accuracy.md states each argument).

Obligations, in order: "accuracy subcubic: rigorous tables", "accuracy subcubic: value bounds",
"accuracy subcubic: <rank-1 | rank-2 | deflation> hint ...", "accuracy subcubic: attention scores (variant)",
"accuracy subcubic: claimed cases".
"""

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.kinds.accuracy.cases import case_inputs, case_name, parse_cases
from tcert.checker.kinds.accuracy.tables import (SHIFT, fixed_point, integer_bounds, integer_tables,
                                                  max_excluding, position_sums, prefix_max)
from tcert.checker.numbers import parse_int, parse_number, parse_vector, show

VARIANTS = ("svd", "svd2", "svd-rec", "exact-eqke")
PROJECTION_STEP = {"svd": "rank-1 hint is a projection", "svd2": "rank-2 hint is a projection",
                   "svd-rec": "deflation hints are projections"}
MAX_EU_GROUPS = 32
EXP_ARG_LIMIT = 1 << 12   # |x| beyond this in exp_bound only arises from hostile hints


class Evidence(NamedTuple):
    """Parsed subcubic evidence: variant, hints x and y (None for exact-eqke), {(m, q, c): cutoff}, and
    the EU option's group id per query token (None without it)."""

    variant: str
    x: list | None
    y: list | None
    cases: dict
    groups: list | None


def certified(B, model, evidence, dist, ob) -> tuple:
    """(weight of the inputs the confirmed cases cover, "subcubic proof (variant[+eu])") for a subcubic
    certificate."""
    parsed = parse_evidence(evidence, model.config)
    eqke = parsed.variant == "exact-eqke"
    with ob.step("accuracy subcubic: rigorous tables (EQKP, EU, EVOU, PVOU" + (", EQKE)" if eqke else ", Q, K)")):
        tables = integer_tables(B, model, eqke, eqke_bounds=eqke)
    return certified_on(B, tables, parsed, ob, dist)


def certified_on(B, tables, parsed: Evidence, ob, dist=None) -> tuple:
    """`certified` from already computed integer tables (EQKE among them for exact-eqke); `dist` None:
    uniform counting."""
    with ob.step("accuracy subcubic: value bounds (mean+diff, top-2 per row)") as fig:
        values = value_bounds(tables, parsed.groups)
        fig["EU groups"] = len(set(parsed.groups)) if parsed.groups else 0
    scores = attention_scores(B, tables, parsed, ob)
    count = confirmed_count(B, tables, values, scores, parsed.cases, ob, dist)
    return count, f"subcubic proof ({parsed.variant}{'+eu' if parsed.groups else ''})"


# ------------------------------------------------------------------------------------------- evidence

def parse_evidence(evidence, cfg) -> Evidence:
    """Validate subcubic evidence (BadInput on any malformed field)."""
    variant = evidence.get("variant")
    if variant not in VARIANTS:
        raise BadInput("evidence.variant: must be \"svd\", \"svd2\", \"svd-rec\" or \"exact-eqke\"")
    hints = set() if variant == "exact-eqke" else {"x", "y"}
    fields(evidence, "evidence", {"strategy", "variant", "cases"} | hints, {"eu_groups"})
    x, y = parse_hints(evidence, variant, cfg.d_head)
    cases = parse_cases(evidence, cfg.n_ctx, cfg.d_vocab, "cutoff", parse_cutoff)
    return Evidence(variant, x, y, cases, parse_groups(evidence, cfg.d_vocab))


def parse_cutoff(cutoff, where: str, v: int, m: int, c: int) -> int:
    """A case's cutoff j: tokens 0..j (j < m; 0 for c = 0, which has no non-max token)."""
    return parse_int(cutoff, where + ".cutoff", 0, 0 if c == 0 else m - 1)


def parse_hints(evidence, variant: str, d_head: int) -> tuple:
    """The hints (x, y): svd one vector each, svd2 two, svd-rec 1 to d_head (as many y as x)."""
    if variant == "exact-eqke":
        return None, None
    if variant == "svd":
        return tuple(parse_vector(evidence[key], f"evidence.{key}", d_head, "d_head") for key in ("x", "y"))
    if variant == "svd2":
        return tuple(parse_pair(evidence[key], f"evidence.{key}", d_head) for key in ("x", "y"))
    x, y = (parse_hint_list(evidence[key], f"evidence.{key}", d_head) for key in ("x", "y"))
    if len(x) != len(y):
        raise BadInput(f"evidence.y: must list as many hint vectors as evidence.x ({len(x)})")
    return x, y


def parse_pair(obj, where: str, d_head: int) -> list:
    """Two hint vectors of d_head exact numbers each (the rank-2 variant's x or y)."""
    if not isinstance(obj, list) or len(obj) != 2 or \
            any(not isinstance(vec, list) or len(vec) != d_head for vec in obj):
        raise BadInput(f"{where}: must be a list of two lists of d_head = {d_head} numbers")
    return [[parse_number(t, f"{where}[{r}][{i}]") for i, t in enumerate(vec)] for r, vec in enumerate(obj)]


def parse_hint_list(obj, where: str, d_head: int) -> list:
    """1 to d_head hint vectors of d_head exact numbers each (the svd-rec variant's x or y)."""
    if not isinstance(obj, list) or not 1 <= len(obj) <= d_head:
        raise BadInput(f"{where}: must be a list of 1 to d_head = {d_head} hint vectors")
    return [parse_vector(vec, f"{where}[{r}]", d_head, "d_head") for r, vec in enumerate(obj)]


def parse_groups(evidence, v: int):
    """The EU option's hint: evidence.eu_groups, a group id in [0, MAX_EU_GROUPS) per query token (None if
    absent). The group count bounds the checker's extra O(groups d_vocab^2) work."""
    if "eu_groups" not in evidence:
        return None
    groups = evidence["eu_groups"]
    if not isinstance(groups, list) or len(groups) != v:
        raise BadInput(f"evidence.eu_groups: must be a list of d_vocab = {v} group ids")
    return [parse_int(g, f"evidence.eu_groups[{q}]", 0, MAX_EU_GROUPS - 1) for q, g in enumerate(groups)]


# ------------------------------------------------------------------------------------- value bounds

def value_bounds(tables, groups=None) -> dict:
    """Subcubic value tables (exact upper bounds at 2^SHIFT; x ranges over x != m):

    Tm[q, m]  >= max_x EU[q,x]-EU[q,m] + EVOU[m,x]-EVOU[m,m] + Pn[m,x]  (mean+diff: EU = mu + d)
    Tq[q, m]  >= max_x F[q,x] - F[q,m],  F = EU + EVOU + PVOU[n-1]
    EUp[q, m] >= max_x EU[q,x] - EU[q,m]
    Rpre[m, j] >= max_{k <= j} (max_x EVOU[k,x] - EVOU[k,m]) + max_x Pn[m,x]
    with Pn[m, x] >= max_{i < n-1} PVOU[i,x] - PVOU[i,m]. O(n d_vocab^2) work. With `groups` (a group id
    per query token, the EU option), Tm is also bounded with one centre row per group (`grouped_tm`) and
    the smaller bound is kept: O(groups d_vocab^2) more.
    """
    n = tables["n"]
    EU_lo, EU_hi = tables["EU_lo"], tables["EU_hi"]
    EVOU_lo, EVOU_hi = tables["EVOU_lo"], tables["EVOU_hi"]
    PVOU_lo, PVOU_hi = tables["PVOU_lo"], tables["PVOU_hi"]
    Pn = PVOU_hi[0][None, :] - PVOU_lo[0][:, None]
    for i in range(1, n - 1):
        Pn = np.maximum(Pn, PVOU_hi[i][None, :] - PVOU_lo[i][:, None])
    G = EVOU_hi - np.diag(EVOU_lo)[:, None] + Pn
    Tm = mean_diff_tm(EU_lo, EU_hi, G, range(tables["v"]))
    if groups is not None:
        Tm = np.minimum(Tm, grouped_tm(EU_lo, EU_hi, G, groups))
    F_hi = EU_hi + EVOU_hi + PVOU_hi[n - 1][None, :]
    F_lo = EU_lo + EVOU_lo + PVOU_lo[n - 1][None, :]
    R = (max_excluding(EVOU_hi) - EVOU_lo).T + np.diag(max_excluding(Pn))[:, None]
    return {"Tm": Tm, "Tq": max_excluding(F_hi) - F_lo, "EUp": max_excluding(EU_hi) - EU_lo,
            "Rpre": prefix_max(R)}


def mean_diff_tm(EU_lo, EU_hi, G, rows):
    """Tm[q, m] >= max_{x != m} EU[q,x] - EU[q,m] + G[m,x] for the query rows `rows`, by the mean+diff
    trick with centre mu = floor of the mean of those rows' lower bounds (any centre is valid):
    max_x (EU[q,x] + G[m,x]) <= max_x (mu[x] + G[m,x]) + max_x (EU[q,x] - mu[x]). O(d_vocab^2)."""
    rows = list(rows)
    lo, hi = EU_lo[rows], EU_hi[rows]
    mu = np.array([sum(col) // len(rows) for col in lo.T.tolist()], dtype=object)
    centre_max = np.diag(max_excluding(mu[None, :] + G)) - mu
    return centre_max[None, :] + (hi - mu[None, :]).max(axis=1)[:, None] - (lo - mu[None, :])


def grouped_tm(EU_lo, EU_hi, G, groups):
    """The EU option: the mean+diff bound of Tm with one centre per group of query tokens (groups[q] is
    q's group; the certificate's hint, never trusted: every grouping gives a valid bound)."""
    Tm = np.empty(EU_lo.shape, dtype=object)
    for g in sorted(set(groups)):
        rows = [q for q, h in enumerate(groups) if h == g]
        Tm[rows] = mean_diff_tm(EU_lo, EU_hi, G, rows)
    return Tm


# ----------------------------------------------------------------------------------- attention scores

def attention_scores(B, tables, parsed: Evidence, ob) -> dict:
    """The EQKE bounds the cases use, as returned by `low_rank_scores` (svd, svd2), `deflated_scores`
    (svd-rec) or `exact_scores`; for the hint variants the hints must first define projections."""
    variant = parsed.variant
    if variant != "exact-eqke":
        with ob.step(f"accuracy subcubic: {PROJECTION_STEP[variant]}"):
            projections = hint_projections(B, variant, parsed.x, parsed.y)
    with ob.step(f"accuracy subcubic: attention scores ({variant})") as fig:
        if variant == "exact-eqke":
            scores = exact_scores(tables)
        elif variant == "svd-rec":
            scores = deflated_scores(B, tables, projections)
        else:
            scores = low_rank_scores(B, tables, *projections[0])
        fig["max_q eps_q (remainder row spread)"] = Fraction(max(scores["eps"]), 1 << scores["shift"])
    return scores


def hint_projections(B, variant: str, x, y) -> list:
    """The hints as projections: pairs (xs, yp) of d_head x r interval matrices with yp^T xs = I, so that
    xs yp^T is a projection (svd: one pair, r = 1; svd2: one pair, r = 2; svd-rec: one r = 1 pair per
    deflation step). Rejected when a normaliser (y . x, det(Y^T X)) may be 0."""
    if variant == "svd":
        return [rank1_projection(B, x, y, "y . x")]
    if variant == "svd2":
        return [rank2_projection(B, x, y)]
    return [rank1_projection(B, xi, yi, f"y_{i} . x_{i}") for i, (xi, yi) in enumerate(zip(x, y))]


def rank1_projection(B, x: list, y: list, name: str) -> tuple:
    """(xs, yp): the columns x and y' = y / (y . x), so yp^T xs = 1 exactly."""
    xs, ys = B.matrix([[B.num(t)] for t in x]), B.matrix([[B.num(t)] for t in y])
    yx = (ys.T @ xs).rows()[0][0]
    if B.lower(yx) <= 0 <= B.upper(yx):
        raise Rejected("", f"{name} in [{show(B.lower(yx))}, {show(B.upper(yx))}] may be 0: the hint vectors "
                           f"do not define a projection")
    return xs, ys.scale(1 / yx)


def rank2_projection(B, X: list, Y: list) -> tuple:
    """(xs, yp) for X = [x1, x2], Y = [y1, y2]: with G = Y^T X (2 x 2), Y' = Y G^-T, so Y'^T X = I exactly."""
    dh = len(X[0])
    xs = B.matrix([[B.num(X[0][d]), B.num(X[1][d])] for d in range(dh)])
    ys = B.matrix([[B.num(Y[0][d]), B.num(Y[1][d])] for d in range(dh)])
    (g11, g12), (g21, g22) = (ys.T @ xs).rows()
    det = g11 * g22 - g12 * g21
    if B.lower(det) <= 0 <= B.upper(det):
        raise Rejected("", f"det(Y^T X) in [{show(B.lower(det))}, {show(B.upper(det))}] may be 0: the hint "
                           f"vectors do not define a projection")
    ginv_t = B.matrix([[g22 / det, -g21 / det], [-g12 / det, g11 / det]])     # (G^-1)^T
    return xs, ys @ ginv_t


def exact_scores(tables) -> dict:
    """The exact-EQKE variant in the shape of `low_rank_scores` (eps = 0, scale 2^SHIFT)."""
    return {"ab_lo": tables["EQKE_lo"], "ab_hi": tables["EQKE_hi"], "eps": np.zeros(tables["v"], dtype=object),
            "shift": SHIFT}


def low_rank_scores(B, tables, xs, yp) -> dict:
    """The rank-r split (svd: r = 1, svd2: r = 2) for a projection xs yp^T (yp^T xs = I):

    EQKE = a b^T + Q_rem K_rem^T / s exactly, with a = Q xs / s, b = K yp, Q_rem = Q - (Q xs) yp^T,
    K_rem = K - (K yp) xs^T (Q Pr K^T + Q (I - Pr)(I - Pr) K^T, Pr = xs yp^T). Returns `split_scores`.
    O(d_vocab d_head) interval work (plus O(d_vocab^2) integer products for the a . b table).
    """
    intervals = tables["intervals"]
    Q, K, inv = intervals["Q"], intervals["K"], intervals["inv_scale"]
    Qx, Ky = Q @ xs, K @ yp
    return split_scores(B, Qx.scale(inv), Ky, Q - Qx @ yp.T, K - Ky @ xs.T, inv)


def deflated_scores(B, tables, projections) -> dict:
    """Recursive rank-1 deflation (the svd-rec variant), one projection (x_i, y_i') per step, i = 1..r.

    Starting from Q_1 = Q, K_1 = K, each step splits exactly
        Q_i K_i^T = (Q_i x_i)(K_i y_i')^T + Q_{i+1} K_{i+1}^T,  Q_{i+1} = Q_i - (Q_i x_i) y_i'^T,
                                                               K_{i+1} = K_i - (K_i y_i') x_i^T
    (Q_i (I - P_i) K_i^T = Q_i (I - P_i)(I - P_i) K_i^T, P_i = x_i y_i'^T). So EQKE = sum_i a_i b_i^T +
    Q_{r+1} K_{r+1}^T / s with a_i = Q_i x_i / s, b_i = K_i y_i'; the rank-r part is bounded entrywise and
    the final remainder by the max-row-diff trick (`split_scores`). Any hints give a valid bound.
    O(r d_vocab d_head) interval work plus O(r d_vocab^2) integer work for the score table.
    """
    intervals = tables["intervals"]
    Q, K, inv = intervals["Q"], intervals["K"], intervals["inv_scale"]
    a_cols, b_cols = [], []
    for xs, yp in projections:
        Qx, Ky = Q @ xs, K @ yp
        a_cols.append([row[0] for row in Qx.scale(inv).rows()])
        b_cols.append([row[0] for row in Ky.rows()])
        Q, K = Q - Qx @ yp.T, K - Ky @ xs.T
    a = B.matrix([list(r) for r in zip(*a_cols)])
    b = B.matrix([list(r) for r in zip(*b_cols)])
    return split_scores(B, a, b, Q, K, inv)


def split_scores(B, a, b, Q_rem, K_rem, inv) -> dict:
    """EQKE = a b^T + Q_rem K_rem^T * inv (interval matrices; a, b: d_vocab x r). Returns integer bounds of
    a_q . b_k at 2^(2 SHIFT) ("ab_lo", "ab_hi"; corner bounds per rank-one term, summed) and
    eps[q] >= max_{k,k'} Rem[q,k] - Rem[q,k'] for Rem = Q_rem K_rem^T * inv, by the max-row-diff trick
    sum_d |Q_rem[q,d]| (max_k K_rem[k,d] - min_k K_rem[k,d]) * inv, at the same scale ("eps", "shift").
    """
    Q_lo, Q_hi = integer_bounds(B, Q_rem, "Q remainder")
    K_lo, K_hi = integer_bounds(B, K_rem, "K remainder")
    abs_Q = np.maximum(-Q_lo, Q_hi)
    spread = K_hi.max(axis=0) - K_lo.min(axis=0)
    inv_hi = fixed_point(B.upper(inv), True)
    eps = [-((-sum(abs_Q[q] * spread) * inv_hi) >> SHIFT) for q in range(Q_rem.shape[0])]
    a_lo, a_hi = integer_bounds(B, a, "a (query factor)")
    b_lo, b_hi = integer_bounds(B, b, "b (key factor)")
    lo = hi = 0
    for r in range(a.shape[1]):
        corners = [np.multiply.outer(ar, br) for ar in (a_lo[:, r], a_hi[:, r]) for br in (b_lo[:, r], b_hi[:, r])]
        lo_r, hi_r = corners[0], corners[0]
        for corner in corners[1:]:
            lo_r, hi_r = np.minimum(lo_r, corner), np.maximum(hi_r, corner)
        lo, hi = lo + lo_r, hi + hi_r
    return {"ab_lo": lo, "ab_hi": hi, "eps": np.array(eps, dtype=object), "shift": 2 * SHIFT}


# ---------------------------------------------------------------------------------------------- cases

def confirmed_count(B, tables, values, scores, cases, ob, dist=None) -> int:
    """Confirm every claimed (m, q, c) -> cutoff j case (obligation "accuracy subcubic: claimed cases");
    return the summed weight numerators of the inputs they cover (all c non-max non-query tokens <= j; their
    number under uniform counting, also when `dist` is None)."""
    n = tables["n"]
    pre_hi = prefix_max(scores["ab_hi"])
    scale = Fraction(1, 1 << (tables["pw_shift"] + SHIFT))
    ratios, sums, count, weight = {}, {}, 0, 0
    with ob.step("accuracy subcubic: claimed cases") as fig:
        for (m, q, c), j in sorted(cases.items()):
            if q not in sums:
                sums[q] = position_sums(tables, q)
            try:
                if (q, m) not in ratios:
                    ratios[q, m] = query_ratio(B, tables, scores, values["Tq"][q, m], q, m)
                bound = case_bound(B, tables, values, scores, pre_hi, sums[q], ratios[q, m], (m, q, c, j))
            except Rejected as e:
                raise Rejected("", f"{case_name(m, q, c)}, cutoff {j}: {e.detail}") from None
            if not bound < 0:
                raise Rejected("", f"{case_name(m, q, c)}, cutoff {j}: bound {show(bound * scale)} >= 0 (a positive multiple of "
                                   f"max_(x != m) logit_x - logit_m; scores at 2^-{scores['shift']})")
            count += case_inputs(n, c, j + 1)
            weight += dist.case(m, q, [(range(j + 1), c)] if c else []) if dist else case_inputs(n, c, j + 1)
        fig["cases confirmed"] = len(cases)
        fig["inputs covered"] = count
    return weight


def query_ratio(B, tables, scores, Tq, q: int, m: int) -> Fraction:
    """r = e_q / alpha = exp(EQKE[q,q] - EQKE[q,m]) pw[q, n-1], bounded on the side Tq's sign needs (above
    when Tq >= 0, below otherwise), so that r Tq bounds the query key's term from above."""
    up = Tq >= 0
    pw = tables["pw_hi" if up else "pw_lo"][q][tables["n"] - 1]
    if q == m:
        return Fraction(pw)
    ab_lo, ab_hi, eps = scores["ab_lo"], scores["ab_hi"], scores["eps"][q]
    diff = (ab_hi[q, q] - ab_lo[q, m] + eps) if up else (ab_lo[q, q] - ab_hi[q, m] - eps)
    return exp_bound(B, diff * Fraction(1, 1 << scores["shift"]), up) * pw


def case_bound(B, tables, values, scores, pre_hi, sums, ratio: Fraction, case: tuple) -> Fraction:
    """An upper bound of u Tm + rho (P - u) max(Smax, 0) + r Tq over both ends u of the max positions'
    weight range (c = 0: P Tm + r Tq); the case (m, q, c, j) holds when it is < 0.

    rho >= exp(-(EQKE[q,m] - max_{k<=j} EQKE[q,k])) bounds every non-max key's numerator / alpha at once.
    """
    m, q, c, j = case
    Tm, query_term = values["Tm"][q, m], ratio * values["Tq"][q, m]
    if c == 0:
        return (sums.total_hi if Tm >= 0 else sums.total_lo) * Tm + query_term
    gap = (scores["ab_lo"][q, m] - pre_hi[q, j] - scores["eps"][q]) * Fraction(1, 1 << scores["shift"])
    rho = exp_bound(B, -gap, True)
    Smax = max(values["EUp"][q, m] + values["Rpre"][m, j], 0)
    r = tables["n"] - 1 - c
    return max(u * Tm + rho * max(sums.total_hi - u, 0) * Smax + query_term
               for u in (sums.smallest[r], sums.largest[r]))


def exp_bound(B, x: Fraction, up: bool) -> Fraction:
    """An exact rational >= exp(x) (up) or <= exp(x). For |x| >= L = EXP_ARG_LIMIT (only reachable through
    hostile hints; exp(2^34) alone is a 3 GB integer) the bound is 2^-L (x <= -L, as e^-L < 2^-L) or 0
    (lower), 2^L (lower, x >= L, as e^L > 2^L), and an upper bound for x >= L is refused (Rejected: the
    case cannot be confirmed)."""
    if x <= -EXP_ARG_LIMIT:
        return Fraction(1, 1 << EXP_ARG_LIMIT) if up else Fraction(0)
    if x >= EXP_ARG_LIMIT:
        if up:
            raise Rejected("", f"exp({show(x)}): a score difference beyond the exp range {EXP_ARG_LIMIT} "
                               f"(hint too poor)")
        return Fraction(1 << EXP_ARG_LIMIT)
    e = B.exp(B.num(x))
    return B.upper(e) if up else B.lower(e)
