"""The refining strategy, the pruned brute force and input distributions: exhaustive oracles on tiny models
for every per-case rule (random and adversarially edited entries), mutations, budget monotonicity, both
backends, and weighted claims against exhaustive weighted counts."""

import itertools
import math
import json
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import make_backend
from tcert.checker.kinds.accuracy import cubic, refine, rows, screen, tables
from tcert.checker.kinds.accuracy.distribution import parse_distribution
from tcert.checker.kinds.accuracy.tables import integer_tables, position_sums
from tcert.checker.modelfile import load_model
from tcert.checker.numbers import parse_number
from tcert.checker.obligations import Obligations
from tcert.checker.verify import verify
from tcert.generator import certificate
from tcert.generator.accuracy.strategies import make_certificate
from tcert.generator.model.files import save_model
from tcert.testing import example_scale
from tcert.testing.accuracy import (all_cases, constructed, input_verdicts, input_weight, maxofk_model,
                                    random_distribution, weighted_truth)

TINY = [(5, 3, 1, 0.05, 15.0), (6, 2, 2, 0.1, 8.0), (4, 4, 3, 0.05, 30.0), (6, 3, 4, 0.1, 40.0), (5, 3, 6, 0.08, 15.0)]


def uniform(n, v):
    return parse_distribution({}, n, v)


@pytest.fixture(scope="module", params=TINY, ids=lambda p: "v{}k{}s{}".format(*p[:3]))
def tiny(request, tmp_path_factory):
    """(model path, model, flint integer tables, verdict per input) of a noisy hand-built model."""
    path = str(tmp_path_factory.mktemp("refine") / "m.safetensors")
    save_model(path, *maxofk_model(*request.param))
    model = load_model(path)
    return path, model, integer_tables(make_backend("flint"), model), input_verdicts(model)


def group_inputs(n, m, q, P, tokens):
    """Every input of pattern group (m, q, P) whose free positions take the given token tuples."""
    for filling in tokens:
        t = [m] * (n - 1) + [q]
        for i, x in zip(P, filling):
            t[i] = x
        yield tuple(t)


def case_inputs_of(n, m, q, c, classes):
    """Every input of case (m, q, c) whose non-max positions hold exactly b tokens of S per class (S, b)."""
    out = []
    for P in itertools.combinations(range(n - 1), c):
        for filling in itertools.product(range(m), repeat=c):
            if all(sum(t in S for t in filling) == b for S, b in classes):
                out.append(tuple(next(iter(group_inputs(n, m, q, P, [filling])))))
    return out


# ------------------------------------------------------------------------- cubic's int64 screen, exhaustively

def test_int64_screen_proves_only_correct_cases(tiny):
    """cubic.screened over every case (m, q, c) with one claimed token at a time and with every token below m:
    each case it proves covers only correct inputs (every filling of its c positions from its set, in every
    order), and it proves every case the exact rule proves here (no case falls back needlessly)."""
    _, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    values = {m: cubic.value_bounds(T, m) for m in range(v)}
    proved_any = 0
    for pick in [lambda m, k=k: [k] if k < m else None for k in range(v)] + [lambda m: list(range(m)) or None]:
        cases = {(m, q, c): pick(m) if c else [] for m, q, c in all_cases(n, v) if not c or pick(m)}
        proved = cubic.screened(T, cases)
        for (m, q, c), ks in cases.items():
            exact = np.atleast_1d(cubic.numerator_bound(T, values[m], position_sums(T, q), m, q, c, ks))
            assert ((m, q, c) in proved) == bool(np.all(exact < 0)), (m, q, c, ks)
            if (m, q, c) in proved:
                assert all(verdicts[t] is True for t in case_inputs_of(n, m, q, c, [(ks, c)] if c else [])), (m, q, c)
                proved_any += 1
    assert proved_any > 0


def test_screen_value_bounds_for_every_m_match_the_definition():
    """screen.value_bounds (every max token m at once) against its definition m by m (each table centred at
    column m, column m dropped, maxima over the rest), on random int64 tables with many ties, n = 2..5 and
    d_vocab 2..7; d_vocab 1 is refused (no x != m)."""
    rng = np.random.default_rng(11)
    for n, v in itertools.product(range(2, 6), range(2, 8)):
        V = {}
        for name, rows_ in (("EU", v), ("EVOU", v), ("PVOU", n)):
            lo = rng.integers(-4, 4, size=(rows_, v)) * (1 << 17)
            V[name] = (lo, lo + rng.integers(0, 3, size=lo.shape) * (1 << 16))
        got = screen.value_bounds(V, n)
        for m in range(v):
            EU, EV, PV = (np.delete(hi - lo[:, [m]], m, axis=1) for lo, hi in (V["EU"], V["EVOU"], V["PVOU"]))
            Pn = PV[: n - 1].max(axis=0)
            want = ((EU + EV[m] + Pn).max(axis=1), (EU + EV + PV[n - 1]).max(axis=1), EU.max(axis=1),
                    (EV + Pn).max(axis=1))
            assert all((g[m] == w).all() for g, w in zip(got, want)), (n, v, m)
    one = {name: (np.zeros((r, 1), np.int64),) * 2 for name, r in (("EU", 1), ("EVOU", 1), ("PVOU", 3))}
    with pytest.raises(BadInput, match="d_vocab >= 2"):
        screen.value_bounds(one, 3)


@pytest.mark.parametrize("weighted", [False, True])
def test_derived_cubic_sets_cover_only_correct_inputs(tiny, weighted):
    """refine's cubic sets, derived by the checker (`refine.cubic_weight`, not read from the certificate):
    every input they cover (max m, query q, its c non-max non-query tokens all in the set of (m, q, c); the
    all-max input where proved) is correct, the credited weight is exactly the covered inputs' weight (so
    no set of a case that does not exist and no token >= m adds anything), and each set holds exactly the
    tokens the exact cubic rule proves for its case here (the all-max input likewise)."""
    _, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    spec = random_distribution(random.Random(n * v), n, v) if weighted else {}
    dist = parse_distribution({"distribution": spec} if weighted else {}, n, v)
    sets, weight = refine.cubic_weight(T, dist, Obligations())
    covered = 0
    for t, ok in verdicts.items():
        m, q = max(t), t[-1]
        others = [x for x in t[:-1] if x != m]
        if (m, q, 0) in sets if not others else set(others) <= set(sets.get((m, q, len(others)))):
            assert ok is True, t
            covered += input_weight(spec, t)
    assert dist.value(weight) == covered and covered > 0
    values = {m: cubic.value_bounds(T, m) for m in range(v)}
    for m, q, c in all_cases(n, v):
        exact = np.atleast_1d(cubic.numerator_bound(T, values[m], position_sums(T, q), m, q, c, list(range(m)) or [0]))
        assert (sets.get((m, q, c)) == [k for k in range(m) if exact[k] < 0]) if c else \
            (((m, q, 0) in sets) == bool(exact[0] < 0)), (m, q, c)
    real = np.zeros_like(sets.K)
    for m, q, c in all_cases(n, v):
        real[m, q, c, :m] = c > 0
    assert not np.any(sets.K & ~real) and not np.any(sets.all_max & ~np.tri(v, dtype=bool))


