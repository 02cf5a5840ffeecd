"""The logit gaps by the exact layer (checker/kinds/prediction/gaps.py) against exact and 300-bit references.

* The whole pass: on tiny random models of every architecture variant, the gaps of an independent 300-bit
  forward pass lie inside the `GapTable`'s integer bounds, which are no wider than the entry-by-entry route's
  wherever the first-digit screen leaves a gap open.
* The screen: the first digit's logits and slack hold the exact logit of every point of the ball (random
  float16/32 columns with zeros, subnormals and wide spreads); with it, the least lower and upper bound, the
  least lower bound minus width and the gaps below a margin equal those of the all-exact table on a random
  model with 3,000 tokens (a screen that settles every gap, the mutant, changes them).
* The final ball's worst direction: a point of the ball whose gap reaches the table's bound (so a table
  without the radius term, the mutant, is caught).
* The pieces: column norm bounds >= the exact norms (float32/float16 with subnormals, zeros, signed zeros,
  wide spreads) and within 2^-30 of them; a mutant that floors the squares is caught; exact products read
  as integers equal their Fraction values; the table's comparisons in integers equal Fraction ones.
"""

import types
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tcert.checker import exact_backend
from tcert.checker.exact_products import bits_for, cut_cols
from tcert.checker.exact_rounding import row_integers
from tcert.checker.forward import Weights, last_logits, unembed_input
from tcert.checker.interval import make_backend
from tcert.checker.kinds import prediction as P
from tcert.checker.kinds.prediction import gaps as G
from tcert.checker.operator_norms import column_norms as old_column_norms
from tcert.testing.exact_forward import TOLERANCE, ExactForward, to_fraction
from tcert.testing.prediction import ARCHS, SIZE, build


def value(r: int, h: int) -> Fraction:
    return Fraction(r) * Fraction(2) ** h


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("gaps"))
    return {(name, seed): build(d, name, seed) for name in ARCHS for seed in (0, 1)}


@pytest.mark.parametrize("name", sorted(ARCHS))
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 1), tokens=st.lists(st.integers(0, SIZE["d_vocab"] - 1), min_size=1, max_size=5))
def test_exact_gaps_hold_the_300_bit_gaps(tiny, name, seed, tokens):
    """Every variant: the 300-bit gaps lie in the table's bounds, each no wider than the Arb route's."""
    model = tiny[name, seed]
    ref = [to_fraction(x) for x in ExactForward(model).logits(tokens)]
    k = max(range(len(ref)), key=ref.__getitem__)
    B = make_backend("flint")
    with B.precision():
        table = P.gap_bounds(B, model, tokens, k)
        W = Weights(B, model)
        old = last_logits(B, model, tokens, W)
    assert isinstance(table, G.GapTable)
    tol = TOLERANCE * (max(abs(x) for x in ref) + 1)
    top = min(hi for j, (_, hi) in enumerate(table) if j != k)
    for j, (lo, hi) in enumerate(table):
        gap = ref[k] - ref[j]
        assert lo - tol <= gap <= hi + tol, (j, float(lo), float(gap), float(hi))
        if j != k and 2 * lo - hi <= top:      # every gap the screen could not settle is exact
            d = old[k] - old[j]
            assert hi - lo <= B.upper(d) - B.lower(d)


