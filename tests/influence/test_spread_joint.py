"""The optional constant spread<k>.joint (checker/kinds/influence/joint.py): the sublayers' moves at an unchanged
position added as one vector, sqrt(sum_j zeta_j^2 / c_j) ||sum_j c_j A_j^T A_j||^(1/2), instead of their norms
added. Sampled sublayer moves stay below it; an exhaustive rigorous oracle on tiny models where it lowers C_abs;
mutations (left out, shrunk, swapped, moved, stated for a block that does not exist); both backends agree on it."""

import copy
import math
from fractions import Fraction

import numpy as np
import pytest
from types import SimpleNamespace

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import blocks, certified_needs
from tcert.checker.kinds.influence.joint import ball_term, head_terms, joint_bound, mlp_terms
from tcert.checker.kinds.influence.sublayers import LNMap
from tcert.checker.numbers import parse_number
from tcert.checker.verify import verify
from tcert.generator.influence import influence_certificate
from tcert.generator.influence.ledger import FillLedger
from tcert.testing.influence import (
    Without, assert_shrunk_and_swapped_rejected, exhaustive_worst, old_rule_certificate, tiny_toy as tiny)


def folded(model, layer, ln_name, W):
    """P diag(w) W for block `layer`'s LayerNorm `ln_name` (float64)."""
    d = model.config.d_model
    P = np.eye(d) - np.ones((d, d)) / d
    return P @ np.diag(model.tensors[f"blocks.{layer}.{ln_name}.w"].astype(float)) @ W


def ln_map(model, layer, ln_name, B):
    """The LN map with R = sqrt(d) (its radius in every block of these models)."""
    t = model.tensors
    return LNMap(Fraction(1), B.upper(B.sqrt(B.num(model.config.d_model))), t[f"blocks.{layer}.{ln_name}.w"],
                 t[f"blocks.{layer}.{ln_name}.b"])


def pieces(model):
    """Per block, the heads' maps N_h and the MLP's (M, W_out, z0) (float64; M and z0 read LN2)."""
    t, out = model.tensors, []
    for layer in range(model.config.n_layers):
        p = f"blocks.{layer}."
        N = [folded(model, layer, "ln1", t[p + "attn.W_V"][h]) @ t[p + "attn.W_O"][h] for h in range(model.config.n_heads)]
        mlp = (folded(model, layer, "ln2", t[p + "mlp.W_in"]), t[p + "mlp.W_out"].astype(float),
               t[p + "ln2.b"] @ t[p + "mlp.W_in"] + t[p + "mlp.b_in"])
        out.append((N, mlp))
    return out


def mlp_extreme(mlp, u, R, rng, sign, starts=8, steps=200):
    """A point g of the R-ball making sign * u . f(g) large (f(g) = relu(g M + z0) W_out): projected (sub)gradient
    ascent from random starts and from +-R times M's top left singular vector."""
    M, W_out, z0 = mlp
    top = np.linalg.svd(M)[0][:, 0] * R
    best, best_g = -np.inf, None
    for g in [top, -top] + [rng.normal(size=M.shape[0]) for _ in range(starts)]:
        g = g / np.linalg.norm(g) * R
        for _ in range(steps):
            grad = sign * M @ ((g @ M + z0 > 0) * (W_out @ u))
            g = g + 0.1 * R * grad / (np.linalg.norm(grad) + 1e-12)
            g = g / max(1.0, np.linalg.norm(g) / R)
        value = sign * np.maximum(g @ M + z0, 0) @ W_out @ u
        if value > best:
            best, best_g = value, g
    return best_g


def searched_move(model, R, rng, rounds=6) -> float:
    """A large ||y - y'||, y - y' = sum over blocks of sum_h (g_h - g_h') N_h + f(g) - f(g'), every piece reading its
    own points of the R-ball: alternately the direction u of the sum, and each piece's points making u . piece
    largest (heads exactly: g_h = -g_h' = R N_h u / |N_h u|; the MLP by `mlp_extreme`)."""
    parts, u = pieces(model), rng.normal(size=model.config.d_model)
    best = 0.0
    for _ in range(rounds):
        u = u / np.linalg.norm(u)
        total = np.zeros_like(u)
        for N, mlp in parts:
            for n in N:
                total += 2 * R * (n @ u) / max(np.linalg.norm(n @ u), 1e-300) @ n
            g, g2 = mlp_extreme(mlp, u, R, rng, 1), mlp_extreme(mlp, u, R, rng, -1)
            total += (np.maximum(g @ mlp[0] + mlp[2], 0) - np.maximum(g2 @ mlp[0] + mlp[2], 0)) @ mlp[1]
        best, u = max(best, np.linalg.norm(total)), total
    return best


