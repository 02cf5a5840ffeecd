"""`accuracy`: a 1-layer attention-only Max-of-K model answers at least N of its d_vocab^K inputs correctly.

claim    {"task": "max-of-k", "d_vocab": v, "n_ctx": K, "inputs": v^K, "correct_at_least": N}
         An input (t_0..t_{K-1}) is answered correctly when the last position's logit of max(t) is strictly
         larger than every other logit (exact real arithmetic on the stored weights; a tie is wrong).
evidence {"strategy": "brute"}                                   every input is re-decided
         {"strategy": "cubic", "cases": [[m, q, c, hexmask], ...]}  pure-sequence cases claimed correct
         {"strategy": "subcubic", "variant": "svd" | "svd2" | "svd-rec" | "exact-eqke",
          "cases": [[m, q, c, cutoff], ...], "x": [...], "y": [...] (svd: rank-1 hint vectors in d_head
          space; svd2: two of each; svd-rec: r of each, applied as successive rank-1 deflations),
          optional "eu_groups": [g_0, ...] (the EU option: a group id < 32 per query token)}

All strategies start from `maxofk_tables.value_tables` (interval matrix products, then exact integer
bounds); the decisions are exact integer comparisons. docs/accuracy.md states each argument.
"""

import itertools
import math
from fractions import Fraction

import numpy as np

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.numbers import parse_int, parse_number, parse_vector
from tcert.checker.kinds.accuracy.tables import centred_upper, deflated_scores, exact_scores, interval_mul, mul_upper, prefix_max, rank1_scores, rank2_scores, require_maxofk, value_bounds, value_tables
from tcert.checker.numbers import show

MAX_BRUTE_INPUTS = 1 << 26
MAX_EU_GROUPS = 32
EXP_ARG_LIMIT = 1 << 12   # |x| beyond this in exp_bound only arises from hostile hints


def parse_claim(claim, cfg) -> int:
    """Validate the claim against the model config; return N."""
    fields(claim, "claim", {"task", "d_vocab", "n_ctx", "inputs", "correct_at_least"})
    if claim["task"] != "max-of-k":
        raise BadInput("claim.task: must be \"max-of-k\"")
    parse_int(claim["d_vocab"], "claim.d_vocab", cfg.d_vocab, cfg.d_vocab)
    parse_int(claim["n_ctx"], "claim.n_ctx", cfg.n_ctx, cfg.n_ctx)
    total = cfg.d_vocab ** cfg.n_ctx
    parse_int(claim["inputs"], "claim.inputs", total, total)
    return parse_int(claim["correct_at_least"], "claim.correct_at_least", 0, total)


# ------------------------------------------------------------------------------------------- brute force

def brute_tables(T, q: int):
    """Exact bounds (object ints) of H[i, t, x] = w(q, i, t) (EU[q,x] + EV[t,x] + PV[i,x]) for query q.

    w(q, i, t) = e[q, t] pw[q, i] is a positive multiple (the same for all i, t) of the softmax numerator
    of key t at position i, so sum_i H[i, t_i, x] is a positive multiple of logit x.
    """
    w_lo = T["e_lo"][q][None, :] * T["pw_lo"][q][:, None]            # (i, t)
    w_hi = T["e_hi"][q][None, :] * T["pw_hi"][q][:, None]
    F_lo = T["EU_lo"][q][None, None, :] + T["EV_lo"][None, :, :] + T["PV_lo"][:, None, :]   # (i, t, x)
    F_hi = T["EU_hi"][q][None, None, :] + T["EV_hi"][None, :, :] + T["PV_hi"][:, None, :]
    return interval_mul(w_lo[:, :, None], w_hi[:, :, None], F_lo, F_hi)


