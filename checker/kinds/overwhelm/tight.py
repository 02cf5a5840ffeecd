"""`overwhelm` evidence method "tight": competitor-wise bounds, exact per head (Dinkelbach).

Same setting and notation as `tcert.checker.kinds.overwhelm.bounds` (read its docstring). For the claimed token k
and a competitor j let d = W_U[:, j] - W_U[:, k]. Everything at the last position except the heads'
free-token terms depends on q alone, so

    logit_j - logit_k = F_j + sum_h R_hj(t),     R_hj(t) = sum_i b_hi(t_i) c_hj(t_i) / (alpha_fix_h + sum_i b_hi(t_i))

with F_j = (E[q] + b_O + sum_h (b_V^h + u_h) W_O^h + MLP(LN(E[q]))) . d + b_U[j] - b_U[k] (the fixed
part), b_hi(t) = exp(l_h(t at free position i) - l_q) > 0 and c_hj(t) = (x_t - u_h) W_O^h d (the
value of t relative to the fixed positions' mean u_h; its numerator has no fixed term: A = 0).

Exact per head (Dinkelbach): since the denominator is > 0, R_hj(t) <= lambda for every t in T iff
    g(lambda) = -lambda alpha_fix + max_t sum_i b_hi(t_i) (c_hj(t_i) - lambda) <= 0.
For `any` the max separates by position (max over tokens per column); for `perm` it is an assignment
problem, bounded above by any dual (u, v) with u_r + v_c >= cost(r, c) (weak duality, checked in exact
rationals against upper enclosures of the costs). The certificate gives lambda (and duals) per head
for the competitors listed in `evidence.exact`; every other competitor must pass the cheap bound
    F_j + sum_h top_h(max_t c_hj(t)),   top_h(x) = beta_max x if x >= 0 else beta_min x
(beta from the naive free-mass bounds: R = beta * weighted mean of c with beta in [beta_min, beta_max]).
Overwhelmed: every competitor's bound (cheap, or F_j + sum_h lambda_hj) is < 0. Heads share the free
tokens, so summing per-head maxima is a (sound) relaxation.

With a final LayerNorm (evidence.final_ln, checker/kinds/overwhelm/final_ln.py) the same bounds run on the
residual rows transformed by P diag(w) and give U_j >= max over T of the linear part; each competitor
then needs max(U_j/sigma_lo, U_j/sigma_hi) + e_j < 0 (the cheap bound too), with sigma_lo/sigma_hi
confirmed first.
"""

from fractions import Fraction

import numpy as np

from tcert.checker.kinds.overwhelm import bounds as ob_bounds
from tcert.checker.kinds.overwhelm import final_ln as final_ln
from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.numbers import parse_int, parse_number
from tcert.checker.forward import Weights, layer_norm, mlp
from tcert.checker.numbers import show


def parse_head_bounds(e, where: str, cfg, perm: bool, n_free: int):
    """{"lambdas": [per head][, "duals": [per head {u, v}] (perm only)]} -> (lambdas, duals or None)."""
    lams = e["lambdas"]
    if not isinstance(lams, list) or len(lams) != cfg.n_heads:
        raise BadInput(f"{where}.lambdas: must list {cfg.n_heads} numbers (one per head)")
    lams = [parse_number(x, f"{where}.lambdas[{h}]") for h, x in enumerate(lams)]
    duals = None
    if perm and "duals" in e:   # without duals: the separable bound over the multiset's tokens
        d = e["duals"]
        if not isinstance(d, list) or len(d) != cfg.n_heads:
            raise BadInput(f"{where}.duals: must list {cfg.n_heads} dual pairs (one per head)")
        duals = []
        for h, uv in enumerate(d):
            fields(uv, f"{where}.duals[{h}]", {"u", "v"})
            pair = []
            for vec in ("u", "v"):
                xs = uv[vec]
                if not isinstance(xs, list) or len(xs) != n_free:
                    raise BadInput(f"{where}.duals[{h}].{vec}: must list {n_free} exact numbers")
                pair.append([parse_number(x, f"{where}.duals[{h}].{vec}[{i}]") for i, x in enumerate(xs)])
            duals.append(pair)
    elif "duals" in e:
        raise BadInput(f"{where}.duals: only for a perm free set")
    return lams, duals


def parse_exact(evidence, cfg, k: int, perm: bool, n_free: int) -> dict:
    """evidence.exact -> {competitor j: (lambdas per head, duals per head or None)}."""
    fields(evidence, "evidence", {"method", "exact"}, {"final_ln"})
    raw = evidence["exact"]
    if not isinstance(raw, list):
        raise BadInput("evidence.exact: must be a list of {competitor, lambdas[, duals]}")
    out = {}
    for n, e in enumerate(raw):
        where = f"evidence.exact[{n}]"
        fields(e, where, {"competitor", "lambdas"}, {"duals"})
        j = parse_int(e["competitor"], where + ".competitor", 0, cfg.d_vocab - 1)
        if j == k or j in out:
            raise BadInput(f"{where}.competitor: {j} is the claimed token or listed twice")
        out[j] = parse_head_bounds(e, where, cfg, perm, n_free)
    return out


