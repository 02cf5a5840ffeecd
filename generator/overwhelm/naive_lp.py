"""Generate `overwhelm` certificates with methods naive and lp: float64 bounds (paper Algorithms 1-5), LP
duals, exact hints.

The float pipeline follows `tcert.checker.kinds.overwhelm.naive_lp` step for step (see its docstring for
the argument). Hints come in two strengths:
- "float": numbers from the float64 pipeline with a relative safety slack of 2^-30 (LP duals repaired
  against float costs shrunk by that slack, deviation inflated, margin from the float gap) - fast, for
  big models;
- "tight": the generator runs the checker's own rigorous routines with BOTH interval backends
  (`certified_deviation`, the logit gaps) and writes the duals/deviation/margin against the worse of
  the two enclosures, rounded outward to one double ulp - every hint is then tight to ~2^-50 relative
  (used for small models; the mutation tests rely on it).
"""

from fractions import Fraction

import numpy as np

from tcert.checker.assignment import parse_duals
from tcert.checker.errors import BadInput
from tcert.checker.forward import Weights
from tcert.checker.interval import make_backend
from tcert.checker.kinds.overwhelm.naive_lp import certified_deviation, lp_costs
from tcert.checker.kinds.overwhelm.tables import MAX_TABLE_ENTRIES, head_tables, supported, table_fits
from tcert.checker.kinds.prediction import logit_gaps
from tcert.checker.obligations import Obligations

from tcert.generator import certificate
from tcert.generator.overwhelm.assignment import repair, solve_assignment
from tcert.generator.overwhelm.claim import fixed_length_claim, free_set
from tcert.generator.overwhelm.tables import FloatModel, float_tables, round_down, round_up
from tcert.generator.prediction import prediction_claim

FLOAT_SLACK = 2.0 ** -30
# The lp duals are repaired against the checker's certified cost bounds moved by this relative margin, so a
# certificate keeps verifying when a later checker encloses the same costs a few bits differently (without
# it the repaired duals are tight to one ulp and any change of the checker's arithmetic rejects them).
RIGOROUS_MARGIN = Fraction(1, 1 << 48)
TIGHT_AUTO_LIMIT = 1 << 16     # d_vocab * d_model up to which "auto" hints are tight


def generate(model, prefix, query, free_spec, method="lp", value_bound="auto", hints="auto", force=False,
             shared=None):
    """Run the float algorithm and build the certificate. Returns (cert or None, report dict).

    force=True returns the certificate even when Inconclusive (benchmarks: the checker then runs every
    obligation and rejects at the last one, W < PTP/2). `shared` (upto:N, tcert.generator.overwhelm.upto.Shared):
    the length's float tables and rigorous enclosures come from work shared by all lengths."""
    c = model.config
    supported(c)
    if c.final_ln:   # the checker refuses naive/lp evidence for these (checker/kinds/overwhelm/naive_lp.py)
        raise BadInput("overwhelm: a model with a final LayerNorm is certified only by --method tight")
    kind, n_free, multiset = free_set(free_spec)
    if method == "lp" and multiset is None:
        method = "naive"   # the LP needs a permutation set; any:N has per-position independence
    allowed = list(range(c.d_vocab)) if multiset is None else sorted(set(multiset))
    value_bound = resolve_value_bound(c, len(allowed), value_bound)
    tight = (c.d_vocab * c.d_model <= TIGHT_AUTO_LIMIT) if hints == "auto" else hints == "tight"
    fm = shared.fm if shared is not None else FloatModel(model)
    tables = shared.float_tables(n_free) if shared is not None else float_tables(fm, prefix, query, allowed, n_free)
    require_float_masses(tables)
    lp = LpHints(tables, allowed, multiset) if method == "lp" else None
    heads, duals = head_hints(c, tables, lp, None)
    w_float, per_head = float_deviation(fm, tables, [(hd["beta_min"], hd["beta_max"]) for hd in heads], value_bound)
    tokens = list(prefix) + (list(multiset) if multiset is not None else [query] * n_free) + [query]
    sample_claim, p = prediction_claim(model, tokens)
    # float decision first: the rigorous (tight) pass only runs when it can matter
    tight = tight and sample_claim is not None and 2 * w_float * (1 + 2.0 ** -20) < p["margin"]
    if tight:
        rig = shared.rigorous(n_free) if shared is not None else \
            rigorous_parts(model, prefix, query, allowed, n_free, value_bound, multiset)
        heads, duals = head_hints(c, tables, lp, rig)
        deviation, margin = rigorous_hints(model, rig, duals, multiset, n_free, tokens, sample_claim)
    else:
        deviation = w_float * (1 + FLOAT_SLACK)
        margin = p["margin"] if sample_claim is not None else float("nan")
    evidence = {"method": method, "value_bound": value_bound, "sample": sample_claim,
                "deviation": certificate.num(deviation)}
    if method == "lp":
        evidence["lp_duals"] = duals
    report = dict(verdict="Overwhelmed" if sample_claim is not None and 2 * deviation < margin else "Inconclusive",
                  **sample_report(p), deviation=deviation, deviation_float=w_float, deviation_per_head=per_head,
                  margin=margin, heads=heads, method=method, value_bound=value_bound,
                  hints="tight" if tight else "float", n_fix=len(prefix), n_free=n_free)
    if report["verdict"] != "Overwhelmed" and not (force and sample_claim is not None):
        return None, report
    claim = fixed_length_claim(prefix, query, p["predicted"], n_free, multiset)
    info = {"verdict": report["verdict"], "deviation_float": w_float, "ptp_float": p["gap"]}
    return certificate.envelope("overwhelm", model, claim, evidence, info), report


