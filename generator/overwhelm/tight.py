"""Generate `overwhelm` certificates with evidence method "tight" (checker/kinds/overwhelm/tight.py).

Float64 pipeline: the per-head tables of generator/overwhelm/tables.py (scores, fixed masses, centred values),
the fixed part F_j of logit_j - logit_k (from one float forward pass at a sample t0 minus the heads'
free terms there), the cheap bound per competitor, and for the competitors where it is not clearly
< 0 the exact per-head maximum by Dinkelbach's parametric search (`any`: per-position maxima; `perm`:
scipy's assignment solver). Each lambda is the exact maximum plus the smallest slack (2^-40 x scale,
grown 4x at a time) for which the inequality holds in floats against costs inflated entrywise by
2^-36 x b (unsigned magnitude of c + |lambda|), which bounds the float tables' rounding including
cancellation; lowering a lambda by 2^-10 relative makes it false (mutation tests). For perm sets
the separable bound of the relaxation "each position any of the multiset's tokens" is tried first; only
competitors it cannot settle get assignment duals (from scipy, made feasible against the float costs
plus a 2^-36 relative slack, with a 2^-48 pad that covers float rounding; the checker verifies exactly).
"""

from fractions import Fraction

import numpy as np

from tcert.checker.errors import BadInput
from tcert.checker.kinds.overwhelm.tables import MAX_TABLE_ENTRIES, supported, table_fits

from tcert.generator import certificate
from tcert.generator.model.forward import logits as forward_logits, residuals
from tcert.generator.overwhelm.assignment import float_repair, solve_assignment
from tcert.generator.overwhelm.claim import fixed_length_claim, free_set
from tcert.generator.overwhelm.tables import FloatModel, float_tables, round_down, round_up

SLACK = 2.0 ** -40        # first lambda slack (x the scale of c and lambda), grown 4x until the float check passes
COST_SLACK = 2.0 ** -36   # costs inflated by COST_SLACK x b (|c| magnitude + |lambda|) entrywise
CHEAP_MARGIN = 2.0 ** -20   # a cheap bound above -CHEAP_MARGIN * scale goes to the exact search


def inner_max(M, rows):
    """max over T of sum_i M[t_i, i] and the maximiser (token indices per free position)."""
    if rows is None:
        choice = M.argmax(axis=0)
    else:
        from scipy.optimize import linear_sum_assignment
        r, c = linear_sum_assignment(M[rows], maximize=True)
        choice = np.empty(len(rows), dtype=int)
        choice[c] = np.asarray(rows)[r]
    return float(M[choice, np.arange(M.shape[1])].sum()), choice


def dinkelbach(b, c, fix, rows, iters=200):
    """The exact max over T of R(t) = sum_i b[t_i, i] c[t_i] / (fix + sum_i b[t_i, i]) (float64)."""
    cols = np.arange(b.shape[1])
    choice = inner_max(b * c[:, None], rows)[1]
    if not fix + b[choice, cols].sum() > 0:   # sharp attention: this string's weights all underflow
        choice = inner_max(b, rows)[1]
    lam = -np.inf
    for _ in range(iters):
        bb = b[choice, cols]
        if not fix + bb.sum() > 0:   # R is a convex combination of c (and 0 for the fixed side)
            return lam if lam > -np.inf else max(float(c.max()), 0.0)
        new = float((bb * c[choice]).sum() / (fix + bb.sum()))
        if new <= lam:
            break
        lam = new
        choice = inner_max(b * (c[:, None] - lam), rows)[1]
    return lam


def certified_lambda(b, cj, mag, fix, rows):
    """(lambda, duals or None): the exact max plus the smallest slack (grown 4x at a time) for which the
    inequality holds in floats against costs inflated entrywise by COST_SLACK x b (mag + |lambda|);
    mag[t] >= |c(t)| is the unsigned magnitude ((|v_t| + |u|) @ |W_O| @ |d|) that bounds the float error
    of c (cancellation included), so the inflated costs exceed the checker's exact upper enclosures."""
    lam0 = dinkelbach(b, cj, fix, rows)
    delta = SLACK * (1.0 + mag.max() + abs(lam0))
    for _ in range(80):
        lam = round_up(Fraction(lam0 + delta))
        bound = b * (cj[:, None] - lam) + COST_SLACK * b * (mag[:, None] + abs(lam))
        if rows is None:
            total, duals = -lam * fix + bound.max(axis=0).sum(), None
        else:
            bound = bound[rows]
            u, v = float_repair(bound, solve_assignment(bound, "max")[2])
            total = -lam * fix + u.sum() + v.sum()
            duals = {"u": [certificate.num(float(x)) for x in u], "v": [certificate.num(float(x)) for x in v]}
        if total < -2.0 ** -40 * (1.0 + abs(lam) * fix + np.abs(bound).max() * len(b[0])):
            return lam, duals
        delta *= 4
    return lam, duals