def row_floats(H_lo, H_hi, n: int):
    """Each row H[i, t, :] as int64 mantissas with one exponent: lo * 2^E <= H <= hi * 2^E (exact floor /
    ceil), |mantissas| < 2^MANT so that n + 1 aligned terms sum without overflow."""
    mant = 61 - (n + 1).bit_length()
    shape = H_lo.shape[:2]
    E = np.zeros(shape, dtype=np.int64)
    lo = np.zeros(H_lo.shape, dtype=np.int64)
    hi = np.zeros(H_lo.shape, dtype=np.int64)
    for i, t in np.ndindex(*shape):
        a, b = H_lo[i, t], H_hi[i, t]
        e = max(max(abs(x) for x in a), max(abs(x) for x in b), 1).bit_length() - mant
        E[i, t] = e
        lo[i, t] = [x >> e if e >= 0 else x << -e for x in a]
        hi[i, t] = [-((-x) >> e) if e >= 0 else x << -e for x in b]
    return lo, hi, E


def aligned(x, shift, up: bool):
    """x * 2^-shift rounded down (or up), exactly: int64 arithmetic shift (shift >= 0, capped at 63,
    which is exact because |x| < 2^62 already floors to 0 or -1 there)."""
    s = np.minimum(shift, 63)
    return -((-x) >> s) if up else x >> s


def brute_count(T) -> int:
    """Number of inputs whose max token's logit is certainly strictly above every other logit.

    For query q, input (t_0..t_{n-2}, q) with max m is counted when sum_i lo_i[t_i, m] > sum_i hi_i[t_i, x]
    for every x != m, all terms aligned to the input's largest row exponent (exact floor / ceil), so each
    input keeps ~58 bits relative to its own dominant term. Positions other than the last two (or one)
    non-query positions are enumerated; those are broadcast.
    """
    if int(np.right_shift(np.array([-5], dtype=np.int64), 1)[0]) != -3:   # floor semantics is relied on
        raise RuntimeError("int64 >> is not an arithmetic (floor) shift on this platform")
    n, v = T["n"], T["v"]
    inner = list(range(max(0, n - 3), n - 1))
    outer = inner[0]
    toks = np.arange(v)
    grids = np.meshgrid(*[toks] * len(inner), indexing="ij")
    gmax = np.maximum.reduce(list(grids))
    count = 0
    for q in range(v):
        lo, hi, E = row_floats(*brute_tables(T, q), n)
        for pre in itertools.product(range(v), repeat=outer):
            rows = [(n - 1, q)] + list(enumerate(pre))
            Eseq = np.maximum.reduce([np.full(gmax.shape, E[i, t]) for i, t in rows]
                                     + [E[pos][g] for pos, g in zip(inner, grids)])
            m = np.maximum(gmax, max((q,) + pre))
            L_hi = sum(aligned(hi[i, t], (Eseq - E[i, t])[..., None], True) for i, t in rows)
            L_lo = sum(aligned(lo[i, t][m], Eseq - E[i, t], False) for i, t in rows)
            for pos, g in zip(inner, grids):
                sh = Eseq - E[pos][g]
                L_hi = L_hi + aligned(hi[pos][g], sh[..., None], True)
                L_lo = L_lo + aligned(lo[pos][g, m], sh, False)
            above = (L_hi >= L_lo[..., None]).sum(axis=-1)    # x = m always counts itself
            count += int(np.count_nonzero(above == 1))
    return count


# ------------------------------------------------------------------------------------------------ cubic

def cubic_values(T, m: int):
    """Exact upper bounds, for max token m (x ranges over x != m; every table centred at column m):

    Tm[q] >= max_x EU[q,x] + EV[m,x] + Pn[x]       a max-token key at a non-query position
    Tq[q] >= max_x EU[q,x] + EV[q,x] + PV[n-1,x]   the query key (token q at position n-1)
    EUp[q] + R[k] >= max_x EU[q,x] + max_x EV[k,x] + Pn[x]    a non-max key k at a non-query position
    with Pn[x] = max_{i < n-1} PV[i,x].
    """
    n, v = T["n"], T["v"]
    keep = np.arange(v) != m
    EU = centred_upper(T["EU_lo"], T["EU_hi"], m)[:, keep]
    EV = centred_upper(T["EV_lo"], T["EV_hi"], m)[:, keep]
    PV = centred_upper(T["PV_lo"], T["PV_hi"], m)[:, keep]
    Pn = PV[: n - 1].max(axis=0)
    Tm = (EU + (EV[m] + Pn)[None, :]).max(axis=1)
    Tq = (EU + EV + PV[n - 1][None, :]).max(axis=1)
    return Tm, Tq, EU.max(axis=1), (EV + Pn[None, :]).max(axis=1)