def test_derived_cubic_sets_by_blocks_and_their_limit(tiny, monkeypatch):
    """screen.cubic_sets by blocks of 1, 2 or 3 max tokens derives the same sets (and "cubic keys", which equal
    refine.key_bounds_int64 on every case with a set) as in one block; beyond MAX_SETS entries the check is
    refused as bad input, in one line."""
    path, model, T, _ = tiny
    n, v = T["n"], T["v"]
    D = {k: x for k, x in T.items() if k not in ("cubic sets", "cubic keys")}
    K, all_max = screen.cubic_sets(D)
    M, Q, C = (a.astype(np.int64) for a in np.nonzero(K.any(axis=3)))     # the cases with a cubic set
    keys = refine.key_bounds_int64(screen.screen_tables(D), refine.CubicSets(K, all_max), M, Q, C)
    assert len(M) and np.array_equal(D["cubic keys"][M, Q, C], keys)      # "cubic keys": key_bound of the sets
    for block in (1, 2, 3):
        monkeypatch.setattr(screen, "SETS_CHUNK", block * v * v)
        D2 = {k: x for k, x in T.items() if k not in ("cubic sets", "cubic keys")}
        K2, all_max2 = screen.cubic_sets(D2)
        assert np.array_equal(K, K2) and np.array_equal(all_max, all_max2)
        assert np.array_equal(D["cubic keys"], D2["cubic keys"])
    cert = refine_cert(path, "refine:0")
    monkeypatch.setattr(screen, "MAX_SETS", v ** 3 * n - 1)
    with pytest.raises(BadInput, match=r"d_vocab\^3 n_ctx = \d+ exceeds"):
        check(cert, path)


def test_block_sets_dense_grid_is_the_rule_per_token(tiny):
    """screen.block_sets on its dense (m, q, k) grid gives, for every (m, q, k) with q <= m, k < m, the rule
    A(u) + upper(w, key) < 0 at both ends u written out per token (x = P_lo - u for key < 0, else P_hi - u;
    a = upper end's factor times key where x >= 0, else b), and nothing elsewhere; on random ends (P - u of
    both signs, P_lo != P_hi) and keys of both signs, blocks of 1 to 3 max tokens. Fails on taking P_hi for
    a negative key, on dropping the mask k < m, on writing c = n-1 for q < m."""
    _, _, T, _ = tiny
    n, v = T["n"], T["v"]
    rng = np.random.default_rng(n * v)
    D = {k: x for k, x in T.items() if k not in ("cubic sets", "cubic keys", "screen")}
    S = screen.screen_tables(D)
    S = S._replace(EUp=rng.integers(-50, 50, S.EUp.shape), R=rng.integers(-50, 50, S.R.shape))
    m, q = np.nonzero(np.tri(v, dtype=bool))
    pair = np.zeros((v, v), dtype=np.int64)
    pair[m, q] = np.arange(len(m))
    ends = {c: [(rng.integers(-9, 9, 2 * v), rng.integers(-3000, 3000, len(m))) for _ in range(2)] for c in range(1, n)}
    for block in (1, 2, 3):
        K, KB = np.zeros((v, v, n, v), dtype=bool), np.full((v, v, n), np.iinfo(np.int64).min)
        for m0 in range(0, v, block):
            screen.block_sets(S, pair, ends, range(m0, min(m0 + block, v)), K, KB)
        want, keys = np.zeros_like(K), np.full_like(KB, np.iinfo(np.int64).min)
        for mm, qq, c, k in itertools.product(range(v), range(v), range(1, n), range(v)):
            if qq > mm or k >= mm or (c == n - 1 and qq != mm):
                continue
            lo, hi = (int(screen.weights(S, np.array(qq), np.array(mm), np.array(k), up)) for up in (False, True))
            key = int(S.EUp[mm, qq] + S.R[mm, k])
            a, b = (key * hi, key * lo) if key >= 0 else (key * lo, key * hi)
            xs = [int(P_u[2 * qq + (key < 0)]) for P_u, _ in ends[c]]
            want[mm, qq, c, k] = all(int(A[pair[mm, qq]]) + (a if x >= 0 else b) * x < 0
                                     for x, (_, A) in zip(xs, ends[c]))
            keys[mm, qq, c] = max(keys[mm, qq, c], a) if want[mm, qq, c, k] else keys[mm, qq, c]
        assert np.array_equal(K, want) and np.array_equal(KB, keys), block


# ------------------------------------------------------------------------------- the mixed rule, exhaustively

def test_every_accepted_mixed_entry_covers_only_correct_inputs(tiny):
    """For every case (m, q, c), number b and bad set S (singletons, pairs, all tokens outside K) and several
    K (the cubic set, a random subset, the empty set): whenever the rule's bound is negative, every input it
    covers is correct, and the credited count is the number of inputs covered. K need not be a confirmed
    cubic set: the rule covers the inputs it names whatever K is. The int64 screen (`mixed_screened`) proves
    the same entries."""
    _, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    rng = random.Random(n * v)
    values = {m: cubic.value_bounds(T, m) for m in range(v)}
    accepted, by_exact = 0, [({}, {}, set()) for _ in range(3)]     # per choice of K: cases, entries, accepted
    for m, q, c in all_cases(n, v):
        if c == 0 or m == 0:
            continue
        for choice, K in enumerate(([], sorted(rng.sample(range(m), rng.randint(0, m))), list(range(m - 1)))):
            bad = [k for k in range(m) if k not in K]
            if not bad:
                continue
            keys = refine.key_bounds(T, q, m, bad)
            ends = [(u, u * keys[0] + keys[1]) for u in refine.max_weights(T, q, c)]
            beta_K = refine.key_bound(T, values[m], q, K)
            for S in [[k] for k in bad] + [bad] + ([bad[:2]] if len(bad) > 2 else []):
                for b in range(1, c + 1):
                    if b < c and not K:
                        continue
                    by_exact[choice][0][(m, q, c)] = K
                    by_exact[choice][1].setdefault((m, q, c), []).append((S, b))
                    if not refine.mixed_bound(T, keys[2], ends, beta_K, (m, q, c), S, b) < 0:
                        continue
                    by_exact[choice][2].add(((m, q, c), tuple(S), b))
                    covered = case_inputs_of(n, m, q, c, [(S, b), (K, c - b)])
                    assert all(verdicts[t] is True for t in covered), (m, q, c, K, S, b)
                    w = uniform(n, v).case(m, q, [(K, c - b), (S, b)] if b < c else [(S, b)])
                    assert w == len(covered)
                    accepted += 1
    assert accepted > 0
    for cases, mixed, exact in by_exact:      # the int64 screen proves exactly what the exact rule proves here
        K = np.zeros((v, v, n, v), dtype=bool)
        for (m, q, c), ks in cases.items():
            K[m, q, c, ks] = True
        flat, proved, meets, sizes = refine.mixed_screened(T, refine.CubicSets(K, np.zeros((v, v), dtype=bool)), mixed)
        assert {(case, tuple(S), b) for (case, S, b), p in zip(flat, proved) if p} == exact
        assert sizes == [len(cases[case]) for case, _, _ in flat] and not meets.any()    # S is outside K here