def require_float_masses(tables) -> None:
    """BadInput unless every attention mass of the argument (alpha_fix, exp(score - l_q) of the free
    tokens) is a finite double: naive/lp hints (LP duals, free masses) are stated in those units."""
    rel = tables["S"] - tables["lq"][:, None, None]
    if not (np.isfinite(tables["alpha_fix"]).all() and np.isfinite(rel).all() and rel.max() < 700):
        raise BadInput("overwhelm: attention scores here differ from the query's own by more than float64's exp "
                       "range (e^700), so naive/lp hints cannot be written; --method tight handles such sharp attention")


def resolve_value_bound(cfg, n_allowed: int, value_bound: str) -> str:
    """"auto" -> table when the exact centred EVOU table fits, else norm; an explicit table must fit."""
    fits = table_fits(cfg, n_allowed)
    if value_bound == "auto":
        return "table" if fits else "norm"
    if value_bound == "table" and not fits:
        raise BadInput(f"value bound 'table' needs more than {MAX_TABLE_ENTRIES} entries here; use norm")
    return value_bound


def sample_report(p: dict) -> dict:
    """The report's view of the sample's float prediction: token, float PTP, top four logits."""
    lg = p["logits"]
    order = [int(j) for j in np.argsort(-lg, kind="stable")[:4]]
    return {"predicted": p["predicted"], "ptp_float": p["gap"], "top_tokens": [(j, float(lg[j])) for j in order]}


class LpHints:
    """The float assignment problems of method lp: per head the float costs exp(score - l_q) of the
    multiset's tokens at each free position, and each (head, sense)'s optimal float duals v (solved once,
    canonically shifted), reused when the duals are repaired against rigorous cost bounds."""

    def __init__(self, tables, allowed, multiset):
        self.tables, self.multiset, self.rows, self.solved = tables, multiset, [allowed.index(t) for t in multiset], {}

    def costs(self, h: int):
        """The float cost matrix of head h (multiset entries x free positions)."""
        return np.exp((self.tables["S"][h] - self.tables["lq"][h])[self.rows])

    def v(self, h: int, sense: str):
        """Optimal float column duals of head h's assignment problem."""
        if (h, sense) not in self.solved:
            v = solve_assignment(self.costs(h), sense)[2]
            self.solved[h, sense] = v - (v.max() if sense == "min" else v.min())  # canonical shift
        return self.solved[h, sense]