def position_sums(T, q: int):
    """For query q: (lo[r], hi[r], P_lo, P_hi): lo[r] <= the r smallest non-query positional weights'
    sum, hi[r] >= the r largest ones' sum, P_lo <= their total <= P_hi."""
    n = T["n"]
    lo = sorted(T["pw_lo"][q][: n - 1])
    hi = sorted(T["pw_hi"][q][: n - 1], reverse=True)
    return ([sum(lo[:r]) for r in range(n)], [sum(hi[:r]) for r in range(n)], sum(lo), sum(hi))


def cubic_case_ok(T, vals, sums, m, q, c, ks):
    """True per k in ks when every input with max m, query q and c non-query copies of non-max tokens
    from {k} is certainly correct (c = 0: ks ignored, the all-max filling).

    Upper bound of the numerator of max_{x != m}(logit_x - logit_m), as a function of u = total
    positional weight of the max-token positions:  G(u) = e[q,m] u Tm + e[q,k] (P - u) S_k + eq Tq.
    G is affine in u and every ordering has u in [lo[r], hi[r]] (r = n-1-c), so both ends suffice.
    """
    Tm, Tq, EUp, R = vals
    lo, hi, P_lo, P_hi = sums
    n = T["n"]
    e_lo, e_hi = T["e_lo"][q], T["e_hi"][q]
    eq_lo, eq_hi = e_lo[q] * T["pw_lo"][q][n - 1], e_hi[q] * T["pw_hi"][q][n - 1]
    D = mul_upper(eq_lo, eq_hi, Tq[q])
    if c == 0:
        return mul_upper(e_lo[m] * P_lo, e_hi[m] * P_hi, Tm[q]) + D < 0
    r = n - 1 - c
    ks = np.asarray(ks)
    S = EUp[q] + R[ks]
    ok = np.ones(len(ks), dtype=bool)
    for u in (lo[r], hi[r]):
        A = mul_upper(e_lo[m] * u, e_hi[m] * u, Tm[q])
        b_lo, b_hi = interval_mul(e_lo[ks], e_hi[ks], P_lo - u, P_hi - u)
        ok &= (A + mul_upper(b_lo, b_hi, S) + D < 0).astype(bool)
    return ok


def parse_cases(evidence, n, v):
    """Validate evidence.cases; return {(m, q, c): [k, ...]} (c = 0 cases map to [])."""
    cases = evidence["cases"]
    if not isinstance(cases, list) or len(cases) > v * v * n:
        raise BadInput(f"evidence.cases: must be a list of at most {v * v * n} cases")
    out = {}
    for j, case in enumerate(cases):
        where = f"evidence.cases[{j}]"
        if not isinstance(case, list) or len(case) != 4:
            raise BadInput(f"{where}: must be [m, q, c, hexmask]")
        m = parse_int(case[0], where + ".m", 0, v - 1)
        q = parse_int(case[1], where + ".q", 0, m)
        c = parse_int(case[2], where + ".c", 0, n - 1 if q == m else n - 2)
        mask = case[3]
        if not isinstance(mask, str) or not 1 <= len(mask) <= v // 4 + 2 or \
                any(ch not in "0123456789abcdef" for ch in mask):
            raise BadInput(f"{where}.mask: must be a lowercase hex string")
        bits = int(mask, 16)
        if (c == 0 and bits != 1) or (c > 0 and not 0 < bits < (1 << m)):
            raise BadInput(f"{where}.mask: must be 1 for c = 0, else a non-empty subset of tokens below m")
        if (m, q, c) in out:
            raise BadInput(f"{where}: case (m={m}, q={q}, c={c}) is listed twice")
        out[(m, q, c)] = [k for k in range(m) if bits >> k & 1] if c else []
    return out