# ------------------------------------------------------------------------------ the pattern rules, exhaustively

@pytest.mark.parametrize("rule", ["d", "e"])
def test_every_pattern_group_credits_only_correct_inputs(tiny, rule):
    """For every group (m, q, P) and several excluded sets K: rule "d" claims (the group minus its failing
    list) only correct inputs, and both rules credit exactly their claimed inputs outside K^P; rule "e",
    with a random unclaimed hint (correct and wrong fillings alike), credits every certainly correct input
    outside K^P and outside the hint (no near ties in these models) and nothing else."""
    _, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    rng = random.Random(rule)
    values = rows.value_tables(T)
    credited_any = 0
    for q in range(v):
        R, Eq, Dal = rows.query_view(T, values, q)
        for m in range(q, v):
            for c in range(0, (n - 1 if q == m else n - 2) + 1):
                for P in itertools.combinations(range(n - 1), c):
                    if m == 0 and P:
                        continue
                    K = sorted(rng.sample(range(m), rng.randint(0, m))) if P else []
                    outside = [f for f in itertools.product(range(m), repeat=c) if not all(t in K for t in f)] \
                        if P else [()]
                    hint = [f for f in itertools.product(range(m), repeat=c) if rng.random() < 0.3] if P else []
                    unclaimed = np.array(hint, dtype=np.int64).reshape(len(hint), c) if rule == "e" else None
                    _, counted, left = refine.pattern_credit(T, (R, Eq, Dal), (m, q, P), K, (rule, unclaimed),
                                                             uniform(n, v))
                    if left:
                        counted += refine.decided_weight(T, R, q, [left], uniform(n, v))[1]
                    inputs = list(group_inputs(n, m, q, P, outside))
                    good = sum(verdicts[t] is True for t in inputs)
                    if rule == "e":
                        skipped = set(group_inputs(n, m, q, P, hint))
                        assert counted == good - sum(verdicts[t] is True for t in skipped if t in inputs), (m, q, P)
                    else:
                        assert counted <= good, (m, q, P)
                        M = [i for i in range(n - 1) if i not in P]
                        theta = -int(rows.fixed_part(R, Eq, q, M, np.array([m]))[0])
                        betas = [Dal[i][:m, m] for i in P]
                        claimed = [f for f in itertools.product(range(m), repeat=c)
                                   if sum(int(b[t]) for b, t in zip(betas, f)) < theta]    # the top-2 bound
                        for t in group_inputs(n, m, q, P, claimed):
                            assert verdicts[t] is True, (m, q, P, t)
                        assert counted == len([f for f in claimed if not (P and all(t in K for t in f))])
                    credited_any += counted
    assert credited_any > 0


def exact_value_tables(model) -> dict:
    """EU, EVOU, PVOU of a 1-layer attention-only model in exact rationals (tables.py's formulas, head 0)."""
    t, n = model.tensors, model.config.n_ctx
    F = lambda a: [[Fraction(float(x)) for x in row] for row in np.atleast_2d(np.asarray(a, dtype=np.float64))]
    mul = lambda A, B: [[sum(a * b for a, b in zip(row, col)) for col in zip(*B)] for row in A]
    add = lambda A, B: [[a + b for a, b in zip(r, s)] for r, s in zip(A, B)]
    E, P, W_U = F(t["embed.W_E"]), F(t["pos_embed.W_pos"]), F(t["unembed.W_U"])
    OU = mul(F(t["blocks.0.attn.W_O"][0]), W_U)
    VOU = mul(F(t["blocks.0.attn.W_V"][0]), OU)
    const = add(mul(add(mul(F(t["blocks.0.attn.b_V"][0]), F(t["blocks.0.attn.W_O"][0])), F(t["blocks.0.attn.b_O"])),
                    W_U), F(t["unembed.b_U"]))
    EU = add(mul(add(E, [P[n - 1]] * len(E)), W_U), const * len(E))
    return {"EU": EU, "EVOU": mul(E, VOU), "PVOU": mul(P, VOU)}


def test_library_products_tables_enclose_the_exact_tables(tiny, monkeypatch):
    """float_tables(library=True) (brute force's and refine's tables: Arb's own products, the exact product
    layer off) builds its interval tables on a backend without the exact layer, and its float64 ends enclose
    EU, EVOU, PVOU computed in exact rationals; its numerators' ends overlap those of the exact layer's tables
    (both enclose the same reals)."""
    import tcert.checker.kinds.accuracy.tables as tables
    _, model, _, _ = tiny
    real, seen = tables.interval_tables, []
    monkeypatch.setattr(tables, "interval_tables", lambda B, m, eqke=True: seen.append(B.exact) or real(B, m, eqke))
    lib, layer = (tables.float_tables(make_backend("flint"), model, library=k) for k in (True, False))
    assert seen == [False, True]
    for name, exact in exact_value_tables(model).items():
        lo, hi = lib["ends"][name]
        assert all(Fraction(lo[i, j]) <= x <= Fraction(hi[i, j]) for i, row in enumerate(exact) for j, x in enumerate(row))
    for key in ("e", "pw"):
        assert (lib["ends"][key][0] <= layer["ends"][key][1]).all() and (layer["ends"][key][0] <= lib["ends"][key][1]).all()


def test_outside_fillings_are_every_filling_outside_K_once():
    """refine.outside_fillings lists every filling of k positions below m that is not all in K, exactly once
    (exhaustive over small m, every K and k = 0..3)."""
    for m in range(0, 5):
        for K in itertools.chain.from_iterable(itertools.combinations(range(m), r) for r in range(m + 1)):
            for k in range(4):
                got = [tuple(f) for f in refine.outside_fillings(m, list(K), k).tolist()]
                want = [f for f in itertools.product(range(m), repeat=k) if not (k and all(t in K for t in f))]
                assert sorted(got) == sorted(want) and len(got) == len(set(got)), (m, K, k)


def as_sets(cases: dict, n: int, v: int):
    """{(m, q, c): K} (c >= 1) as the `refine.CubicSets` pattern_weight reads (no all-max input proved)."""
    K = np.zeros((v, v, n, v), dtype=bool)
    for (m, q, c), tokens in cases.items():
        K[m, q, c, tokens] = True
    return refine.CubicSets(K, np.zeros((v, v), dtype=bool))


