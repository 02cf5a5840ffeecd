"""The flip search of `tcert.generator.influence.search_flip`: its tables give the forward pass's block-1 input at
the last position (every supported block layout), a swap is the input with that one token changed, the two
coordinate searches never go the wrong way, the witness's figure is the uncached movement and its pair is the
worst at i, and models the tables cannot describe are refused."""

import numpy as np
import pytest

from tcert.generator.influence import toy_model
from tcert.generator.influence.search import pair_movement
from tcert.generator.influence.search_flip import (_centred_norm, _flatten, _flip_distance, _LastRow, _normalised,
                                                   _spread, block1_inputs, flat_queries, flip_influence,
                                                   flip_profile)
from tcert.generator.model.forward import _ln, _weights, as_model, residuals
from tcert.generator.model.random_models import random_model
from tcert.testing.influence import search_toy, worst_found_bench


LAYOUTS = {
    "rotary parallel": lambda: search_toy(),
    "rotary sequential": lambda: search_toy(parallel=False),
    "no positions, bidirectional": lambda: search_toy(rotary=False, nope=True, attention="bidirectional"),
    "attention only": lambda: search_toy(attn_only=True),
    "llama (RMSNorm, GQA, SwiGLU)": lambda: as_model(*random_model("llama", seed=3, n_layers=2, d_vocab=16,
                                                                  d_model=16, n_heads=4, d_head=4, d_mlp=32, n_ctx=12,
                                                                  n_key_value_heads=2)),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_block1_inputs_are_the_forward_pass(layout):
    """The tables' block-1 input at the last position equals `residuals(...)[1][-1]` on random inputs."""
    model = LAYOUTS[layout]()
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 12):
        tokens = rng.integers(0, model.config.d_vocab, n)
        assert np.allclose(block1_inputs(model, tokens), residuals(model, tokens)[1][-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["rotary parallel", "llama (RMSNorm, GQA, SwiGLU)"])
def test_normalised_is_block_1s_norm_without_gain_and_bias(layout):
    """Times block 1's gain plus its bias, `_normalised` is the forward pass's LayerNorm / RMSNorm."""
    model = LAYOUTS[layout]()
    W = _weights(model)
    x = np.random.default_rng(2).normal(size=(5, model.config.d_model))
    x[0] = 0.01 + 1e-3 * x[0]      # nearly constant: the case the search is after
    ln = W.t["blocks.1.ln1.w"], W.t.get("blocks.1.ln1.b", 0.0)
    assert np.allclose(_normalised(W, x) * ln[0] + ln[1], _ln(W, x, "blocks.1.ln1"), rtol=0, atol=1e-12)


def test_tables_hold_under_a_large_common_score_and_refuse_a_wide_span():
    """A query whose scores against every key share an offset of ~800 (past float64's exp) still gives the
    forward pass's block-1 input; a head whose scores span more than 700 is refused."""
    t, cfg = toy_model(n_layers=2, d_vocab=8, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=12, seed=3, scale=0.6,
                       nope=True, parallel=True)
    model = as_model(t, cfg)
    W = _weights(model)
    tokens = np.array([4, 0, 6, 1, 5, 2])
    x = t["embed.W_E"][tokens[-1]]
    u = (x - x.mean()) / np.sqrt(np.var(x) + W.eps) * t["blocks.0.ln1.w"] + t["blocks.0.ln1.b"]
    for h in range(2):
        qh = u @ t["blocks.0.attn.W_Q"][h] + t["blocks.0.attn.b_Q"][h]
        t["blocks.0.attn.b_K"][h] = qh / (qh @ qh) * 1600.0      # q . b_K = 1600: every score of the row + 800
    shifted = as_model(t, cfg)
    assert np.allclose(block1_inputs(shifted, tokens), residuals(shifted, tokens)[1][-1], rtol=0, atol=1e-9)
    t["blocks.0.attn.W_Q"] = t["blocks.0.attn.W_Q"] * 1e4
    with pytest.raises(ValueError, match="too wide"):
        block1_inputs(as_model(t, cfg), tokens)


def test_a_swap_is_the_input_with_that_token_changed():
    """`swaps(tokens, r)[t]` is the block-1 input of tokens with position r set to t, for every r and t."""
    model = search_toy(seed=2)
    W = _weights(model)
    tokens = np.array([3, 1, 4, 1, 5, 2, 6, 7])
    row = _LastRow(W, int(tokens[-1]), len(tokens))
    for r in range(len(tokens) - 1):
        sw = row.swaps(tokens, r)
        for t in range(8):
            changed = tokens.copy()
            changed[r] = t
            assert np.allclose(sw[t], residuals(model, changed)[1][-1], rtol=0, atol=1e-12)


def test_flat_queries_sort_the_own_part_by_centred_norm():
    """Parallel block 0: a last token's own part is its length-1 input's block-1 residual minus its own value
    through W_O (b_V included, b_O kept); `flat_queries` lists every token by that part's centred norm, smallest
    first."""
    model = search_toy(seed=4)
    W = _weights(model)
    H, dh = model.config.n_heads, model.config.d_head
    own = []
    for q in range(8):
        res = residuals(model, [q])[1][0]
        u = (W.t["embed.W_E"][q] - W.t["embed.W_E"][q].mean())
        u = u / np.sqrt(np.mean(u * u) + W.eps) * W.t["blocks.0.ln1.w"] + W.t["blocks.0.ln1.b"]
        v = u @ W.qkv_w[0][:, 2 * H * dh:] + W.qkv_b[0][2 * H * dh:]
        own.append(res - v @ W.o_w[0])
    norms = _centred_norm(W, np.stack(own))
    order = flat_queries(model, 8)
    assert sorted(order.tolist()) == list(range(8))
    assert np.all(np.diff(norms[order]) >= 0)
    assert np.array_equal(flat_queries(model, 3), order[:3])


def test_flatten_and_spread_stop_at_coordinate_optima_without_going_the_wrong_way():
    """Each returns the figure of the tokens it leaves (centred norm, resp. flip distance), no worse than the
    start's, touches neither i nor the last position, and, run to convergence, leaves no single position (and, for
    the flip, no token at i for a or for b) whose change would improve it."""
    model = search_toy(seed=5)
    W = _weights(model)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 8, 10)
    i, q = 6, int(tokens[-1])
    row = _LastRow(W, q, 10)
    start = _centred_norm(W, row.inputs(tokens)[None])[0]
    kept = tokens[[i, -1]].copy()
    reached = _flatten(row, tokens, i, 20, rng)
    assert reached < start and abs(reached - _centred_norm(W, row.inputs(tokens)[None])[0]) < 1e-12
    assert np.array_equal(tokens[[i, -1]], kept)
    for r in range(9):
        if r != i:
            assert _centred_norm(W, row.swaps(tokens, r)).min() >= reached - 1e-12

    def dist(a, b, r=None, t=None):
        ta, tb = tokens.copy(), tokens.copy()
        if r is not None:
            ta[r] = tb[r] = t
        ta[i], tb[i] = a, b
        return _flip_distance(W, row.inputs(ta)[None], row.inputs(tb)[None])[0]

    for a0 in range(8):                  # one round from every start pair: the figure is always its pair's
        for b0 in range(8):
            once = tokens.copy()
            first, a1, b1 = _spread(row, once, i, a0, b0, 1, np.random.default_rng(a0 * 8 + b0))
            ta, tb = once.copy(), once.copy()
            ta[i], tb[i] = a1, b1
            assert abs(first - _flip_distance(W, row.inputs(ta)[None], row.inputs(tb)[None])[0]) < 1e-12
    begin = dist(2, 5)
    best, a, b = _spread(row, tokens, i, 2, 5, 20, rng)
    assert best > begin and abs(best - dist(a, b)) < 1e-12 and tokens[-1] == q
    for t in range(8):
        assert max(dist(t, b), dist(a, t)) <= best + 1e-12
        for r in range(9):
            if r != i:
                assert dist(a, b, r, t) <= best + 1e-12


