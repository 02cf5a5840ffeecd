"""Mutation harness: edit valid certificates one field at a time, run the checker, classify the outcome.

Shared by tests/soundness/test_mutation.py (a CI-sized sample) and benchmarks/mutation_tally.py (every mutant).

Moves (`mutants`):
  numeric   every exact-number string and JSON integer under claim and evidence: one ulp up and down
            (hex float: the neighbouring double; p/q or integer string: +-2^-52 relative; JSON int: +-1),
            +-1e-9 and +-1e-3 relative, sign flip (moves that keep the value, like -0, are skipped). Both directions are always tried: which one is unsafe
            is the oracle's business, not the harness's.
  array     swap each element with its right neighbour; truncate (drop the last element)
  evidence  drop, duplicate or reverse list entries under evidence; drop an evidence key
  strings   claim strings replaced by the other values the schema allows (and one it does not)
  envelope  kind -> every other kind, version -> 2, model_sha256 -> another model's digest

Headline moves (`headline_mutants`): each kind's headline number (HEADLINES) moved just past the value
the checker certified, read from the figures `verify()` records under the field's JSON path (for a
prediction margin, which the checker certifies at a raised precision when it must, past the recorded
upper bound of the true gap); the harness reaches into no checker internals (see the TEMPORARY block for
the one exception left).

Classification of a mutant after `verify`: "rejected" (Rejected or BadInput), "internal" (any
other exception: a robustness bug, never VERIFIED), or accepted. An accepted mutant whose claim equals
the original's is "accepted-true" (only evidence changed; the original claim was verified and is
checked by the kind's own oracle tests). An accepted mutant with a changed claim is judged by a
per-kind oracle on the tiny model: "accepted-true", "accepted-false" (a soundness bug) or
"accepted-undecided" (the oracle could not decide). Envelope mutants that are accepted are counted as
"accepted-false": a certificate for another kind, version or model must never verify.
"""

import copy
import itertools
import json
import math
import os
import random
import time
from collections import Counter
from fractions import Fraction

import numpy as np

from tcert.checker.verify import verify
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.numbers import parse_number
from tcert.generator.certificate import format_number
from tcert.checker.forward import Weights, final_residual, last_logits, softmax
from tcert.checker.interval import make_backend
from tcert.checker.mpmath_backend import MpmathBackend
from tcert.checker.kinds.influence import rate as influence_rate

KINDS = ("prediction", "overwhelm", "accuracy", "influence")
CLASSES = ("rejected", "accepted-true", "accepted-false", "accepted-undecided", "internal")
ULP = Fraction(1, 2 ** 52)


# --- paths into a JSON tree --------------------------------------------------------------------

def get(obj, path):
    """The value at `path` (a tuple of keys and indices)."""
    for p in path:
        obj = obj[p]
    return obj


def put(obj, path, value):
    """A deep copy of `obj` with `value` at `path`."""
    out = copy.deepcopy(obj)
    parent = get(out, path[:-1])
    parent[path[-1]] = value
    return out


