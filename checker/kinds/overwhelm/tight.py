"""overwhelm method "tight": competitor-wise bounds, exact per head (Dinkelbach).

evidence {"method": "tight",
          "exact": [{"competitor": j, "lambdas": [per head], "duals": [per head {"u", "v"}] (perm only)}, ...],
          "final_ln": (exactly when the model has a final LayerNorm; see final_ln.py)}

Setting and notation of `tables` (read its docstring). For the claimed token k and a competitor j let
d_j = W_U[:, j] - W_U[:, k]. Everything at the last position except the heads' free-token terms depends
on q alone, so

    logit_j - logit_k = F_j + sum_h R_hj(t),     R_hj(t) = sum_i b_hi(t_i) c_hj(t_i) / (alpha_fix_h + sum_i b_hi(t_i))

with F_j = (E[q] + b_O + sum_h (b_V^h + u_h) W_O^h + MLP(LN(E[q]))) . d_j + b_U[j] - b_U[k] (the fixed
part), b_hi(t) = exp(l_h(t at free position i) - l_q) > 0 and c_hj(t) = EVO_h(t) . d_j, where
EVO_h(t) = (x_t - u_h) W_O^h is the centred EVO row of t (times W_U: its centred EVOU row), so c_hj(t)
is the difference of two centred EVOU entries (its numerator has no fixed term).

Exact per head (Dinkelbach): since the denominator is > 0, R_hj(t) <= lambda for every t in T iff
    g(lambda) = -lambda alpha_fix + max_t sum_i b_hi(t_i) (c_hj(t_i) - lambda) <= 0.
For `any` the max separates by position (max over tokens per column); for `perm` it is an assignment
problem, bounded above by any dual (u, v) with u_r + v_c >= cost(r, c) (weak duality, checked in exact
rationals against upper enclosures of the costs by `tcert.checker.assignment`). The certificate gives
lambda (and duals) per head for the competitors listed in `evidence.exact`; every other competitor must
pass the cheap bound
    F_j + sum_h top_h(max_t c_hj(t)),   top_h(x) = beta_max x if x >= 0 else beta_min x
(beta from the naive free-mass bounds: R = beta * weighted mean of c with beta in [beta_min, beta_max]).
Overwhelmed: every competitor's bound (cheap, or F_j + sum_h lambda_hj) is < 0. Heads share the free
tokens, so summing per-head maxima is a (sound) relaxation.

With a final LayerNorm (evidence.final_ln, final_ln.py) the same bounds run on the residual rows
transformed by M_w = P diag(w) and give U_j >= max over T of the linear part; each competitor then
needs max(U_j/sigma_lo, U_j/sigma_hi) + e_j < 0 (the cheap bound too), with sigma_lo/sigma_hi
confirmed first.
"""

import math
from collections import namedtuple
from fractions import Fraction

import numpy as np

from tcert.checker import exact_backend
from tcert.checker.assignment import assignment_bound, parse_duals
from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.forward import Weights, layer_norm, mlp
from tcert.checker.kinds.overwhelm import final_ln
from tcert.checker.kinds.overwhelm.claim import Place, Question
from tcert.checker.kinds.overwhelm.tables import (ATTN, MAX_TABLE_ENTRIES, HeadData, beta_bounds, fixed_side, ln_rows,
                                                  table_fits)
from tcert.checker.numbers import on_grid, parse_int, parse_vector, show


class TightTables(namedtuple("TightTables", "heads b evo evo_all beta rows")):
    """The hint-independent tables of method tight: per head the fixed side (HeadData without free
    extremes), the free weights b[h][t][i] = exp(score of allowed token t at free position i - l_q)
    (intervals), the centred EVO rows evo[h] (allowed x d_model), all heads' rows stacked (evo_all),
    the naive beta bounds, and `rows`, the allowed-token index of each multiset entry (None for any)."""