def parse_final_ln(evidence, cfg, perm: bool, n_free: int):
    """evidence.final_ln (present iff the model has a final LN) -> tcert.checker.kinds.overwhelm.final_ln.parse's dict
    with "variance" and "cross_term" replaced by (lambdas, duals or None); None without a final LN."""
    if cfg.final_ln != ("final_ln" in evidence):
        raise BadInput("evidence.final_ln: required exactly when the model has a final LayerNorm "
                       f"(final_ln = {cfg.final_ln})")
    if not cfg.final_ln:
        return None
    fl = final_ln.parse(evidence["final_ln"], cfg)
    for key in ("variance", "cross_term"):
        where = f"evidence.final_ln.{key}"
        fields(fl[key], where, {"lambdas"}, {"duals"})
        fl[key] = parse_head_bounds(fl[key], where, cfg, perm, n_free)
    return fl


def diff_unembed(B, model, k: int, cols: list):
    """The interval matrix W_U[:, cols] - W_U[:, k] (d_model x len(cols)), built with matrix operations."""
    WU = model.tensors["unembed.W_U"]
    outer = B.array(WU[:, [k]]) @ B.array(np.ones((1, len(cols)), dtype=np.float64))
    return B.array(WU[:, cols]) - outer


def fixed_residual(B, model, W, heads, query: int):
    """The fixed part f of the last position's residual (1 x d_model): E[q] + b_O + sum_h (b_V^h + u_h) W_O^h
    + MLP(ln2(E[q])) (parallel MLP: it reads the query's own embedding only)."""
    cfg = model.config
    pre = "blocks.0.attn."
    x = B.array(model.tensors["embed.W_E"][[query]]) + W.mat(pre + "b_O")
    for h, hd in enumerate(heads):
        uv = B.matrix([[a + b for a, b in zip(hd.u, W.vec(pre + "b_V", h))]])
        x = x + uv @ W.mat(pre + "W_O", h)
    if not cfg.attn_only:
        ln2 = ("blocks.0.ln1" if cfg.shared_ln else "blocks.0.ln2") if cfg.has_ln else None
        x = x + mlp(B, W, cfg, 0, layer_norm(B, B.array(model.tensors["embed.W_E"][[query]]), W, ln2, cfg.eps))
    return x


def tables(B, model, W, heads, allowed: list, n_free: int):
    """Per head: b[t][i] = exp(score of allowed token t at free position i - l_q) (intervals) and the rows
    (x_t - u_h) W_O^h (allowed x d_model); also all heads' rows stacked ((heads * allowed) x d_model)."""
    cfg = model.config
    pre, dh = "blocks.0.attn.", cfg.d_head
    X = ob_bounds.ln_rows(B, model, W, allowed)
    V = (X @ W.heads_concat(pre + "W_V")).rows()
    b, Ps = [], []
    for h, hd in enumerate(heads):
        S = (X @ hd.qcols).rows()
        b.append([[B.exp(s + c - hd.lq) for s, c in zip(row, hd.bias)] for row in S])
        vals = B.matrix([[x - m for x, m in zip(row[h * dh:(h + 1) * dh], hd.u)] for row in V])
        Ps.append(vals @ W.mat(pre + "W_O", h))
    return b, Ps, B.matrix([r for Ph in Ps for r in Ph.rows()])


def beta_bounds(B, hd, b: list):
    """(beta_min, beta_max) from the naive free-mass bounds (per-column extremes over allowed tokens)."""
    cols = list(zip(*b))
    amin = sum((min(B.lower(x) for x in col) for col in cols), Fraction(0))
    amax = sum((max(B.upper(x) for x in col) for col in cols), Fraction(0))
    return ob_bounds.betas(B, hd, max(amin, Fraction(0)), amax)


def top(beta, x: Fraction) -> Fraction:
    """Upper bound of beta' * x over beta' in [beta_min, beta_max] (beta_min >= 0)."""
    return beta[1] * x if x >= 0 else beta[0] * x


