"""`tcert selftest`: a bounded property-based soundness campaign on the installed checker (docs/selftest.md).

Per kind: random tiny models and claims; the generator makes certificates (tcert.api); both backends check
each one; every VERIFIED claim is confirmed by exhaustive enumeration with the oracle of
tcert.generator.exact_oracle (mpmath at 200 bits, written from docs/model-format.md, sharing no code with the
checker); then mutants of each certificate (the moves of tcert.testing.mutation, plus moves that make the
claim false on purpose) are checked, and a mutant the checker accepts is judged by the same oracle. A false
VERIFIED or a disagreement between the backends makes the campaign fail (exit 1).
"""

import itertools
import random
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from tcert.generator.cli import EXIT_FAILED, EXIT_OK, Outcome, outcome_command
from tcert.generator.exact_oracle import ExactModel, all3, distinct_permutations

KINDS = ("prediction", "overwhelm", "accuracy", "influence")
BACKENDS = ("flint", "mpmath")
DEFAULT_EXAMPLES = 10     # per kind: under a minute on this machine (docs/selftest.md)
MUTANTS_PER_CERTIFICATE = 6
COLUMNS = ("tried", "certified", "verified", "confirmed", "mutants", "mutants rejected", "mutants still true",
           "false VERIFIED", "backend disagreements", "undecided")


@dataclass
class Row:
    """One kind's tally; `problems` names every false VERIFIED, disagreement and undecided case."""

    kind: str
    counts: dict = field(default_factory=lambda: dict.fromkeys(COLUMNS, 0))
    problems: list = field(default_factory=list)

    def add(self, column: str, note: str | None = None):
        self.counts[column] += 1
        if note:
            self.problems.append(f"{self.kind}: {column}: {note}")


def exact(text) -> Fraction:
    """A certificate number (hex float, p/q or integer) as a Fraction; the oracle's own reader."""
    if isinstance(text, int) and not isinstance(text, bool):
        return Fraction(text)
    text = str(text)
    return Fraction(float.fromhex(text)) if "0x" in text.lower() else Fraction(text)


def verdict(cert: dict, model, backend: str) -> str:
    """"VERIFIED", "REJECTED" (a failed obligation or unusable input) or "INTERNAL" (any other exception)."""
    import tcert.api as tc
    try:
        return "VERIFIED" if tc.check(cert, model, backend) else "REJECTED"
    except tc.BadInputError:
        return "REJECTED"
    except Exception as e:   # a checker bug: never VERIFIED, but worth a line
        return f"INTERNAL {type(e).__name__}: {str(e)[:80]}"


# --- truth of a claim on a tiny model (True, False, or None: undecided) ------------------------------