@pytest.mark.parametrize("layout", ["rotary parallel", "rotary sequential", "llama (RMSNorm, GQA, SwiGLU)"])
def test_flip_influence_returns_the_movement_of_its_witness_and_the_worst_pair(layout):
    """The figure is `pair_movement` of the witness; the last token is one of the queries; the pair at i is the
    worst over every two tokens there (the context fixed)."""
    model = LAYOUTS[layout]()
    V, n = model.config.d_vocab, 7
    dy, dp, tokens, i, a, b = flip_influence(model, n, queries=[0, 3], rounds=2, seed=1)
    assert (dy, dp) == pair_movement(model, tokens, i, a, b)
    assert i == n - 2 and len(tokens) == n and tokens[-1] in (0, 3) and tokens[i] == a
    for s in range(V):
        for t in range(s + 1, V):
            assert pair_movement(model, tokens, i, s, t)[0] <= dy + 1e-12


def test_flip_profile_reads_the_forward_pass():
    """The profile's centred norms and distance are those of the forward pass's block-1 inputs, normalised by
    block 1's LayerNorm with its gain 1 and bias 0."""
    model = search_toy(seed=6)
    tokens, i, a, b = [5, 1, 2, 7, 0, 3], 3, 6, 4
    xs = []
    for t in (a, b):
        x = list(tokens)
        x[i] = t
        xs.append(residuals(model, x)[1][-1])
    xc = [x - x.mean() for x in xs]
    g = [c / np.sqrt(np.mean(c * c) + 0.01) for c in xc]       # toy_model's eps is 1/100
    na, nb, dist = flip_profile(model, tokens, i, a, b)
    assert abs(na - np.linalg.norm(xc[0])) < 1e-12 and abs(nb - np.linalg.norm(xc[1])) < 1e-12
    assert abs(dist - np.linalg.norm(g[0] - g[1])) < 1e-12