def test_worst_point_reaches_the_bound_and_the_mutant_is_caught(tiny, monkeypatch):
    """x = c + e u with u along w_j - w_k gives gap_j - e ||w_k - w_j||: inside the table's bounds, and
    outside those of a table without the radius term."""
    model = tiny["neox1l-partial-rotary-final-ln", 0]
    B = make_backend("flint")
    tokens = [1, 2, 3]
    with B.precision():
        W = Weights(B, model)
        x = unembed_input(B, model, tokens, W)
        c = [sum(Fraction(float(p[0, i])) for p in exact_backend.point_parts(x.centre, B)) for i in range(x.centre.shape[1])]
        w = np.asarray(model.tensors["unembed.W_U"], dtype=np.float64)
        b = np.asarray(model.tensors["unembed.b_U"], dtype=np.float64)
        logit = [sum(ci * Fraction(float(w[i, j])) for i, ci in enumerate(c)) + Fraction(float(b[j])) for j in range(w.shape[1])]
        k = max(range(len(logit)), key=logit.__getitem__)
        j = min((t for t in range(len(logit)) if t != k), key=lambda t: logit[k] - logit[t])
        table = G.exact_gap_table(B, W, x, k)
        u = [Fraction(float(w[i, j] - w[i, k])) for i in range(len(c))]
        norm = sum(v * v for v in u)
        # a rational point within e of c: u scaled by e / sqrt(norm) rounded down (so inside the ball)
        scale = x.eps[0] * Fraction(999, 1000) / Fraction(np.sqrt(float(norm)) * (1 + 2 ** -40))
        pt = [ci + scale * v for ci, v in zip(c, u)]
        gap = sum(p * Fraction(float(w[i, k] - w[i, j])) for i, p in enumerate(pt)) + Fraction(float(b[k] - b[j]))
        lo, hi = table[j]
        assert lo <= gap <= hi and gap < logit[k] - logit[j]
        monkeypatch.setattr(G, "dyadic_up", lambda e: (0, 0))     # the mutant: no radius
        lo_m, _ = G.exact_gap_table(B, W, x, k)[j]
        assert gap < lo_m


def matrices(seed: int, dtype):
    """Random columns with zeros, signed zeros, subnormals and a wide exponent spread."""
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 40)), int(rng.integers(1, 9))
    a = rng.standard_normal((m, n)) * np.exp2(rng.integers(-30, 10, size=(m, n)))
    a[rng.random((m, n)) < 0.2] = 0.0
    a[rng.random((m, n)) < 0.1] = -0.0
    tiny = np.finfo(dtype).smallest_subnormal
    a[rng.random((m, n)) < 0.1] = tiny * rng.integers(1, 5)
    return np.clip(a, -6e4, 6e4).astype(dtype)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 31), dtype=st.sampled_from([np.float32, np.float16]))
def test_column_norms_bound_the_exact_norms(seed, dtype):
    a = matrices(seed, dtype)
    r, h = G.column_norms(a)
    old = old_column_norms(a)
    for j in range(a.shape[1]):
        sq = sum(Fraction(float(x)) ** 2 for x in a[:, j])
        bound = value(r[j], h[j])
        assert sq <= bound ** 2 <= sq * (1 + Fraction(1, 2 ** 30)) + Fraction(2) ** (2 * h[j] + 2 * G.NORM_SHIFT + 2)
        assert bound <= old[j] * (1 + Fraction(1, 2 ** 30)) or sq == 0      # old >= the exact norm


def test_column_norms_refuse_float64_and_a_floor_mutant_is_caught(monkeypatch):
    assert G.column_norms(np.ones((3, 2))) is None
    a = np.full((512, 1), 2.0 ** -30, np.float32)
    a[0, 0] = 1.0          # 511 squares far below the column's unit, each counted as one unit
    r, h = G.column_norms(a)
    assert value(r[0], h[0]) ** 2 >= 1 + 511 * Fraction(2) ** -60
    fake = types.SimpleNamespace(**{n: getattr(np, n) for n in dir(np) if not n.startswith("__")})
    fake.ceil, fake.count_nonzero = np.floor, (lambda x, axis: 0)
    monkeypatch.setattr(G, "np", fake)
    r, h = G.column_norms(a)
    assert value(r[0], h[0]) ** 2 < 1 + 511 * Fraction(2) ** -60


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 31))
def test_row_integers_equal_the_exact_product(seed):
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(1, 30)), int(rng.integers(1, 12))
    parts = (rng.standard_normal((1, k)) * 2.0 ** rng.integers(-40, 40), rng.standard_normal((1, k)) * 2.0 ** -60)
    w = (rng.standard_normal((k, n)) * np.exp2(rng.integers(-20, 20, size=(k, n)))).astype(np.float32).astype(np.float64)
    w[rng.random((k, n)) < 0.2] = 0.0
    v, e = row_integers(exact_backend.parts_times_point(parts, cut_cols(w, bits_for(k))))
    for j in range(n):
        want = sum(sum(Fraction(float(p[0, i])) for p in parts) * Fraction(float(w[i, j])) for i in range(k))
        assert Fraction(v[j]) * Fraction(2) ** e == want


