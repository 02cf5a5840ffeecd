"""`overwhelm`: for prefix s, query q and every free string t in a designed set T, the greedy next
token of M(s + t + q) is k (the model is "overwhelmed" by s; arXiv 2024, Algorithms 1-5).

claim    {"prefix": [int, ...], "query": int, "predicted": int,
          "free": {"kind": "any", "length": N}            every string of N tokens, or
                  {"kind": "perm", "tokens": [int, ...]}  every permutation of this multiset, or
                  {"kind": "upto", "length": N}           every string of every length 0..N (check_upto)}
evidence {"method": "naive" | "lp" ("tight": see checker/kinds/overwhelm/tight.py), "value_bound": "table" | "norm",
          "lp_duals": [{"min": {"u": [...], "v": [...]}, "max": {"u": [...], "v": [...]}} per head]
                      (method "lp" only; rows = multiset entries in claim order, columns = free positions),
          "deviation": number  claimed upper bound W on how far any logit moves over T,
          "sample": a prediction claim on s + t0 + q for one t0 in T (its margin is the PTP bound)}

Obligations, in order: the sample's prediction (PTP >= margin); per head the query/prefix scores, the
free-position score table, the fixed mass and value mean (overwhelm_bounds.prepare); the free attention
mass bounds (naive, and the LP duals' feasibility in exact rationals); beta bounds; the deviation bound
W (heads summed per logit); claimed deviation >= W; and deviation < margin / 2 in exact arithmetic.
"""

from fractions import Fraction

from tcert.checker.kinds.overwhelm import bounds as ob_bounds
from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.numbers import parse_int, parse_number
from tcert.checker.forward import Weights
from tcert.checker.numbers import show
from tcert.checker.kinds.overwhelm.tight import check_tight
from tcert.checker.kinds.prediction import check_claim, parse_claim as parse_prediction


def parse_tokens(value, where: str, cfg, min_len: int) -> list:
    """A JSON list of token ids of length >= min_len."""
    if not isinstance(value, list) or not min_len <= len(value) <= cfg.n_ctx:
        raise BadInput(f"{where}: must be a list of {min_len}..n_ctx={cfg.n_ctx} token ids")
    return [parse_int(t, f"{where}[{i}]", 0, cfg.d_vocab - 1) for i, t in enumerate(value)]


def parse_claim(claim: dict, cfg):
    """Validate the claim; return (prefix, query, k, free_kind, n_free, multiset or None)."""
    fields(claim, "claim", {"prefix", "query", "predicted", "free"})
    prefix = parse_tokens(claim["prefix"], "claim.prefix", cfg, 0)
    query = parse_int(claim["query"], "claim.query", 0, cfg.d_vocab - 1)
    k = parse_int(claim["predicted"], "claim.predicted", 0, cfg.d_vocab - 1)
    free = claim["free"]
    if not isinstance(free, dict) or free.get("kind") not in ("any", "perm"):
        raise BadInput('claim.free: must be {"kind": "any", "length": N} or {"kind": "perm", "tokens": [...]} '
                       'or {"kind": "upto", "length": N}')
    if free["kind"] == "any":
        fields(free, "claim.free", {"kind", "length"})
        n_free, multiset = parse_int(free["length"], "claim.free.length", 1, cfg.n_ctx), None
    else:
        fields(free, "claim.free", {"kind", "tokens"})
        multiset = parse_tokens(free["tokens"], "claim.free.tokens", cfg, 1)
        n_free = len(multiset)
    if len(prefix) + n_free + 1 > cfg.n_ctx:
        raise BadInput(f"claim: n_fix + n_free + 1 = {len(prefix) + n_free + 1} exceeds n_ctx = {cfg.n_ctx}")
    return prefix, query, k, free["kind"], n_free, multiset


def check_sample(B, model, W, sample, prefix, query, k, n_free, multiset, ob) -> Fraction:
    """The PTP obligation: the sample lies in the designed set and predicts k with the claimed margin."""
    tokens, predicted, margin = parse_prediction(sample, model.config, "evidence.sample")
    n_fix = len(prefix)
    t = tokens[n_fix:-1]
    ob.require(tokens[:n_fix] == prefix and tokens[-1] == query and len(t) == n_free,
               "sample in designed set", "evidence.sample.tokens is not prefix + free string + query")
    if multiset is not None:
        ob.require(sorted(t) == sorted(multiset), "sample in designed set",
                   "the sample's free tokens are not a permutation of claim.free.tokens")
    ob.require(predicted == k, "sample prediction", f"the sample predicts {predicted}, the claim says {k}")
    check_claim(B, model, sample, ob, "evidence.sample", W)
    return margin


