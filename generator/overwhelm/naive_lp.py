"""Generate `overwhelm` certificates: float64 bounds (paper Algorithms 1-5), LP duals, exact hints.

The float pipeline mirrors `tcert.checker.kinds.overwhelm.bounds` step for step (see its docstring for the
argument). Hints come in two strengths:
- "float": numbers from the float64 pipeline with a relative safety slack of 2^-30 (LP duals repaired
  against float costs shrunk by that slack, deviation inflated, margin from the float gap) - fast, for
  big models;
- "tight": the generator runs the checker's own rigorous routines with BOTH interval backends and
  writes the duals/deviation/margin against the worse of the two enclosures, rounded outward to one
  double ulp - every hint is then tight to ~2^-50 relative (used for small models; the mutation tests
  rely on it).
"""

import math
from fractions import Fraction

import numpy as np

from tcert.checker.kinds.overwhelm import bounds as rb
from tcert.checker.errors import BadInput
from tcert.checker.numbers import parse_number
from tcert.checker.forward import Weights
from tcert.checker.interval import make_backend
from tcert.checker.kinds.prediction import logit_gaps

from tcert.generator import certificate
from tcert.generator.prediction import prediction_claim

FLOAT_SLACK = 2.0 ** -30
TIGHT_AUTO_LIMIT = 1 << 16     # d_vocab * d_model up to which "auto" hints are tight


def round_down(q) -> float:
    """The largest double <= q (q a Fraction)."""
    f = float(q)
    return math.nextafter(f, -math.inf) if Fraction(f) > q else f


def round_up(q) -> float:
    """The smallest double >= q."""
    f = float(q)
    return math.nextafter(f, math.inf) if Fraction(f) < q else f


def parse_free(spec: str):
    """"any:N" -> ("any", N, None); "perm:3,5,5" -> ("perm", 3, [3, 5, 5])."""
    kind, _, rest = spec.partition(":")
    try:
        if kind == "any":
            return "any", int(rest), None
        if kind == "perm":
            toks = [int(t) for t in rest.replace(" ", "").split(",") if t]
            return "perm", len(toks), toks
    except ValueError:
        pass
    raise BadInput(f"--free: {spec[:40]!r} is not any:N or perm:ID,ID,...")