def test_gap_table_integer_comparisons():
    for exp in (-70, 0, 5):
        lows, highs = [0, -3, 7, 2, 9], [0, 1, 9, 4, 12]
        t = G.GapTable(lows, highs, exp).without(0)
        s = Fraction(2) ** exp
        assert list(t) == [(lo * s, hi * s) for lo, hi in zip(lows[1:], highs[1:])]
        assert t.extremes() == (-3 * s, 1, 1 * s)
        for margin in (Fraction(1, 3) * s, 2 * s, 7 * s, Fraction(15, 2) * s):
            assert t.below(margin) == [(lo, hi) for lo, hi in t if lo < margin]
    assert G.dyadic_up(Fraction(3, 8)) == (3, -3) and G.dyadic_up(Fraction(0)) == (0, 0)
    n, e = G.dyadic_up(Fraction(1, 3))
    assert Fraction(1, 3) <= Fraction(n) * Fraction(2) ** e <= Fraction(1, 3) * (1 + Fraction(1, 2 ** 63))
    a = np.array([0.0, -0.0, 5e-324, -1.5, 2.0 ** 100, np.float32(0.1)])
    v, e = G.float_integers(a)
    assert [Fraction(x) * Fraction(2) ** e for x in v] == [Fraction(float(x)) for x in a]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 31), dtype=st.sampled_from([np.float32, np.float16]))
def test_unembedding_cut_is_cut_cols(seed, dtype):
    """The transposed row cut equals cut_cols: digits, lines, scales and bounds."""
    w = matrices(seed, dtype)
    bits = bits_for(w.shape[0])
    a, b = G.unembedding_cut(w, bits), cut_cols(w.astype(np.float64), bits)
    assert a.axis == b.axis == 1 and a.shape == b.shape and a.bound == b.bound and np.array_equal(a.scale, b.scale)
    assert len(a.digits) == len(b.digits)
    for x, y, i, j, m1, m2, s1, s2 in zip(a.digits, b.digits, a.index, b.index, a.line_max, b.line_max, a.line_sum, b.line_sum):
        assert np.array_equal(x, y) and np.array_equal(i, j) and np.array_equal(m1, m2) and np.array_equal(s1, s2)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 31), dtype=st.sampled_from([np.float32, np.float16]))
def test_screened_columns_hold_every_point_of_the_ball(seed, dtype):
    """|logit_j(x) - screened_j| <= slack_j for x within e of c: the first digit's error (||c||_1 2^(top - bits))
    and e ||w_j||, against exact Fractions."""
    w = matrices(seed, dtype)
    rng = np.random.default_rng(seed)
    d = w.shape[0]
    parts = (rng.standard_normal((1, d)) * 2.0 ** rng.integers(-20, 20), rng.standard_normal((1, d)) * 2.0 ** -60)
    bias = (rng.standard_normal(w.shape[1]) * (rng.random(w.shape[1]) < 0.7)).astype(dtype).astype(np.float64)
    for e in ((0, 0), G.dyadic_up(Fraction(1, 3 * 2 ** 40))):
        logit, slack, exp = G.screened_columns(parts, w, bias, e)
        c = [sum(Fraction(float(p[0, i])) for p in parts) for i in range(d)]
        radius = Fraction(e[0]) * Fraction(2) ** e[1]
        for j in range(w.shape[1]):
            col = [Fraction(float(x)) for x in w[:, j]]
            diff = abs(sum(ci * x for ci, x in zip(c, col)) + Fraction(float(bias[j])) - Fraction(logit[j]) * Fraction(2) ** exp)
            room = Fraction(slack[j]) * Fraction(2) ** exp - diff
            assert room >= 0 and room ** 2 >= radius ** 2 * sum(x * x for x in col)


