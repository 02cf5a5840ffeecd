"""Sets over the vocabulary by blocks of tokens (checker/kinds/influence/vocabulary.py): block 0's value
balls and the unembedding's radius agree with the interval-table route to 1e-12 on both backends and
contain every member (exact rationals); the exact layer's new helpers bound what they claim to."""

from fractions import Fraction

import numpy as np
import pytest

from tcert.checker import exact_backend
from tcert.checker.forward import kv_head
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import norms, vocabulary
from tcert.checker.kinds.influence.norms import max_row_dist
from tcert.checker.kinds.influence.sublayers import LNMap, fold
from tcert.checker.modelfile import kv_names, load_model
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model

MODELS = {"neox": ("neox1l", {}), "preln-rotary": ("preln", {"positional_embedding_type": "rotary"}),
          "llama": ("llama", {})}


@pytest.fixture
def blockwise(monkeypatch):
    """Force the blockwise route (no tables) with blocks of 7 tokens, so several blocks and a short last one."""
    monkeypatch.setattr(vocabulary, "TABLE_ENTRIES", 0)
    monkeypatch.setattr(vocabulary, "VOCAB_ROWS", 7)
    monkeypatch.setattr(norms, "VECTOR_ROWS", 7)   # scaled_value_sets reads the blocks of norms.RowTerms


def tiny(tmp_path, key, vocab=23, dtype=None):
    arch, extra = MODELS[key]
    tensors, config = random_model(arch, d_vocab=vocab, d_model=12, n_heads=2, d_head=4, d_mlp=16, bias_std=0.3,
                                   seed=5, **extra)
    if dtype is not None:
        tensors = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in tensors.items()}
    path = tmp_path / f"{key}.safetensors"
    save_model(str(path), tensors, config)
    return load_model(str(path))


def mp(x: Fraction):
    import mpmath
    return mpmath.mpf(x.numerator) / x.denominator


def exact_ln(x, w, b, eps):
    """LayerNorm of a Fraction row at the caller's mpmath precision (80 digits)."""
    import mpmath
    d = len(x)
    mean = sum(x) / d
    c = [v - mean for v in x]
    inv = 1 / mpmath.sqrt(mp(sum(v * v for v in c) / d) + mp(Fraction(eps)))
    return [mp(ci) * inv * wi + bi for ci, wi, bi in zip(c, w, b)]


def exact_values(model, h):
    """Every token's block-0 value row of head h, at 80 digits (mpmath)."""
    import mpmath
    cfg, t = model.config, model.tensors
    names, p = kv_names(cfg), "blocks.0.attn."
    W_V, b_V = (np.asarray(t[p + names[m]][kv_head(cfg, h)], np.float64) for m in ("W_V", "b_V"))
    W_O = np.asarray(t[p + "W_O"][h], np.float64)
    w, b = (np.asarray(t["blocks.0.ln1." + k], np.float64) for k in ("w", "b"))
    rows = []
    with mpmath.workdps(80):
        for x in np.asarray(t["embed.W_E"], np.float64):
            u = exact_ln([Fraction(v) for v in x], w.tolist(), b.tolist(), cfg.eps)
            y = [sum(u[i] * W_V[i, j] for i in range(len(u))) + b_V[j] for j in range(W_V.shape[1])]
            rows.append([sum(y[i] * W_O[i, j] for i in range(len(y))) for j in range(W_O.shape[1])])
    return rows


def distance(row, centre):
    import mpmath
    with mpmath.workdps(80):
        return mpmath.sqrt(sum((a - mp(c)) ** 2 for a, c in zip(row, centre)))