class LogitGap(namedtuple("LogitGap", "fixed offsets sigma_lo sigma_hi evo_all Wd f")):
    """logit_j - logit_k in terms of the free terms: the fixed parts F_j (upper bounds), the offsets e_j
    and sigma range (0 and [1, 1] without a final LN), the centred EVO rows of all heads (stacked) mapped
    to the space where their dot product with d_j is the linear part (times M_w with a final LN),
    W_U - W_U[:, k] (Wd) and the fixed residual f."""

    def bound(self, U: Fraction, j: int) -> Fraction:
        """The bound on logit_j - logit_k from an upper bound U of its linear part."""
        return final_ln.decide(U, self.offsets[j], self.sigma_lo, self.sigma_hi)


def check_tight(model, q: Question, evidence, B, ob, place: Place) -> None:
    """Verify tight evidence for one free length (claim already parsed); sets ob.summary."""
    cfg = model.config
    title = place.title("tight")
    exact = parse_exact(evidence, cfg, q, place.where)
    fl = parse_final_ln(evidence, cfg, q, place.where)
    if not table_fits(cfg, len(q.allowed(cfg.d_vocab))):
        raise BadInput(f"{title}: the centred EVOU table would exceed {MAX_TABLE_ENTRIES} entries")
    W = Weights(B, model)
    with ob.step(f"{title}: scores, fixed masses, value means"):
        tables = tight_tables(B, model, W, q)
    with ob.step(f"{title}: fixed part F_j"):
        gap = logit_gap(B, model, W, tables, q, fl)
    if fl is not None:
        check_sigma_range(B, cfg, tables, gap, fl, ob, title)
    worst = check_cheap_bound(B, model, tables, gap, exact, q.predicted, ob, title)
    check_lambdas(B, model, tables, gap, exact, q.predicted, ob, title)
    worst = check_exact_bounds(gap, exact, worst, fl is not None, ob, title)
    fln = "" if fl is None else f"; final LN sigma in [{show(gap.sigma_lo)}, {show(gap.sigma_hi)}]"
    ob.summary = (f"for the {len(q.prefix)}-token prefix, query {q.query} and {q.free_words()} in between, the next "
                  f"token is {q.predicted} (tight: max over competitors j of the bound on logit_j - logit_k <= "
                  f"{show(worst)}; {len(exact)} of {cfg.d_vocab - 1} competitors needed the exact per-head bound{fln})")


def parse_head_bounds(e, where: str, cfg, q: Question):
    """{"lambdas": [per head][, "duals": [per head {u, v}] (perm only)]} -> (lambdas, duals or None); the
    lambdas rounded up to the grid of `on_grid` (a larger lambda is checked and used: still sound)."""
    lams = [on_grid(x, True) for x in parse_vector(e["lambdas"], f"{where}.lambdas", cfg.n_heads, "n_heads")]
    if "duals" not in e:   # perm without duals: the separable bound over the multiset's tokens
        return lams, None
    if q.multiset is None:
        raise BadInput(f"{where}.duals: only for a perm free set")
    d = e["duals"]
    if not isinstance(d, list) or len(d) != cfg.n_heads:
        raise BadInput(f"{where}.duals: must list {cfg.n_heads} dual pairs (one per head)")
    return lams, [parse_duals(uv, f"{where}.duals[{h}]", q.n_free, "max") for h, uv in enumerate(d)]


def parse_exact(evidence, cfg, q: Question, where: str) -> dict:
    """evidence.exact -> {competitor j: (lambdas per head, duals per head or None)}."""
    fields(evidence, where, {"method", "exact"}, {"final_ln"})
    raw = evidence["exact"]
    if not isinstance(raw, list):
        raise BadInput(f"{where}.exact: must be a list of {{competitor, lambdas[, duals]}}")
    out = {}
    for n, e in enumerate(raw):
        at = f"{where}.exact[{n}]"
        fields(e, at, {"competitor", "lambdas"}, {"duals"})
        j = parse_int(e["competitor"], at + ".competitor", 0, cfg.d_vocab - 1)
        if j == q.predicted or j in out:
            raise BadInput(f"{at}.competitor: {j} is the claimed token or listed twice")
        out[j] = parse_head_bounds(e, at, cfg, q)
    return out


