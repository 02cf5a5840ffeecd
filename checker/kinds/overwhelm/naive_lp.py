"""overwhelm methods "naive" and "lp" (paper Algorithms 1-5): one deviation bound W for every logit, and
W < PTP/2, where PTP is the certified margin of one sample t0 in the designed set.

evidence {"method": "naive" | "lp", "value_bound": "table" | "norm",
          "lp_duals": [{"min": {"u": [...], "v": [...]}, "max": {"u": [...], "v": [...]}} per head]
                      (method lp only; rows = multiset entries in claim order, columns = free positions),
          "deviation": number  claimed upper bound W on how far any logit moves over the designed set,
          "sample": a prediction claim on s + t0 + q (its margin is the PTP bound)}

With the setting and notation of `tables` (read its docstring): head h adds u_h W_O^h W_U plus A_free
times a convex combination of centred EVOU rows. With A_free in [beta_min, beta_max] and every centred
EVOU entry (x_t - u_h) W_O^h W_U for allowed free tokens t in [lo_hj, hi_hj], logit j of head h moves
within an interval of width
    width_hj = (beta_max hi if hi >= 0 else beta_min hi) - (beta_max lo if lo <= 0 else beta_min lo),
and the whole logit vector moves by at most W = max_j sum_h width_hj in every coordinate (heads ADD).
So two strings of the set differ in logit_k - logit_j by at most 2W, and W < PTP/2 keeps k on top.

The free masses alpha_free = sum_free exp(l_p - l_q) are bounded naively (per-position extremes over the
allowed tokens, Algorithms 4/5) and, for permutations (lp), by the assignment LP of Algorithm 3 through
a dual solution checked in exact rationals (`tcert.checker.assignment`, weak duality).
"""

import math
from fractions import Fraction

from tcert.checker.assignment import assignment_bound, parse_duals
from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.forward import Weights
from tcert.checker.kinds.overwhelm.claim import Place, Question, check_sample
from tcert.checker.kinds.overwhelm.tables import MAX_TABLE_ENTRIES, HeadData, beta_bounds, head_tables, table_fits
from tcert.checker.numbers import parse_number, show


def check_naive_lp(model, q: Question, evidence, B, ob, place: Place, W=None, shared=None) -> None:
    """Verify naive/lp evidence for one free length (any:n_free, or perm of the multiset); sets ob.summary.
    `shared` (free kind upto only): value mode -> UptoTables whose length-n_free part replaces head_tables."""
    if model.config.final_ln:   # the deviation argument has no final-LN enclosure (docs/overwhelm.md)
        raise BadInput("overwhelm: a model with a final LayerNorm is certified only by evidence method tight")
    method, mode, duals, claimed_w = parse_evidence(evidence, q, model.config, place.where)
    title = place.title(method)
    W = W or Weights(B, model)
    margin = check_sample(B, model, W, evidence["sample"], q, ob, title, f"{place.where}.sample")
    heads = head_tables_of_length(B, model, W, q, mode, shared, ob, title)
    dev, per_head = certified_deviation(B, model, heads, duals, q.multiset, ob, title)
    with ob.step(f"{title}: deviation bound") as fig:
        fig[f"{place.where}.deviation"] = dev
        ob.require(claimed_w >= dev, f"claimed deviation {show(claimed_w)} is below the certified bound {show(dev)}")
    with ob.step(f"{title}: W < PTP/2"):
        ob.require(2 * claimed_w < margin, f"deviation {show(claimed_w)} is not below PTP/2 = {show(margin / 2)} "
                                           f"(the sample's claimed margin {show(margin)})")
    ob.summary = (f"for the {len(q.prefix)}-token prefix, query {q.query} and {q.free_words()} in between, the "
                  f"next token is {q.predicted} (deviation <= {show(claimed_w)} < PTP/2 = {show(margin / 2)}; "
                  f"heads {', '.join(show(x) for x in per_head)})")


def parse_evidence(evidence, q: Question, cfg, where: str):
    """(method, value mode, per-head LP duals or None, claimed deviation) of naive/lp evidence."""
    fields(evidence, where, {"method", "value_bound", "deviation", "sample"}, {"lp_duals"})
    method, mode = evidence["method"], evidence["value_bound"]
    if method not in ("naive", "lp") or mode not in ("table", "norm"):
        raise BadInput(f"{where}: method must be naive|lp and value_bound table|norm")
    if mode == "table" and not table_fits(cfg, len(q.allowed(cfg.d_vocab))):
        raise BadInput(f"{where}.value_bound: 'table' would need more than {MAX_TABLE_ENTRIES} entries; use 'norm'")
    if method == "naive" and "lp_duals" in evidence:
        raise BadInput(f"{where}.lp_duals: only with method lp")
    duals = parse_lp_duals(evidence.get("lp_duals"), f"{where}.lp_duals", cfg, q) if method == "lp" else None
    return method, mode, duals, parse_number(evidence["deviation"], f"{where}.deviation")


def parse_lp_duals(raw, where: str, cfg, q: Question) -> list:
    """Per head {"min": (u, v), "max": (u, v)}, each vector n_free exact numbers."""
    if q.multiset is None:
        raise BadInput(f"{where}: method lp needs a perm free set")
    if not isinstance(raw, list) or len(raw) != cfg.n_heads:
        raise BadInput(f"{where}: must list {cfg.n_heads} heads")
    heads = [fields(entry, f"{where}[{h}]", {"min", "max"}) for h, entry in enumerate(raw)]
    return [{s: parse_duals(e[s], f"{where}[{h}].{s}", q.n_free, s) for s in ("min", "max")} for h, e in enumerate(heads)]