def cubic_check(T, cases, ob) -> int:
    """Confirm every claimed case; return the number of inputs they cover."""
    n = T["n"]
    count = 0
    vals, sums = {}, {}
    for (m, q, c), ks in sorted(cases.items()):
        if m not in vals:
            vals[m] = cubic_values(T, m)
        if q not in sums:
            sums[q] = position_sums(T, q)
        ok = cubic_case_ok(T, vals[m], sums[q], m, q, c, ks)
        bad = [k for k, good in zip(ks, np.atleast_1d(ok)) if not good] if c else ([] if ok else ["-"])
        ob.require(not bad, "cubic case", f"max {m}, query {q}, {c} non-max copies: not certainly correct "
                                          f"for non-max token(s) {bad[:8]}")
        count += math.comb(n - 1, c) * len(ks) ** c if c else 1
    return count


# --------------------------------------------------------------------------------------------- subcubic

def parse_subcubic(evidence, cfg):
    """Validate subcubic evidence; return (variant, x, y, {(m, q, c): j})."""
    n, v = cfg.n_ctx, cfg.d_vocab
    variant = evidence.get("variant")
    if variant == "svd":
        fields(evidence, "evidence", {"strategy", "variant", "cases", "x", "y"}, {"eu_groups"})
        x, y = (parse_vector(evidence[key], f"evidence.{key}", cfg.d_head, "d_head") for key in ("x", "y"))
    elif variant == "svd2":
        fields(evidence, "evidence", {"strategy", "variant", "cases", "x", "y"}, {"eu_groups"})
        x, y = (parse_pair(evidence[key], f"evidence.{key}", cfg.d_head) for key in ("x", "y"))
    elif variant == "svd-rec":
        fields(evidence, "evidence", {"strategy", "variant", "cases", "x", "y"}, {"eu_groups"})
        x, y = (parse_hint_list(evidence[key], f"evidence.{key}", cfg.d_head) for key in ("x", "y"))
        if len(x) != len(y):
            raise BadInput(f"evidence.y: must list as many hint vectors as evidence.x ({len(x)})")
    elif variant == "exact-eqke":
        fields(evidence, "evidence", {"strategy", "variant", "cases"}, {"eu_groups"})
        x = y = None
    else:
        raise BadInput("evidence.variant: must be \"svd\", \"svd2\", \"svd-rec\" or \"exact-eqke\"")
    cases = evidence["cases"]
    if not isinstance(cases, list) or len(cases) > v * v * n:
        raise BadInput(f"evidence.cases: must be a list of at most {v * v * n} cases")
    out = {}
    for i, case in enumerate(cases):
        where = f"evidence.cases[{i}]"
        if not isinstance(case, list) or len(case) != 4:
            raise BadInput(f"{where}: must be [m, q, c, cutoff]")
        m = parse_int(case[0], where + ".m", 0, v - 1)
        q = parse_int(case[1], where + ".q", 0, m)
        c = parse_int(case[2], where + ".c", 0, n - 1 if q == m else n - 2)
        j = parse_int(case[3], where + ".cutoff", 0, 0 if c == 0 else m - 1)
        if (m, q, c) in out:
            raise BadInput(f"{where}: case (m={m}, q={q}, c={c}) is listed twice")
        out[(m, q, c)] = j
    return variant, x, y, out


def parse_pair(obj, where: str, d_head: int) -> list:
    """Two hint vectors of d_head exact numbers each (the rank-2 variant's x or y)."""
    if not isinstance(obj, list) or len(obj) != 2 or \
            any(not isinstance(vec, list) or len(vec) != d_head for vec in obj):
        raise BadInput(f"{where}: must be a list of two lists of d_head = {d_head} numbers")
    return [[parse_number(t, f"{where}[{r}][{i}]") for i, t in enumerate(vec)] for r, vec in enumerate(obj)]