def head_hints(c, tables, lp, rig):
    """Per head the report's alpha/beta summary (floats) and, for lp, the exact duals: repaired against
    the worse of both backends' rigorous cost bounds (rig) or against float costs with slack (rig None)."""
    heads, duals = [], []
    for h in range(c.n_heads):
        S = tables["S"][h] - tables["lq"][h]
        amin, amax = float(np.exp(S.min(axis=0)).sum()), float(np.exp(S.max(axis=0)).sum())
        info = {"alpha_fix": float(tables["alpha_fix"][h]), "alpha_free_min_naive": amin, "alpha_free_max_naive": amax}
        if lp is not None:
            entry, amin, amax = lp_dual_hint(lp, h, amin, amax, rig)
            info.update(alpha_free_min_lp=amin, alpha_free_max_lp=amax)
            duals.append(entry)
        fix = tables["alpha_fix"][h]
        info.update(beta_min=amin / (fix + amin), beta_max=amax / (fix + amax))
        heads.append(info)
    return heads, duals


def lp_dual_hint(lp: LpHints, h: int, amin: float, amax: float, rig):
    """Head h's duals {min, max: {u, v}} and the free-mass bounds (amin, amax) they give (floats)."""
    rig_costs = None if rig is None else [lp_costs(B, parts[h], lp.multiset) for B, _, parts in rig]
    entry = {}
    for sense in ("min", "max"):
        u, v, val = repair(lp.v(h, sense), cost_bounds(lp.costs(h), rig_costs, sense), sense)
        entry[sense] = {"u": [certificate.num(x) for x in u], "v": [certificate.num(x) for x in v]}
        amin, amax = (max(amin, float(val)), amax) if sense == "min" else (amin, min(amax, float(val)))
    return entry, amin, amax


def cost_bounds(C, rig_costs, sense: str):
    """The costs the duals must be feasible against: the worse of both backends' exact bounds (lower for
    min, upper for max) moved outward by RIGOROUS_MARGIN, or the float costs shrunk (min) / grown (max) by
    FLOAT_SLACK."""
    if rig_costs is None:
        return (C * ((1 - FLOAT_SLACK) if sense == "min" else (1 + FLOAT_SLACK))).tolist()
    side, pick = (0, min) if sense == "min" else (1, max)
    n = len(C)
    return [[margin(pick(Fraction(cs[side][i][j]) for cs in rig_costs), sense) for j in range(n)] for i in range(n)]


def margin(x: Fraction, sense: str) -> Fraction:
    """x moved by RIGOROUS_MARGIN of |x| toward the side the duals must stay on: down for min, up for max."""
    step = abs(x) * RIGOROUS_MARGIN
    return x - step if sense == "min" else x + step


def float_deviation(fm: FloatModel, tables, beta, mode):
    """Float version of the checker's deviation_bound: (W, per-head maxima)."""
    total = np.zeros(fm.c.d_vocab)
    per_head = []
    for h in range(fm.c.n_heads):
        bmin, bmax = beta[h]
        if mode == "table":
            evou = (tables["values"][h] @ fm.WO[h]) @ fm.WU   # centred EVOU rows
            lo, hi = evou.min(axis=0), evou.max(axis=0)
        else:
            R = np.sqrt((tables["values"][h] ** 2).sum(axis=1)).max()
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
        out.append((B, W, head_tables(B, model, prefix, query, allowed, n_free, mode, set(multiset or ()), W)))
    return out


def rigorous_hints(model, rig, duals, multiset, n_free, tokens, sample_claim):
    """(deviation, margin) hints from the checker's own certified deviation and logit gaps, the worse of
    both backends, rounded outward to doubles; writes the margin into sample_claim (nan if not > 0)."""
    parsed = [{s: parse_duals(e[s], "lp_duals", n_free, s) for s in ("min", "max")} for e in duals] if duals else None
    k, dev, gaps_lo = sample_claim["predicted"], Fraction(0), None
    for B, W, parts in rig:
        dev = max(dev, certified_deviation(B, model, parts, parsed, multiset, Obligations(), "generator")[0])
        m = min(x for j, x in enumerate(logit_gaps(B, model, tokens, k, W)) if j != k)
        gaps_lo = m if gaps_lo is None else min(gaps_lo, m)
    if not gaps_lo > 0:
        return round_up(dev), float("nan")
    sample_claim["margin"] = certificate.num(round_down(gaps_lo))
    return round_up(dev), float(round_down(gaps_lo))


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