def test_joint_bound_covers_sampled_moves(tmp_path):
    """Over heads and MLPs reading independent points of their R-balls, the largest sum of the moves a search
    finds (`searched_move`) stays below joint_bound over every block's terms and within 1.3x of it, and joint_bound
    is below the moves' norm bounds added (sum_h 2 r_h + the MLP diameter, per block)."""
    _, model = tiny(tmp_path, n_heads=4, d_head=2, d_model=8)
    B, cfg = make_backend("flint"), model.config
    R = math.sqrt(cfg.d_model)
    ld = FillLedger()
    certified_needs(model, B, ld, cfg.n_ctx, 6)
    c = ld.claimed
    terms = []
    for layer in range(cfg.n_layers):
        radii = [c[f"L{layer}.h{h}.value_radius"] for h in range(cfg.n_heads)]
        terms += head_terms(B, model, layer, ln_map(model, layer, "ln1", B), radii)
        terms += mlp_terms(B, model, layer, ln_map(model, layer, "ln2", B), c[f"L{layer}.mlp.W_in"],
                           c[f"L{layer}.mlp.W_out"], 6)
    bound = float(joint_bound(B, [terms], cfg.d_model, 6))
    added = sum(float(2 * c[f"L{k}.attn.radius"] + min(2 * c[f"L{k}.mlp.radius"], c[f"L{k}.mlp.diameter"]))
                for k in range(cfg.n_layers))
    best = max(searched_move(model, R, np.random.default_rng(seed)) for seed in range(4))
    assert best <= bound < added and best >= bound / 1.3, (best, bound, added)


def test_ball_terms_alone_are_the_ball():
    """One ball term is its own radius up to the trace power's d^(1/2^(p+1)); no term gives 0."""
    B = make_backend("flint")
    assert joint_bound(B, [[]], 4, 6) == 0
    one = joint_bound(B, [ball_term(Fraction(3))], 4, 6)
    assert 3 <= one <= 3 * 4 ** (1 / 128) * (1 + 1e-9)
    assert ball_term(Fraction(0)) == []


@pytest.mark.parametrize("kw", [{"attention": "causal"}, {"attention": "bidirectional"}, {"parallel": True},
                                {"rotary": True, "d_head": 2, "n_heads": 3}])
def test_exhaustive_oracle_where_the_joint_lowers_the_cap(tmp_path, kw):
    """On tiny 2-layer models (learned positions, or rotary: block 0 then a ball term) the joint bound lowers C_abs
    below the rule without it, exhaustive single changes at every n stay within the certified bounds (Arb, 100
    bits), and both backends give the same verdict."""
    path, model = tiny(tmp_path, n_ctx=3, scale=0.4, **kw)
    B = make_backend("flint")
    new, old = certified_needs(model, B, FillLedger(), 3, 6), certified_needs(model, B, Without(".joint"), 3, 6)
    assert new["C_abs"] < old["C_abs"] * Fraction(9, 10)
    cert = influence_certificate(model)
    assert sorted(k for k in cert["evidence"]["constants"] if k.endswith(".joint")) == ["spread1.joint", "spread2.joint"]
    assert verify(cert, path, "flint").summary == verify(cert, path, "mpmath").summary
    assert 0 < exhaustive_worst(model, cert, make_backend("flint", 100)) <= 1


def test_left_out_shrunk_swapped_or_moved(tmp_path):
    """Left out: spread2 (tight with it) is REJECTED, and the old rule's constants verify without it. Shrunk by
    2^-20: REJECTED naming its obligation, on both backends, which agree on its figure to 1e-12. Swapped with the
    other block's: REJECTED. Moved to a block that does not exist: REJECTED (spread2) or, added there, BadInput."""
    path, model = tiny(tmp_path, n_heads=4, d_head=2, d_model=8)
    cert = influence_certificate(model)
    consts = cert["evidence"]["constants"]
    names = ["spread1.joint", "spread2.joint"]
    for name in names:
        j, s = parse_number(consts[name], name), parse_number(consts[name[:7]], "spread")
        assert j <= s <= j * (1 + Fraction(1, 2 ** 28))   # it binds (spread is the joint rounded up once more)
        bad = copy.deepcopy(cert)
        del bad["evidence"]["constants"][name]
        with pytest.raises(Rejected, match=rf"influence: constant {name[:7]}: claimed .* is below"):
            verify(bad, path)
    verify(old_rule_certificate(cert, model), path)
    assert_shrunk_and_swapped_rejected(cert, path, names, r"influence: constant spread\d(\.joint)?: claimed")
    moved = copy.deepcopy(cert)
    moved["evidence"]["constants"]["spread3.joint"] = moved["evidence"]["constants"].pop("spread2.joint")
    with pytest.raises(Rejected, match="influence: constant spread2: claimed"):
        verify(moved, path)
    extra = copy.deepcopy(cert)
    extra["evidence"]["constants"]["spread3.joint"] = consts["spread2.joint"]
    with pytest.raises(BadInput, match="unused"):
        verify(extra, path)


def bare_mlp(M, W_out, b_in):
    """A stand-in model with one relu MLP read without normalisation (all `mlp_terms` reads)."""
    t = {"blocks.0.mlp.W_in": M, "blocks.0.mlp.W_out": W_out, "blocks.0.mlp.b_in": b_in}
    return SimpleNamespace(tensors=t, config=SimpleNamespace(act_fn="relu"))