@pytest.mark.parametrize("weighted", [False, True])
def test_batched_pattern_groups_credit_what_each_group_credits(tiny, monkeypatch, weighted):
    """pattern_weight settles the groups of 1 or 2 free positions per position pattern for many queries at
    once (stacked rows, chunks of groups by max token). With stacks of 2 and of all queries, and the chunks
    and grids forced small, over every group of every query (rules "d" and "e" at random, random K and
    hints), it credits exactly the weight and number the groups credit one at a time (pattern_credit, then
    decided_weight); the rule "e" groups credit exactly the correct inputs outside K^P and the hint."""
    _, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    rng = random.Random(5 + weighted)
    dist = parse_distribution({"distribution": random_distribution(rng, n, v)}, n, v) if weighted else uniform(n, v)
    monkeypatch.setattr(refine, "GRID_BANDS", 3)
    monkeypatch.setattr(refine, "GRID_ELEMENTS", 2 * v ** 2)         # at most 2 groups per grid
    values = rows.value_tables(T)
    cases, patterns, weight, count, truth, count_e = {}, {}, 0, 0, 0, 0
    for q in range(v):
        query = rows.query_view(T, values, q)
        for m in range(max(q, 1), v):
            for c in range(0, (n - 1 if q == m else n - 2) + 1):
                K = sorted(rng.sample(range(m), rng.randint(0, m))) if c else []
                if K:
                    cases[(m, q, c)] = K
                for P in itertools.combinations(range(n - 1), c):
                    rule = rng.choice("de")
                    hint = [f for f in itertools.product(range(m), repeat=c) if rng.random() < 0.3] if P else []
                    unclaimed = np.array(hint, dtype=np.int64).reshape(len(hint), c) if rule == "e" else None
                    patterns[(m, q, P)] = (rule, unclaimed)
                    w, k, left = refine.pattern_credit(T, query, (m, q, P), K, (rule, unclaimed), dist)
                    if left:
                        w2, k2, _ = refine.decided_weight(T, query[0], q, [left], dist)
                        w, k = w + w2, k + k2
                    weight, count = weight + w, count + k
                    if rule == "e":
                        outside = [f for f in itertools.product(range(m), repeat=c)
                                   if not (P and all(t in K for t in f)) and f not in hint]
                        truth += sum(verdicts[t] is True for t in group_inputs(n, m, q, P, outside))
                        count_e += k
    for stack in (2, v):                         # queries per stack
        monkeypatch.setattr(refine, "QUERY_ELEMENTS", stack * n * v * v)
        ob = Obligations()
        assert refine.pattern_weight(T, as_sets(cases, n, v), patterns, dist, ob) == weight
        assert ob.figure("inputs credited by pattern groups") == count
    assert count_e == truth > 0


def test_coupled_bound_proves_only_correct_inputs(tiny):
    """rows.coupled over every input of every position pattern: whatever it proves is correct, and it proves
    every input the top-2 bound proves (it is never looser)."""
    _, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    values = rows.value_tables(T)
    proved_any = 0
    for q in range(v):
        R, Eq, Dal = rows.query_view(T, values, q)
        for m in range(max(q, 1), v):
            for c in range(1, (n - 1 if q == m else n - 2) + 1):
                for P in itertools.combinations(range(n - 1), c):
                    inputs = list(group_inputs(n, m, q, P, itertools.product(range(m), repeat=c)))
                    tok = np.array(inputs, dtype=np.int64)
                    proved = rows.coupled(R, Eq, Dal, q, m, P, tok)
                    assert all(verdicts[t] is True for t, ok in zip(inputs, proved) if ok), (m, q, P)
                    M = [i for i in range(n - 1) if i not in P]
                    top2 = rows.fixed_part(R, Eq, q, M, np.array([m]))[0] + sum(Dal[i][tok[:, i], m] for i in P) < 0
                    assert np.all(proved[top2]), (m, q, P)
                    proved_any += int(np.count_nonzero(proved))
    assert proved_any > 0