def exact_lambdas(bs, cs, mags, alpha_fix, rows):
    """Per head the certified lambda and, for rows (perm), the duals; rows None: the separable bound
    (`any`, or perm relaxed to any of the multiset's tokens)."""
    lams, duals = [], ([] if rows is not None else None)
    for b, cj, mag, fix in zip(bs, cs, mags, alpha_fix):
        lam, d = certified_lambda(b, cj, mag, fix, rows)
        lams.append(lam)
        if rows is not None:
            duals.append(d)
    return lams, duals


def final_ln_directions(model, Wd):
    """u_jk = P (w * (W_U[:, j] - W_U[:, k])) as the columns of P diag(w) Wd (float64)."""
    d = model.config.d_model
    w = np.asarray(model.tensors["ln_final.w"], np.float64)
    return ((np.eye(d) - 1.0 / d) * w[None, :]) @ Wd


def final_ln_hints(model, fm, tables, prefix, query, t0, k, D, heads, rows):
    """Float pieces of the final-LN argument (checker/kinds/overwhelm/final_ln.py) as a FloatGap.

    F_j = f . u_jk is the fixed part (D's columns are u_jk), e_j the offset; f is the sample's residual
    minus the heads' free terms at the sample. sigma_hi from |P f|, the spread S and Dinkelbach lambdas
    for the cross term (direction P f); sigma_lo from the hint g = P r0 with Dinkelbach lambdas for the
    direction -P g; both rounded with slack."""
    c, t = model.config, model.tensors
    Wd = fm.WU - fm.WU[:, [k]]
    bU = np.asarray(t["unembed.b_U"], np.float64)
    r0 = residuals(model, np.asarray(list(prefix) + list(t0) + [query]))[-1][-1]
    f = r0 - heads.R0vec
    e = np.asarray(t["ln_final.b"], np.float64) @ Wd + bU - bU[k]

    def head_lambdas(y):
        """Certified per-head lambdas (and perm duals) for the residual direction y."""
        mags = [(np.abs(tables["values"][h] + tables["u"][h]) + np.abs(tables["u"][h])) @ np.abs(fm.WO[h]) @ np.abs(y)
                for h in range(c.n_heads)]
        return exact_lambdas(heads.b, [R @ y for R in heads.evo], mags, heads.alpha_fix, rows)

    cross = head_lambdas(centred(f))
    s_hi = float_sigma_hi(c, f, heads, cross[0])
    g = centred(r0)
    # perm: always the assignment bound (the relaxation "any of the multiset's tokens" is much weaker here;
    # on the shipped example sigma_lo 1.71 against 4.41, true minimum 4.52)
    variance = head_lambdas(-centred(g))
    s_lo = float_sigma_lo(c, f, g, variance[0])
    entry = {"variance_direction": [certificate.num(float(x)) for x in g], "variance": lambda_entry(*variance),
             "cross_term": lambda_entry(*cross), "sigma_lo": certificate.num(s_lo), "sigma_hi": certificate.num(s_hi)}
    return FloatGap(f @ D, e, s_lo, s_hi, entry)


def centred(x):
    """x minus its mean over the last axis (the final LN's centring P)."""
    return x - x.mean(axis=-1, keepdims=True)


def float_sigma_hi(c, f, heads, cross: list) -> float:
    """sigma_hi: |P r|^2 <= min((|Pf| + S)^2, |Pf|^2 + 2 sum(cross lambdas) + S^2), inflated for the
    checker's rounding, then sqrt(. / d + eps) rounded up with slack."""
    Pf = centred(f)
    S = sum(bmax * np.linalg.norm(centred(R), axis=1).max() for (_, bmax), R in zip(heads.betas, heads.evo))
    pf2, lam = float(Pf @ Pf), sum(cross)
    N2 = min((np.sqrt(pf2) + S) ** 2, pf2 + 2 * lam + S * S) + 2.0 ** -30 * (pf2 + 2 * sum(map(abs, cross)) + S * S)
    return round_up(Fraction(float(np.sqrt(max(N2, 0.0) / c.d_model + float(c.eps))) * (1 + 2.0 ** -30)))


def float_sigma_lo(c, f, g, lams: list) -> float:
    """sigma_lo from the hint direction v = P g: m = v . f - sum lambdas (less slack) bounds min v . r, and
    sigma^2 >= eps + max(m, 0)^2 / (d |v|^2), rounded down with slack."""
    v = centred(g)
    m = float(v @ f) - sum(lams)
    m -= 2.0 ** -30 * (np.linalg.norm(v) * np.linalg.norm(f) + sum(abs(x) for x in lams))
    vv = float(v @ v)
    s_lo2 = float(c.eps) + (m * m / (c.d_model * vv) if m > 0 and vv > 0 else 0.0)
    return round_down(Fraction(float(np.sqrt(s_lo2)) * (1 - 2.0 ** -40)))