def dinkelbach(B, hd, b: list, c: list, lam: Fraction, rows, duals, name: str) -> None:
    """The one-pass inequality -lam alpha_fix + max_t sum_i b_i(t_i) (c(t_i) - lam) <= 0 for a perm set,
    with the assignment maximum bounded by the duals (u, v) (weak duality, exact rationals).

    `c` are the enclosures of c_hj(t) per allowed token, `rows` the allowed-token index of each multiset
    entry; cost(r, i) is the upper endpoint of b_i(t_r) (c(t_r) - lam)."""
    L = B.num(lam)
    u, v = duals
    for r, t in enumerate(rows):
        for i, e in enumerate(b[t]):
            x = B.upper(e * (c[t] - L))
            if u[r] + v[i] < x:
                raise Rejected(f"{name}: dual feasibility",
                               f"u[{r}] + v[{i}] = {show(u[r] + v[i])} is below the cost bound {show(x)}")
    total = B.upper(-L * hd.alpha_fix) + sum(u) + sum(v)
    if total > 0:
        raise Rejected(f"{name}: Dinkelbach inequality",
                       f"lambda {show(lam)} gives -lambda*alpha_fix + max sum (a - lambda b) <= {show(total)} > 0")


def separable_batch(B, hd, b: list, C, lams: list, js: list, h: int, what: str = "competitor") -> None:
    """The Dinkelbach inequality without duals for many competitors js of head h at once (`what` names
    them in messages: "competitor" j, or the final LN's "variance direction").

    C[t][n] encloses c_hj(t) for j = js[n]. The costs b_i(t) (c(t) - lambda_j) form one interval matrix
    K = blk @ C - bcol @ lambda with rows (i, t) (blk[(i, t), s] = b_i(t) if s = t else 0, bcol = b_i(t)),
    an enclosure of the same reals as the scalar rule; its column maxima per block i are the per-column
    maxima over tokens, so the check is upper(-lambda_j alpha_fix) + sum_i max_t upper(K) <= 0."""
    na, n_free = len(b), len(b[0])
    zero = B.num(0)
    blk = B.matrix([[b[t][i] if s == t else zero for s in range(na)] for i in range(n_free) for t in range(na)])
    bcol = B.matrix([[b[t][i]] for i in range(n_free) for t in range(na)])
    L = [B.num(x) for x in lams]
    his = [hi for _, hi in (blk @ C - bcol @ B.matrix([L])).col_bounds(n_free)]
    for n, j in enumerate(js):
        total = B.upper(-L[n] * hd.alpha_fix) + sum(hi[n] for hi in his)
        if total > 0:
            raise Rejected(f"overwhelm tight: head {h}, {what} {j}: Dinkelbach inequality",
                           f"lambda {show(lams[n])} gives -lambda*alpha_fix + max sum (a - lambda b) <= {show(total)} > 0")


def direction_bound(B, heads, b, Ps, col, bounds, rows, name: str) -> Fraction:
    """sum_h lambda_h >= max over T of sum_h R_h(t) . y for a residual direction y (col: d_model x 1), each
    lambda_h checked by the Dinkelbach inequality with c_h(t) = P_h(t) . y (duals for perm if given)."""
    lams, duals = bounds
    for h, hd in enumerate(heads):
        C = Ps[h] @ col
        if duals is None:
            separable_batch(B, hd, b[h], C, [lams[h]], [name], h, "final LN direction")
        else:
            dinkelbach(B, hd, b[h], [r[0] for r in C.rows()], lams[h], rows, duals[h],
                       f"overwhelm tight: head {h}, final LN direction {name}")
    return sum(lams)


def variance_bound(B, heads, b, Ps, f, fl, rows) -> Fraction:
    """m <= min over T of v . r for the final LN's direction v = P g: the exact per-head bound (lambdas,
    duals for perm if given) on the direction -v, m = -(upper(-v . f) + sum_h lambda_h)."""
    v, _ = final_ln.centred_direction(fl["g"])
    col = B.matrix([[B.num(-x)] for x in v])
    return -(B.upper((f @ col).rows()[0][0]) + direction_bound(B, heads, b, Ps, col, fl["variance"], rows, "-v"))