def test_unclaimed_hint_parses_to_its_fillings():
    """parse_unclaimed: fillings position by position, as many hex digits per token as d_vocab - 1 needs."""
    one = lambda text, m, k, v: refine.parse_unclaimed([(text, "u", m, k)], v)[0]
    assert one("0a0b3e00", 63, 2, 64).tolist() == [[10, 11], [62, 0]]
    assert one("4213", 5, 2, 6).tolist() == [[4, 2], [1, 3]]
    assert one("", 5, 0, 6).shape == (0, 0) and refine.parse_unclaimed([], 64) == []
    got = refine.parse_unclaimed([("0102", "a", 5, 2), ("", "b", 9, 1), ("030405", "c", 6, 1)], 64)
    assert [g.tolist() for g in got] == [[[1, 2]], [], [[3], [4], [5]]]
    for text, k, msg in (("0a0", 2, "fillings"), ("0A0b", 2, "hex"), ("0a3f", 2, "below"), ("1", 0, "fillings"),
                         ("\u00e90a", 1, "hex"), (7, 1, "fillings"), ("0-", 1, "hex")):
        with pytest.raises(BadInput, match=msg):
            one(text, 63, k, 64)
    with pytest.raises(BadInput, match="^c: a token is not below the group's max token m = 4"):
        refine.parse_unclaimed([("0102", "a", 5, 2), ("", "b", 9, 1), ("0304", "c", 4, 1)], 64)
    many = [("00" * 4096, f"h{j}", 64, 2) for j in range(refine.MAX_UNCLAIMED_DIGITS // 8192 + 1)]
    with pytest.raises(BadInput, match="unclaimed hints exceed"):
        refine.parse_unclaimed(many, 65)
    with pytest.raises(BadInput, match="^b: must be a lowercase"):
        refine.parse_unclaimed([("0102", "a", 5, 2), ("0G", "b", 9, 1), ("0304", "c", 4, 1)], 64)


def test_top_two_is_the_max_over_the_other_entries():
    """rows.top_two: X[..., m] = max_{x != m} M[..., x], against the definition, on random int64 rows with
    many ties (the maximum attained once, twice, everywhere) and huge magnitudes, as rows of a matrix and of a
    3-d array; M itself is unchanged (`row_tops` restores the entries it masks)."""
    rng = np.random.default_rng(3)
    for width in (2, 3, 5, 64):
        M = rng.integers(-3, 3, size=(200, width)) * (1 << 60) // 4 + rng.integers(-2, 2, size=(200, width))
        want = np.array([[max(row[:m].tolist() + row[m + 1:].tolist()) for m in range(width)] for row in M])
        before = M.copy()
        assert (rows.top_two(M) == want).all() and (M == before).all()
        assert (rows.top_two(M.reshape(20, 10, width)) == want.reshape(20, 10, width)).all() and (M == before).all()


def test_interval_products_and_align_up_against_the_definitions():
    """rows.interval_products: Hl / Hh are exactly the least / largest of the four end products of w in
    [wl, wh] (wl >= 0) and V in [Vl, Vh] of both signs, written into given arrays or new ones; rows.align_up
    is the ceiling of x 2^-s (shifts 0..70, |x| < 2^62), as `align`."""
    rng = np.random.default_rng(5)
    wl = rng.integers(0, 1 << 30, size=(3, 4, 1))
    wh = wl + rng.integers(0, 1 << 10, size=wl.shape)
    Vl = rng.integers(-(1 << 28), 1 << 28, size=(3, 4, 6))
    Vh = Vl + rng.integers(0, 1 << 20, size=Vl.shape)
    corners = [a * b for a in (wl, wh) for b in (Vl, Vh)]
    want_l, want_h = np.minimum.reduce(corners), np.maximum.reduce(corners)
    Hl, Hh = rows.interval_products(wl, wh, Vl.copy(), Vh.copy())
    assert (Hl == want_l).all() and (Hh == want_h).all()
    out = np.zeros((2,) + Vl.shape, dtype=np.int64)
    rows.interval_products(wl, wh, Vl.copy(), Vh.copy(), out[0], out[1])
    assert (out[0] == want_l).all() and (out[1] == want_h).all()
    x = rng.integers(-(1 << 62) + 1, 1 << 62, size=(5, 71))
    s = np.broadcast_to(np.arange(71), x.shape).copy()
    want = np.array([[-((-int(v)) >> int(k)) for v, k in zip(row, srow)] for row, srow in zip(x, s)])
    assert (rows.align_up(x, s.copy()) == want).all() and (rows.align(x, s, True) == want).all()


def test_stacked_view_is_each_querys_view(tiny, monkeypatch):
    """rows.stacked_view of several queries, by blocks of ROW_BLOCK queries (1, 2, 3 and the default), holds
    exactly each query's own rows.query_view (Hl, Hh, E, D, Eq, Dal), for every key token and for the tokens
    below a limit, also in buffers reused from a larger stack (`rows.workspace`: stale entries). A mutant that
    writes a block's products, gaps or aligned gaps into the wrong queries, or leaves an entry unwritten, fails."""
    _, _, T, _ = tiny
    v, values = T["v"], rows.value_tables(T)
    alone, scratch = [rows.query_view(T, values, q) for q in range(v)], {}
    for block in (1, 2, 3, rows.ROW_BLOCK):
        monkeypatch.setattr(rows, "ROW_BLOCK", block)
        for qs, tokens in ((list(range(v))[::-1], None), ([0, v - 2, 1], v - 1)):     # each query below tokens
            R, Eq, Dal = rows.stacked_view(T, values, qs, tokens, scratch if block > 1 else None)
            for k, q in enumerate(qs):
                (Ra, Eqa, Dala), t = alone[q], tokens or v
                assert all((a[k] == b[..., :t, :]).all() for a, b in zip(R[:3], Ra[:3]) if a.ndim == 4)
                assert (R.E[k] == Ra.E[:, :t]).all() and (R.D[k] == Ra.D[:, :t]).all()
                assert (Eq[k] == Eqa[:t]).all() and (Dal[k] == Dala[:, :t, :t]).all()


def test_int64_rows_bound_the_exact_terms(tiny):
    """rows.query_rows: Hl 2^(E - 2 WB - k) <= w V <= Hh 2^(E - 2 WB - k) and D >= max_{x != m} H[x] - H[m]
    (k the value scale), against exact rationals of the float64 ends the rows are built from (w = e pw over
    both ends, V = EU + EVOU + PVOU), for every query, position, token and max token; and those ends enclose
    the interval matrices' exact ends (e and pw: the numerators', lower ends clipped at 0)."""
    _, model, T, _ = tiny
    n, v = T["n"], T["v"]
    F = {name: tuple(np.vectorize(Fraction, otypes=[object])(a) for a in ends) for name, ends in T["ends"].items()}
    B = make_backend("flint")
    mats = dict(T["intervals"], **{k: tables.numerators(B, T["intervals"][name])[0] for k, name in (("e", "EQKE"), ("pw", "EQKP"))})
    for name, (lo, hi) in F.items():
        exact = mats[name].rows()
        floor = 0 if name in ("e", "pw") else -math.inf
        assert all(a <= max(B.lower(x), floor) and B.upper(x) <= b
                   for row, ra, rb in zip(exact, lo, hi) for x, a, b in zip(row, ra, rb)), name
    values = rows.value_tables(T)
    for q in range(v):
        R = rows.query_rows(T, values, q)
        for i in range(n):
            for t in range(v):
                scale = Fraction(2) ** (int(R.E[i, t]) - 2 * rows.WB - values["k"])
                w = (F["e"][0][q, t] * F["pw"][0][q, i], F["e"][1][q, t] * F["pw"][1][q, i])
                V_lo = [F["EU"][0][q, x] + F["EVOU"][0][t, x] + F["PVOU"][0][i, x] for x in range(v)]
                V_hi = [F["EU"][1][q, x] + F["EVOU"][1][t, x] + F["PVOU"][1][i, x] for x in range(v)]
                H_lo = [min(w[0] * V_lo[x], w[1] * V_lo[x]) for x in range(v)]
                H_hi = [max(w[0] * V_hi[x], w[1] * V_hi[x]) for x in range(v)]
                for x in range(v):
                    assert int(R.Hl[i, t, x]) * scale <= H_lo[x] and H_hi[x] <= int(R.Hh[i, t, x]) * scale
                for m in range(v) if i < n - 1 else ():          # D: the non-query positions only
                    gap = max(H_hi[x] - H_lo[m] for x in range(v) if x != m)
                    assert gap <= int(R.D[i, t, m]) * scale
    assert R.D.shape == (n - 1, v, v)
    assert (R.D == rows.top_two(R.Hh[: n - 1]) - R.Hl[: n - 1]).all()      # no looser than the definition


# --------------------------------------------------------------------------- certificates, random and edited

def oracle_count(verdicts):
    return sum(ok is True for ok in verdicts.values()), sum(ok is not False for ok in verdicts.values())


def refine_cert(path, strategy="refine", distribution=None):
    cert, report = make_certificate(load_model(path), strategy, None, distribution)
    return cert


def check(cert, path, backend="flint"):
    return verify(json.loads(certificate.dumps(cert)), path, backend)


def derived_sets(model):
    """The cubic sets the checker derives for `model` (`refine.CubicSets`)."""
    T = integer_tables(make_backend("flint"), model, eqke_bounds=False)
    return refine.cubic_weight(T, uniform(model.config.n_ctx, model.config.d_vocab), Obligations())[0]


def test_refine_reaches_brute_force_and_budgets_are_monotone(tiny):
    """refine at no budget limit certifies the exact count (that of brute force); its bound never falls
    as the budget grows, from the cubic proof alone up."""
    path, model, T, verdicts = tiny
    lo, hi = oracle_count(verdicts)
    exact = check(refine_cert(path, "brute"), path).figure("claim.correct_at_least")
    assert lo <= exact <= hi
    bounds = [check(refine_cert(path, f"refine:{b}"), path).figure("claim.correct_at_least")
              for b in ("0", "1x", "1.02x", "1.05x", "1.1x", "1.3x", "2x", "5x", "max")]
    assert bounds == sorted(bounds), bounds
    assert bounds[0] == check(refine_cert(path, "cubic"), path).figure("claim.correct_at_least")
    assert bounds[-1] == exact


ACCEPTED_EDITS = []


@settings(max_examples=example_scale(25), deadline=None)
@given(seed=st.integers(0, 2 ** 16), edits=st.integers(1, 20), params=st.sampled_from(TINY))
def test_random_refine_evidence_never_overclaims(tmp_path_factory, seed, edits, params):
    """An adversary extends a valid refine certificate entry by entry (random mixed token sets, counts,
    position patterns and rules, each kept when the checker still accepts the certificate): whatever it
    accepts, the weight it certifies is at most the oracle's count of inputs not certainly wrong."""
    rng = random.Random(seed)
    path = str(tmp_path_factory.mktemp("rand") / "m.safetensors")
    save_model(path, *maxofk_model(*params[:3], params[3] * (1 + seed % 3), params[4]))
    model = load_model(path)
    n, v = model.config.n_ctx, model.config.d_vocab
    _, hi = oracle_count(input_verdicts(model))
    ev = refine_cert(path, rng.choice(["refine:0", "refine:1.05x", "refine"]))["evidence"]
    B, sets = make_backend("flint"), derived_sets(model)
    for _ in range(edits):
        m = rng.randint(1, v - 1)
        q = rng.randint(0, m)
        top = n - 1 if q == m else n - 2
        trial = json.loads(json.dumps(ev))
        if rng.random() < 0.5 and top >= 1:
            c = rng.randint(1, top)
            bad = [k for k in range(m) if k not in sets.get((m, q, c))] or [0]
            S = rng.sample(bad, rng.randint(1, len(bad)))
            trial["patterns"] = [p for p in trial["patterns"] if (p[0], p[1], bin(p[2]).count("1")) != (m, q, c)]
            trial["mixed"].append([m, q, c, format(sum(1 << k for k in S), "x"), rng.randint(1, c)])
        else:
            P = rng.sample(range(n - 1), rng.randint(0, min(top, 3)))
            trial["mixed"] = [x for x in trial["mixed"] if x[:3] != [m, q, len(P)]]
            trial["patterns"] = [p for p in trial["patterns"] if p[:3] != [m, q, sum(1 << i for i in P)]]
            hint = "".join(f"{rng.randrange(m):x}" for _ in range(len(P) * rng.randint(0, 3)))
            trial["patterns"].append([m, q, sum(1 << i for i in P), "d"] if rng.random() < 0.5 else
                                     [m, q, sum(1 << i for i in P), "e", hint])
        try:
            weight, _ = refine.certified(B, model, trial, uniform(n, v), Obligations())
        except (BadInput, Rejected):
            continue
        assert weight <= hi
        ev = trial
        ACCEPTED_EDITS.append(1)


def test_random_edits_were_accepted():
    """Runs after the property test: some random edits were accepted (the test was not vacuous)."""
    if not ACCEPTED_EDITS:
        pytest.skip("property test did not run in this session")
    assert len(ACCEPTED_EDITS) >= 10


@pytest.fixture(scope="module")
def shipped_tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mut") / "m.safetensors")
    save_model(path, *constructed(8, 3, 15.0, 3.0, 0.1, 1))
    cert = refine_cert(path)
    assert cert["evidence"]["patterns"] and "cases" not in cert["evidence"]
    return path, cert


def edited(cert, edit):
    out = json.loads(certificate.dumps(cert))
    edit(out)
    return out


def wrong_mixed_entry(path):
    """A mixed entry some of whose inputs the model gets wrong (one bad token, the others in K)."""
    model = load_model(path)
    verdicts = input_verdicts(model)
    for t, ok in sorted(verdicts.items()):
        m, q = max(t), t[-1]
        others = [x for x in t[:-1] if x != m]
        if ok is False and len(others) == 1:
            return [m, q, 1, format(1 << others[0], "x"), 1]
    raise AssertionError("no wrong input with one non-max token")


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
def test_refine_mutations_are_rejected(shipped_tiny, backend):
    path, cert = shipped_tiny
    check(cert, path, backend)
    with pytest.raises(Rejected, match="accuracy: count"):
        check(edited(cert, lambda c: c["claim"].update(correct_at_least=c["claim"]["correct_at_least"] + 1)),
              path, backend)

    def add_wrong(c):
        entry = wrong_mixed_entry(path)
        c["evidence"]["patterns"] = [p for p in c["evidence"]["patterns"]
                                     if (p[0], p[1], bin(p[2]).count("1")) != tuple(entry[:3])]
        c["evidence"]["mixed"] = [k for k in c["evidence"]["mixed"] if tuple(k[:3]) != tuple(entry[:3])] + [entry]
    with pytest.raises(Rejected, match="accuracy refine: mixed cases"):
        check(edited(cert, add_wrong), path, backend)


def with_pattern(c, entry):
    """evidence with `entry` as the only split of its case (m, q, |P|)."""
    case = (entry[0], entry[1], bin(entry[2]).count("1"))
    c["evidence"]["mixed"] = [x for x in c["evidence"]["mixed"] if tuple(x[:3]) != case]
    c["evidence"]["patterns"] = [x for x in c["evidence"]["patterns"]
                                 if (x[0], x[1], bin(x[2]).count("1")) != case] + [entry]


def test_unclaimed_hint_never_adds_to_the_count(shipped_tiny):
    """The count is what is proved, never what the hint says. A hint that lists one more correct input, one
    the claim counts, lowers the certified count: REJECTED. Hints emptied (the model's errors no longer
    listed): the same count, those inputs decided one by one instead. An unclaimed filling the coupled bound
    proves is not credited either."""
    path, cert = shipped_tiny
    verdicts = input_verdicts(load_model(path))
    n = len(next(iter(verdicts)))
    base = check(cert, path)
    e = [j for j, p in enumerate(cert["evidence"]["patterns"]) if p[3] == "e" and p[4]]
    assert e, "no rule-e entry with unclaimed fillings"
    j = e[0]
    m, q, mask, _, hint = cert["evidence"]["patterns"][j]
    P = [i for i in range(n - 1) if mask >> i & 1]
    K = sum(1 << k for k in derived_sets(load_model(path)).get((m, q, len(P))))
    listed = {tuple(int(hint[a + b], 16) for b in range(len(P))) for a in range(0, len(hint), len(P))}
    assert all(verdicts[next(group_inputs(n, m, q, P, [f]))] is False for f in listed)
    extra = next(f for f in itertools.product(range(m), repeat=len(P)) if f not in listed
                 and not all(K >> t & 1 for t in f) and verdicts[next(group_inputs(n, m, q, P, [f]))] is True)

    def also(c):
        c["evidence"]["patterns"][j][4] = "".join(f"{t:x}" for f in sorted(listed | {extra}) for t in f)
    with pytest.raises(Rejected, match="accuracy: count") as err:
        check(edited(cert, also), path)
    assert "1 fewer" in str(err.value)
    emptied = check(edited(cert, lambda c: [p.__setitem__(4, "") for p in c["evidence"]["patterns"] if p[3] == "e"]),
                    path)
    assert emptied.figure("claim.correct_at_least") == base.figure("claim.correct_at_least")
    assert emptied.figure("inputs decided one by one") > base.figure("inputs decided one by one")


def test_every_unclaimed_hint_mutant_certifies_at_most_the_truth(shipped_tiny):
    """The moves the mutation harness makes on the unclaimed hints (fillings dropped, duplicated, added,
    moved, junk; the first 6 of each): each is rejected or certifies at most the oracle's count, and a hint
    that takes a counted input out of the claim is rejected."""
    import tcert.testing.mutation as M
    path, cert = shipped_tiny
    lo, _ = oracle_count(input_verdicts(load_model(path)))
    moves = [x for x in M.mutants(cert) if x.move.startswith("hint")]
    moves = [x for j, x in enumerate(moves) if sum(y.move == x.move for y in moves[:j]) < 6]   # 6 per move: ~1 s
    assert {x.move for x in moves} >= {"hint-drop-first", "hint-dup-first", "hint-add", "hint-junk"}
    rejected = set()
    for x in moves:
        try:
            assert check(x.cert, path).figure("claim.correct_at_least") <= lo, x.label()
        except (BadInput, Rejected):
            rejected.add(x.move)
    assert {"hint-add", "hint-junk"} <= rejected


@pytest.mark.parametrize("edit, msg", [
    (lambda c: c["evidence"]["patterns"].append(c["evidence"]["patterns"][0]), "split twice"),
    (lambda c: c["evidence"]["patterns"][0].__setitem__(3, "x"), "posmask"),
    (lambda c: c["evidence"]["patterns"][0].__setitem__(2, 99), "posmask"),
    (lambda c: c["evidence"]["patterns"].append([7, 2, 3, "d"]), "position pattern"),
    (lambda c: c["evidence"]["mixed"].append([7, 2, 1, "80", 1]), "mask"),
    (lambda c: c["evidence"]["mixed"].append([7, 2, 1, "1", 2]), "b"),
    (lambda c: c["evidence"].pop("mixed"), "mixed"),
    (lambda c: c["evidence"].update(patterns="d"), "patterns"),
    (lambda c: with_pattern(c, [7, 7, 3, "e"]), "unclaimed"),
    (lambda c: with_pattern(c, [7, 7, 3, "d", ""]), "unclaimed"),
    (lambda c: with_pattern(c, [7, 7, 3, "e", "7"]), "unclaimed"),
    (lambda c: with_pattern(c, [7, 7, 3, "e", "0x"]), "hex"),
    (lambda c: with_pattern(c, [7, 7, 3, "e", "07"]), "below"),
])
def test_malformed_refine_evidence_is_bad_input(shipped_tiny, edit, msg):
    path, cert = shipped_tiny
    with pytest.raises(BadInput, match=msg):
        check(edited(cert, edit), path)


def test_mixed_entries_one_line_test_refuses_what_the_field_checks_refuse():
    """parse_mixed's one-line test of an entry and refine.mixed_fields (each field, named) agree: on a sweep of
    values, types (bools, floats, strings, None) and shapes, an entry either passes both (and is read as
    {(m, q, c): [(S, b)]}) or parse_mixed refuses it with mixed_fields' message; a mask read once per (mask, m)
    is the same set wherever it recurs."""
    n, v = 4, 6
    vals = [-1, 0, 1, 2, 3, 5, 6, True, False, 1.0, "1", None]      # no 4: the first entry's case below
    for m, q, c, b in itertools.product(vals, vals, vals, vals):
        for e in ([m, q, c, "3", b], [m, q, c, "0", b], [m, q, c, "3", b, 0], (m, q, c, "3", b)):
            try:
                refine.mixed_fields(e, "evidence.mixed[1]", n, v)
            except BadInput as x:
                with pytest.raises(BadInput) as got:
                    refine.parse_mixed([[4, 2, 1, "1", 1], e], n, v)
                assert str(got.value) == str(x), e
                continue
            assert refine.parse_mixed([[4, 2, 1, "1", 1], e], n, v)[(m, q, c)][-1] == ([0, 1], b), e
    read = refine.parse_mixed([[3, 1, 1, "5", 1], [4, 1, 1, "5", 1], [3, 0, 1, "5", 1], [5, 5, 1, "5", 1]], n, v)
    assert [S for entries in read.values() for S, _ in entries] == [[0, 2]] * 4


def test_pattern_entries_one_line_test_refuses_what_the_field_checks_refuse():
    """parse_patterns' one-line test of an entry and refine.pattern_fields (each field, named) agree: on a sweep
    of values, types (bools, floats, strings, None) and shapes, an entry either passes both (and is read as
    {(m, q, P): (rule, fillings)}) or parse_patterns refuses it with pattern_fields' message."""
    n, v = 4, 6
    vals = [-1, 0, 1, 2, 5, 6, 7, 8, True, False, 1.0, "1", None]
    for m, q, mask in itertools.product(vals, vals, vals):
        for e in ([m, q, mask, "d"], [m, q, mask, "e", ""], [m, q, mask, "e"], [m, q, mask, "d", ""],
                  [m, q, mask, "x"], (m, q, mask, "d"), [m, q, mask]):
            try:
                refine.pattern_fields(e, "evidence.patterns[1]", n, v)
            except BadInput as x:
                with pytest.raises(BadInput) as got:
                    refine.parse_patterns([[3, 0, 0, "d"], e], {}, n, v)
                assert str(got.value) == str(x), e
                continue
            try:
                read = refine.parse_patterns([[3, 0, 0, "d"], e], {}, n, v)
            except BadInput as x:         # the pattern or its position set: parse_patterns' own tests
                assert "no such position pattern" in str(x) or "split twice" in str(x), (e, x)
                continue
            P = tuple(i for i in range(n - 1) if mask >> i & 1)
            assert read[(m, q, P)][0] == e[3] and (e[3] == "d" or read[(m, q, P)][1].shape == (0, len(P))), e


def test_mixed_and_patterns_of_one_case_are_refused(shipped_tiny):
    """A case split both ways would credit its inputs twice; two mixed entries of one case and one b must
    have disjoint sets."""
    path, cert = shipped_tiny
    m, q, P = next(p for p in cert["evidence"]["patterns"] if p[2])[:3]
    c = bin(P).count("1")
    bad = [k for k in range(m) if k not in derived_sets(load_model(path)).get((m, q, c))]
    with pytest.raises(BadInput, match="split twice"):
        check(edited(cert, lambda d: d["evidence"]["mixed"].append([m, q, c, format(1 << bad[0], "x"), c])), path)

    def overlapping(d):
        d["evidence"]["patterns"] = [p for p in d["evidence"]["patterns"] if p[:2] != [m, q]]
        d["evidence"]["mixed"] = [[m, q, c, format(1 << bad[0], "x"), c],
                                  [m, q, c, format((1 << bad[0]) | (1 << bad[-1]), "x"), c]]
    with pytest.raises(BadInput, match="overlaps"):
        check(edited(cert, overlapping), path)


def test_mixed_set_meeting_the_cubic_set_is_rejected(shipped_tiny):
    """The cubic sets are derived from the weights, so a mixed set that meets one is an obligation that
    fails (its inputs would be credited twice), not a malformed field."""
    path, cert = shipped_tiny
    sets = derived_sets(load_model(path))
    (m, q, c), K = next(((m, q, c), sets.get((m, q, c))) for m, q, c in zip(*np.nonzero(sets.K.sum(axis=3) >= 2)))
    cert = edited(cert, lambda d: d["evidence"].update(patterns=[p for p in d["evidence"]["patterns"]
                                                                 if (p[0], p[1]) != (m, q)], mixed=[]))
    for S in (K, K[:1]):
        with pytest.raises(Rejected, match=r"accuracy refine: mixed cases.*meets the case's cubic set"):
            check(edited(cert, lambda d: d["evidence"]["mixed"].append([int(m), int(q), int(c),
                                                                         format(sum(1 << k for k in S), "x"), 1])), path)


def test_longer_inputs_use_mixed_entries(tmp_path):
    """K = 5 (four non-query positions): patterns are not generated, mixed entries are; the bound is sound
    and at least the cubic proof's."""
    path = str(tmp_path / "k5.safetensors")
    save_model(path, *maxofk_model(4, 5, 2, 0.08, 15.0))
    model = load_model(path)
    lo, hi = oracle_count(input_verdicts(model))
    cub = check(refine_cert(path, "cubic"), path).figure("claim.correct_at_least")
    cert = refine_cert(path)
    got = check(cert, path).figure("claim.correct_at_least")
    assert cub <= got <= hi and not cert["evidence"]["patterns"]


# ------------------------------------------------------------------------------------------- brute force

def test_brute_force_decides_near_ties_exactly(tmp_path):
    """Two unembedding columns a hair apart (2^-40 relative) leave margins int64 cannot resolve: the exact
    test on the integer tables decides them, and the count equals the oracle's."""
    t, config = maxofk_model(5, 3, 9, 0.05, 15.0)
    t = {k: a.astype(np.float64) for k, a in t.items()}
    t["unembed.W_U"][:, 3] = t["unembed.W_U"][:, 4] * (1 + 2.0 ** -40)
    t["unembed.b_U"][3] = t["unembed.b_U"][4]
    path = str(tmp_path / "near.safetensors")
    save_model(path, t, config, dtype=np.float64)
    model = load_model(path)
    lo, hi = oracle_count(input_verdicts(model))
    ob = check(refine_cert(path, "brute"), path)
    assert lo <= ob.figure("claim.correct_at_least") <= hi
    assert ob.figure("inputs decided by the exact test") > 0


# ------------------------------------------------------------------------------------------ distributions

def test_distribution_weights_match_enumeration():
    """Distribution.case (every filling class) and group_sum against direct sums of input weights."""
    rng = random.Random(7)
    for n, v in ((3, 4), (4, 3), (2, 5)):
        for _ in range(3):
            dj = random_distribution(rng, n, v)
            dist = parse_distribution({"distribution": dj}, n, v)
            total = sum(input_weight(dj, t) for t in itertools.product(range(v), repeat=n))
            assert dist.value(dist.total()) == total
            for m, q, c in all_cases(n, v):
                if c == 0:
                    want = input_weight(dj, tuple([m] * (n - 1) + [q]))
                    assert dist.value(dist.case(m, q, [])) == want
                    continue
                if m == 0:
                    continue
                S, K = [m - 1], list(range(m - 1))
                for b in range(1, c + 1):
                    classes = [(S, b), (K, c - b)]
                    want = sum(input_weight(dj, t) for t in case_inputs_of(n, m, q, c, classes))
                    assert dist.value(dist.case(m, q, [(K, c - b), (S, b)] if b < c else [(S, b)])) == want
            q, P = 0, tuple(range(n - 2))
            M = [i for i in range(n - 1) if i not in P]
            ms = np.arange(1, v)
            mask = np.random.default_rng(rng.randint(0, 99)).random((len(ms),) + (v,) * len(P)) < 0.5
            want = Fraction(0)
            for k, m in enumerate(ms):
                for f in itertools.product(range(v), repeat=len(P)):
                    if mask[(k,) + f]:
                        want += input_weight(dict(dj, max_at_least=0), next(group_inputs(n, int(m), q, P, [f])))
            d0 = parse_distribution({"distribution": dict(dj, max_at_least=0)}, n, v)
            assert d0.value(d0.group_sum(mask, q, ms, M, P)) == want


STRATEGIES = ("brute", "cubic", "subcubic:svd-rec", "subcubic:exact-eqke", "refine:1.1x", "refine")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_weighted_claims_against_exhaustive_weighted_counts(tiny, strategy):
    """Under random position weights and max_at_least, every strategy's certified weight lies below the
    oracle's weighted count of the inputs not certainly wrong; brute force and refine reach the weighted
    count of the certainly correct ones."""
    path, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    rng = random.Random(strategy + path)
    for dj in (random_distribution(rng, n, v), random_distribution(rng, n, v, weights=False),
               random_distribution(rng, n, v, max_at_least=False)):
        lo, hi = weighted_truth(verdicts, dj)
        cert = refine_cert(path, strategy, dj)
        ob = check(cert, path)
        got = ob.figure("claim.correct_at_least")
        assert parse_number(cert["claim"]["correct_at_least"], "claim") <= got <= hi, (strategy, dj)
        if strategy in ("brute", "refine"):
            assert got >= lo
        total = sum(input_weight(dj, t) for t in verdicts)
        assert parse_number(cert["claim"]["total_weight"], "t") == total


def test_weighted_mutations(tiny):
    """A weighted claim a hair above what is certified is rejected; a wrong total, a negative or float weight,
    a claim above the total, a max_at_least out of range or an unknown field are bad input; the uniform
    claim without a distribution is unchanged."""
    path, model, T, verdicts = tiny
    n, v = T["n"], T["v"]
    dj = random_distribution(random.Random(3), n, v)
    cert = refine_cert(path, "refine", dj)
    ob = check(cert, path)
    got = ob.figure("claim.correct_at_least")
    total = parse_number(cert["claim"]["total_weight"], "t")
    with pytest.raises(Rejected if got < total else BadInput, match="accuracy: count" if got < total else "outside"):
        check(edited(cert, lambda c: c["claim"].update(correct_at_least=certificate.num(got + Fraction(1, 10 ** 30)))),
              path)
    bad = [lambda c: c["claim"].update(total_weight="1/3"),
           lambda c: c["claim"]["distribution"]["position_weights"][0].__setitem__(0, "-1"),
           lambda c: c["claim"]["distribution"]["position_weights"][0].__setitem__(0, 0.5),
           lambda c: c["claim"].update(correct_at_least=certificate.num(
               parse_number(c["claim"]["total_weight"], "t") + 1)),
           lambda c: c["claim"]["distribution"].update(max_at_least=v),
           lambda c: c["claim"]["distribution"].update(temperature=1),
           lambda c: c["claim"].pop("total_weight"),
           lambda c: c["claim"]["distribution"].update(position_weights=[["1"] * v] * (n - 1))]
    for edit in bad:
        with pytest.raises(BadInput):
            check(edited(cert, edit), path)
    plain = refine_cert(path, "cubic")
    assert "distribution" not in plain["claim"] and isinstance(plain["claim"]["correct_at_least"], int)
    with pytest.raises(BadInput, match="total_weight"):
        check(edited(plain, lambda c: c["claim"].update(total_weight="1")), path)


def test_weighted_refine_with_mpmath(tiny):
    path, model, T, verdicts = tiny
    dj = random_distribution(random.Random(11), T["n"], T["v"])
    cert = refine_cert(path, "refine:1.2x", dj)
    assert check(cert, path, "flint").summary == check(cert, path, "mpmath").summary