def test_terms_are_reached():
    """Where the inequalities are equalities the terms give exactly what is reached. A head alone: 2R ||N|| (g = -g'
    along N's top direction) up to the trace power's rank^(1/128). The MLP M = m I, W_out = w I with g = (R, 0),
    g' = (0, R): |v| = |s| = R/sqrt 2 and |a_k| = |b_k| per unit, so f(g) - f(g') = m w R (1, -1) has norm
    sqrt 2 m w R, which the pair of terms gives. For a random W_out at the same points, |v|^2 / c_l + ||z_e||^2 / c_e
    equals the MLP's share (z0 = 0, claimed ||W_out|| tight or 2x loose); with z0 != 0, sampled points stay below it."""
    B, R, rng = make_backend("flint"), Fraction(3), np.random.default_rng(1)
    ln = LNMap(Fraction(1), R, None, None)
    path_model = SimpleNamespace(tensors={"blocks.0.attn.W_V": rng.normal(size=(1, 3, 2)),
                                          "blocks.0.attn.W_O": rng.normal(size=(1, 2, 3))},
                                 config=SimpleNamespace(n_key_value_heads=None, n_heads=1))
    N = path_model.tensors["blocks.0.attn.W_V"][0] @ path_model.tensors["blocks.0.attn.W_O"][0]
    reached = 2 * 3 * np.linalg.norm(N, 2)
    head = float(joint_bound(B, [head_terms(B, path_model, 0, ln, [Fraction(reached / 2 * 1.001)])], 3, 6))
    assert reached * (1 - 1e-12) <= head <= reached * 2 ** (1 / 128)   # float64 reached: last bits
    m, w = 1.5, 0.75
    model = bare_mlp(m * np.eye(2), w * np.eye(2), np.zeros(2))
    pair = float(joint_bound(B, [mlp_terms(B, model, 0, ln, Fraction(m), Fraction(w), 6)], 2, 6))
    reached = np.linalg.norm((np.maximum([3 * m, 0], 0) - np.maximum([0, 3 * m], 0)) @ (w * np.eye(2)))
    assert abs(reached - math.sqrt(2) * m * w * 3) < 1e-12 and reached * (1 - 1e-12) <= pair <= reached * 2 ** (1 / 64) * (1 + 1e-9)
    for b_in, loose in ((np.zeros(2), 1 + 1e-9), (np.zeros(2), 2), (rng.normal(size=2), 1 + 1e-9)):
        W_out = rng.normal(size=(2, 2))   # a loose claimed ||W_out|| (2x) makes Q = 2P: the share's (P + Q)/2 is reached
        model = bare_mlp(m * np.eye(2), W_out, b_in)
        (c_e, _, share, _), (c_l, _, _, _) = (f() for f in mlp_terms(B, model, 0, ln, Fraction(m), Fraction(np.linalg.norm(W_out, 2) * loose), 6))
        points = [(np.array([3.0, 0]), np.array([0, 3.0]))] + [tuple(ball_point(rng, 2, 3.0) for _ in range(2)) for _ in range(2000)]
        q = []
        for g, g2 in points:
            a, b = (g + g2) / 2 @ model.tensors["blocks.0.mlp.W_in"] + b_in, (g - g2) / 2 @ model.tensors["blocks.0.mlp.W_in"]
            z_e = (np.abs(a + b) - np.abs(a - b)) / 2   # (h(a + b) - h(a - b)) / 2 for relu, h = |.|
            q.append(np.dot(g - g2, g - g2) / 4 / float(c_l) + np.dot(z_e, z_e) / float(c_e))
        assert max(q) <= float(share) * (1 + 1e-9)
        if not b_in.any():
            assert q[0] >= float(share) * (1 - 1e-6)


def ball_point(rng, d, R):
    """A random point of the R-ball (on its sphere 4 times in 5)."""
    g = rng.normal(size=d)
    return g / np.linalg.norm(g) * R * (1 if rng.random() < 0.8 else rng.random())


def test_block0_heads_where_they_beat_the_ball(tmp_path, monkeypatch):
    """Without positions block 0's values are finite sets; the joint bound also reads them as heads on the LN ball
    (the smaller variant is kept). On a tiny model where the heads variant is the smaller (C_abs below the ball's:
    the variant disabled by a useless term), exhaustive single changes (100-bit Arb) stay within the certified
    bounds and both backends verify."""
    path, model = tiny(tmp_path, nope=True, d_vocab=8, d_head=1, n_heads=4, seed=1, n_ctx=3, scale=0.6)
    B = make_backend("flint")
    new = certified_needs(model, B, FillLedger(), 3, 6)["C_abs"]
    heads = blocks.head_terms
    monkeypatch.setattr(blocks, "head_terms", lambda B_, m, layer, ln, radii: [lambda: (Fraction(1), None, Fraction(10 ** 6), False)]
                        if layer == 0 else heads(B_, m, layer, ln, radii))
    assert new < certified_needs(model, B, FillLedger(), 3, 6)["C_abs"] * Fraction(95, 100)
    monkeypatch.undo()
    cert = influence_certificate(model)
    assert verify(cert, path, "flint").summary == verify(cert, path, "mpmath").summary
    assert 0 < exhaustive_worst(model, cert, make_backend("flint", 100)) <= 1
