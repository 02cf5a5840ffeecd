"""The overwhelm claim (prefix s, query q, predicted k, designed free set T), where an evidence object sits,
and the sample obligation (PTP): one t0 in T predicts k with the claimed margin."""

from collections import namedtuple
from fractions import Fraction

from tcert.checker.envelope import fields
from tcert.checker.errors import BadInput
from tcert.checker.kinds.prediction import check_claim, parse_claim as parse_prediction
from tcert.checker.numbers import parse_int


class Question(namedtuple("Question", "prefix query predicted kind n_free multiset")):
    """A parsed claim: for every free string t of the designed set, M(prefix + t + [query]) predicts
    `predicted`. kind "any": every string of n_free tokens; "perm": every permutation of `multiset`
    (None for any and upto); "upto": every string of every length 0..n_free (one any:L per length)."""

    def allowed(self, d_vocab: int) -> list:
        """The distinct tokens a free position may hold."""
        return list(range(d_vocab)) if self.multiset is None else sorted(set(self.multiset))

    def free_words(self) -> str:
        """The designed set in words, for the summary."""
        return f"{'any string' if self.multiset is None else 'every permutation'} of {self.n_free} tokens"


class Place(namedtuple("Place", "where length", defaults=("evidence", None))):
    """Where one free length's evidence sits: its JSON path, and the free length inside an upto
    certificate (None for a fixed-length certificate), which prefixes its obligation names."""

    def title(self, method: str) -> str:
        """The obligation-name prefix for this evidence's method: "overwhelm lp", "overwhelm upto: length 3, lp"."""
        return f"overwhelm {method}" if self.length is None else f"overwhelm upto: length {self.length}, {method}"


def parse_tokens(value, where: str, cfg, min_len: int) -> list:
    """A JSON list of token ids of length min_len..n_ctx."""
    if not isinstance(value, list) or not min_len <= len(value) <= cfg.n_ctx:
        raise BadInput(f"{where}: must be a list of {min_len}..n_ctx={cfg.n_ctx} token ids")
    return [parse_int(t, f"{where}[{i}]", 0, cfg.d_vocab - 1) for i, t in enumerate(value)]


def parse_claim(claim: dict, cfg) -> Question:
    """Validate the claim (free kind any, perm or upto) against the model config."""
    fields(claim, "claim", {"prefix", "query", "predicted", "free"})
    if cfg.d_vocab < 2:   # as for prediction: no competitor, so no claim (and no summary) to make
        raise BadInput("claim: the model has d_vocab = 1, so there is no other token to be ahead of")
    prefix = parse_tokens(claim["prefix"], "claim.prefix", cfg, 0)
    query = parse_int(claim["query"], "claim.query", 0, cfg.d_vocab - 1)
    k = parse_int(claim["predicted"], "claim.predicted", 0, cfg.d_vocab - 1)
    free = claim["free"]
    if not isinstance(free, dict) or free.get("kind") not in ("any", "perm", "upto"):
        raise BadInput('claim.free: must be {"kind": "any", "length": N} or {"kind": "perm", "tokens": [...]} '
                       'or {"kind": "upto", "length": N}')
    if free["kind"] == "perm":
        fields(free, "claim.free", {"kind", "tokens"})
        multiset = parse_tokens(free["tokens"], "claim.free.tokens", cfg, 1)
        n_free = len(multiset)
    else:   # any: 1..n_ctx tokens; upto: every length 0..N
        fields(free, "claim.free", {"kind", "length"})
        n_free, multiset = parse_int(free["length"], "claim.free.length", int(free["kind"] == "any"), cfg.n_ctx), None
    if len(prefix) + n_free + 1 > cfg.n_ctx:
        raise BadInput(f"claim: n_fix + n_free + 1 = {len(prefix) + n_free + 1} exceeds n_ctx = {cfg.n_ctx}")
    return Question(prefix, query, k, free["kind"], n_free, multiset)


def check_sample(B, model, W, sample, q: Question, ob, title: str, where: str) -> Fraction:
    """The PTP obligations: the sample lies in the designed set and predicts k with its claimed margin,
    which is returned (the prediction kind's check_claim certifies it, records the certified margin as
    figure f"{where}.margin")."""
    tokens, predicted, margin = parse_prediction(sample, model.config, where)
    n_fix = len(q.prefix)
    t0 = tokens[n_fix:-1]
    with ob.step(f"{title}: sample in designed set"):
        ob.require(tokens[:n_fix] == q.prefix and tokens[-1] == q.query and len(t0) == q.n_free,
                   f"{where}.tokens is not the {n_fix}-token prefix + {q.n_free} free tokens + query {q.query} "
                   f"({len(tokens)} tokens, prefix {'' if tokens[:n_fix] == q.prefix else 'not '}matched, last {tokens[-1]})")
        ob.require(q.multiset is None or sorted(t0) == sorted(q.multiset), f"the sample's free tokens (sorted) "
                   f"{sorted(t0)} are not a permutation of claim.free.tokens {sorted(q.multiset or [])}")
    with ob.step(f"{title}: sample prediction"):
        ob.require(predicted == q.predicted, f"the sample predicts {predicted}, the claim says {q.predicted}")
    check_claim(B, model, sample, ob, where, W, f"{title}: sample margin (PTP)")
    return margin