def parse_final_ln(evidence, cfg, q: Question, where: str):
    """evidence.final_ln (present iff the model has a final LN) -> final_ln.parse's dict with "variance"
    and "cross_term" replaced by (lambdas, duals or None); None without a final LN."""
    if cfg.final_ln != ("final_ln" in evidence):
        raise BadInput(f"{where}.final_ln: required exactly when the model has a final LayerNorm "
                       f"(final_ln = {cfg.final_ln})")
    if not cfg.final_ln:
        return None
    fl = final_ln.parse(evidence["final_ln"], cfg, f"{where}.final_ln")
    for key in ("variance", "cross_term"):
        fields(fl[key], f"{where}.final_ln.{key}", {"lambdas"}, {"duals"})
        fl[key] = parse_head_bounds(fl[key], f"{where}.final_ln.{key}", cfg, q)
    return fl


def tight_tables(B, model, W, q: Question) -> TightTables:
    """The fixed side, the free weights b, the centred EVO rows and the naive betas of every head."""
    allowed = q.allowed(model.config.d_vocab)
    dh = model.config.d_head
    heads = fixed_side(B, model, W, q.prefix, q.query, q.n_free)
    X = ln_rows(B, model, W, allowed)
    V = (X @ W.heads_concat(ATTN + "W_V")).rows()
    b, evo = [], []
    for h, hd in enumerate(heads):
        scores = X @ hd.score_cols
        shift = mass_shift(B, hd, scores)
        if shift:   # b and alpha_fix both times e^-shift: every ratio and Dinkelbach sign is unchanged
            heads[h] = hd = HeadData(hd.lq, hd.alpha_fix * B.exp(B.num(-shift)), hd.u, hd.score_cols, hd.score_bias)
        ref = hd.lq + shift if shift else hd.lq
        b.append([[B.exp(s + c - ref) for s, c in zip(row, hd.score_bias)] for row in scores.rows()])
        vals = B.matrix([[x - m for x, m in zip(row[h * dh:(h + 1) * dh], hd.u)] for row in V])
        evo.append(vals @ W.mat(ATTN + "W_O", h))
    beta = [naive_betas(B, hd, bh) for hd, bh in zip(heads, b)]
    rows = None if q.multiset is None else [allowed.index(t) for t in q.multiset]
    return TightTables(heads, b, evo, B.matrix([r for E in evo for r in E.rows()]), beta, rows)


def mass_shift(B, hd, scores) -> int:
    """0, or an integer r > 64 such that alpha_fix and every free weight b = exp(score - lq) are at most
    about e^r (`scores`: the free columns' scores before score_bias): past e^64 both are taken times e^-r,
    so that no exact endpoint of them exceeds the exact-number bound (sharp attention gives e^(1.6e6))."""
    top = max([B.upper(B.log(hd.alpha_fix))] +
              [hi + B.upper(c - hd.lq) for hi, c in zip(scores.col_bounds()[1], hd.score_bias)])
    return 0 if top <= 64 else math.ceil(top)


def naive_betas(B, hd, b: list):
    """(beta_min, beta_max) from the naive free-mass bounds (per-column extremes over allowed tokens)."""
    cols = list(zip(*b))
    amin = sum((min(B.lower(x) for x in col) for col in cols), Fraction(0))
    amax = sum((max(B.upper(x) for x in col) for col in cols), Fraction(0))
    return beta_bounds(B, hd, max(amin, Fraction(0)), amax)


def diff_unembed(B, model, k: int, cols: list):
    """W_U[:, cols] - W_U[:, k] (d_model x len(cols)): the exact point matrix of float64 differences when
    every one is exact (`exact_differences`), else an interval matrix built with matrix operations."""
    WU = model.tensors["unembed.W_U"]
    a, b = np.asarray(WU[:, cols], dtype=np.float64), np.asarray(WU[:, [k]], dtype=np.float64)
    if np.isfinite(a).all() and np.isfinite(b).all() and exact_backend.exact_differences(a, b, np.finfo(WU.dtype).nmant + 1):
        return B.array(a - b)
    outer = B.array(WU[:, [k]]) @ B.array(np.ones((1, len(cols)), dtype=np.float64))
    return B.array(WU[:, cols]) - outer


