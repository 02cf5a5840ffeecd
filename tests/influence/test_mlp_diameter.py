"""The optional constant Ll.mlp.diameter (checker/kinds/influence/sublayers.py:mlp_diameter): the MLP's output
moves by at most it between any two LN outputs. Sampled and searched pairs stay below it; an exhaustive rigorous
oracle on tiny models where it is the binding term; mutations (left out, moved to another layer, perturbed);
both backends; the propagated local rule uses it."""

import copy
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.forward import Weights, final_residual
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import certified_needs, propagated
from tcert.checker.kinds.influence.sublayers import LNMap, mlp_diameter
from tcert.checker.kinds.influence.norms import operator_norm, folded_norm
from tcert.testing.influence import Without, WithoutOptional, certificate_without, exhaustive_worst, old_rule_certificate, tiny_toy
from tcert.checker.numbers import parse_number
from tcert.checker.verify import verify
from tcert.generator import certificate

ACTS = {"relu": lambda z: np.maximum(z, 0), "silu": lambda z: z / (1 + np.exp(-z)),
        "gelu": lambda z: z * (1 + np.vectorize(math.erf)(z / math.sqrt(2))) / 2,
        "gelu_new": lambda z: z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3))) / 2}


def tiny(tmp_path, act="relu", **kw):
    """A tiny 2-layer toy model with activation `act` (`tcert.testing.influence.tiny_toy`)."""
    return tiny_toy(tmp_path, act_fn=act, **kw)


def mlp_of(model, layer):
    """(f, R) with f(g) the MLP output on folded LN outputs g (rows), float64; R = sqrt(d)."""
    t, d, p = model.tensors, model.config.d_model, f"blocks.{layer}.mlp."
    w, b = t[f"blocks.{layer}.ln2.w"].astype(float), t[f"blocks.{layer}.ln2.b"].astype(float)
    P = np.eye(d) - np.ones((d, d)) / d
    M, z0 = P @ np.diag(w) @ t[p + "W_in"], b @ t[p + "W_in"] + t[p + "b_in"]
    act = ACTS[model.config.act_fn]
    return (lambda g: act(g @ M + z0) @ t[p + "W_out"] + t[p + "b_out"]), math.sqrt(d)


def diameter(model, layer, B=None):
    B = B or make_backend("flint")
    t, p, d = model.tensors, f"blocks.{layer}.mlp.", model.config.d_model
    ln = LNMap(Fraction(1), B.upper(B.sqrt(B.num(d))), t[f"blocks.{layer}.ln2.w"], t[f"blocks.{layer}.ln2.b"])
    s_in, s_out = folded_norm(B, ln.w, t[p + "W_in"], 6), operator_norm(B, [t[p + "W_out"]], 6)
    return mlp_diameter(B, model, layer, ln, s_in, s_out, 6), s_in, s_out


def largest_move(f, R, d, rng, samples=4000, steps=300) -> float:
    """Random pairs on the sphere |g| = R (and antipodal ones), then hill climbing on the best pair."""
    g = rng.normal(size=(samples, d))
    g *= R / np.linalg.norm(g, axis=1, keepdims=True)
    h = rng.normal(size=(samples, d))
    h *= R / np.linalg.norm(h, axis=1, keepdims=True)
    top, a, b = 0.0, None, None
    for left, right in ((g, h), (g, -g)):
        moves = np.linalg.norm(f(left) - f(right), axis=1)
        if moves.max() > top:
            top, a, b = moves.max(), left[moves.argmax()], right[moves.argmax()]
    for step in range(steps):
        scale = 0.3 * R * (1 - step / steps) + 1e-3
        a2, b2 = a + rng.normal(size=d) * scale / math.sqrt(d), b + rng.normal(size=d) * scale / math.sqrt(d)
        a2, b2 = a2 * min(1, R / np.linalg.norm(a2)), b2 * min(1, R / np.linalg.norm(b2))
        move = np.linalg.norm(f(a2[None]) - f(b2[None]))
        if move > top:
            top, a, b = move, a2, b2
    return top


@pytest.mark.parametrize("act", sorted(ACTS))
def test_diameter_bounds_the_largest_move(tmp_path, act):
    """Over |g|, |g'| <= sqrt(d) the searched largest ||f(g) - f(g')|| stays below mlp_diameter, which is below
    the old 2 radius = 2 Lip ||W_out|| ||M|| sqrt(d), and the search reaches a fifth of it (not vacuous; measured
    0.48-0.54 relu, 0.39-0.47 gelu, 0.34-0.40 silu, 0.25-0.34 gelu_new, whose Lip 3/2 is loose)."""
    from tcert.checker.forward import act_lipschitz
    _, model = tiny(tmp_path, act, d_mlp=12, scale=0.5)
    B, rng = make_backend("flint"), np.random.default_rng(0)
    for layer in range(2):
        f, R = mlp_of(model, layer)
        bound, s_in, s_out = diameter(model, layer, B)
        old = 2 * act_lipschitz(B, act) * s_in * s_out * B.upper(B.sqrt(B.num(6)))
        found = largest_move(f, R, 6, rng)
        assert found <= float(bound) * (1 + 1e-9), (layer, found, float(bound))
        assert bound < old and found >= float(bound) / 5, (layer, found, float(bound), float(old))