def test_models_the_tables_cannot_describe_are_refused():
    """Learned positions (block 0 reads positions), one layer, no normalisation, a bad length or position."""
    with pytest.raises(ValueError, match="token alone"):
        flip_influence(search_toy(rotary=False), 5)
    with pytest.raises(ValueError, match="normalised block 1"):
        flip_influence(as_model(*toy_model(n_layers=1, rotary=True, seed=0)), 4)
    with pytest.raises(ValueError, match="normalised block 1"):
        flip_influence(search_toy(ln=False), 5)
    with pytest.raises(ValueError, match="not in"):
        flip_influence(search_toy(), 13)
    with pytest.raises(ValueError, match="non-final"):
        flip_influence(search_toy(), 6, i=5)


def test_benchmark_flip_search_keeps_the_best_offset_and_prints_real_movements(tmp_path, capsys):
    """benchmarks/influence_worst_found.py --search flip runs `flip_influence` at each offset with the flattest
    queries and prints the largest (here the second offset's), its movement equal to pair_movement of the
    printed witness."""
    import json

    from tcert.checker.modelfile import load_model
    from tcert.generator.model.files import save_model
    t, cfg = toy_model(n_layers=2, d_vocab=8, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=12, seed=7, scale=0.6,
                       rotary=True, parallel=True)
    path = str(tmp_path / "toy.safetensors")
    save_model(path, t, cfg, dtype="float64")
    model = load_model(path)
    bench = worst_found_bench()
    bench.main(["--model", path, "--n", "7", "--search", "flip", "--flip-queries", "2", "--flip-offsets", "3,2",
                "--rounds", "2"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    queries = flat_queries(model, 2)
    found = [flip_influence(model, 7, queries, i=7 - o, rounds=2, seed=7) for o in (3, 2)]
    assert r["dy"] == max(f[0] for f in found) and r["i"] in (5, 4) and r["tokens"][-1] in queries.tolist()
    assert r["dy"] == r["recomputed"][0] == pair_movement(model, r["tokens"], r["i"], r["a"], r["b"])[0]