def fixed_residual(B, model, W, heads, query: int):
    """The fixed part f of the last position's residual (1 x d_model): E[q] + b_O + sum_h (b_V^h + u_h) W_O^h
    + MLP(ln2(E[q])) (parallel MLP: it reads the query's own embedding only)."""
    cfg = model.config
    x = B.array(model.tensors["embed.W_E"][[query]]) + W.mat(ATTN + "b_O")
    for h, hd in enumerate(heads):
        uv = B.matrix([[a + b for a, b in zip(hd.u, W.vec(ATTN + "b_V", h))]])
        x = x + uv @ W.mat(ATTN + "W_O", h)
    if not cfg.attn_only:
        ln2 = ("blocks.0.ln1" if cfg.shared_ln else "blocks.0.ln2") if cfg.has_ln else None
        x = x + mlp(B, W, cfg, 0, layer_norm(B, B.array(model.tensors["embed.W_E"][[query]]), W, ln2, cfg.eps))
    return x


def logit_gap(B, model, W, tables: TightTables, q: Question, fl) -> LogitGap:
    """The fixed parts F_j and how the free terms enter logit_j - logit_k (with a final LN: through
    M_w = P diag(w), (u_jk . r) = (r M_w) . d_j, the offsets e_j and the certificate's sigma range)."""
    cfg, k = model.config, q.predicted
    Wd = diff_unembed(B, model, k, list(range(cfg.d_vocab)))
    f = fixed_residual(B, model, W, tables.heads, q.query)
    if fl is None:   # logit_j - logit_k = F_j + sum_h R_hj: sigma = 1, e = 0
        bU = W.vec("unembed.b_U")
        fixed = [B.upper(x + bU[j] - bU[k]) for j, x in enumerate((f @ Wd).rows()[0])]
        return LogitGap(fixed, [Fraction(0)] * cfg.d_vocab, Fraction(1), Fraction(1), tables.evo_all, Wd, f)
    w = model.tensors["ln_final.w"]
    fixed = [B.upper(x) for x in (final_ln.centred(B, f, w) @ Wd).rows()[0]]
    return LogitGap(fixed, final_ln.offsets(B, W, k, Wd), fl["sigma_lo"], fl["sigma_hi"],
                    final_ln.centred(B, tables.evo_all, w), Wd, f)


def check_sigma_range(B, cfg, tables: TightTables, gap: LogitGap, fl: dict, ob, title: str) -> None:
    """The final LN's obligations (final_ln.py): sigma_hi >= sigma(r) and sigma_lo <= sigma(r) for every
    reachable residual r, each from a per-head Dinkelbach bound on one residual direction."""
    with ob.step(f"{title}: final LN cross term (direction P f)") as fig:
        Pf = final_ln.centred(B, gap.f)
        cross = direction_bound(B, tables, Pf.T, fl["cross_term"], "P f", ob)
        fig["max of P f . (r - f)"] = cross
    with ob.step(f"{title}: final LN sigma_hi") as fig:
        N2, pf2, S = final_ln.residual_sq_upper(B, cfg, Pf, tables.evo_all, tables.beta, cross)
        need, s_hi = N2 / cfg.d_model + cfg.eps, gap.sigma_hi
        fig["sigma^2 upper bound"] = need
        ob.require(s_hi > 0 and s_hi * s_hi >= need, f"sigma_hi = {show(s_hi)} is not > 0 with sigma_hi^2 >= "
                   f"max |P r|^2/d + eps = {show(need)} (|P r|^2 <= {show(N2)}: |P f|^2 <= {show(pf2)}, spread S = "
                   f"{show(S)}, cross term <= {show(cross)})")
    with ob.step(f"{title}: final LN variance term (direction -v)") as fig:
        v, vv = final_ln.centred_direction(fl["g"])
        col = B.matrix([[B.num(-x)] for x in v])
        m = -(B.upper((gap.f @ col).rows()[0][0]) + direction_bound(B, tables, col, fl["variance"], "-v", ob))
        fig["min of v . r"] = m
    with ob.step(f"{title}: final LN sigma_lo") as fig:
        low, s_lo = final_ln.sigma_sq_lower(cfg, m, vv), gap.sigma_lo
        fig["sigma^2 lower bound"] = low
        ob.require(s_lo > 0 and s_lo * s_lo <= low, f"sigma_lo = {show(s_lo)} is not > 0 with sigma_lo^2 <= eps + "
                   f"max(m, 0)^2/(d |v|^2) = {show(low)} (m = {show(m)}, the certified minimum of v . r over the designed set)")