def lambda_entry(lams: list, duals) -> dict:
    """A {lambdas[, duals]} evidence entry."""
    out = {"lambdas": [certificate.num(x) for x in lams]}
    if duals is not None:
        out["duals"] = duals
    return out


def generate_tight(model, prefix, query, free_spec, force=False, relax=True, exact_all=False):
    """Build a tight overwhelm certificate. Returns (cert or None, report dict).

    Test levers: relax=False gives every exact perm competitor assignment duals; exact_all=True sends
    every competitor to the exact bound (not only those the cheap bound cannot settle)."""
    c = model.config
    supported(c)
    kind, n_free, multiset = free_set(free_spec)
    allowed = list(range(c.d_vocab)) if multiset is None else sorted(set(multiset))
    if not table_fits(c, len(allowed)):
        raise BadInput(f"tight: the value table would exceed {MAX_TABLE_ENTRIES} entries")
    fm = FloatModel(model)
    tables = float_tables(fm, prefix, query, allowed, n_free)
    t0 = list(multiset) if multiset is not None else [query] * n_free
    lg = forward_logits(model, np.asarray([list(prefix) + t0 + [query]]))[0]
    k = int(np.argmax(lg))
    Wd = fm.WU - fm.WU[:, [k]]
    D = final_ln_directions(model, Wd) if c.final_ln else Wd
    heads = FloatHeads(fm, tables, D, [allowed.index(t) for t in t0])
    rows = None if multiset is None else [allowed.index(t) for t in multiset]
    if c.final_ln:   # logit_j - logit_k = (u_jk . r)/sigma + e_j, u_jk . r = F_j + sum_h R_hj
        gap = final_ln_hints(model, fm, tables, prefix, query, t0, k, D, heads, rows)
    else:            # fixed part of logit_j - logit_k: the sample's gap minus the heads' free terms there
        gap = FloatGap((lg - lg[k]) - heads.R0, np.zeros(c.d_vocab), 1.0, 1.0, None)
    cheap = gap.decide(cheap_linear_part(gap.F, heads))
    scale = 1.0 + np.abs(gap.F) / gap.s_lo + np.abs(gap.e)
    exact_js = [j for j in range(c.d_vocab) if j != k and (exact_all or cheap[j] >= -CHEAP_MARGIN * scale[j])]
    exact, bound = exact_entries(fm, tables, heads, gap, exact_js, rows, relax, scale, D, cheap, k)
    worst_j = int(np.argmax(bound))
    verdict = "Overwhelmed" if bound[worst_j] < 0 else "Inconclusive"
    report = {"verdict": verdict, "predicted": k, "method": "tight", "n_fix": len(prefix), "n_free": n_free,
              "exact_competitors": len(exact), "competitors": c.d_vocab - 1,
              "worst_bound": float(bound[worst_j]), "worst_competitor": worst_j,
              "worst_cheap": float(np.max(np.delete(cheap, k))) if c.d_vocab > 1 else float("-inf")}
    if gap.entry is not None:
        report["sigma"] = (float(gap.s_lo), float(gap.s_hi))
    if verdict != "Overwhelmed" and not force:
        return None, report
    evidence = {"method": "tight", "exact": exact}
    if gap.entry is not None:
        evidence["final_ln"] = gap.entry
    info = {"verdict": verdict, "worst_bound_float": report["worst_bound"], "exact_competitors": len(exact)}
    claim = fixed_length_claim(prefix, query, k, n_free, multiset)
    return certificate.envelope("overwhelm", model, claim, evidence, info), report