def parse_duals(entry, where: str, n: int) -> dict:
    """{"min": {"u", "v"}, "max": {"u", "v"}} with n exact numbers in each vector."""
    fields(entry, where, {"min", "max"})
    out = {}
    for sense in ("min", "max"):
        fields(entry[sense], f"{where}.{sense}", {"u", "v"})
        for vec in ("u", "v"):
            xs = entry[sense][vec]
            if not isinstance(xs, list):
                raise BadInput(f"{where}.{sense}.{vec}: must be a list of exact numbers")
            if len(xs) != n:
                raise Rejected("LP duals match the free set", f"{where}.{sense}.{vec} has {len(xs)} entries, "
                                                               f"the free multiset {n}")
            out[sense, vec] = [parse_number(x, f"{where}.{sense}.{vec}[{i}]") for i, x in enumerate(xs)]
    return out


def alpha_bounds(B, heads, method, duals, multiset) -> list:
    """Per head (lower bound of alpha_free min, upper bound of alpha_free max): naive, tightened by the LP."""
    out = []
    for h, hd in enumerate(heads):
        amin, amax = ob_bounds.naive_alpha(B, hd)
        if method == "lp":
            lo, hi = ob_bounds.lp_costs(B, hd, multiset)
            d = duals[h]
            name = f"head {h} assignment LP"
            amin = max(amin, ob_bounds.lp_bound(d["min", "u"], d["min", "v"], lo, "min", name + " (min)"))
            amax = min(amax, ob_bounds.lp_bound(d["max", "u"], d["max", "v"], hi, "max", name + " (max)"))
        out.append((amin, amax))
    return out


def check(model, claim, evidence, B, ob):
    """Verify an overwhelm certificate (free kinds any/perm here; upto: check_upto)."""
    cfg = model.config
    ob_bounds.supported(cfg)
    if isinstance(claim, dict) and isinstance(claim.get("free"), dict) and claim["free"].get("kind") == "upto":
        return check_upto(model, claim, evidence, B, ob)
    prefix, query, k, kind, n_free, multiset = parse_claim(claim, cfg)
    check_fixed_length(model, prefix, query, k, n_free, multiset, evidence, B, ob)


def check_upto(model, claim, evidence, B, ob):
    """free {"kind": "upto", "length": N}: every free string of every length L = 0..N (Definition 1.1).

    evidence {"lengths": [e_0, ..., e_N]}: e_0 is a prediction claim on prefix + [query] predicting k;
    e_L (L >= 1) is exactly the evidence of the any:L certificate for the same prefix, query and k, and
    is checked by check_fixed_length; for method naive its length-independent enclosures come from
    overwhelm_bounds.UptoTables, computed once for all lengths (shared_tables). All lengths must pass;
    the claim is their conjunction."""
    cfg = model.config
    fields(claim, "claim", {"prefix", "query", "predicted", "free"})
    fields(claim["free"], "claim.free", {"kind", "length"})
    n = parse_int(claim["free"]["length"], "claim.free.length", 0, cfg.n_ctx)
    prefix = parse_tokens(claim["prefix"], "claim.prefix", cfg, 0)
    query = parse_int(claim["query"], "claim.query", 0, cfg.d_vocab - 1)
    k = parse_int(claim["predicted"], "claim.predicted", 0, cfg.d_vocab - 1)
    if len(prefix) + n + 1 > cfg.n_ctx:
        raise BadInput(f"claim: n_fix + N + 1 = {len(prefix) + n + 1} exceeds n_ctx = {cfg.n_ctx}")
    fields(evidence, "evidence", {"lengths"})
    lengths = evidence["lengths"]
    if not isinstance(lengths, list) or len(lengths) != n + 1:
        got = len(lengths) if isinstance(lengths, list) else "no list"
        raise BadInput(f"evidence.lengths: must list evidence for each length 0..{n} ({n + 1} entries), "
                       f"got {got}")
    sample = lengths[0]
    tokens, predicted, _ = parse_prediction(sample, cfg, "evidence.lengths[0]")
    ob.require(tokens == list(prefix) + [query], "length 0: sample is prefix + query",
               "evidence.lengths[0].tokens is not prefix + [query]")
    ob.require(predicted == k, "length 0: prediction", f"length 0 predicts {predicted}, the claim says {k}")
    W = Weights(B, model)
    check_claim(B, model, sample, ob, "evidence.lengths[0]", W)
    shared = shared_tables(B, model, prefix, query, lengths, W, ob)
    for L in range(1, n + 1):
        try:
            check_fixed_length(model, prefix, query, k, L, None, lengths[L], B, ob, W, shared)
        except Rejected as e:
            raise Rejected(f"length {L}: {e.obligation}", e.detail) from e
        except BadInput as e:
            raise BadInput(f"evidence.lengths[{L}]: {e}") from e
    ob.summary = (f"for the {len(prefix)}-token prefix, query {query} and every string of length 0..{n} "
                  f"in between, the next token is {k} (each of the {n + 1} lengths certified; length-independent "
                  f"tables shared)")