@pytest.mark.parametrize("act, attention", [("relu", "causal"), ("gelu", "bidirectional"), ("silu", "causal")])
def test_exhaustive_oracle_where_the_diameter_binds(tmp_path, act, attention):
    """On tiny 2-layer models whose C_abs the diameters lower (the old rule's C_abs is larger), exhaustive single
    changes stay within the certified bounds, and the certificate verifies on both backends."""
    path, model = tiny(tmp_path, act, attention=attention)
    B = make_backend("flint")
    new, old = certified_needs(model, B, Without(".joint"), 4, 6), certified_needs(model, B, WithoutOptional(), 4, 6)
    assert new["C_abs"] < old["C_abs"] and new["C"] < old["C"]
    cert = certificate_without(model, ".joint")   # the spread's joint bound supersedes it
    assert parse_number(cert["claim"]["C_abs"], "C_abs") < old["C_abs"]
    assert verify(cert, path, "flint").summary == verify(cert, path, "mpmath").summary
    assert 0 < exhaustive_worst(model, cert, make_backend("flint", 100)) <= 1


def test_left_out_or_misplaced(tmp_path):
    """The field left out: the old rule applies and the constants after it (tight with the diameter) are REJECTED;
    the constants and claim of the old rule verify without it. Moved to the other layer or to a layer that
    does not exist, shrunk by 2^-20: REJECTED or BadInput. Both backends agree on its figure to 1e-12."""
    path, model = tiny(tmp_path)
    cert = certificate_without(model, ".joint")   # the spread's joint bound supersedes it
    names = sorted(k for k in cert["evidence"]["constants"] if k.endswith("mlp.diameter"))
    assert names == ["L0.mlp.diameter", "L1.mlp.diameter"]
    consts = cert["evidence"]["constants"]
    for name in names:
        bad = copy.deepcopy(cert)
        del bad["evidence"]["constants"][name]
        with pytest.raises(Rejected, match=r"influence: (constant (spread|E)\d|claim C)"):
            verify(bad, path)
    relaxed = old_rule_certificate(cert, model)
    assert not set(relaxed["evidence"]["constants"]) & set(names)
    verify(relaxed, path)
    swapped = copy.deepcopy(cert)
    swapped["evidence"]["constants"]["L0.mlp.diameter"], swapped["evidence"]["constants"]["L1.mlp.diameter"] = \
        consts["L1.mlp.diameter"], consts["L0.mlp.diameter"]
    with pytest.raises(Rejected, match=r"influence: (constant L\d\.mlp\.diameter|claim C)"):
        verify(swapped, path)
    moved = copy.deepcopy(cert)
    moved["evidence"]["constants"]["L2.mlp.diameter"] = moved["evidence"]["constants"].pop("L1.mlp.diameter")
    with pytest.raises(Rejected, match="influence: constant spread2"):
        verify(moved, path)
    extra = copy.deepcopy(cert)
    extra["evidence"]["constants"]["L2.mlp.diameter"] = consts["L1.mlp.diameter"]
    with pytest.raises(BadInput, match="unused"):
        verify(extra, path)
    figs = {}
    for name in names:
        bad = copy.deepcopy(cert)
        bad["evidence"]["constants"][name] = certificate.num(parse_number(consts[name], name) * (1 - Fraction(1, 2 ** 20)))
        for backend in ("flint", "mpmath"):
            with pytest.raises(Rejected, match=f"influence: constant {name.replace('.', '[.]')}: claimed .* is below"):
                verify(bad, path, backend)
            figs[backend, name] = verify(cert, path, backend).figure(f"evidence.constants.{name}")
        a, b = figs["flint", name], figs["mpmath", name]
        assert abs(a - b) <= Fraction(1, 10 ** 12) * a <= parse_number(consts[name], name)


def test_propagated_rule_uses_the_diameter(tmp_path, monkeypatch):
    """block_constants' diameter is mlp_diameter with R = sqrt(d) and below 2 lip sqrt(d); the propagated change
    with it is below the change without it (the diameter binds here) and still covers every exhaustive single
    change of x (rigorous, 100 bits)."""
    path, model = tiny(tmp_path, n_ctx=6, eps="1/10", scale=0.5)
    B, x = make_backend("flint"), [0, 2, 1, 1, 0]
    for layer in range(2):
        c = propagated.block_constants(B, model, layer)
        assert c["diameter"] == diameter(model, layer, B)[0] < 2 * c["mlp"] * c["root"]
    change, per = propagated.propagated_change(B, model, x)
    with monkeypatch.context() as m:
        m.setattr(propagated, "mlp_diameter", lambda B, model, layer, ln, s_in, s_out, power: Fraction(10 ** 9))
        without, _ = propagated.propagated_change(B, model, x)
    assert change < without
    B100 = make_backend("flint", 100)
    W = Weights(B100, model)
    y = final_residual(B100, model, x, W)
    for j, tok in itertools.product(range(len(x) - 1), range(3)):
        if tok != x[j]:
            y2 = final_residual(B100, model, x[:j] + [tok] + x[j + 1:], W)
            assert B100.upper(B100.sqrt(B100.fsum((a - b) * (a - b) for a, b in zip(y, y2)))) <= per[j][-1], (j, tok)