class FloatHeads:
    """Per head (float64): the free weights b = exp(score - l_q) (allowed x n_free), the centred EVO rows
    (x_t - u_h) W_O^h (allowed x d_model), their products C with the logit directions D (centred EVOU
    differences), the naive betas; and the heads' free terms at the sample t0 (R0 in the logit directions,
    R0vec in the residual stream)."""

    def __init__(self, fm, tables, D, idx0: list):
        c = fm.c
        self.b, self.evo, self.C, self.betas = [], [], [], []
        self.R0, self.R0vec = np.zeros(c.d_vocab), np.zeros(c.d_model)
        self.alpha_fix = []
        n_free = tables["S"].shape[2]
        for h in range(c.n_heads):
            # R and the sign of each Dinkelbach inequality are unchanged when b and alpha_fix share a positive
            # factor: past e^600 both are taken relative to the largest of them (finite; sharp attention)
            rel = tables["S"][h] - tables["lq"][h]
            shift = max(float(tables["log_alpha_fix"][h]), float(rel.max()))
            shift = shift if shift > 600 else 0.0
            b = np.exp(rel - shift)                                      # (allowed, n_free)
            evo = tables["values"][h] @ fm.WO[h]                         # (allowed, d_model)
            fix = float(tables["alpha_fix"][h]) if shift == 0 else float(np.exp(tables["log_alpha_fix"][h] - shift))
            self.alpha_fix.append(fix)
            amin, amax = b.min(axis=0).sum(), b.max(axis=0).sum()
            self.betas.append((amin / (fix + amin) if fix + amin > 0 else 0.0, amax / (fix + amax)))
            b0, fix0 = b[idx0, np.arange(n_free)], fix
            if shift:   # the sample's own weights relative to their largest (the shifted ones may all be 0)
                logs = rel[idx0, np.arange(n_free)]
                top = max(float(tables["log_alpha_fix"][h]), float(logs.max()))
                b0, fix0 = np.exp(logs - top), float(np.exp(tables["log_alpha_fix"][h] - top))
            C = evo @ D                                                  # (allowed, d_vocab)
            self.R0 += (b0[:, None] * C[idx0]).sum(axis=0) / (fix0 + b0.sum())
            self.R0vec += (b0[:, None] * evo[idx0]).sum(axis=0) / (fix0 + b0.sum())
            self.b.append(b)
            self.evo.append(evo)
            self.C.append(C)


class FloatGap:
    """logit_j - logit_k in floats: the fixed parts F_j, offsets e_j, the sigma range (1, 1 without a final
    LN) and the final_ln evidence entry (None without one)."""

    def __init__(self, F, e, s_lo, s_hi, entry):
        self.F, self.e, self.s_lo, self.s_hi, self.entry = F, e, s_lo, s_hi, entry

    def decide(self, U, j=slice(None)):
        """Float bound on logit_j - logit_k from an upper bound U of the linear part (checker's rule)."""
        return np.maximum(U / self.s_lo, U / self.s_hi) + self.e[j]


def cheap_linear_part(F, heads: FloatHeads):
    """The cheap upper bound of every competitor's linear part: F_j + sum_h top_h(max_t c_hj(t))."""
    cheapU = F.copy()
    for (bmin, bmax), C in zip(heads.betas, heads.C):
        hi = C.max(axis=0)
        cheapU += np.where(hi >= 0, bmax * hi, bmin * hi)
    return cheapU


def exact_entries(fm, tables, heads: FloatHeads, gap: FloatGap, exact_js, rows, relax, scale, D, cheap, k):
    """(evidence.exact entries, float bound per competitor): for each competitor in exact_js the certified
    per-head lambdas (perm: the separable relaxation first when `relax`, assignment duals if it is not
    clearly enough); every other competitor keeps its cheap bound."""
    exact, bound = [], cheap.copy()
    bound[k] = -np.inf
    absD = np.abs(D[:, exact_js])
    # unsigned magnitudes of c = (v_t - u) W_O d: |v_t| + |u|, not |v_t - u| (which may cancel to ~0)
    mags = [(np.abs(tables["values"][h] + tables["u"][h]) + np.abs(tables["u"][h])) @ np.abs(fm.WO[h]) @ absD
            for h in range(fm.c.n_heads)]
    for n, j in enumerate(exact_js):
        cs, ms = [C[:, j] for C in heads.C], [mg[:, n] for mg in mags]
        lams, duals = exact_lambdas(heads.b, cs, ms, heads.alpha_fix, None)
        if rows is not None and (not relax or gap.decide(gap.F[j] + sum(lams), j) >= -CHEAP_MARGIN * scale[j]):
            lams, duals = exact_lambdas(heads.b, cs, ms, heads.alpha_fix, rows)
        entry = {"competitor": j, "lambdas": [certificate.num(x) for x in lams]}
        if duals is not None:
            entry["duals"] = duals
        exact.append(entry)
        bound[j] = gap.decide(gap.F[j] + sum(lams), j)
    return exact, bound


def format_report(r) -> str:
    """Human-readable summary of a tight run."""
    return (f"{r['verdict']}: max_j bound(logit_j - logit_k) <= {r['worst_bound']:.6g} (competitor "
            f"{r['worst_competitor']}; cheap bound alone {r['worst_cheap']:.6g})\n"
            f"  n_fix {r['n_fix']}, n_free {r['n_free']}, method tight; predicted token {r['predicted']}; "
            f"{r['exact_competitors']} of {r['competitors']} competitors needed the exact per-head bound"
            + (f"; final LN sigma in [{r['sigma'][0]:.6g}, {r['sigma'][1]:.6g}]" if "sigma" in r else ""))