def head_tables_of_length(B, model, W, q: Question, mode: str, shared, ob, title: str) -> list:
    """The HeadData of this free length: from the upto tables shared by all lengths when there are
    some for this value mode, else computed here (head_tables)."""
    if shared and mode in shared and q.multiset is None and q.n_free <= shared[mode].n_max:
        with ob.step(f"{title}: fixed masses, value means, value extremes from the shared tables ({mode})"):
            return shared[mode].heads(q.n_free)
    with ob.step(f"{title}: scores, fixed masses, value extremes ({mode})"):
        return head_tables(B, model, q.prefix, q.query, q.allowed(model.config.d_vocab), q.n_free, mode,
                           set(q.multiset or ()), W)


def certified_deviation(B, model, heads: list, duals, multiset, ob, title: str):
    """(W, per-head maxima): the certified bound on max_j |logit_j(X) - logit_j(X')| over the designed set,
    from the free attention masses (naive; lp: tightened by the duals), the beta bounds and the centred
    EVOU extremes. The checker compares W with the claim; the generator writes it as its hint."""
    alphas = free_mass_bounds(B, heads, duals, multiset, ob, title)
    with ob.step(f"{title}: beta bounds") as fig:
        beta = [beta_bounds(B, hd, *a) for hd, a in zip(heads, alphas)]
        fig["beta per head"] = beta
    with ob.step(f"{title}: deviation W") as fig:
        dev, per_head = deviation_bound(B, model, heads, beta)
        fig["deviation W"], fig["deviation per head"] = dev, per_head
    return dev, per_head


def free_mass_bounds(B, heads: list, duals, multiset, ob, title: str) -> list:
    """Per head (lower bound of min alpha_free, upper bound of max alpha_free) over the designed set."""
    with ob.step(f"{title}: free attention mass, per-position extremes") as fig:
        naive = [naive_free_mass(B, hd) for hd in heads]
        fig["alpha_free per head"] = naive
    if duals is None:
        return naive
    return [lp_free_mass(B, hd, h, duals[h], multiset, naive[h], ob, title) for h, hd in enumerate(heads)]


def naive_free_mass(B, hd: HeadData):
    """(lower bound of min alpha_free, upper bound of max alpha_free) from per-position extremes."""
    amin = B.lower(B.fsum(B.exp(B.num(x) - hd.lq) for x in hd.score_lo))
    amax = B.upper(B.fsum(B.exp(B.num(x) - hd.lq) for x in hd.score_hi))
    return amin, amax


def lp_free_mass(B, hd: HeadData, h: int, duals: dict, multiset: list, naive: tuple, ob, title: str):
    """Head h's naive free-mass bounds tightened by the assignment LP: the duals' objective bounds the
    sum of exp(l(t_i at its position) - l_q) over every permutation (weak duality, exact rationals)."""
    with ob.step(f"{title}: head {h} assignment LP (min)") as fig:
        lo, hi = lp_costs(B, hd, multiset)
        amin = fig["alpha_free lower bound"] = max(naive[0], assignment_bound(*duals["min"], lo, "min"))
    with ob.step(f"{title}: head {h} assignment LP (max)") as fig:
        amax = fig["alpha_free upper bound"] = min(naive[1], assignment_bound(*duals["max"], hi, "max"))
    return amin, amax


def lp_costs(B, hd: HeadData, multiset: list):
    """Exact (lower, upper) bounds of the assignment costs exp(l(t_i at free position c) - l_q)."""
    es = [[B.exp(s - hd.lq) for s in hd.lp_rows[t]] for t in multiset]
    return [[B.lower(e) for e in row] for row in es], [[B.upper(e) for e in row] for row in es]


def deviation_bound(B, model, heads: list, beta: list):
    """Upper bound W on max_j |logit_j(X) - logit_j(X')| over the designed set; also per-head maxima.

    Exact integer arithmetic: every centred EVOU bound is written over one common denominator `den` (a
    power of two, as all interval endpoints are binary), so the d_vocab x n_heads widths are integer
    operations; W = max_j sum_h width_hj / (den * beta denominator)."""
    values = [x for hd in heads for x in hd.evou_lo + hd.evou_hi]
    den = math.lcm(*{x.denominator for x in values})
    betas_den = math.lcm(*{b.denominator for pair in beta for b in pair})
    total = [0] * model.config.d_vocab
    per_head = []
    for hd, (bmin, bmax) in zip(heads, beta):
        b0, b1 = bmin.numerator * (betas_den // bmin.denominator), bmax.numerator * (betas_den // bmax.denominator)
        widths = []
        for lo, hi in zip(hd.evou_lo, hd.evou_hi):
            lo, hi = lo.numerator * (den // lo.denominator), hi.numerator * (den // hi.denominator)
            widths.append((b1 * hi if hi >= 0 else b0 * hi) - (b1 * lo if lo <= 0 else b0 * lo))
        total = [a + b for a, b in zip(total, widths)]
        per_head.append(Fraction(max(widths), den * betas_den))
    return Fraction(max(total), den * betas_den), per_head