def check_tight(model, prefix, query, k, n_free, multiset, evidence, B, ob) -> None:
    """Verify a tight overwhelm certificate (claim already parsed by checker.kinds.overwhelm)."""
    cfg = model.config
    exact = parse_exact(evidence, cfg, k, multiset is not None, n_free)
    fl = parse_final_ln(evidence, cfg, multiset is not None, n_free)
    allowed = list(range(cfg.d_vocab)) if multiset is None else sorted(set(multiset))
    if len(allowed) * cfg.d_vocab * cfg.n_heads > ob_bounds.MAX_TABLE_ENTRIES:
        raise BadInput(f"overwhelm tight: the value table would exceed {ob_bounds.MAX_TABLE_ENTRIES} entries")
    W = Weights(B, model)
    H, na = cfg.n_heads, len(allowed)
    rows = None if multiset is None else [allowed.index(t) for t in multiset]
    with ob.step("scores, fixed masses, value means"):
        heads = ob_bounds.prepare(B, model, prefix, query, [], n_free, "table", (), W)
        b, Ps, P = tables(B, model, W, heads, allowed, n_free)
        beta = [beta_bounds(B, hd, bh) for hd, bh in zip(heads, b)]
    with ob.step("fixed part F_j"):
        Wd = diff_unembed(B, model, k, list(range(cfg.d_vocab)))
        f = fixed_residual(B, model, W, heads, query)
        if fl is None:   # logit_j - logit_k = F_j + sum_h R_hj: sigma = 1, e = 0
            bU = W.vec("unembed.b_U")
            fixed = [B.upper(x + bU[j] - bU[k]) for j, x in enumerate((f @ Wd).rows()[0])]
            offs, s_lo, s_hi, raw = [Fraction(0)] * cfg.d_vocab, Fraction(1), Fraction(1), Ps
        else:            # (u_jk . r)/sigma + e_jk with u_jk . r = (r T) . d_jk, T = P diag(w)
            T = final_ln.transform(B, W, cfg.d_model)
            fixed = [B.upper(x) for x in ((f @ T) @ Wd).rows()[0]]
            offs, s_lo, s_hi = final_ln.offsets(B, W, k, Wd), fl["sigma_lo"], fl["sigma_hi"]
            raw, Ps, P = Ps, [Ph @ T for Ph in Ps], P @ T
    if fl is not None:
        with ob.step("final LN: sigma upper bound"):
            Pf = f @ final_ln.centring(B, cfg.d_model)
            cross = direction_bound(B, heads, b, raw, Pf.T, fl["cross_term"], rows, "P f")
            final_ln.check_sigma_hi(B, cfg, Pf, raw, beta, cross, s_hi)
        with ob.step("final LN: sigma lower bound (variance direction)"):
            m = variance_bound(B, heads, b, raw, f, fl, rows)
            final_ln.check_sigma_lo(cfg, m, final_ln.centred_direction(fl["g"])[1], s_lo)

    def decide(U, j):
        """The bound on logit_j - logit_k from an upper bound U of its (final-LN-free) linear part."""
        return final_ln.decide(U, offs[j], s_lo, s_hi)

    with ob.step("cheap bound (value extremes x beta)"):
        C = P @ Wd
        cheap = [fixed[j] for j in range(cfg.d_vocab)]
        for h, (_, hi) in enumerate(C.col_bounds(H)):
            cheap = [x + top(beta[h], y) for x, y in zip(cheap, hi)]
        cheap = [decide(x, j) for j, x in enumerate(cheap)]
        failing = [j for j in range(cfg.d_vocab) if j != k and j not in exact and cheap[j] >= 0]
        if failing:
            j = failing[0]
            raise Rejected("overwhelm tight: cheap bound",
                           f"competitor {j} is not listed for the exact bound and its cheap bound "
                           f"{show(cheap[j])} is not < 0 ({len(failing)} such competitors)")
    worst = max((cheap[j] for j in range(cfg.d_vocab) if j != k and j not in exact), default=None)
    with ob.step(f"exact per-head bounds ({len(exact)} competitors)"):
        sel = sorted(exact)
        sep = [j for j in sel if exact[j][1] is None]
        dual = [j for j in sel if exact[j][1] is not None]
        Wsep = diff_unembed(B, model, k, sep) if sep else None
        Wdual = diff_unembed(B, model, k, dual) if dual else None
        for h, hd in enumerate(heads):
            if sep:
                separable_batch(B, hd, b[h], Ps[h] @ Wsep, [exact[j][0][h] for j in sep], sep, h)
            if dual:
                Cd = (Ps[h] @ Wdual).rows()
                for n, j in enumerate(dual):
                    dinkelbach(B, hd, b[h], [Cd[t][n] for t in range(na)], exact[j][0][h], rows, exact[j][1][h],
                               f"overwhelm tight: head {h}, competitor {j}")
        for j in sel:
            bound = decide(fixed[j] + sum(exact[j][0]), j)
            ob.require(bound < 0, "overwhelm tight: exact bound < 0",
                       f"competitor {j}: F_j + sum_h lambda_hj = {show(bound)} is not < 0" if fl is None else
                       f"competitor {j}: max over sigma in [sigma_lo, sigma_hi] of (F_j + sum_h lambda_hj)/sigma "
                       f"+ e_j = {show(bound)} is not < 0")
            worst = bound if worst is None else max(worst, bound)
    free = f"any string of {n_free} tokens" if multiset is None else f"every permutation of {n_free} tokens"
    fln = "" if fl is None else f"; final LN sigma in [{show(s_lo)}, {show(s_hi)}]"
    ob.summary = (f"for the {len(prefix)}-token prefix, query {query} and {free} in between, the next token "
                  f"is {k} (tight: max over competitors j of the bound on logit_j - logit_k <= {show(worst)}; "
                  f"{len(exact)} of {cfg.d_vocab - 1} competitors needed the exact per-head bound{fln})")