def direction_bound(B, tables: TightTables, col, bounds, name: str, ob) -> Fraction:
    """sum_h lambda_h >= max over T of sum_h R_h(t) . y for a residual direction y (col: d_model x 1), each
    lambda_h checked by the Dinkelbach inequality with c_h(t) = EVO_h(t) . y (duals for perm if given)."""
    lams, duals = bounds
    for h, hd in enumerate(tables.heads):
        C = tables.evo[h] @ col
        label = f"head {h}, final LN direction {name}"
        if duals is None:
            excess = separable_excess(B, hd, tables.b[h], C, [lams[h]])[0]
        else:
            excess = assignment_excess(B, hd, tables.b[h], [r[0] for r in C.rows()], lams[h], tables.rows, duals[h], label)
        require_dinkelbach(ob, excess, lams[h], label)
    return sum(lams)


def top(beta, x: Fraction) -> Fraction:
    """Upper bound of beta' * x over beta' in [beta_min, beta_max] (beta_min >= 0)."""
    return beta[1] * x if x >= 0 else beta[0] * x


def check_cheap_bound(B, model, tables: TightTables, gap: LogitGap, exact: dict, k: int, ob, title: str):
    """Every competitor not listed for the exact bound passes the cheap bound (value extremes x beta);
    returns the worst of their bounds (None if every competitor is listed). Every competitor's bound comes
    first from the leading-digit screen (`screened_sums`); the full product (`product_bounds`) then runs
    on the columns of the competitors not listed whose screened bound is not < 0 or may be the worst
    (`near_worst`, so the figure is the product's), or on every column where the screen does not apply.
    Each competitor keeps the least of its certified bounds, so a rejection is the exact rule's."""
    V = model.config.d_vocab
    with ob.step(f"{title}: cheap bound") as fig:
        rest = [j for j in range(V) if j != k and j not in exact]
        screen = screened_sums(B, model.config, tables, gap)
        cheap = {} if screen is None else {j: gap.bound(gap.fixed[j] + s, j) for j, s in enumerate(screen[0])}
        cols = list(range(V)) if screen is None else near_worst(cheap, screen[1], rest)
        for j, bound in (product_bounds(B, model, tables, gap, k, cols, set(rest)) if cols else {}).items():
            cheap[j] = min(cheap[j], bound) if j in cheap else bound
        failing = [j for j in rest if cheap[j] >= 0]
        if failing:
            raise Rejected("", f"competitor {failing[0]} is not listed for the exact bound and its cheap bound "
                               f"{show(cheap[failing[0]])} is not < 0 ({len(failing)} such competitors)")
        worst = fig["worst cheap bound"] = max((cheap[j] for j in rest), default=None)
        fig["competitors by cheap bound"] = len(rest)
        fig["competitors by the full product"] = len(cols)
    return worst


def screened_sums(B, cfg, tables: TightTables, gap: LogitGap):
    """(sums, slack): per competitor j an upper bound (Fraction) of sum_h top(beta_h, max_t c_hj(t)) from
    the leading digits of the EVO rows and of W_U - W_U[:, k] (`exact_backend.leading_maxima`: max_t
    c_hj(t) <= P_hj + S_hj, S_hj >= 0), and a float estimate of how far its bound may lie above the full
    product's (2 sum_h beta_max_h S_hj / sigma_lo); None where the screen does not apply. top_h(x) =
    max(beta_min x, beta_max x) is nondecreasing and sublinear (a maximum of linear maps), so top(P + S)
    <= top(P) + top(S): the pairs enter `free_sums_upper` as single-part extremes (P, 0) and (S, 0) of the
    same head (for them q1 is the value, so its sign is the value's)."""
    screen = exact_backend.leading_maxima(gap.evo_all, gap.Wd, B, cfg.n_heads)
    if screen is None:
        return None
    zero = np.zeros(screen[0].shape[1])
    sums = free_sums_upper(B, tables.beta * 2, [(row, zero) for part in screen for row in part])
    with np.errstate(all="ignore"):     # an estimate only: inf or nan sends more columns to the product
        return sums, 2 * np.array([estimate(b) for _, b in tables.beta]) @ screen[1] / estimate(gap.sigma_lo)