def prediction_truth(oracle: ExactModel, claim: dict) -> bool | None:
    c = oracle.c
    try:
        tokens, k, margin = [int(t) for t in claim["tokens"]], int(claim["predicted"]), exact(claim["margin"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return False
    if not (1 <= len(tokens) <= c.n_ctx and all(0 <= t < c.d_vocab for t in tokens) and 0 <= k < c.d_vocab):
        return False
    return oracle.ahead_by(tokens, k, margin) if margin > 0 else False


def overwhelm_truth(oracle: ExactModel, claim: dict, limit: int = 5000) -> bool | None:
    """Every free string of the claim's set gives the predicted token as the strict argmax."""
    c = oracle.c
    try:
        prefix, query, k, free = list(claim["prefix"]), int(claim["query"]), int(claim["predicted"]), claim["free"]
        if free["kind"] == "any":
            strings = itertools.product(range(c.d_vocab), repeat=int(free["length"]))
            count = c.d_vocab ** int(free["length"])
        elif free["kind"] == "perm":
            strings = distinct_permutations(free["tokens"])
            count = len(strings)
        else:
            return None   # upto:N is not drawn by the campaign
    except (KeyError, TypeError, ValueError):
        return False
    ids = prefix + [query] + (list(free.get("tokens", [])))
    if any(not isinstance(t, int) or not 0 <= t < c.d_vocab for t in ids) or not 0 <= k < c.d_vocab:
        return False
    if count > limit:
        return None
    return all3(oracle.strict_argmax(prefix + list(t) + [query], k) for t in strings)


def accuracy_truth(oracle: ExactModel, correct: int, claim: dict) -> bool | None:
    c = oracle.c
    try:
        same = (claim["task"] == "max-of-k" and claim["d_vocab"] == c.d_vocab and claim["n_ctx"] == c.n_ctx
                and claim["inputs"] == c.d_vocab ** c.n_ctx)
        return bool(same and int(claim["correct_at_least"]) <= correct)
    except (KeyError, TypeError, ValueError):
        return False


def exact_correct(oracle: ExactModel) -> int | None:
    """How many of the d_vocab^n_ctx inputs the model answers correctly (None if one is undecided)."""
    c, count = oracle.c, 0
    for t in itertools.product(range(c.d_vocab), repeat=c.n_ctx):
        ok = oracle.strict_argmax(list(t), max(t))
        if ok is None:
            return None
        count += ok
    return count


def influence_extremes(oracle: ExactModel, n: int) -> tuple:
    """(max ||y - y'||_2, max ||p - p'||_1) over inputs of length n differing at one position i <= n-2."""
    mp, c = oracle.mp, oracle.c
    runs = {}
    for t in itertools.product(range(c.d_vocab), repeat=n):
        y = oracle.residual(list(t))
        yf = oracle.norm(y, "ln_final") if c.final_ln else y
        runs[t] = (y, oracle.probabilities(oracle.affine(yf, oracle.W["unembed.W_U"], oracle.W["unembed.b_U"])))
    dy = dp = mp.mpf(0)
    for t, (y, p) in runs.items():
        for i in range(n - 1):
            for s in range(t[i] + 1, c.d_vocab):
                y2, p2 = runs[t[:i] + (s,) + t[i + 1:]]
                dy = max(dy, mp.sqrt(mp.fsum((a - b) ** 2 for a, b in zip(y, y2))))
                dp = max(dp, mp.fsum(abs(a - b) for a, b in zip(p, p2)))
    return dy, dp


def influence_truth(oracle: ExactModel, extremes: dict, claim: dict) -> bool | None:
    c = oracle.c
    try:
        n_min, n_max, rate = int(claim["n_min"]), int(claim["n_max"]), claim["rate"]
        C, Cp, Ca, Cpa = (exact(claim[k]) for k in ("C", "C_prob", "C_abs", "C_prob_abs"))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return False
    if "corollary" in claim or rate not in ("inverse", "harmonic") or not 2 <= n_min <= n_max <= c.n_ctx:
        return None if "corollary" in claim else False
    out = True
    for n in range(n_min, n_max + 1):
        H = sum(Fraction(1, m) for m in range(1, n + 1))
        r = Fraction(1, n) if rate == "inverse" else H ** (c.n_layers - 1) / n
        dy, dp = extremes[n] if n in extremes else extremes.setdefault(n, influence_extremes(oracle, n))
        for value, bound in ((dy, min(C * r, Ca)), (dp, min(Cp * r, Cpa))):
            out = all3([out, oracle.at_least(oracle.exact(bound), value)])
    return out


# --- the random examples ------------------------------------------------------------------------

def prediction_example(rng: random.Random):
    """A random tiny model of a random architecture, a random input; (model, certificate or None, truth)."""
    import tcert.api as tc
    arch = rng.choice(["attn-only", "preln", "neox1l"])
    extra = {} if arch == "neox1l" else {"attention_dir": rng.choice(["causal", "bidirectional"])}
    if arch == "preln":
        extra.update(act_fn=rng.choice(["relu", "gelu", "gelu_new"]),
                     positional_embedding_type=rng.choice(["standard", "rotary"]))
    model = tc.random_model(arch, seed=rng.randrange(1 << 30), d_vocab=8, d_model=8, n_heads=2, d_head=4, d_mlp=8,
                            n_ctx=6, n_layers=1 if arch == "neox1l" else rng.choice([1, 2]), **extra)
    tokens = [rng.randrange(8) for _ in range(rng.randint(1, 6))]
    oracle = ExactModel(model)
    return model, _generate(tc.predict, model, tokens), lambda claim: prediction_truth(oracle, claim)


def overwhelm_example(rng: random.Random):
    """A random 1-layer rotary model, a long constant prefix (so that it may overwhelm), a small free set."""
    import tcert.api as tc
    model = tc.random_model("neox1l", seed=rng.randrange(1 << 30), d_vocab=5, d_model=8, n_heads=2, d_head=4,
                            d_mlp=8, n_ctx=40, weight_scale=0.5)
    prefix = [rng.randrange(5)] * rng.randint(20, 30) + [rng.randrange(5) for _ in range(rng.randint(0, 2))]
    free, method = rng.choice([(f"any:{rng.randint(1, 2)}", "naive"), ("perm:" + ",".join(
        str(rng.randrange(5)) for _ in range(3)), rng.choice(["lp", "naive"])), ("any:2", "tight")])
    oracle = ExactModel(model)
    cert = _generate(tc.overwhelm, model, prefix, rng.randrange(5), free, method)
    return model, cert, lambda claim: overwhelm_truth(oracle, claim)


def maxofk_tensors(v: int, k: int, noise: float, seed: int):
    """A Max-of-k model that attends to the largest key token and copies it to the logits, plus noise."""
    d = 2 * v + 2
    g = np.random.default_rng(seed)
    E = np.zeros((v, d))
    E[np.arange(v), np.arange(v)] = 1
    E[:, v] = np.arange(v) / (v - 1)
    P = np.zeros((k, d))
    P[:, v + 1] = 1
    WQ, WK, WO, WU = (np.zeros(s) for s in ((d, d), (d, d), (d, d), (d, v)))
    WQ[v + 1, 0], WK[v, 0] = 12.0, 1.0
    WO[np.arange(v), v + 2 + np.arange(v)] = 1
    WU[v + 2 + np.arange(v), np.arange(v)] = 3.0
    t = {"embed.W_E": E, "pos_embed.W_pos": P, "blocks.0.attn.W_Q": WQ[None], "blocks.0.attn.W_K": WK[None],
         "blocks.0.attn.W_V": np.eye(d)[None], "blocks.0.attn.W_O": WO[None], "unembed.W_U": WU,
         "blocks.0.attn.b_Q": np.zeros((1, d)), "blocks.0.attn.b_K": np.zeros((1, d)),
         "blocks.0.attn.b_V": np.zeros((1, d)), "blocks.0.attn.b_O": np.zeros(d), "unembed.b_U": np.zeros(v)}
    t = {name: (a + noise * g.standard_normal(a.shape)).astype(np.float32) for name, a in t.items()}
    return t, dict(n_layers=1, d_model=d, n_heads=1, d_head=d, d_vocab=v, n_ctx=k, attn_only=True,
                   normalization_type=None)


def accuracy_example(rng: random.Random):
    import tcert.api as tc
    from tcert.generator.model.files import in_memory_model
    model = in_memory_model(*maxofk_tensors(5, 3, rng.choice([0.02, 0.1, 0.3]), rng.randrange(1 << 30)))
    oracle = ExactModel(model)
    correct = exact_correct(oracle)
    cert = _generate(tc.accuracy, model, rng.choice(["brute", "cubic"]))
    return model, cert, lambda claim: None if correct is None else accuracy_truth(oracle, correct, claim)


def influence_example(rng: random.Random):
    import tcert.api as tc
    arch = rng.choice(["preln", "attn-only"])
    extra = {"act_fn": rng.choice(["relu", "gelu"])} if arch == "preln" else {}
    model = tc.random_model(arch, seed=rng.randrange(1 << 30), d_vocab=3, d_model=8, n_heads=2, d_head=4, d_mlp=8,
                            n_ctx=4, n_layers=rng.choice([1, 2]),
                            attention_dir=rng.choice(["causal", "bidirectional"]), **extra)
    oracle, extremes = ExactModel(model), {}
    cert = _generate(tc.influence, model, rng.choice([2, 3]))
    return model, cert, lambda claim: influence_truth(oracle, extremes, claim)


EXAMPLES = {"prediction": prediction_example, "overwhelm": overwhelm_example, "accuracy": accuracy_example,
            "influence": influence_example}


def _generate(fn, *args):
    """The certificate dict `fn` makes, or None when the generator finds nothing to certify."""
    import tcert.api as tc
    try:
        return fn(*args).data
    except tc.InconclusiveError:
        return None


# --- the campaign -------------------------------------------------------------------------------

def false_moves(cert: dict, d_vocab: int) -> list:
    """Claims made false on purpose (the checker must reject each): (label, certificate)."""
    import copy
    c, kind, out = cert["claim"], cert["kind"], []

    def edit(label, **changes):
        m = copy.deepcopy(cert)
        m["claim"].update(changes)
        out.append((label, m))
    if kind in ("prediction", "overwhelm"):
        edit("predicted+1", predicted=(c["predicted"] + 1) % d_vocab)
    if kind == "prediction":
        edit("margin*2+1", margin=str(2 * exact(c["margin"]) + 1))
    if kind == "accuracy" and c["correct_at_least"] < c["inputs"]:
        edit("count+inputs/5", correct_at_least=min(c["inputs"], c["correct_at_least"] + c["inputs"] // 5 + 1))
    if kind == "influence":
        edit("C/1000", C=str(exact(c["C"]) / 1000), C_abs=str(exact(c["C_abs"]) / 1000))
    return out


def run_example(row: Row, rng: random.Random, mutants_per_cert: int):
    """One random example of `row.kind`: generate, check with both backends, confirm, mutate."""
    from tcert.testing.mutation import mutants
    model, cert, truth = EXAMPLES[row.kind](rng)
    row.add("tried")
    if cert is None:
        return
    row.add("certified")
    label = f"{row.kind} claim {str(cert['claim'])[:120]}"
    got = {b: verdict(cert, model, b) for b in BACKENDS}
    if len(set(got.values())) > 1:
        row.add("backend disagreements", f"{got} on {label}")
    if got["flint"] == "VERIFIED" and got["mpmath"] == "VERIFIED":
        row.add("verified")
    if "VERIFIED" in got.values():
        judge(row, truth(cert["claim"]), "confirmed", label)
    moves = [m for m in mutants(cert, other_sha="0" * 64)]
    sample = rng.sample(moves, min(mutants_per_cert, len(moves)))
    tries = [(m.label(), m.cert, m.envelope) for m in sample]
    tries += [(lab, m, False) for lab, m in false_moves(cert, model.config.d_vocab)]
    for lab, mutant, envelope in tries:
        row.add("mutants")
        v = verdict(mutant, model, "flint")
        if v.startswith("INTERNAL"):
            row.problems.append(f"{row.kind}: mutant {lab}: {v}")   # never VERIFIED; noted, not a failure
        if v != "VERIFIED":
            row.add("mutants rejected")
        elif envelope:
            row.add("false VERIFIED", f"envelope mutant {lab} verified")
        else:   # accepted: its claim (changed or not: the original may have been rejected) must be true
            judge(row, truth(mutant["claim"]), "mutants still true", f"mutant {lab}")


def judge(row: Row, truth, true_column: str, label: str):
    """Count a VERIFIED claim as `true_column` when the oracle confirms it, else as false or undecided."""
    if truth is True:
        row.add(true_column)
    elif truth is False:
        row.add("false VERIFIED", f"{label} is false (exhaustive oracle)")
    else:
        row.add("undecided", f"{label}: the oracle could not decide")


def campaign(examples: int = DEFAULT_EXAMPLES, kinds=KINDS, seed: int = 0, progress: bool = False,
             mutants_per_cert: int = MUTANTS_PER_CERTIFICATE) -> dict:
    """Run the campaign; {kind: Row}."""
    rng = random.Random(seed)
    rows = {k: Row(k) for k in kinds}
    jobs = [k for k in kinds for _ in range(examples)]
    bar = _bar(len(jobs), progress)
    for kind in jobs:
        run_example(rows[kind], random.Random(rng.randrange(1 << 62)), mutants_per_cert)
        bar(kind)
    return rows


def _bar(total: int, on: bool):
    """A progress bar on stderr (tqdm) or nothing."""
    if not on:
        return lambda kind: None
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:   # a plain counter without tqdm
        done = []

        def count(kind):
            done.append(kind)
            sys.stderr.write(f"\rselftest: {len(done)}/{total} examples ({kind}) " + ("\n" if len(done) == total else ""))
            sys.stderr.flush()
        return count
    t = tqdm(total=total, file=sys.stderr, unit="example", leave=False)

    def step(kind):
        t.set_description(kind)
        t.update()
        if t.n == total:
            t.close()
    return step


def table(rows: dict) -> str:
    """The per-kind table as fixed-width text."""
    heads = ["kind"] + list(COLUMNS)
    body = [[r.kind] + [str(r.counts[c]) for c in COLUMNS] for r in rows.values()]
    widths = [max(len(x) for x in col) for col in zip(heads, *body)]
    return "\n".join("  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(line, widths)))
                     for line in [heads] + body)


@outcome_command
def cmd_selftest(args) -> Outcome:
    """`tcert selftest`: exit 0 only when no false VERIFIED and no backend disagreement was found."""
    from tcert.checker.errors import BadInput
    given = " ".join(args.kinds) if isinstance(args.kinds, list) else args.kinds
    kinds = list(dict.fromkeys(k for k in given.replace(",", " ").split()))
    if not kinds or any(k not in KINDS for k in kinds):
        raise BadInput(f"--kinds: a subset of {' '.join(KINDS)} (got {given!r})")
    if not 1 <= args.examples <= 10_000:
        raise BadInput("--examples must be between 1 and 10000")
    start = time.perf_counter()
    rows = campaign(args.examples, kinds, args.seed, progress=not args.quiet and sys.stderr.isatty())
    seconds = time.perf_counter() - start
    bad = sum(r.counts["false VERIFIED"] + r.counts["backend disagreements"] for r in rows.values())
    problems = [p for r in rows.values() for p in r.problems]
    figures = {"kinds": {k: r.counts for k, r in rows.items()}, "problems": problems, "seconds": round(seconds, 1),
               "examples": args.examples, "seed": args.seed}
    text = table(rows) + "".join(f"\n  {p}" for p in problems[:20]) + (
        f"\nselftest FAILED: {bad} false VERIFIED / backend disagreement(s) ({seconds:.0f} s)" if bad else
        f"\nselftest passed: no false VERIFIED, no backend disagreement ({seconds:.0f} s, seed {args.seed})")
    return Outcome(EXIT_FAILED if bad else EXIT_OK, "failed" if bad else "passed", None, figures, text)


def add_commands(sub):
    """Register `tcert selftest`."""
    p = sub.add_parser("selftest", help="a soundness campaign on the installed checker (run it before trusting "
                                        "a verdict)")
    p.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, help="random examples per kind")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), metavar="KIND",
                   help="kinds to test (space- or comma-separated)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (same seed, same examples)")
    p.set_defaults(func=cmd_selftest, own_progress=True)
