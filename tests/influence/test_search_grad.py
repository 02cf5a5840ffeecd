"""The gradient-guided influence search (`tcert.generator.influence.search_grad`): its torch forward pass is the
generator's float64 forward pass (whole inputs and behind a cached prefix), its gradient gains are the one-hot
derivatives, every witness it returns recomputes to the movement it reports, and on a tiny model it reaches the
exhaustive maximum."""

import itertools

import numpy as np
import pytest

from tcert.generator.influence import toy_model
from tcert.generator.influence.search import last_states, pair_movement
from tcert.generator.model.forward import as_model

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
from tcert.generator.influence.search_grad import (TorchWeights, final_states, gcg_influence,  # noqa: E402
                                                   grad_influence, movements, prefix_kv, relaxed_influence,
                                                   swap_gains)

SHAPES = {
    "rotary-parallel": dict(rotary=True, parallel=True),
    "learned-sequential-gelu": dict(act_fn="gelu"),
    "attn-only-nope": dict(attn_only=True, nope=True, final_ln=False),
    "no-ln-silu": dict(ln=False, parallel=True, rotary=True, act_fn="silu"),
    "gelu-new-bidirectional": dict(act_fn="gelu_new", attention="bidirectional", rotary=True),
}


def model_of(n_layers=2, d_vocab=6, n_ctx=12, seed=0, scale=0.6, adjacent=False, **kw):
    """A seeded toy model in memory (`toy_model`), causal unless told; `adjacent`: rotary pairs (2j, 2j+1)."""
    t, cfg = toy_model(n_layers=n_layers, d_vocab=d_vocab, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=n_ctx,
                       seed=seed, scale=scale, **kw)
    if adjacent:
        cfg["rotary_adjacent_pairs"] = True
    return as_model(t, cfg)


def torch_states(tw, rows, cache=None):
    """final_states of token rows (B, s) as a float64 numpy array."""
    with torch.no_grad():
        return final_states(tw, tw.t["embed.W_E"][torch.as_tensor(np.asarray(rows))], cache).numpy()


@pytest.mark.parametrize("name", sorted(SHAPES) + ["rotary-adjacent"])
def test_torch_forward_is_the_generator_forward(name):
    """final_states in float64 equals the generator's last_states residual to 1e-12 on every shape (learned and
    rotary positions, both rotary pairings, parallel and sequential blocks, no LN, attention only, four
    activations, bidirectional), and behind prefix_kv of every prefix length (causal models)."""
    shape = dict(rotary=True, adjacent=True) if name == "rotary-adjacent" else SHAPES[name]
    model = model_of(**shape)
    tw = TorchWeights(model, torch.float64)
    x = np.random.default_rng(3).integers(0, 6, (5, 10))
    y = last_states(model, x)[0]
    assert np.abs(torch_states(tw, x) - y).max() < 1e-12
    if model.config.attention_dir != "causal":
        with pytest.raises(ValueError, match="causal"):
            prefix_kv(tw, x[0, :3])
        return
    for m in range(1, 10):
        x[:, :m] = x[0, :m]
        y = last_states(model, x)[0]
        assert np.abs(torch_states(tw, x[:, m:], prefix_kv(tw, x[0, :m])) - y).max() < 1e-12, m


def test_movements_and_swap_gains_are_the_pair_movement_and_its_derivatives():
    """movements (with and without a prefix cache) is pair_movement's ||y - y'||; swap_gains' value is too, and
    its gains are the derivatives along the one-hot segment from the current token to each other one (central
    differences of the relaxed input), zero at the current token, -inf at the changed position."""
    model = model_of(**SHAPES["rotary-parallel"])
    tw = TorchWeights(model, torch.float64)
    E = tw.t["embed.W_E"]
    x, i, a, b = np.array([3, 1, 4, 1, 5, 2, 0, 2]), 5, 0, 4
    truth = pair_movement(model, x, i, a, b)[0]
    X = np.stack([x, np.roll(x, 1)])
    both = [pair_movement(model, r, i, a, b)[0] for r in X]
    assert np.allclose(movements(tw, X, i, np.full(2, a), np.full(2, b)), both, atol=1e-12, rtol=0)
    cache = prefix_kv(tw, x[:3])
    assert abs(movements(tw, x[None, 3:], i - 3, [a], [b], cache)[0] - truth) < 1e-12
    value, G, ga, gb = swap_gains(tw, x, i, a, b)
    assert abs(value - truth) < 1e-12
    assert np.all(np.isneginf(G[i])) and np.all(G[np.arange(8) != i, x[np.arange(8) != i]] == 0)
    assert ga[a] == 0 and gb[b] == 0

    def relaxed(j, t, h):
        """||y_a - y_b|| with position j's one-hot moved by h towards token t (j == i: a's row only)."""
        hot = torch.nn.functional.one_hot(torch.as_tensor(x), 6).to(torch.float64)
        hb = hot.clone()
        hot[i], hb[i] = torch.nn.functional.one_hot(torch.as_tensor(a), 6), torch.nn.functional.one_hot(
            torch.as_tensor(b), 6)
        step = torch.nn.functional.one_hot(torch.as_tensor(t), 6) - hot[j]
        hot[j] += h * step
        if j != i:
            hb[j] += h * step
        y = final_states(tw, torch.stack([hot @ E, hb @ E]))
        return float((y[0] - y[1]).norm())

    h = 1e-6
    for j, t in itertools.product((0, 2, 7), range(6)):
        fd = (relaxed(j, t, h) - relaxed(j, t, -h)) / (2 * h)
        assert abs(fd - G[j, t]) < 1e-6 * max(1.0, abs(fd)), (j, t)
    for t in range(6):
        assert abs((relaxed(i, t, h) - relaxed(i, t, -h)) / (2 * h) - ga[t]) < 1e-6 * max(1.0, abs(ga[t]))