def exact_centre(B, centre):
    """Midpoints of the centre's enclosures, as Fractions."""
    return [(B.lower(c) + B.upper(c)) / 2 for c in centre]


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
@pytest.mark.parametrize("key,dtype", [("neox", None), ("preln-rotary", None), ("neox", np.float16)])
def test_value_sets_match_the_tables_and_contain_every_value(tmp_path, blockwise, backend, key, dtype):
    """Blockwise balls: radius within 1e-12 (relative) of the table route's, centre within 1e-12, and every
    token's exact value (80 digits) inside."""
    import mpmath
    model, B = tiny(tmp_path, key, dtype=dtype), make_backend(backend)
    with B.precision():
        table, blocks = vocabulary.table_value_sets(B, model), vocabulary.value_sets(B, model)
        for h, ((tc, tr), (bc, br)) in enumerate(zip(table, blocks)):
            assert abs(br - tr) <= tr * Fraction(1, 10 ** 12)
            assert max(abs(a - b) for a, b in zip(exact_centre(B, tc), exact_centre(B, bc))) <= Fraction(1, 10 ** 12)
            with mpmath.workdps(80):
                slack = mpmath.mpf(10) ** -40      # the centre's enclosure is far narrower than the radius' margin
                far = max(distance(row, exact_centre(B, bc)) for row in exact_values(model, h))
                assert far <= mp(br) - slack


def test_the_exact_layer_route_is_taken(tmp_path, blockwise, monkeypatch):
    """On flint (exact layer on) a LayerNorm model's value sets come from scaled_value_sets (no interval rows of
    LN1 outputs: token_blocks is never called), with an error bound below 1e-12 per block; its radii are within
    4e-14 (relative) of the table's on this model; mpmath takes the interval route."""
    model, B = tiny(tmp_path, "neox"), make_backend("flint")
    monkeypatch.setattr(vocabulary, "token_blocks", None)
    seen = []
    real = vocabulary.head_ball
    monkeypatch.setattr(vocabulary, "head_ball", lambda B, kept, *a: seen.append((len(kept), a[-1])) or real(B, kept, *a))
    with B.precision():
        assert vocabulary.exact_layernorm(B, model)
        got, table = vocabulary.value_sets(B, model), vocabulary.table_value_sets(B, model)
    assert len(seen) == 2 and all(n == 4 and 0 < e < Fraction(1, 10 ** 12) for n, e in seen)
    assert all(abs(g[1] - t[1]) <= t[1] * Fraction(4, 10 ** 14) for g, t in zip(got, table))
    assert not vocabulary.exact_layernorm(make_backend("mpmath"), model)


@pytest.mark.parametrize("backend", ["flint", "mpmath"])
@pytest.mark.parametrize("key", ["neox", "preln-rotary", "llama"])
def test_unembedding_radius_matches_the_table(tmp_path, blockwise, backend, key):
    """max_k ||M[:, k] - c|| blockwise (no final LN, LayerNorm, RMSNorm) within 1e-12 of the table route, and
    >= every column's exact distance from the returned centre."""
    model, B = tiny(tmp_path, key), make_backend(backend)
    cfg, t = model.config, model.tensors
    ln = (LNMap(Fraction(1), Fraction(1), t["ln_final.w"], t.get("ln_final.b"), not cfg.has_rms) if cfg.final_ln
          else LNMap(Fraction(1), Fraction(1), None, None))
    with B.precision():
        M = fold(B, ln, t["unembed.W_U"]).T
        lo, hi = M.col_bounds()
        table = max_row_dist(B, M, [B.num((a + b) / 2) for a, b in zip(lo, hi)])
        centre, radius = vocabulary.unembedding_ball(B, model, ln)
        assert abs(radius - table) <= table * Fraction(1, 10 ** 12)
        c = exact_centre(B, centre)
        for row in M.rows():
            worst = sum(max(abs(B.lower(x) - ci), abs(B.upper(x) - ci)) ** 2 for x, ci in zip(row, c))
            assert worst <= radius ** 2


def test_tables_below_the_threshold(tmp_path):
    """Small vocabularies keep the table route (so earlier certificates regenerate byte-identically)."""
    model, B = tiny(tmp_path, "neox"), make_backend("flint")
    with B.precision():
        assert vocabulary.unembedding_ball(B, model, LNMap(Fraction(1), Fraction(1), None, None)) is None
        got, table = vocabulary.value_sets(B, model), vocabulary.table_value_sets(B, model)
        assert [r for _, r in got] == [r for _, r in table]
        assert [exact_centre(B, c) for c, _ in got] == [exact_centre(B, c) for c, _ in table]


