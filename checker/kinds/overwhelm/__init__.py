"""`overwhelm`: for prefix s, query q and every free string t in a designed set T, the greedy next
token of M(s + t + q) is k (the model is "overwhelmed" by s; arXiv 2024, Algorithms 1-5).

claim    {"prefix": [int, ...], "query": int, "predicted": int,
          "free": {"kind": "any", "length": N}            every string of N tokens, or
                  {"kind": "perm", "tokens": [int, ...]}  every permutation of this multiset, or
                  {"kind": "upto", "length": N}           every string of every length 0..N}
evidence by method: "naive" | "lp" (naive_lp.py: one deviation bound W < PTP/2), "tight" (tight.py:
          competitor-wise bounds, exact per head); for upto, {"lengths": [...]} with one of these per
          length (upto.py).

Reading order (modules of this package):
  claim.py     the claim, where each evidence object sits, the sample (PTP) obligation
  tables.py    the fixed side and the hint-independent per-head tables (scores, masses, centred EVOU)
  naive_lp.py  naive/lp: free attention mass (naive; the assignment LP's duals), betas, W, W < PTP/2
  tight.py     tight: fixed part F_j, cheap bound, Dinkelbach inequalities, exact bound < 0
  final_ln.py  tight with a final LayerNorm: the sigma range
  upto.py      upto: length 0, the tables shared by all lengths
and tcert.checker.assignment (weak duality for the assignment problem, used by lp and tight).
Obligation names are "overwhelm <method>: <what>" ("overwhelm upto: length L, <method>: <what>").
"""

from tcert.checker.forward import Weights
from tcert.checker.kinds.overwhelm.claim import Place, Question, parse_claim
from tcert.checker.kinds.overwhelm.naive_lp import check_naive_lp
from tcert.checker.kinds.overwhelm.tables import supported
from tcert.checker.kinds.overwhelm.tight import check_tight
from tcert.checker.kinds.overwhelm.upto import check_length_zero, parse_lengths, shared_tables


def check(model, claim, evidence, B, ob):
    """Verify an overwhelm certificate: the model's shape, the claim, then the evidence of its free kind."""
    supported(model.config)
    q = parse_claim(claim, model.config)
    if q.kind == "upto":
        return check_upto(model, q, evidence, B, ob)
    check_fixed_length(model, q.prefix, q.query, q.predicted, q.n_free, q.multiset, evidence, B, ob)


def check_fixed_length(model, prefix, query, k, n_free, multiset, evidence, B, ob, W=None, shared=None,
                       place: Place = Place()):
    """Verify the evidence for one free length (any:n_free, or perm of multiset) by its method; sets
    ob.summary. `shared` (free kind upto only): value mode -> UptoTables for the naive lengths."""
    q = Question(prefix, query, k, "any" if multiset is None else "perm", n_free, multiset)
    if isinstance(evidence, dict) and evidence.get("method") == "tight":
        return check_tight(model, q, evidence, B, ob, place)
    check_naive_lp(model, q, evidence, B, ob, place, W, shared)


def check_upto(model, q: Question, evidence, B, ob):
    """free {"kind": "upto", "length": N}: length 0 is a prediction, each length L >= 1 an any:L check
    (the lengths' naive tables computed once); the claim is their conjunction."""
    lengths = parse_lengths(evidence, q.n_free)
    W = Weights(B, model)
    check_length_zero(B, model, W, q, lengths[0], ob)
    shared = shared_tables(B, model, q.prefix, q.query, lengths, W, ob)
    for L in range(1, q.n_free + 1):
        check_fixed_length(model, q.prefix, q.query, q.predicted, L, None, lengths[L], B, ob, W, shared,
                           Place(f"evidence.lengths[{L}]", L))
    ob.summary = (f"for the {len(q.prefix)}-token prefix, query {q.query} and every string of length 0..{q.n_free} "
                  f"in between, the next token is {q.predicted} (each of the {q.n_free + 1} lengths certified; "
                  f"length-independent tables shared)")