def walk(obj, path=()):
    """Every (path, value) in a JSON tree, containers included, parents first."""
    yield path, obj
    if isinstance(obj, dict):
        for k in sorted(obj):
            yield from walk(obj[k], path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from walk(v, path + (i,))


def is_number(v) -> bool:
    """Whether a leaf is an exact certificate number (JSON integer or number string)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    if isinstance(v, str):
        try:
            parse_number(v, "leaf")
            return True
        except BadInput:
            return False
    return False


# --- numeric moves -----------------------------------------------------------------------------

def is_hex(text) -> bool:
    """Whether a number string is a hex float."""
    return isinstance(text, str) and "0x" in text.lower()


def number_moves(v) -> list:
    """(move name, new leaf) pairs for one numeric leaf; the new leaf keeps the leaf's JSON type."""
    if isinstance(v, int):
        return [("int+1", v + 1), ("int-1", v - 1)] + ([("sign", -v)] if v else []) + \
            ([("rel+1e-3", v + max(1, abs(v) // 1000)), ("rel-1e-3", v - max(1, abs(v) // 1000))]
             if abs(v) >= 1000 else [])
    x = parse_number(v, "leaf")
    out = []
    if is_hex(v):
        f = float(x)
        out += [("ulp+", math.nextafter(f, math.inf).hex()), ("ulp-", math.nextafter(f, -math.inf).hex())]
    else:
        step = abs(x) * ULP if x else ULP
        out += [("ulp+", format_number(x + step)), ("ulp-", format_number(x - step))]
    for name, rel in (("1e-9", Fraction(1, 10 ** 9)), ("1e-3", Fraction(1, 1000))):
        step = abs(x) * rel if x else rel
        out += [(f"rel+{name}", format_number(x + step)), (f"rel-{name}", format_number(x - step))]
    out.append(("sign", format_number(-x) if not is_hex(v) else (-float(x)).hex()))
    return [(n, t) for n, t in out if parse_number(t, "move") != x]    # no-ops (sign of 0) are not mutants


STRING_ALTERNATIVES = {"rate": ["inverse", "harmonic"], "kind": ["any", "perm"], "task": ["max-of-k"],
                       "method": ["naive", "lp"], "value_bound": ["table", "norm"],
                       "strategy": ["brute", "cubic", "subcubic"], "variant": ["svd", "svd2", "exact-eqke"]}


def is_unclaimed(path, v) -> bool:
    """Whether a leaf is an accuracy refine rule-"e" entry's unclaimed hint (evidence.patterns[j][4])."""
    return isinstance(v, str) and len(path) == 4 and path[:2] == ("evidence", "patterns") and path[3] == 4


def unclaimed_moves(cert, path, v) -> list:
    """(move, new hint) pairs for an unclaimed hint: each of its first and last fillings dropped (that input is
    then decided one by one), the first filling listed twice, the first filling not yet listed added (it is then
    never credited), every listed token moved by one, and hex junk."""
    m, _, posmask = get(cert, path[:3])[:3]
    w, k = len(format(cert["claim"]["d_vocab"] - 1, "x")), bin(posmask).count("1")
    size = w * k
    listed = [v[i:i + size] for i in range(0, len(v), size)] if size else []
    fillings = ("".join(format(t, f"0{w}x") for t in f) for f in itertools.product(range(m), repeat=k))
    unlisted = next((f for f in fillings if f not in listed), None) if k else None
    out = [("hint-drop-first", "".join(listed[1:])), ("hint-drop-last", "".join(listed[:-1]))] if listed else []
    out += [("hint-dup-first", listed[0] + v)] if listed else []
    out += [("hint-add", "".join(sorted(listed + [unlisted])))] if unlisted else []
    out += [("hint-token+1", "".join(format(min(int(v[i:i + w], 16) + 1, m - 1), f"0{w}x")
                                     for i in range(0, len(v), w)))] if v else []
    out.append(("hint-junk", v + "g"))
    return [(name, new) for name, new in out if new != v]


class Mutant:
    """One edited certificate: what was moved, how, and whether the claim or envelope changed. The
    edited certificate is built on first use (`cert`), so that sampling a large certificate is cheap."""

    __slots__ = ("family", "where", "move", "_make", "_cert", "claim_changed", "envelope")

    def __init__(self, family, where, move, make):
        self.family, self.where, self.move, self._make, self._cert = family, where, move, make, None
        self.envelope = family == "envelope"
        self.claim_changed = not self.envelope and where[0] == "claim"

    @property
    def cert(self) -> dict:
        """The mutated certificate."""
        if self._cert is None:
            self._cert = self._make()
        return self._cert

    def label(self) -> str:
        """A short name: family, JSON path, move."""
        return f"{self.family}:{'.'.join(map(str, self.where))}:{self.move}"


def mutants(cert: dict, other_sha: str | None = None):
    """Every mutant of `cert` (a generator of Mutant)."""
    def at(path, value):
        # A claim edit would also make the statement stale ("statement: the claim in words" rejects it):
        # drop the statement so that the kind's own obligations and the oracle judge the edited claim.
        def make():
            out = put(cert, path, value() if callable(value) else value)
            if path[0] == "claim":
                out.pop("statement", None)
            return out
        return make

    def swapped(v, i):
        w = list(v)
        w[i], w[i + 1] = w[i + 1], w[i]
        return w

    for top in ("claim", "evidence"):
        for path, v in walk(cert[top], (top,)):
            if is_unclaimed(path, v):           # before is_number: "0111" is a hint, not a number
                for move, new in unclaimed_moves(cert, path, v):
                    yield Mutant("evidence", path, move, at(path, new))
            elif is_number(v):
                for move, new in number_moves(v):
                    yield Mutant("numeric", path, move, at(path, new))
            elif isinstance(v, str) and len(path) > 1 and path[-1] in STRING_ALTERNATIVES:
                for alt in STRING_ALTERNATIVES[path[-1]] + ["bogus"]:
                    if alt != v:
                        yield Mutant("string", path, f"->{alt}", at(path, alt))
            elif isinstance(v, list) and v:
                for i in range(len(v) - 1):
                    if v[i] != v[i + 1]:
                        yield Mutant("array", path, f"swap{i}", at(path, lambda v=v, i=i: swapped(v, i)))
                yield Mutant("array", path, "truncate", at(path, lambda v=v: v[:-1]))
                if top == "evidence":
                    for i in range(len(v)):
                        yield Mutant("evidence", path, f"drop{i}", at(path, lambda v=v, i=i: v[:i] + v[i + 1:]))
                        yield Mutant("evidence", path, f"dup{i}", at(path, lambda v=v, i=i: v[:i + 1] + v[i:]))
                    if len(v) > 1 and v[::-1] != v:
                        yield Mutant("evidence", path, "reverse", at(path, lambda v=v: v[::-1]))
            elif isinstance(v, dict) and top == "evidence":
                for k in sorted(v):
                    yield Mutant("evidence", path + (k,), "drop-key",
                                 at(path, lambda v=v, k=k: {key: x for key, x in v.items() if key != k}))
    for kind in KINDS:
        if kind != cert["kind"]:
            yield Mutant("envelope", ("kind",), f"->{kind}", lambda kind=kind: dict(cert, kind=kind))
    yield Mutant("envelope", ("version",), "->2", lambda: dict(cert, version=2))
    if other_sha:
        yield Mutant("envelope", ("model_sha256",), "->other model", lambda: dict(cert, model_sha256=other_sha))


# --- running and classifying -------------------------------------------------------------------

def run_checker(cert: dict, model_path: str, backend: str = "flint"):
    """Check the in-memory `cert` with tcert.checker.verify.verify (which reads a dict exactly as it reads a
    file); return ("verified" | "rejected" | "internal", detail)."""
    try:
        ob = verify(cert, model_path, backend)
        return "verified", ob.summary
    except (Rejected, BadInput) as e:
        return "rejected", str(e)
    except Exception as e:  # a checker bug: never VERIFIED, but recorded
        return "internal", f"{type(e).__name__}: {e}"


class Tally:
    """Counts per class, timings, and the offending mutants."""

    def __init__(self):
        self.counts, self.seconds, self.bad, self.accepted = Counter(), 0.0, [], []
        self.claim_true = 0     # accepted-true mutants whose claim changed (decided by the oracle)

    def add(self, mutant, cls, detail=""):
        """Record one classified mutant."""
        self.counts[cls] += 1
        if cls in ("accepted-false", "accepted-undecided", "internal"):
            self.bad.append((cls, mutant.label(), detail, mutant.cert))
        elif cls == "accepted-true":
            self.accepted.append(mutant.label())
            self.claim_true += mutant.claim_changed

    def merge(self, other):
        """Add another tally into this one."""
        self.counts.update(other.counts)
        self.seconds += other.seconds
        self.claim_true += other.claim_true
        self.bad += other.bad
        self.accepted += other.accepted

    @property
    def tried(self) -> int:
        """Number of mutants run."""
        return sum(self.counts.values())


def classify(mutant, model_path, oracle, backend="flint") -> tuple:
    """(class, detail) of one mutant."""
    verdict, detail = run_checker(mutant.cert, model_path, backend)
    if verdict != "verified":
        return verdict, detail
    if mutant.envelope:
        return "accepted-false", "envelope edit verified"
    if not mutant.claim_changed:
        return "accepted-true", "evidence-only"
    truth = oracle(mutant.cert["claim"])
    return {True: "accepted-true", False: "accepted-false", None: "accepted-undecided"}[truth], detail


# --- oracles: is a (mutated) claim true of the tiny model? -----------------------------------------

def cached(fn):
    """Memoise an oracle on the claim's JSON text."""
    memo = {}

    def oracle(claim):
        key = json.dumps(claim, sort_keys=True)
        if key not in memo:
            memo[key] = fn(claim)
        return memo[key]
    return oracle


def decide_gaps(B, logits, k, margin) -> bool | None:
    """True if lower(L_k - L_j) >= margin for all j != k, False if some upper(L_k - L_j) < margin."""
    gaps = [logits[k] - logits[j] for j in range(len(logits)) if j != k]
    if all(B.lower(g) >= margin for g in gaps):
        return True
    if any(B.upper(g) < margin for g in gaps):
        return False
    return None


def strict_argmax(B, logits, k) -> bool | None:
    """True if logit k is certainly above every other, False if some other is certainly >= it."""
    gaps = [logits[k] - logits[j] for j in range(len(logits)) if j != k]
    if all(B.lower(g) > 0 for g in gaps):
        return True
    if any(B.upper(g) <= 0 for g in gaps):
        return False
    return None


def prediction_truth(model, claim, B=None) -> bool | None:
    """Prediction oracle: 110-bit mpmath forward; k the strict argmax with gap >= margin (> 0)."""
    B = B or MpmathBackend(110)
    try:
        tokens, k, margin = claim["tokens"], claim["predicted"], parse_number(claim["margin"], "m")
    except (KeyError, TypeError, BadInput):
        return None
    if margin <= 0:
        return None     # the kind refuses non-positive margins; a verified one would be a bug to inspect
    with B.precision():     # the oracle's own precision, whatever the checker's
        return decide_gaps(B, last_logits(B, model, tokens), k, margin)


def prediction_oracle(model):
    """Cached prediction oracle for `model`."""
    return cached(lambda claim: prediction_truth(model, claim))


def free_strings(free, d_vocab):
    """The designed free set of an overwhelm claim."""
    if free["kind"] == "any":
        return itertools.product(range(d_vocab), repeat=free["length"])
    if free["kind"] == "upto":   # every length 0..N
        return itertools.chain.from_iterable(itertools.product(range(d_vocab), repeat=n)
                                             for n in range(free["length"] + 1))
    return sorted(set(itertools.permutations(free["tokens"])))


def overwhelm_oracle(model, prec=110):
    """Overwhelm oracle: every string of the designed set enumerated, 110-bit rigorous forward (Arb);
    the claim holds when token k is the strict argmax on each."""
    B = make_backend("flint", prec)
    W = Weights(B, model)

    def truth(claim):
        verdict = True
        with B.precision():     # the oracle's own precision, whatever the checker's
            for t in free_strings(claim["free"], model.config.d_vocab):
                L = last_logits(B, model, list(claim["prefix"]) + list(t) + [claim["query"]], W)
                d = strict_argmax(B, L, claim["predicted"])
                if d is False:
                    return False
                if d is None:
                    verdict = None
        return verdict
    return cached(truth)


def max_token_gaps(model) -> tuple:
    """Every input of a Max-of-K model with its max token and float64 gap logit[max] - max other logit:
    (tokens, max token, gap) arrays over the d_vocab^n_ctx inputs."""
    from tcert.generator.model.forward import logits
    c = model.config
    toks = np.array(list(itertools.product(range(c.d_vocab), repeat=c.n_ctx)))
    lg = logits(model, toks)
    mx = toks.max(axis=1)
    right = lg[np.arange(len(toks)), mx].copy()
    lg[np.arange(len(toks)), mx] = -np.inf
    return toks, mx, right - lg.max(axis=1)


def accuracy_counts(model, prec=120) -> tuple:
    """(certainly correct, not certainly wrong) input counts of a Max-of-K model: float64 decides gaps
    beyond 1e-6, a rigorous forward pass the rest."""
    toks, mx, gap = max_token_gaps(model)
    lo = hi = int(np.count_nonzero(gap > 1e-6))
    B = make_backend("flint", prec)
    with B.precision():
        for i in np.nonzero(np.abs(gap) <= 1e-6)[0]:
            L = last_logits(B, model, [int(t) for t in toks[i]])
            d = strict_argmax(B, L, int(mx[i]))
            lo += d is True
            hi += d is not False
    return lo, hi


def accuracy_oracle(model):
    """Accuracy oracle: the exact count by enumeration; claim N true iff N <= count. A claim under a
    distribution (claim.distribution) is judged by the weighted count of its inputs (None if the
    distribution or its stated total is malformed: the checker must refuse it)."""
    lo, hi = accuracy_counts(model)
    c = model.config
    verdicts = []

    def truth(claim):
        if (claim.get("task"), claim.get("d_vocab"), claim.get("n_ctx"), claim.get("inputs")) != \
                ("max-of-k", c.d_vocab, c.n_ctx, c.d_vocab ** c.n_ctx):
            return None
        if "distribution" in claim:
            return weighted_claim_truth(model, claim, verdicts)
        N = claim["correct_at_least"]
        return True if N <= lo else False if N > hi else None
    return cached(truth)


def weighted_claim_truth(model, claim, verdicts: list):
    """Truth of a weighted accuracy claim by exhaustive weighted counts (`verdicts` caches the per-input
    verdicts of the model)."""
    from tcert.checker.kinds.accuracy.distribution import parse_distribution
    from tcert.testing.accuracy import input_verdicts, input_weight, weighted_truth
    c = model.config
    try:
        parse_distribution(claim, c.n_ctx, c.d_vocab)
        dist, N = claim["distribution"], parse_number(claim["correct_at_least"], "N")
        total = sum(input_weight(dist, t) for t in itertools.product(range(c.d_vocab), repeat=c.n_ctx))
        if parse_number(claim.get("total_weight"), "total") != total:
            return None
    except (BadInput, KeyError, TypeError, ValueError, IndexError):
        return None
    if not verdicts:
        verdicts.append(input_verdicts(model))
    w_lo, w_hi = weighted_truth(verdicts[0], dist)
    return True if N <= w_lo else False if N > w_hi else None


MAX_COROLLARY_INPUTS = 20_000


class InfluenceOracle:
    """Influence oracle on a tiny model: every input of every length, every single non-final change,
    rigorous (Arb, 100 bits) ||y - y'||_2 and ||p - p'||_1; per length n the max lower and max upper
    enclosure. The corollary part: every change of <= R non-final positions of the given input."""

    def __init__(self, model, original_claim, prec=100):
        self.model, self.original, self.B = model, original_claim, make_backend("flint", prec)
        self.W = Weights(self.B, model)
        self.per_n = {}     # n -> sweep(n), computed on first use
        self.logits = {}    # tokens -> last_logits enclosure (the corollary enumeration)
        self.truth = cached(self._truth)

    def logits_of(self, tokens):
        """Enclosure of the last position's logits, memoised: mutants of one corollary visit the same inputs."""
        key = tuple(tokens)
        if key not in self.logits:
            self.logits[key] = last_logits(self.B, self.model, list(tokens), self.W)
        return self.logits[key]

    def outputs(self, tokens):
        """Enclosures (final residual, next-token distribution) for one input."""
        B = self.B
        return (final_residual(B, self.model, list(tokens), self.W),
                softmax(B, last_logits(B, self.model, list(tokens), self.W)))

    def sweep(self, n):
        """(max lower dy, max upper dy, max lower dp, max upper dp) over single changes at length n."""
        B, v = self.B, self.model.config.d_vocab
        outs = {x: self.outputs(x) for x in itertools.product(range(v), repeat=n)}
        best = [Fraction(0)] * 4
        for x, (y, p) in outs.items():
            for i in range(n - 1):
                for tok in range(x[i] + 1, v):
                    y2, p2 = outs[x[:i] + (tok,) + x[i + 1:]]
                    dy = B.sqrt(B.fsum((a - b) * (a - b) for a, b in zip(y, y2)))
                    diffs = [a - b for a, b in zip(p, p2)]
                    dp_hi = sum(B.abs_upper(d) for d in diffs)
                    dp_lo = sum(max(B.lower(d), -B.upper(d), Fraction(0)) for d in diffs)
                    vals = (B.lower(dy), B.upper(dy), dp_lo, dp_hi)
                    best = [max(b, q) for b, q in zip(best, vals)]
        return best

    def main_truth(self, claim):
        """The influence statement itself."""
        L = self.model.config.n_layers
        try:
            bounds = {k: parse_number(claim[k], k) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
        except (KeyError, BadInput):
            return None
        verdict = True
        for n in range(claim["n_min"], claim["n_max"] + 1):
            if n not in self.per_n:
                self.per_n[n] = self.sweep(n)
            r = influence_rate(claim["rate"], n, L)
            by, bp = min(bounds["C"] * r, bounds["C_abs"]), min(bounds["C_prob"] * r, bounds["C_prob_abs"])
            dy_lo, dy_hi, dp_lo, dp_hi = self.per_n[n]
            if dy_lo > by or dp_lo > bp:
                return False
            if dy_hi > by or dp_hi > bp:
                verdict = None
        return verdict

    def corollary_size(self, cor) -> int:
        """How many changed inputs the corollary enumeration would visit."""
        n, v, R = len(cor["prediction"]["tokens"]), self.model.config.d_vocab, cor["substitutions"]
        return sum(math.comb(n - 1, r) * (v - 1) ** r for r in range(1, R + 1))

    def corollary_truth(self, cor):
        """The one-input robustness statement: prediction holds, and every change of <= R non-final
        positions keeps token k the strict argmax."""
        B, v = self.B, self.model.config.d_vocab
        try:
            if self.corollary_size(cor) > MAX_COROLLARY_INPUTS:
                return None
        except (KeyError, TypeError):
            return None
        base = prediction_truth(self.model, cor["prediction"], B)
        if base is not True:
            return base
        x, k, R = cor["prediction"]["tokens"], cor["prediction"]["predicted"], cor["substitutions"]
        verdict = True
        for r in range(1, R + 1):
            for pos in itertools.combinations(range(len(x) - 1), r):
                for toks in itertools.product(*[[t for t in range(v) if t != x[p]] for p in pos]):
                    x2 = list(x)
                    for p, t in zip(pos, toks):
                        x2[p] = t
                    d = strict_argmax(B, self.logits_of(x2), k)
                    if d is False:
                        return False
                    if d is None:
                        verdict = None
        return verdict

    def local_truth(self, local):
        """The local statement for input x: the prediction holds, every ONE non-final substitution moves the
        last residual by <= change and the distribution (L1) by <= change_prob, and every <= R substitutions
        keep token k (gap_lipschitz, competitors and exact_changes are hints, not part of the statement)."""
        B, v = self.B, self.model.config.d_vocab
        try:
            x = list(local["prediction"]["tokens"])
            D, Dp = (parse_number(local[key], key) for key in ("change", "change_prob"))
            self.corollary_size({"prediction": local["prediction"], "substitutions": local["substitutions"]})
        except (KeyError, TypeError, BadInput):
            return None
        y, p = self.outputs(x)
        verdict = True
        for i in range(len(x) - 1):
            for tok in (t for t in range(v) if t != x[i]):
                y2, p2 = self.outputs(x[:i] + [tok] + x[i + 1:])
                dy = B.sqrt(B.fsum((a - b) * (a - b) for a, b in zip(y, y2)))
                diffs = [a - b for a, b in zip(p, p2)]
                dp_lo = sum(max(B.lower(d), -B.upper(d), Fraction(0)) for d in diffs)
                if B.lower(dy) > D or dp_lo > Dp:
                    return False
                if B.upper(dy) > D or sum(B.abs_upper(d) for d in diffs) > Dp:
                    verdict = None
        robust = self.corollary_truth({"prediction": local["prediction"], "substitutions": local["substitutions"]})
        return False if robust is False else (None if robust is None else verdict)

    def _truth(self, claim):
        """Decide an influence claim: implication from the original where it applies, else enumeration
        (at the oracle's own precision)."""
        with self.B.precision():
            return self._decide(claim)

    def _decide(self, claim):
        """_truth inside the oracle backend's precision block."""
        if "local" in claim or "local" in self.original:
            if set(claim) != {"local"} or not isinstance(claim["local"], dict):
                return None
            return True if implied_local(claim["local"], self.original["local"]) else self.local_truth(claim["local"])
        main = {k: v for k, v in claim.items() if k != "corollary"}
        orig_main = {k: v for k, v in self.original.items() if k != "corollary"}
        verdict = True if implied_influence(main, orig_main) else self.main_truth(main)
        if verdict is False:
            return False
        if "corollary" in claim:
            cor, orig = claim["corollary"], self.original.get("corollary")
            if orig is not None and implied_corollary(cor, orig):
                c = True
            else:
                c = self.corollary_truth(cor)
            verdict = False if c is False else (None if c is None else verdict)
        return verdict


def implied_influence(claim, original) -> bool:
    """Whether an influence claim (without corollary) follows from the verified original: same rate,
    a sub-range of lengths, every bound at least the original's."""
    try:
        return (claim["rate"] == original["rate"] and claim["n_min"] >= original["n_min"]
                and claim["n_max"] <= original["n_max"]
                and all(parse_number(claim[k], k) >= parse_number(original[k], k)
                        for k in ("C", "C_prob", "C_abs", "C_prob_abs")))
    except (KeyError, TypeError, BadInput):
        return False


def implied_corollary(cor, original) -> bool:
    """Whether a corollary follows from the verified original's: same input and token, a margin and a
    number of substitutions no larger (gap_lipschitz is a hint, not part of the statement)."""
    try:
        p, q = cor["prediction"], original["prediction"]
        return (p["tokens"] == q["tokens"] and p["predicted"] == q["predicted"]
                and Fraction(0) < parse_number(p["margin"], "m") <= parse_number(q["margin"], "m")
                and 1 <= cor["substitutions"] <= original["substitutions"])
    except (KeyError, TypeError, BadInput):
        return False


def implied_local(local, original) -> bool:
    """Whether a local claim follows from the verified original's: the same input, token and a margin, R no
    larger, change bounds no smaller."""
    try:
        return (implied_corollary(local, original) or (local["substitutions"] == 0 == original["substitutions"]
                                                       and local["prediction"] == original["prediction"])) \
            and all(parse_number(local[k], k) >= parse_number(original[k], k) for k in ("change", "change_prob"))
    except (KeyError, TypeError, BadInput):
        return False


# --- the certificates under test ------------------------------------------------------------------

class Case:
    """One valid certificate to mutate: its kind, model file, oracle (built lazily) and headline."""

    def __init__(self, kind, name, cert, model_path, make_oracle, shipped=False):
        self.kind, self.name, self.cert, self.model_path = kind, name, cert, model_path
        self._make_oracle, self._oracle, self.shipped = make_oracle, None, shipped

    def oracle(self, claim):
        """The kind's truth oracle for a claim about this case's model."""
        if self._oracle is None:
            self._oracle = self._make_oracle()
        return self._oracle(claim)


def tiny_cases(workdir: str) -> list:
    """Small certificates of every kind generated on tiny models written under `workdir`."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.accuracy.strategies import make_certificate
    from tcert.generator.influence import corollary_certificate, influence_certificate, robust_toy_model, toy_model
    from tcert.generator.model.files import save_model
    from tcert.generator.overwhelm.naive_lp import generate
    from tcert.generator.overwhelm.tight import generate_tight
    from tcert.generator.prediction import prediction_certificate
    from tcert.generator.model.random_models import random_model
    from tcert.testing.overwhelm import tiny_neox1l
    from tcert.testing.accuracy import constructed

    def saved(name, tensors_cfg):
        path = os.path.join(workdir, name + ".safetensors")
        save_model(path, *tensors_cfg)
        return path, load_model(path)

    cases = []
    for arch, layers in (("neox1l", 1), ("preln", 2)):
        path, m = saved(f"pred_{arch}", random_model(arch, d_vocab=8, d_model=8, n_heads=2, d_head=4, d_mlp=16,
                                                     n_ctx=8, n_layers=layers, seed=3))
        cert, _ = prediction_certificate(m, [1, 2, 3, 4, 5])
        cases.append(Case("prediction", f"tiny {arch} L{layers}", cert, path,
                          lambda m=m: prediction_oracle(m)))
    for seed, spec, method in ((6, ("perm", 3, [0, 3, 4]), "lp"), (14, ("any", 2, None), "naive")):
        path, m = saved(f"ow_{seed}", tiny_neox1l(seed, qk_scale=0.5))
        cert, rep = generate(m, [1] * 20, 2, spec, method, "table", "tight")
        assert cert is not None, rep["verdict"]
        cases.append(Case("overwhelm", f"tiny neox1l {spec[0]}/{method}", cert, path,
                          lambda m=m: overwhelm_oracle(m)))
    tight_cases = []
    for seed, spec in ((6, ("perm", 3, [0, 3, 4])), (14, ("any", 2, None))):
        path, m = saved(f"ow_{seed}", tiny_neox1l(seed, qk_scale=0.5))
        # every competitor on the exact path, perm ones with assignment duals: mutants reach every lambda/dual
        cert, rep = generate_tight(m, [1] * 20, 2, spec, relax=False, exact_all=True)
        assert cert is not None, rep
        tight_cases.append(Case("overwhelm", f"tiny neox1l {spec[0]}/tight", cert, path,
                                lambda m=m: overwhelm_oracle(m)))
    path, m = saved("acc", constructed(6, 3, 15.0, 3.0, 0.1, 1))
    for strategy in ("brute", "cubic", "subcubic:svd"):
        cert, _ = make_certificate(m, strategy)
        cases.append(Case("accuracy", f"tiny max-of-3 v6 {strategy}", cert, path,
                          lambda m=m: accuracy_oracle(m)))
    kw = {"d_vocab": 3, "n_ctx": 5, "d_model": 6, "n_heads": 2, "d_head": 3, "d_mlp": 8, "scale": 0.3, "eps": "1"}
    for layers, attention in ((2, "causal"), (1, "bidirectional")):
        path, m = saved(f"infl_{layers}{attention}", toy_model(n_layers=layers, attention=attention, **kw))
        cert = influence_certificate(m)
        cases.append(Case("influence", f"toy L{layers} {attention}", cert, path,
                          lambda m=m, c=cert: InfluenceOracle(m, c["claim"]).truth))
    # n_ctx 6: the oracle enumerates every input of every length (3^6 at the top) and, for the corollary,
    # every change of <= R positions; at n_ctx 8 this one case was a fifth of the suite's time.
    path, m = saved("robust2", robust_toy_model(2, d_vocab=3, n_ctx=6))
    cert, info = corollary_certificate(m, [1, 2, 0, 1, 2, 0])
    assert cert is not None, info
    cases.append(Case("influence", "robust L2 causal v3 + corollary", cert, path,
                      lambda m=m, c=cert: InfluenceOracle(m, c["claim"]).truth))
    path, m = saved("acc", constructed(6, 3, 15.0, 3.0, 0.1, 1))
    cert, _ = make_certificate(m, "subcubic:svd-rec")      # recursive deflation hints (x_i, y_i)
    tight_cases.append(Case("accuracy", "tiny max-of-3 v6 subcubic:svd-rec", cert, path,
                            lambda m=m: accuracy_oracle(m)))
    for name, strategy, dist in (("refine", "refine", None), ("refine:1.1x", "refine:1.1x", None),
                                 ("refine weighted", "refine", {"max_at_least": 2, "position_weights": [
                                     ["1", "2", "1/3", "0", "5", "1"], ["1"] * 6, ["3/7", "1", "1", "2", "1", "1"]]}),
                                 ("cubic weighted", "cubic", {"max_at_least": 3})):
        cert, _ = make_certificate(m, strategy, None, dist)
        tight_cases.append(Case("accuracy", f"tiny max-of-3 v6 {name}", cert, path, lambda m=m: accuracy_oracle(m)))
    return (cases + tight_cases + real_block_cases(workdir) + upto_cases(workdir)   # appended last: the per-index
            + nope_cases(workdir) + llama_cases(workdir) + local_cases(workdir))      # tests keep their cases


def local_cases(workdir: str) -> list:
    """A local influence certificate (claim {"local": ...}, evidence {}) on a tiny 1-layer rotary model with
    parallel blocks (d_vocab 3), R >= 2 with a competitor checked along its direction, and one on a sharper
    model, R = 1 with exactly evaluated single changes, and one on a 2-layer model (the propagated rule, R = 1):
    judged by every single substitution and every set of <= R substitutions of its input."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.influence import toy_model
    from tcert.generator.influence.local import local_certificate
    from tcert.generator.model.files import save_model
    path = os.path.join(workdir, "local_rotary.safetensors")
    save_model(path, *toy_model(n_layers=1, d_vocab=3, n_ctx=6, d_model=6, n_heads=2, d_head=4, d_mlp=8,
                                scale=0.3, eps="1/10", rotary=True, parallel=True, seed=4))
    m = load_model(path)
    cert, info = local_certificate(m, [2, 2, 2, 2, 2])
    assert cert is not None and info["R"] >= 2 and info["competitors"] >= 1, info
    sharp = os.path.join(workdir, "local_rotary_sharp.safetensors")   # R = 1 by exactly evaluated single changes
    save_model(sharp, *toy_model(n_layers=1, d_vocab=3, n_ctx=6, d_model=6, n_heads=2, d_head=4, d_mlp=8,
                                 scale=0.8, eps="1/10", rotary=True, parallel=True, seed=4))
    m2 = load_model(sharp)
    cert2, info2 = local_certificate(m2, [2, 2, 2, 2, 2], 1)
    assert cert2 is not None and info2["exact_changes"] >= 1, info2
    deep = os.path.join(workdir, "local_rotary_l2.safetensors")   # 2 layers: the propagated rule, R = 1
    tensors, cfg = toy_model(n_layers=2, d_vocab=3, n_ctx=6, d_model=6, n_heads=2, d_head=4, d_mlp=8, scale=0.3,
                             eps="1/10", rotary=True, parallel=True)
    tensors["unembed.b_U"] = tensors["unembed.b_U"] + 32 * (np.arange(3) == 0)   # a margin R = 1 survives
    save_model(deep, tensors, cfg)
    m3 = load_model(deep)
    cert3, info3 = local_certificate(m3, [0, 2, 1, 1, 0])
    assert cert3 is not None and info3["R"] == 1, info3
    return [Case("influence", "tiny local rotary parallel", cert, path,
                 lambda m=m, c=cert: InfluenceOracle(m, c["claim"]).truth),
            Case("influence", "tiny local rotary sharp (exact changes)", cert2, sharp,
                 lambda m=m2, c=cert2: InfluenceOracle(m, c["claim"]).truth),
            Case("influence", "tiny local L2 rotary parallel (propagated)", cert3, deep,
                 lambda m=m3, c=cert3: InfluenceOracle(m, c["claim"]).truth)]


def llama_cases(workdir: str) -> list:
    """A global influence certificate on a tiny Llama-family model (RMSNorm, SiLU-gated MLP, grouped-query
    attention: one key/value head for two query heads, 2 layers, d_vocab 3, n_ctx 4), so mutants reach the
    gated MLP's and RMSNorm's ledger constants."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.influence import influence_certificate
    from tcert.generator.model.files import save_model
    from tcert.generator.model.random_models import random_model
    path = os.path.join(workdir, "llama_gqa.safetensors")
    save_model(path, *random_model("llama", seed=1, n_layers=2, n_key_value_heads=1, d_vocab=3, d_model=8,
                                   n_heads=2, d_head=4, d_mlp=8, n_ctx=4, bias_std=0.3, eps="1/10"))
    m = load_model(path)
    cert = influence_certificate(m)
    return [Case("influence", "tiny llama L2 gqa", cert, path, lambda m=m, c=cert: InfluenceOracle(m, c["claim"]).truth)]


def upto_cases(workdir: str) -> list:
    """An overwhelm `upto:2` certificate (naive evidence per length, tight hints) on a tiny neox1l model:
    its lengths' tables come from the checker's shared UptoTables."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.model.files import save_model
    from tcert.generator.overwhelm.upto import generate_upto
    from tcert.testing.overwhelm import tiny_neox1l
    path = os.path.join(workdir, "ow_upto_14.safetensors")
    save_model(path, *tiny_neox1l(14, qk_scale=0.5))
    m = load_model(path)
    cert, rep = generate_upto(m, [1] * 30, 2, 2, "naive", "table", "tight")
    assert cert is not None, rep["failing"]
    return [Case("overwhelm", "tiny neox1l upto/naive", cert, path, lambda m=m: overwhelm_oracle(m))]


def nope_cases(workdir: str) -> list:
    """Overwhelm certificates on a tiny model without positions (positional_embedding_type "none",
    appendix F): naive any:2 and tight perm with every competitor exact and assignment duals."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.model.files import save_model
    from tcert.generator.overwhelm.naive_lp import generate
    from tcert.generator.overwhelm.tight import generate_tight
    from tcert.testing.overwhelm import tiny_nope
    path = os.path.join(workdir, "ow_nope_14.safetensors")
    save_model(path, *tiny_nope(seed=14, qk_scale=0.5))
    m = load_model(path)
    naive, rep = generate(m, [1] * 20, 2, ("any", 2, None), "naive", "table", "tight")
    assert naive is not None, rep["verdict"]
    tight, rep = generate_tight(m, [1] * 20, 2, ("perm", 3, [0, 3, 4]), relax=False, exact_all=True)
    assert tight is not None, rep
    return [Case("overwhelm", f"tiny nope {name}", cert, path, lambda m=m: overwhelm_oracle(m))
            for name, cert in (("any/naive", naive), ("perm/tight", tight))]


def real_block_cases(workdir: str) -> list:
    """Tight overwhelm certificates on a tiny real GPT-NeoX block (separate ln1/ln2, final LN, GELU,
    nonzero biases, partial rotary): every competitor exact, perm with assignment duals (also for the
    final LN's variance direction), so mutants reach evidence.final_ln and every lambda/dual."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.model.files import save_model
    from tcert.generator.overwhelm.tight import generate_tight
    from tcert.testing.overwhelm import tiny_neox_real
    out = []
    path = os.path.join(workdir, "ow_real_1.safetensors")
    save_model(path, *tiny_neox_real(1))
    m = load_model(path)
    for spec in (("perm", 3, [0, 3, 4]), ("any", 2, None)):
        cert, rep = generate_tight(m, [1] * 20, 2, spec, relax=False, exact_all=True)
        assert cert is not None, rep
        out.append(Case("overwhelm", f"tiny neox-real {spec[0]}/tight", cert, path, lambda m=m: overwhelm_oracle(m)))
    return out


def shipped_cases(root) -> list:
    """Every certificate under certificates/ with the model it names (found by SHA-256); only evidence
    and envelope mutations are meaningful there (the oracle is never consulted for a changed claim,
    which counts as undecided)."""
    from tcert.checker.envelope import load_certificate
    from tcert.checker.modelfile import load_model
    models = {load_model(str(p)).sha256: str(p) for p in sorted(root.rglob("*.safetensors"))}
    out = []
    for p in sorted(root.rglob("*.json")):
        load_certificate(str(p))                       # validates the envelope
        with open(p, encoding="utf-8") as f:
            cert = json.load(f)                         # plain JSON (generator info may hold floats)
        out.append(Case(cert["kind"], str(p.relative_to(root)), cert, models[cert["model_sha256"]],
                        lambda: (lambda claim: None), shipped=True))
    return out


def model_shas(cases) -> dict:
    """model path -> SHA-256 for the cases' models."""
    from tcert.checker.modelfile import load_model
    return {c.model_path: load_model(c.model_path).sha256 for c in cases}


def other_sha(case, shas) -> str:
    """The digest of some other model file among the cases (the 'point at another model' mutant)."""
    return next(s for p, s in sorted(shas.items()) if s != case.cert["model_sha256"])


EVIDENCE_FAMILIES = ("numeric", "array", "evidence", "string", "envelope")


def case_mutants(case, shas):
    """The mutants to try on a case (shipped: evidence and envelope edits only)."""
    ms = list(mutants(case.cert, other_sha(case, shas)))
    if case.shipped:
        ms = [m for m in ms if m.envelope or not m.claim_changed]
    return ms


def run_case(case, shas, sample=None, seed=0, backend="flint") -> Tally:
    """Classify (a deterministic sample of) the case's mutants."""
    ms = case_mutants(case, shas)
    if sample is not None and sample < len(ms):
        ms = random.Random(seed).sample(ms, sample)
    tally = Tally()
    start = time.perf_counter()
    for m in ms:
        tally.add(m, *classify(m, case.model_path, case.oracle, backend))
    tally.seconds = time.perf_counter() - start
    return tally


# --- headline numbers: the certified value, moved a hair in the unsafe direction ----------------------

def hair(x: Fraction) -> Fraction:
    """A tiny positive step relative to x (2^-60 |x|, or 2^-60 at zero)."""
    return Fraction(abs(x)) / 2 ** 60 if x else Fraction(1, 2 ** 60)


# Per kind, the headline numbers: the figure key verify() records each under (the JSON path of the
# certificate field it bounds, HELPERS.md "figure keys") and the direction that strengthens the claim.
HEADLINES = {
    "prediction": [("claim.margin", +1)],                       # certified min logit gap
    "overwhelm": [("evidence.deviation", -1),                   # certified W (naive/lp evidence)
                  ("evidence.sample.margin", +1)],              # the sample string's certified gap
    "accuracy": [("claim.correct_at_least", +1)],               # certified count
    "influence": [("claim.C", -1), ("claim.C_prob", -1), ("claim.C_abs", -1), ("claim.C_prob_abs", -1)],
}
COROLLARY_MARGIN = ("claim.corollary.prediction.margin", +1)


def headline_keys(cert: dict) -> list:
    """(figure key, unsafe direction) of every headline number of `cert`."""
    keys = list(HEADLINES[cert["kind"]])
    if cert["kind"] == "influence" and "corollary" in cert["claim"]:
        keys.append(COROLLARY_MARGIN)
    return keys


def certified_values(case) -> dict:
    """Check the case once (flint); return figure key -> the certified value verify() recorded under it,
    for each of the case's headline numbers. A margin's headline is the upper bound of the true gap the
    prediction kind records as "<key>.upper": below it the checker raises its precision until it certifies
    the claim (a true claim, rightly VERIFIED), above it the claim is false."""
    ob = verify(case.cert, case.model_path, "flint")
    return {key: ob.figure(key + ".upper" if key.endswith(".margin") else key) for key, _ in headline_keys(case.cert)}


def moved(value, direction: int, field):
    """The certified `value` moved just past itself in `direction`, in the form of the certificate's `field`:
    a JSON integer (a count) by 1, a number string by a hair."""
    if isinstance(field, int):
        return int(value) + direction
    return format_number(Fraction(value) + direction * hair(Fraction(value)))


def headline_mutants(case) -> list:
    """(label, certificate) pairs that move each kind's headline number just past its certified value in
    the unsafe direction; every one must be REJECTED."""
    values, cert, out = certified_values(case), case.cert, []
    for key, direction in headline_keys(cert):
        path = tuple(key.split("."))
        field = get(cert, path)
        step = "1" if isinstance(field, int) else "hair"
        out.append((f"{key} = certified {'+' if direction > 0 else '-'} {step}",
                    put(cert, path, moved(values[key], direction, field))))
    if "corollary" in cert["claim"]:
        r = cert["claim"]["corollary"]["substitutions"]
        out.append(("corollary substitutions + 1", put(cert, ("claim", "corollary", "substitutions"), r + 1)))
    return out


def unsafe_claim_move(kind: str, m) -> bool:
    """Whether a claim mutant strengthens the claim (the moves that must mostly be rejected)."""
    if not m.claim_changed or m.family != "numeric":
        return False
    up, down = m.move.startswith(("ulp+", "rel+", "int+")), m.move.startswith(("ulp-", "rel-", "int-", "sign"))
    leaf = m.where[-1]
    if kind == "prediction":
        return (leaf == "margin" and up) or leaf == "predicted"
    if kind == "accuracy":
        return leaf == "correct_at_least" and up
    if kind == "influence":
        return (leaf in ("C", "C_prob", "C_abs", "C_prob_abs") and down) or (leaf == "n_max" and up) \
            or (leaf == "n_min" and down) or (leaf == "substitutions" and up) or (leaf == "margin" and up)
    return True     # overwhelm: every claim edit (prefix, query, token, free set) changes the statement