def parse_groups(evidence, v: int):
    """The EU option's hint: evidence.eu_groups, a group id in [0, MAX_EU_GROUPS) per query token (None if
    absent). The group count bounds the checker's extra O(groups d_vocab^2) work."""
    if "eu_groups" not in evidence:
        return None
    groups = evidence["eu_groups"]
    if not isinstance(groups, list) or len(groups) != v:
        raise BadInput(f"evidence.eu_groups: must be a list of d_vocab = {v} group ids")
    return [parse_int(g, f"evidence.eu_groups[{q}]", 0, MAX_EU_GROUPS - 1) for q, g in enumerate(groups)]


def parse_hint_list(obj, where: str, d_head: int) -> list:
    """1 to d_head hint vectors of d_head exact numbers each (the svd-rec variant's x or y)."""
    if not isinstance(obj, list) or not 1 <= len(obj) <= d_head:
        raise BadInput(f"{where}: must be a list of 1 to d_head = {d_head} hint vectors")
    return [parse_vector(vec, f"{where}[{r}]", d_head, "d_head") for r, vec in enumerate(obj)]


def exp_bound(B, x: Fraction, up: bool) -> Fraction:
    """An exact rational >= exp(x) (up) or <= exp(x). For |x| >= L = EXP_ARG_LIMIT (only reachable through
    hostile hints; exp(2^34) alone is a 3 GB integer) the bound is 2^-L (x <= -L, as e^-L < 2^-L) or 0
    (lower), 2^L (lower, x >= L, as e^L > 2^L), and an upper bound for x >= L is refused."""
    if x <= -EXP_ARG_LIMIT:
        return Fraction(1, 1 << EXP_ARG_LIMIT) if up else Fraction(0)
    if x >= EXP_ARG_LIMIT:
        if up:
            raise Rejected("exp range", f"exp({show(x)}): a score difference beyond {EXP_ARG_LIMIT} (hint too poor)")
        return Fraction(1 << EXP_ARG_LIMIT)
    e = B.exp(B.num(x))
    return B.upper(e) if up else B.lower(e)