class FloatModel:
    """Float64 views of the tensors the bound needs."""

    def __init__(self, model):
        c = self.c = model.config
        t = model.tensors
        self.memo = {}
        f = lambda name: np.asarray(t[name], dtype=np.float64)
        self.E, self.WU = f("embed.W_E"), f("unembed.W_U")
        p = "blocks.0.attn."
        self.WQ, self.WK, self.WV, self.WO = f(p + "W_Q"), f(p + "W_K"), f(p + "W_V"), f(p + "W_O")
        self.bQ, self.bK = f(p + "b_Q"), f(p + "b_K")
        self.lnw = f("blocks.0.ln1.w") if c.has_ln else None
        self.lnb = f("blocks.0.ln1.b") if c.has_ln else None
        self.div = math.sqrt(c.d_head) if c.attn_scale is None else float(c.attn_scale)
        rd = c.rotary_dim if c.rotary else 0   # positional type "none": no pairs, rotate is the identity
        self.theta = float(c.rotary_base) ** (-2.0 * np.arange(rd // 2) / rd)
        half = rd // 2
        if c.rotary_adjacent_pairs:
            self.i1, self.i2 = np.arange(0, rd, 2), np.arange(1, rd, 2)
        else:
            self.i1, self.i2 = np.arange(half), np.arange(half, rd)

    def ln(self, tokens):
        """LayerNorm'd embedding rows (identity without LN)."""
        x = self.E[tokens]
        if self.lnw is None:
            return x
        xc = x - x.mean(axis=1, keepdims=True)
        return xc / np.sqrt((xc * xc).mean(axis=1, keepdims=True) + float(self.c.eps)) * self.lnw + self.lnb

    def rotate(self, q, offsets):
        """q (heads, d_head) rotated by each offset: (len(offsets), heads, d_head)."""
        ang = np.asarray(offsets, dtype=np.float64)[:, None] * self.theta[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = q[None, :, self.i1], q[None, :, self.i2]
        out = np.repeat(q[None], len(offsets), axis=0)
        out[:, :, self.i1] = x1 * cos - x2 * sin
        out[:, :, self.i2] = x2 * cos + x1 * sin
        return out


def float_fixed(fm: FloatModel, prefix, query, n_free):
    """(q (heads, d_head), and per head lq, alpha_fix, u): the fixed side with the query at n_fix + n_free."""
    n_fix, P = len(prefix), len(prefix) + n_free
    Xq = fm.ln([query])[0]
    q = np.einsum("d,hde->he", Xq, fm.WQ) + fm.bQ                      # (H, dh)
    fixed_tokens = list(prefix) + [query]
    Xf = fm.ln(fixed_tokens)
    Kf = np.einsum("nd,hde->nhe", Xf, fm.WK) + fm.bK                   # (n_fix+1, H, dh)
    Vf = np.einsum("nd,hde->nhe", Xf, fm.WV)
    qrot_fix = fm.rotate(q, [P - p for p in range(n_fix)] + [0]) / fm.div
    lfix = np.einsum("nhe,nhe->hn", qrot_fix, Kf)                    # (H, n_fix+1), last = query
    lq = lfix[:, -1]
    w = np.exp(lfix - lq[:, None])
    alpha_fix = w.sum(axis=1)
    u = np.einsum("hn,nhe->he", w, Vf) / alpha_fix[:, None]
    return q, lq, alpha_fix, u


def float_tables(fm: FloatModel, prefix, query, allowed, n_free):
    """Per head: lq, alpha_fix, u (head space), values (allowed x d_head), free scores (allowed x n_free)."""
    q, lq, alpha_fix, u = float_fixed(fm, prefix, query, n_free)
    Xa = fm.ln(allowed)
    qrot_free = fm.rotate(q, [n_free - c for c in range(n_free)]) / fm.div   # (n_free, H, dh)
    wcols = np.einsum("hde,che->hdc", fm.WK, qrot_free)              # (H, d_model, n_free)
    consts = np.einsum("he,che->hc", fm.bK, qrot_free)
    S = np.einsum("nd,hdc->hnc", Xa, wcols) + consts[:, None, :]     # (H, allowed, n_free)
    values = np.einsum("nd,hde->hne", Xa, fm.WV) - u[:, None, :]
    return dict(lq=lq, alpha_fix=alpha_fix, u=u, values=values, S=S)


def solve_assignment(C, sense):
    """Optimum and optimal duals (u, v) of the assignment problem with cost C (rows x columns).

    The optimal permutation comes from scipy's linear_sum_assignment; the duals are potentials of the
    difference constraints v_c - v_pi(i) <= C_ic - C_i,pi(i) (shortest paths by Bellman-Ford, feasible
    because an optimal assignment has no negative cycle), then u_i = C_i,pi(i) - v_pi(i). For "max",
    the same on -C with the signs flipped: u_i + v_c >= C_ic.
    """
    from scipy.optimize import linear_sum_assignment
    sign = 1.0 if sense == "min" else -1.0
    A = sign * np.asarray(C, dtype=np.float64)
    n = A.shape[0]
    rows, cols = linear_sum_assignment(A)
    pi = np.empty(n, dtype=int)
    pi[rows] = cols
    # edge pi(i) -> c with weight A[i, c] - A[i, pi(i)]; w[a, b] = min over rows i with pi(i) = a
    w = np.full((n, n), np.inf)
    w[pi, :] = A - A[np.arange(n), pi][:, None]
    dist = np.zeros(n)
    for _ in range(n):
        new = np.minimum(dist, (dist[:, None] + w).min(axis=0))
        if np.array_equal(new, dist):
            break
        dist = new
    v = dist
    u = A[np.arange(n), pi] - v[pi]
    return sign * float(A[np.arange(n), pi].sum()), sign * u, sign * v


def repair(v, bounds, sense):
    """Exact, tight duals from float ones: keep v (as doubles), set each u_i to its best feasible
    double against `bounds`, then each v_c likewise given u (so every row and column has a constraint
    tight to one ulp).

    min: u_i + v_c <= L_ic (rounding down); max: u_i + v_c >= U_ic (rounding up).
    """
    L = [[Fraction(b) for b in row] for row in bounds]
    n = len(L)
    best, rnd = (min, round_down) if sense == "min" else (max, round_up)
    v = [float(x) for x in v]
    u = [rnd(best(L[i][c] - Fraction(v[c]) for c in range(n))) for i in range(n)]
    v = [rnd(best(L[i][c] - Fraction(u[i]) for i in range(n))) for c in range(n)]
    return u, v, sum(Fraction(x) for x in u) + sum(Fraction(x) for x in v)


def float_deviation(fm: FloatModel, T, beta, mode):
    """Float version of overwhelm_bounds.deviation: (W, per-head maxima)."""
    total = np.zeros(fm.c.d_vocab)
    per_head = []
    for h in range(fm.c.n_heads):
        bmin, bmax = beta[h]
        if mode == "table":
            D = (T["values"][h] @ fm.WO[h]) @ fm.WU
            lo, hi = D.min(axis=0), D.max(axis=0)
        else:
            R = np.sqrt((T["values"][h] ** 2).sum(axis=1)).max()
            if ("colnorm", h) not in fm.memo:   # length-independent (shared by the lengths of upto:N)
                fm.memo["colnorm", h] = np.sqrt(((fm.WO[h] @ fm.WU) ** 2).sum(axis=0))
            n = fm.memo["colnorm", h]
            lo, hi = -R * n, R * n
        top = np.where(hi >= 0, bmax * hi, bmin * hi)
        bottom = np.where(lo <= 0, bmax * lo, bmin * lo)
        widths = top - bottom
        total += widths
        per_head.append(float(widths.max()))
    return float(total.max()), per_head


def rigorous_parts(model, prefix, query, allowed, n_free, mode, multiset):
    """The checker's hint-independent enclosures for both backends (tight hints)."""
    out = []
    for name in ("mpmath", "flint"):
        B = make_backend(name)
        W = Weights(B, model)
        out.append((B, W, rb.prepare(B, model, prefix, query, allowed, n_free, mode, set(multiset or ()), W)))
    return out


def generate(model, prefix, query, free_spec, method="lp", value_bound="auto", hints="auto", force=False,
             shared=None):
    """Run the float algorithm and build the certificate. Returns (cert or None, report dict).

    force=True returns the certificate even when Inconclusive (benchmarks: the checker then runs every
    obligation and rejects at the last one, W < PTP/2). `shared` (upto:N, tcert.generator.overwhelm.upto.Shared):
    the length's float tables and rigorous enclosures come from work shared by all lengths."""
    c = model.config
    rb.supported(c)
    if c.final_ln:   # the checker refuses naive/lp evidence for these (checker/kinds/overwhelm/__init__.py)
        raise BadInput("overwhelm: a model with a final LayerNorm is certified only by --method tight")
    kind, n_free, multiset = parse_free(free_spec) if isinstance(free_spec, str) else free_spec
    if method == "lp" and multiset is None:
        method = "naive"   # the LP needs a permutation set; any:N has per-position independence
    allowed = list(range(c.d_vocab)) if multiset is None else sorted(set(multiset))
    fits = len(allowed) * c.d_vocab * c.n_heads <= rb.MAX_TABLE_ENTRIES
    if value_bound == "auto":
        value_bound = "table" if fits else "norm"
    elif value_bound == "table" and not fits:
        raise BadInput(f"value bound 'table' needs more than {rb.MAX_TABLE_ENTRIES} entries here; use norm")
    tight = (c.d_vocab * c.d_model <= TIGHT_AUTO_LIMIT) if hints == "auto" else hints == "tight"
    fm = shared.fm if shared is not None else FloatModel(model)
    T = shared.float_tables(n_free) if shared is not None else float_tables(fm, prefix, query, allowed, n_free)
    solved = {}

    def heads_and_duals(rig):
        """Per-head alpha/beta summary and repaired LP duals (against float or rigorous cost bounds)."""
        heads, duals = [], []
        for h in range(c.n_heads):
            S = T["S"][h] - T["lq"][h]
            amin, amax = float(np.exp(S.min(axis=0)).sum()), float(np.exp(S.max(axis=0)).sum())
            info = {"alpha_fix": float(T["alpha_fix"][h]), "alpha_free_min_naive": amin, "alpha_free_max_naive": amax}
            if method == "lp":
                C = np.exp(S[[allowed.index(t) for t in multiset]])
                entry = {}
                for sense in ("min", "max"):
                    if (h, sense) not in solved:
                        v = solve_assignment(C, sense)[2]
                        solved[h, sense] = v - (v.max() if sense == "min" else v.min())  # canonical shift
                    if rig is not None:
                        costs = [rb.lp_costs(B, parts[h], multiset)[0 if sense == "min" else 1]
                                 for B, _, parts in rig]
                        pick = min if sense == "min" else max
                        bounds = [[pick(cs[i][j] for cs in costs) for j in range(n_free)] for i in range(n_free)]
                    else:
                        bounds = (C * ((1 - FLOAT_SLACK) if sense == "min" else (1 + FLOAT_SLACK))).tolist()
                    u, v, val = repair(solved[h, sense], bounds, sense)
                    entry[sense] = {"u": [certificate.num(x) for x in u], "v": [certificate.num(x) for x in v]}
                    if sense == "min":
                        amin = max(amin, float(val))
                    else:
                        amax = min(amax, float(val))
                info.update(alpha_free_min_lp=amin, alpha_free_max_lp=amax)
                duals.append(entry)
            fix = T["alpha_fix"][h]
            info.update(beta_min=amin / (fix + amin), beta_max=amax / (fix + amax))
            heads.append(info)
        return heads, duals

    heads, duals = heads_and_duals(None)
    beta = [(hd["beta_min"], hd["beta_max"]) for hd in heads]
    w_float, per_head = float_deviation(fm, T, beta, value_bound)
    t0 = list(multiset) if multiset is not None else [query] * n_free
    tokens = list(prefix) + t0 + [query]
    sample_claim, p = prediction_claim(model, tokens)
    evidence = {"method": method, "value_bound": value_bound, "sample": sample_claim}
    # float decision first: the rigorous (tight) pass only runs when it can matter
    tight = tight and sample_claim is not None and 2 * w_float * (1 + 2.0 ** -20) < p["margin"]
    if tight:
        rig = shared.rigorous(n_free) if shared is not None else \
            rigorous_parts(model, prefix, query, allowed, n_free, value_bound, multiset)
        heads, duals = heads_and_duals(rig)
    if method == "lp":
        evidence["lp_duals"] = duals
    if tight:
        dev = Fraction(0)
        gaps_lo = None
        for B, W, parts in rig:
            alphas = []
            for h, hd in enumerate(parts):
                lo_a, hi_a = rb.naive_alpha(B, hd)
                if method == "lp":
                    lo_c, hi_c = rb.lp_costs(B, hd, multiset)
                    d = {sense: [[parse_number(x, "dual") for x in duals[h][sense][vec]] for vec in ("u", "v")]
                         for sense in ("min", "max")}
                    lo_a = max(lo_a, rb.lp_bound(*d["min"], lo_c, "min", "generator"))
                    hi_a = min(hi_a, rb.lp_bound(*d["max"], hi_c, "max", "generator"))
                alphas.append((lo_a, hi_a))
            bet = [rb.betas(B, hd, *a) for hd, a in zip(parts, alphas)]
            dev = max(dev, rb.deviation(B, model, parts, bet)[0])
            if sample_claim is not None:
                g = logit_gaps(B, model, tokens, p["predicted"], W)
                m = min(x for j, x in enumerate(g) if j != p["predicted"])
                gaps_lo = m if gaps_lo is None else min(gaps_lo, m)
        deviation = round_up(dev)
        if sample_claim is not None and gaps_lo > 0:
            sample_claim["margin"] = certificate.num(round_down(gaps_lo))
            margin = float(round_down(gaps_lo))
        else:
            margin = float("nan")
    else:
        deviation = w_float * (1 + FLOAT_SLACK)
        margin = p["margin"] if sample_claim is not None else float("nan")
    evidence["deviation"] = certificate.num(deviation)
    k = p["predicted"]
    lg = p["logits"]
    order = [int(j) for j in np.argsort(-lg, kind="stable")[:4]]
    report = {"verdict": "Overwhelmed" if sample_claim is not None and 2 * deviation < margin else "Inconclusive",
              "predicted": k, "deviation": deviation, "deviation_float": w_float, "deviation_per_head": per_head,
              "margin": margin, "ptp_float": p["gap"], "top_tokens": [(j, float(lg[j])) for j in order],
              "heads": heads, "method": method, "value_bound": value_bound, "hints": "tight" if tight else "float",
              "n_fix": len(prefix), "n_free": n_free}
    if report["verdict"] != "Overwhelmed" and not (force and sample_claim is not None):
        return None, report
    free = {"kind": "any", "length": n_free} if multiset is None else {"kind": "perm", "tokens": list(multiset)}
    claim = {"prefix": list(prefix), "query": query, "predicted": k, "free": free}
    info = {"verdict": report["verdict"], "deviation_float": w_float, "ptp_float": p["gap"]}
    return certificate.envelope("overwhelm", model, claim, evidence, info), report


def format_report(r) -> str:
    """Human-readable summary: W by head, PTP, margin, top competitors."""
    lines = [f"{r['verdict']}: W <= {r['deviation']:.6g} (float {r['deviation_float']:.6g}), "
             f"PTP >= {r['margin']:.6g} (float {r['ptp_float']:.6g}), PTP/2 - W = {r['margin'] / 2 - r['deviation']:.6g}",
             f"  n_fix {r['n_fix']}, n_free {r['n_free']}, method {r['method']}, value bound {r['value_bound']}, "
             f"hints {r['hints']}; predicted token {r['predicted']}",
             "  top logits on the sample: " + ", ".join(f"{j}: {v:.6g}" for j, v in r["top_tokens"])]
    for h, (hd, w) in enumerate(zip(r["heads"], r["deviation_per_head"])):
        extra = "" if "alpha_free_max_lp" not in hd else \
            f" (naive {hd['alpha_free_min_naive']:.4g}..{hd['alpha_free_max_naive']:.4g})"
        lines.append(f"  head {h}: alpha_fix {hd['alpha_fix']:.6g}, beta_free in [{hd['beta_min']:.4g}, "
                     f"{hd['beta_max']:.4g}]{extra}, max logit width {w:.6g}")
    return "\n".join(lines)