def near_worst(cheap: dict, slack, rest: list) -> list:
    """The competitors in `rest` whose screened bound is not < 0 or within its slack of the worst one,
    chosen by float estimates: only the figure's tightness rests on the choice (every bound is certified)."""
    est = np.array([estimate(cheap[j]) for j in rest])
    if not est.size:
        return []
    with np.errstate(all="ignore"):
        floor = np.nan_to_num((est - slack[rest]).max(), nan=-np.inf)
        return [j for j, x in zip(rest, est) if not x < floor - 2.0 ** -20 * abs(floor) or x >= 0]


def estimate(x: Fraction) -> float:
    """x as a float for choosing work (never for a verdict); +-inf beyond the float range."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def product_bounds(B, model, tables: TightTables, gap: LogitGap, k: int, cols: list, rest: set) -> dict:
    """{j: cheap bound} for the competitors `cols` from the product of the EVO rows with their columns of
    W_U - W_U[:, k]: the free terms' sum from `free_sums_upper` where the extremes are float64 arrays; a
    competitor in `rest` whose bound from it is not < 0, and every one without it, gets the exact
    Fraction sum."""
    Wd = gap.Wd if len(cols) == model.config.d_vocab else diff_unembed(B, model, k, cols)
    his = [hi for _, hi in (gap.evo_all @ Wd).col_extremes(model.config.n_heads)]
    sums = free_sums_upper(B, tables.beta, his) if all(isinstance(hi, tuple) for hi in his) else None
    cheap = {} if sums is None else {j: gap.bound(gap.fixed[j] + s, j) for j, s in zip(cols, sums)}
    unsure = [n for n, j in enumerate(cols) if j in rest and cheap.get(j, 0) >= 0]
    if unsure:
        his = [exact_backend.fractions(hi) for hi in his]
        for n in unsure:
            cheap[cols[n]] = gap.bound(gap.fixed[cols[n]] + sum(top(b, hi[n]) for b, hi in zip(tables.beta, his)), cols[n])
    return cheap


def free_sums_upper(B, beta: list, his: list) -> list:
    """Per column j, an upper bound (Fraction) of sum_h top(beta_h, x_hj) for the upper extremes x_h in
    split form (float64 arrays (q1, q2), x = q1 + q2 exactly, q1 its ceiling: x > 0 iff q1 > 0), as one
    product: the interval row of beta_max / beta_min per head and part times the point matrix of the
    parts kept where x > 0 / x <= 0 (rows of zeros elsewhere), so no Fraction per head and column."""
    coef, rows = [], []
    for (b_min, b_max), (q1, q2) in zip(beta, his):
        pos = q1 > 0
        for b, keep in ((b_max, pos), (b_min, ~pos)):
            coef += [B.num(b)] * 2
            rows += [np.where(keep, q1, 0.0), np.where(keep, q2, 0.0)]
    return [B.upper(x) for x in (B.matrix([coef]) @ B.array(np.array(rows))).rows()[0]]


def check_lambdas(B, model, tables: TightTables, gap: LogitGap, exact: dict, k: int, ob, title: str) -> None:
    """Each listed competitor's lambdas pass the Dinkelbach inequality of every head: the separable
    bound for those without duals (one matrix product per head), the assignment duals for the rest (c_hj
    for all heads from one product of the stacked EVO rows)."""
    sel = sorted(exact)
    sep = [j for j in sel if exact[j][1] is None]
    dual = [j for j in sel if exact[j][1] is not None]
    with ob.step(f"{title}: Dinkelbach inequalities") as fig:
        fig["competitors by exact bound"], fig["competitors with assignment duals"] = len(sel), len(dual)
        Csep, Cdual = (head_blocks(gap.evo_all @ diff_unembed(B, model, k, js), len(tables.heads)) if js else None
                       for js in (sep, dual))
        for h, hd in enumerate(tables.heads):
            if sep:
                lams = [exact[j][0][h] for j in sep]
                for j, lam, excess in zip(sep, lams, separable_excess(B, hd, tables.b[h], B.matrix(Csep[h]), lams)):
                    require_dinkelbach(ob, excess, lam, f"head {h}, competitor {j}")
            if dual:
                Cd = Cdual[h]
                for n, j in enumerate(dual):
                    label, lam, c = f"head {h}, competitor {j}", exact[j][0][h], [row[n] for row in Cd]
                    excess = assignment_excess(B, hd, tables.b[h], c, lam, tables.rows, exact[j][1][h], label)
                    require_dinkelbach(ob, excess, lam, label)


def head_blocks(M, heads: int) -> list:
    """The rows of M (the heads' rows stacked, as evo_all) as one list of rows per head."""
    rows = M.rows()
    n = len(rows) // heads
    return [rows[h * n:(h + 1) * n] for h in range(heads)]


def check_exact_bounds(gap: LogitGap, exact: dict, worst, with_ln: bool, ob, title: str):
    """Every listed competitor's bound from its lambdas is < 0; returns the worst bound of all competitors."""
    with ob.step(f"{title}: exact bound < 0") as fig:
        rule = "max over sigma in [sigma_lo, sigma_hi] of (F_j + sum_h lambda_hj)/sigma + e_j" if with_ln else \
            "F_j + sum_h lambda_hj"
        for j in sorted(exact):
            bound = gap.bound(gap.fixed[j] + sum(exact[j][0]), j)
            ob.require(bound < 0, f"competitor {j}: {rule} = {show(bound)} is not < 0")
            worst = bound if worst is None else max(worst, bound)
        fig["worst bound"] = worst
    return worst


def separable_excess(B, hd, b: list, C, lams: list) -> list:
    """Upper bounds of g(lambda_n) = -lambda_n alpha_fix + max_t sum_i b_i(t_i) (c_n(t_i) - lambda_n) over
    every string of allowed tokens (the max separates by position), for many c_n at once.

    C[t][n] encloses c_n(t). The costs b_i(t) (c_n(t) - lambda_n) form one interval matrix
    K = blk @ C - bcol @ lambda with rows (i, t) (blk[(i, t), s] = b_i(t) if s = t else 0, bcol = b_i(t)),
    an enclosure of the same reals as the scalar rule; its column maxima per block i are the per-column
    maxima over tokens, so the bound is upper(-lambda_n alpha_fix) + sum_i max_t upper(K)."""
    na, n_free = len(b), len(b[0])
    zero = B.num(0)
    blk = B.matrix([[b[t][i] if s == t else zero for s in range(na)] for i in range(n_free) for t in range(na)])
    bcol = B.matrix([[b[t][i]] for i in range(n_free) for t in range(na)])
    lam_iv = [B.num(x) for x in lams]
    his = [hi for _, hi in (blk @ C - bcol @ B.matrix([lam_iv])).col_bounds(n_free)]
    return [B.upper(-lam_iv[n] * hd.alpha_fix) + sum(hi[n] for hi in his) for n in range(len(lams))]


def assignment_excess(B, hd, b: list, c: list, lam: Fraction, rows: list, duals, label: str) -> Fraction:
    """Upper bound of g(lambda) over the permutations of the multiset: the assignment maximum of
    cost(r, i) = upper(b_i(t_r) (c(t_r) - lambda)) bounded by the duals (weak duality, exact rationals).
    `c` encloses c(t) per allowed token, `rows` the allowed-token index of each multiset entry."""
    lam_iv = B.num(lam)
    costs = [[B.upper(e * (c[t] - lam_iv)) for e in b[t]] for t in rows]
    return B.upper(-lam_iv * hd.alpha_fix) + assignment_bound(*duals, costs, "max", label)


def require_dinkelbach(ob, excess: Fraction, lam: Fraction, label: str) -> None:
    """The Dinkelbach inequality g(lambda) <= 0, given a certified upper bound of g(lambda)."""
    ob.require(excess <= 0, f"{label}: lambda {show(lam)} gives -lambda*alpha_fix + max sum b (c - lambda) "
                            f"<= {show(excess)} > 0")