def test_gcg_witness_is_real_and_never_below_its_start():
    """gcg_influence and grad_influence return a pair whose movement, recomputed by two independent
    `last_states` calls, is the one reported, at least the start's; positions outside the window keep their
    tokens; the trace counts each round's steps, candidates and accepted candidates."""
    model = model_of(**SHAPES["rotary-parallel"], n_ctx=16)
    x = np.random.default_rng(5).integers(0, 6, 14)
    i, a, b = 11, 1, 3
    start = pair_movement(model, x, i, a, b)[0]
    dy, tok, j, a2, b2 = gcg_influence(model, x, i, a, b, positions=range(8, 14), steps=6, batch=16, topk=4,
                                       dtype=torch.float64)
    assert j == i and np.array_equal(tok[:8], x[:8]) and tok[i] == a2
    ya, yb = last_states(model, tok[None])[0][0], last_states(model, np.where(np.arange(14) == i, b2, tok)[None])[0][0]
    assert abs(dy - np.linalg.norm(ya - yb)) < 1e-12 and dy >= start - 1e-12
    trace = []
    dy, dp, tok, j, a3, b3 = grad_influence(model, x, i, a, b, window=6, rounds=2, steps=4, batch=16, topk=4,
                                            trace=trace)
    assert (dy, dp) == pair_movement(model, tok, j, a3, b3) and dy >= start - 1e-12 and tok[j] == a3
    assert [t[:2] for t in trace] == [(4, 64), (4, 64)] and all(0 <= t[2] <= 4 for t in trace)
    dy, tok, j, a4, b4 = gcg_influence(model, x, i, a, b, positions=[], steps=3, batch=8, topk=6)
    assert np.array_equal(np.delete(tok, i), np.delete(x, i)) and dy == pair_movement(model, tok, i, a4, b4)[0]


@pytest.mark.parametrize("name", ["rotary-parallel", "learned-sequential-gelu"])
def test_grad_influence_reaches_the_exhaustive_maximum_on_a_tiny_model(name):
    """On a 5-token vocabulary at n = 4 with the change at position 2, grad_influence from a fixed all-zero start
    finds the largest ||y - y'|| over every input and every pair (a, b) (float64 brute force over 5^4 inputs)."""
    model = model_of(d_vocab=5, **SHAPES[name])
    n, i = 4, 2
    rows = np.array(list(itertools.product(range(5), repeat=n)))
    y = last_states(model, rows)[0]
    index = {tuple(r): k for k, r in enumerate(rows)}
    best = 0.0
    for r in rows:
        for t in range(r[i] + 1, 5):
            other = r.copy()
            other[i] = t
            best = max(best, float(np.linalg.norm(y[index[tuple(r)]] - y[index[tuple(other)]])))
    dy = grad_influence(model, np.zeros(n, dtype=int), i, 0, 1, rounds=3, steps=12, batch=32, topk=5, seed=1)[0]
    assert abs(dy - best) < 1e-9, (dy, best)


def test_relaxed_influence_rounds_to_a_real_pair():
    """relaxed_influence's argmax tokens are a real pair: the movement reported is pair_movement's; started sharp
    with a near-zero learning rate it keeps the start's tokens, and its relaxed value is then the start's."""
    model = model_of(**SHAPES["rotary-parallel"])
    x, i, a, b = np.array([3, 1, 4, 1, 5, 2, 0, 2]), 5, 0, 4
    dy, tok, j, a2, b2, relaxed = relaxed_influence(model, x, i, a, b, steps=30, lr=0.2, seed=2)
    assert dy == pair_movement(model, tok, j, a2, b2)[0] and tok[j] == a2
    dy, tok, j, a2, b2, relaxed = relaxed_influence(model, x, i, a, b, steps=3, lr=1e-9, sharp=40.0,
                                                    temperatures=(1.0, 1.0), dtype=torch.float64)
    x[i] = a
    assert np.array_equal(tok, x) and (a2, b2) == (a, b)
    assert abs(relaxed - pair_movement(model, x, i, a, b)[0]) < 1e-9


def test_benchmark_grad_search_starts_from_a_padded_witness_and_prints_real_movements(tmp_path, capsys):
    """benchmarks/influence_worst_found.py --search grad with a witness file shorter than n pads it with its first
    token, and prints a movement equal to pair_movement of the printed witness, at least the padded start's."""
    import json

    from tcert.checker.modelfile import load_model
    from tcert.testing.influence import worst_found_bench
    from tcert.generator.model.files import save_model
    t, cfg = toy_model(n_layers=2, d_vocab=6, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=12, seed=0, scale=0.6,
                       rotary=True, parallel=True)
    path = str(tmp_path / "toy.safetensors")
    save_model(path, t, cfg, dtype="float64")
    model = load_model(path)
    (tmp_path / "w.jsonl").write_text(json.dumps(dict(n=6, dy=0.0, tokens=[1, 2, 3, 4, 0, 5], i=4, a=0, b=2)) + "\n")
    bench = worst_found_bench()
    bench.main(["--model", path, "--n", "9", "--search", "grad", "--witness", str(tmp_path / "w.jsonl"),
                "--rounds", "1", "--steps", "3", "--batch", "8", "--topk", "3"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["n"] == 9 and len(r["tokens"]) == 9 and r["i"] == 7
    assert r["start_dy"] == pair_movement(model, [1, 1, 1, 1, 2, 3, 4, 0, 5], 7, 0, 2)[0]
    assert r["dy"] == r["recomputed"][0] == pair_movement(model, r["tokens"], r["i"], r["a"], r["b"])[0]
    assert r["dy"] >= r["start_dy"] and r["gcg"][0][:2] == [3, 24]