@pytest.mark.parametrize("block", [1, 3, 7])
def test_screen_by_blocks_equals_one_block(block, monkeypatch):
    """The screen by blocks of `block` columns (`screened_centre`: each block's integers moved to the least
    power of two) gives the same exact logits and slacks as one block of every column."""
    w = matrices(5, np.float32)
    rng = np.random.default_rng(5)
    parts = (rng.standard_normal((1, w.shape[0])), rng.standard_normal((1, w.shape[0])) * 2.0 ** -60)
    bias, e = rng.standard_normal(w.shape[1]), G.dyadic_up(Fraction(1, 3 * 2 ** 40))
    whole = G.screened_columns(parts, w, bias, e)
    monkeypatch.setattr(G, "SCREEN_BLOCK", block)
    cut = G.screened_columns(parts, w, bias, e)
    for (l1, s1, e1), (l2, s2, e2) in [(whole, cut)]:
        assert [Fraction(v) * Fraction(2) ** e1 for v in l1] == [Fraction(v) * Fraction(2) ** e2 for v in l2]
        assert [Fraction(v) * Fraction(2) ** e1 for v in s1] == [Fraction(v) * Fraction(2) ** e2 for v in s2]


def test_screened_slack_is_needed():
    """A float32 column whose small entry the first digit drops: the screened logit is off by c_1 2^-30, and
    the slack (||c||_1 2^(top - bits) = 2 2^(1 - 26)) covers it."""
    w = np.array([[1.0], [2.0 ** -30]], np.float32)
    logit, slack, exp = G.screened_columns((np.array([[1.0, 1.0]]),), w, np.zeros(1), (0, 0))
    assert Fraction(logit[0]) * Fraction(2) ** exp == 1 and Fraction(slack[0]) * Fraction(2) ** exp == Fraction(1, 2 ** 24) > 2 ** -30


def test_screen_keeps_what_the_exact_table_gives(tmp_path, monkeypatch):
    """On a random model with 3,000 tokens: the screened table's least lower and upper bound, least lower bound
    minus width and gaps below margins up to the least upper bound equal the all-exact table's (every gap a
    contender); a screen that settles every gap (no contenders, the mutant) changes them."""
    from tcert.checker.modelfile import load_model
    from tcert.generator.model.files import save_model
    from tcert.generator.model.random_models import random_model
    tensors, config = random_model("neox1l", seed=3, n_layers=1, d_vocab=3000, d_model=32, n_heads=2, d_head=16,
                                   d_mlp=64, n_ctx=8)
    save_model(str(tmp_path / "m.safetensors"), tensors, config)
    model, tokens = load_model(str(tmp_path / "m.safetensors")), [5, 17, 2999, 0, 5, 1]
    B = make_backend("flint")

    def summary(table):
        t = table.without(k)
        lower, j, upper = t.extremes()
        margins = [lower, (lower + upper) / 2, upper, upper / 2]
        return lower, j, upper, min(2 * lo - hi for lo, hi in t), [t.below(m) for m in margins]

    with B.precision():
        W = Weights(B, model)
        x = unembed_input(B, model, tokens, W)
        logit, _, _ = G.screened_columns(exact_backend.point_parts(x.centre, B), np.asarray(model.tensors["unembed.W_U"]),
                                         np.asarray(model.tensors["unembed.b_U"], dtype=np.float64), (0, 0))
        k = max(range(3000), key=logit.__getitem__)
        screened = G.exact_gap_table(B, W, x, k)
        opened = len(G.contenders(screened.lows, screened.highs, k))
        monkeypatch.setattr(G, "contenders", lambda lows, highs, k: [j for j in range(len(lows)) if j != k])
        exact = G.exact_gap_table(B, W, x, k)
        monkeypatch.setattr(G, "contenders", lambda lows, highs, k: [])
        mutant = G.exact_gap_table(B, W, x, k)
    assert 1 <= opened < 100
    assert summary(screened) == summary(exact)
    assert summary(mutant) != summary(exact)