def subcubic_check(B, model, T, evidence, ob):
    """Confirm every claimed (m, q, c, cutoff) case of a subcubic certificate; return (count, how).

    Per case, all inputs with max m, query q, c non-query non-max tokens all <= cutoff j are correct when
    u Tm + rho (P - u) max(Smax, 0) + r Tq < 0 at both ends u of the max positions' weight range, where
    rho >= exp(-(EQKE[q,m] - max_{k<=j} EQKE[q,k])), Smax = EUp[q,m] + Rpre[m,j], r = e_q / alpha.
    """
    cfg = model.config
    n = cfg.n_ctx
    variant, x, y, cases = parse_subcubic(evidence, cfg)
    groups = parse_groups(evidence, cfg.d_vocab)
    with ob.step("subcubic value tables (mean+diff" + (f", {len(set(groups))} EU groups" if groups else "")
                 + ", top-2 per row)"):
        V = value_bounds(T, groups)
    with ob.step(f"attention scores ({variant})"):
        S = rank1_scores(B, T, x, y) if variant == "svd" else \
            rank2_scores(B, T, x, y) if variant == "svd2" else \
            deflated_scores(B, T, x, y) if variant == "svd-rec" else exact_scores(T)
    one, scale = Fraction(1, 1 << S["shift"]), S["shift"]
    pre_hi = prefix_max(S["ab_hi"])
    count = 0
    with ob.step(f"subcubic: {len(cases)} cases"):
        ratios, sums = {}, {}
        for (m, q, c), j in sorted(cases.items()):
            if q not in sums:
                sums[q] = position_sums(T, q)
            lo, hi, P_lo, P_hi = sums[q]
            Tm, Tq = V["Tm"][q, m], V["Tq"][q, m]
            if (q, m) not in ratios:        # r = exp(EQKE[q,q] - EQKE[q,m]) pw[q, n-1], bounded on Tq's side
                if q == m:
                    ratios[q, m] = Fraction(T["pw_hi"][q][n - 1] if Tq >= 0 else T["pw_lo"][q][n - 1])
                else:
                    eps = S["eps"][q]
                    d = (S["ab_hi"][q, q] - S["ab_lo"][q, m] + eps) if Tq >= 0 else \
                        (S["ab_lo"][q, q] - S["ab_hi"][q, m] - eps)
                    pw = T["pw_hi"][q][n - 1] if Tq >= 0 else T["pw_lo"][q][n - 1]
                    ratios[q, m] = exp_bound(B, d * one, Tq >= 0) * pw
            D = ratios[q, m] * Tq
            if c == 0:
                ok = (P_hi if Tm >= 0 else P_lo) * Tm + D < 0
            else:
                gap = (S["ab_lo"][q, m] - pre_hi[q, j] - S["eps"][q]) * one
                rho = exp_bound(B, -gap, True)
                Smax = max(V["EUp"][q, m] + V["Rpre"][m, j], 0)
                u_ends = (lo[n - 1 - c], hi[n - 1 - c])
                ok = all(u * Tm + rho * max(P_hi - u, 0) * Smax + D < 0 for u in u_ends)
            ob.require(ok, "subcubic case", f"max {m}, query {q}, {c} non-max copies <= {j}: not certainly "
                                            f"correct ({variant}, scores at 2^-{scale})")
            count += math.comb(n - 1, c) * (j + 1) ** c if c else 1
    return count, f"subcubic proof ({variant}{'+eu' if groups else ''})"


# ------------------------------------------------------------------------------------------------ entry

def check(model, claim, evidence, B, ob):
    """Verify an accuracy certificate."""
    require_maxofk(model)
    cfg = model.config
    N = parse_claim(claim, cfg)
    if not isinstance(evidence, dict) or "strategy" not in evidence:
        raise BadInput("evidence: missing field 'strategy'")
    strategy = evidence["strategy"]
    n, v = cfg.n_ctx, cfg.d_vocab
    if strategy == "brute":
        fields(evidence, "evidence", {"strategy"})
        if v ** n > MAX_BRUTE_INPUTS:
            raise BadInput(f"evidence: brute force over {v}^{n} inputs exceeds the limit {MAX_BRUTE_INPUTS}")
        with ob.step("rigorous tables (EQKE, EQKP, EU, EV, PV)"):
            T = value_tables(B, model)
        with ob.step(f"brute force over all {v ** n} inputs"):
            count = brute_count(T)
        how = "brute force"
    elif strategy == "cubic":
        fields(evidence, "evidence", {"strategy", "cases"})
        cases = parse_cases(evidence, n, v)
        with ob.step("rigorous tables (EQKE, EQKP, EU, EV, PV)"):
            T = value_tables(B, model)
        with ob.step(f"cubic: {len(cases)} pure-sequence cases"):
            count = cubic_check(T, cases, ob)
        how = "cubic proof"
    elif strategy == "subcubic":
        eqke = evidence.get("variant") == "exact-eqke"
        with ob.step("rigorous tables (EQKP, EU, EV, PV" + (", EQKE)" if eqke else ", Q, K)")):
            T = value_tables(B, model, eqke)
        count, how = subcubic_check(B, model, T, evidence, ob)
    else:
        raise BadInput(f"evidence.strategy: unknown strategy {str(strategy)[:30]!r}")
    ob.require(count >= N, "count", f"{how} certifies {count} correct inputs, fewer than the claimed {N}")
    ob.summary = (f"Max-of-{n} model is correct on >= {N} of {v ** n} inputs ({show(N / v ** n)}; "
                  f"{how} certifies {count})")