def shared_tables(B, model, prefix, query, lengths, W, ob) -> dict:
    """value mode -> overwhelm_bounds.UptoTables covering every length whose evidence uses that mode
    (method naive; tight evidence is checked per length). Each length's own part is computed later."""
    need = {}
    for L, e in enumerate(lengths[1:], 1):
        if isinstance(e, dict) and e.get("method") == "naive" and e.get("value_bound") in ("table", "norm"):
            need[e["value_bound"]] = L
    out = {}
    for mode, n_max in sorted(need.items()):
        with ob.step(f"lengths 1..{n_max}: LN'd rows, score table for offsets 1..{n_max}, value extremes ({mode})"):
            try:
                out[mode] = ob_bounds.UptoTables(B, model, prefix, query, n_max, mode, list(range(model.config.d_vocab)), W)
            except BadInput as e:
                raise BadInput(f"evidence.lengths: {e}") from e
    return out


def check_fixed_length(model, prefix, query, k, n_free, multiset, evidence, B, ob, W=None, shared=None):
    """Verify the evidence for one free length (any:n_free, or perm of multiset); sets ob.summary.

    `shared` (free kind upto only): value mode -> UptoTables whose length-n_free part replaces prepare."""
    cfg = model.config
    if isinstance(evidence, dict) and evidence.get("method") == "tight":   # checker/kinds/overwhelm/tight.py
        return check_tight(model, prefix, query, k, n_free, multiset, evidence, B, ob)
    if cfg.final_ln:   # the naive/lp deviation argument has no final-LN enclosure (docs/overwhelm.md)
        raise BadInput("overwhelm: a model with a final LayerNorm is certified only by evidence method tight")
    fields(evidence, "evidence", {"method", "value_bound", "deviation", "sample"}, {"lp_duals"})
    method, mode = evidence["method"], evidence["value_bound"]
    if method not in ("naive", "lp") or mode not in ("table", "norm"):
        raise BadInput("evidence: method must be naive|lp and value_bound table|norm")
    duals = None
    if method == "lp":
        if multiset is None:
            raise Rejected("LP duals match the free set", "method lp needs a perm free set")
        raw = evidence.get("lp_duals")
        if not isinstance(raw, list) or len(raw) != cfg.n_heads:
            raise BadInput(f"evidence.lp_duals: must list {cfg.n_heads} heads")
        duals = [parse_duals(e, f"evidence.lp_duals[{h}]", n_free) for h, e in enumerate(raw)]
    elif "lp_duals" in evidence:
        raise BadInput("evidence.lp_duals: only with method lp")
    claimed_w = parse_number(evidence["deviation"], "evidence.deviation")
    allowed = list(range(cfg.d_vocab)) if multiset is None else sorted(set(multiset))
    W = W or Weights(B, model)

    margin = check_sample(B, model, W, evidence["sample"], prefix, query, k, n_free, multiset, ob)
    if shared and mode in shared and multiset is None and n_free <= shared[mode].n_max:
        with ob.step(f"length {n_free}: fixed masses, value means, value extremes from the shared tables ({mode})"):
            heads = shared[mode].heads(n_free)
    else:
        with ob.step(f"scores, fixed masses, value extremes ({mode})"):
            heads = ob_bounds.prepare(B, model, prefix, query, allowed, n_free, mode, set(multiset or ()), W)
    with ob.step(f"free attention mass ({method})"):
        alphas = alpha_bounds(B, heads, method, duals, multiset)
    with ob.step("beta bounds"):
        beta = [ob_bounds.betas(B, hd, *a) for hd, a in zip(heads, alphas)]
    with ob.step("deviation bound"):
        dev, per_head = ob_bounds.deviation(B, model, heads, beta)
    ob.require(claimed_w >= dev, "deviation bound",
               f"claimed deviation {show(claimed_w)} is below the certified bound {show(dev)}")
    ob.require(2 * claimed_w < margin, "overwhelm: W < PTP/2",
               f"deviation {show(claimed_w)} is not below half the sample margin {show(margin)}")
    free = f"any string of {n_free} tokens" if multiset is None else f"every permutation of {n_free} tokens"
    ob.summary = (f"for the {len(prefix)}-token prefix, query {query} and {free} in between, the next token "
                  f"is {k} (deviation <= {show(claimed_w)} < PTP/2 = {show(margin / 2)}; "
                  f"heads {', '.join(show(x) for x in per_head)})")