def random_floats(rng, shape, spread=40):
    """float64 values with exponents over +-spread and random signs, some zeros."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, size=shape))
    x[rng.random(shape) < 0.1] = 0.0
    return x


def test_max_row_square_bounds_the_exact_sums():
    rng = np.random.default_rng(3)
    lo = random_floats(rng, (9, 13))
    hi = lo + np.abs(random_floats(rng, (9, 13), 5)) * 2.0 ** -30
    got = exact_backend.max_row_square(((lo,), (hi,)))
    exact = max(sum(max(Fraction(a) ** 2, Fraction(b) ** 2) for a, b in zip(r, s)) for r, s in zip(lo, hi))
    assert exact <= got <= exact * (1 + Fraction(1, 2 ** 48))
    assert exact_backend.max_row_square(((lo,), (hi * 2.0 ** 500,))) is None


def test_max_quadratic_and_widths():
    rng = np.random.default_rng(5)
    y = random_floats(rng, (5, 4), 8)
    Q = rng.standard_normal((4, 4))
    Q = Q @ Q.T
    P = exact_backend.point_bounds(y, Q)
    got = exact_backend.max_quadratic(y, P)
    exact = max(sum(Fraction(y[r, i]) * Fraction(Q[i, j]) * Fraction(y[r, j]) for i in range(4) for j in range(4))
                for r in range(5))
    assert exact <= got <= exact + abs(exact) * Fraction(1, 2 ** 45)
    rows = exact_backend.quadratic_rows(y, P)     # per row, as head_ball reads it
    for r in range(5):
        value = sum(Fraction(y[r, i]) * Fraction(Q[i, j]) * Fraction(y[r, j]) for i in range(4) for j in range(4))
        assert value <= Fraction(rows[r]) <= value + exact * Fraction(1, 2 ** 45)
    assert exact_backend.quadratic_rows(y * 2.0 ** 500, P) is None
    width = exact_backend.widths(P)
    assert all(Fraction(w) >= Fraction(b) - Fraction(a) for w, a, b in zip(width.ravel(), P[0][0].ravel(), P[1][0].ravel()))


def test_pieces_sum_to_the_value():
    x = random_floats(np.random.default_rng(6), (50,), 300)
    x[x == 0] = 1.0
    parts = exact_backend._pieces(x)
    assert all(sum(Fraction(p[i]) for p in parts) == Fraction(x[i]) for i in range(50))


def test_blockwise_certificate_verifies_on_both_backends_and_a_low_constant_rejects(tmp_path, blockwise):
    """A rotary LayerNorm model's default influence certificate, made and checked with the blockwise sets
    (flint's exact-layer route, mpmath's interval route), VERIFIED; a value radius or the unembedding radius
    claimed at half its value is REJECTED under its own obligation."""
    import copy
    import tcert.api as tc
    tensors, config = random_model("preln", d_vocab=23, d_model=12, n_heads=2, d_head=4, d_mlp=16, n_layers=2,
                                   bias_std=0.3, seed=7, positional_embedding_type="rotary")
    path = str(tmp_path / "m.safetensors")
    save_model(path, tensors, config)
    cert = tc.influence(tc.load_model(path))
    for backend in ("flint", "mpmath"):
        assert tc.check(cert.data, path, backend=backend).verified
    for name in ("L0.h1.value_radius", "unembed.radius"):
        low = copy.deepcopy(cert.data)
        value = Fraction(float.fromhex(low["evidence"]["constants"][name]))
        low["evidence"]["constants"][name] = (value / 2).__float__().hex()
        verdict = tc.check(low, path)
        assert not verdict.verified and verdict.obligation == f"influence: constant {name}"
