"""The optional constant Ll.attn.stacked (checker/kinds/influence/sublayers.py:stacked_radius): a block's attention
output lies within sqrt(H) R ||[N_1; ...; N_H]|| of its centre, the heads stacked instead of their radii added.
Sampled head outputs stay below it; an exhaustive rigorous oracle on tiny models where it lowers C_abs; mutations
(left out, moved, shrunk, added where it does not apply); both backends agree on it."""

import copy
import math
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import certified_needs
from tcert.testing.influence import (
    Without, assert_shrunk_and_swapped_rejected, certificate_without, exhaustive_worst, old_rule_certificate,
    tiny_toy as tiny)
from tcert.checker.kinds.influence.sublayers import LNMap, stacked_radius
from tcert.checker.numbers import parse_number
from tcert.checker.verify import verify


def folded_values(model, layer):
    """The heads' maps N_h = P diag(w) W_V,h W_O,h (float64, d x d each) and R = sqrt(d)."""
    t, d, p = model.tensors, model.config.d_model, f"blocks.{layer}."
    P = np.eye(d) - np.ones((d, d)) / d
    w = t[p + "ln1.w"].astype(float)
    return [P @ np.diag(w) @ t[p + "attn.W_V"][h] @ t[p + "attn.W_O"][h] for h in range(model.config.n_heads)], math.sqrt(d)


def stacked(model, layer, B):
    t = model.tensors
    ln = LNMap(Fraction(1), B.upper(B.sqrt(B.num(model.config.d_model))), t[f"blocks.{layer}.ln1.w"],
               t[f"blocks.{layer}.ln1.b"])
    return stacked_radius(B, model, layer, ln, 6)


def test_stacked_radius_bounds_every_head_mix(tmp_path):
    """Over |g_h| <= sqrt(d) the largest ||sum_h g_h N_h|| (each head's g_h along the top left singular vector of
    the stack's block, and random ones) stays below stacked_radius, which is below the added radii sum_h R ||N_h||
    on this model and within 1.2x of the largest found (measured 1.04)."""
    _, model = tiny(tmp_path, n_heads=4, d_head=2, d_model=8)
    B, rng = make_backend("flint"), np.random.default_rng(0)
    for layer in range(2):
        N, R = folded_values(model, layer)
        bound = float(stacked(model, layer, B))
        stack = np.concatenate(N, axis=0)
        u = np.linalg.svd(stack)[0][:, 0].reshape(len(N), -1)   # the best row [g_1 ... g_H], blockwise
        best = np.linalg.norm(sum(R * math.sqrt(len(N)) * u[h] @ N[h] for h in range(len(N))))
        for _ in range(2000):
            g = rng.normal(size=(len(N), N[0].shape[0]))
            g *= R / np.linalg.norm(g, axis=1, keepdims=True)
            best = max(best, np.linalg.norm(sum(g[h] @ N[h] for h in range(len(N)))))
        added = sum(R * np.linalg.norm(n, 2) for n in N)
        assert best <= bound * (1 + 1e-9) and bound < added and best >= bound / 1.2, (layer, best, bound, added)


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_exhaustive_oracle_where_stacking_lowers_the_cap(tmp_path, attention):
    """On tiny 2-layer models (learned positions: block 0 stacks too) the stacked radii lower C_abs below the rule
    without them, exhaustive single changes at every n stay within the certified bounds (Arb, 100 bits), and
    both backends give the same verdict."""
    path, model = tiny(tmp_path, attention=attention, n_heads=4, d_head=2, d_model=8, n_ctx=3, scale=0.4)
    B = make_backend("flint")

    new, old = certified_needs(model, B, Without(".joint"), 3, 6), certified_needs(model, B, Without(".joint", "attn.stacked"), 3, 6)
    assert new["C_abs"] < old["C_abs"]
    cert = certificate_without(model, ".joint")   # the spread's joint bound (test_spread_joint.py) supersedes it
    assert sorted(k for k in cert["evidence"]["constants"] if k.endswith("attn.stacked")) == \
        ["L0.attn.stacked", "L1.attn.stacked"]
    assert verify(cert, path, "flint").summary == verify(cert, path, "mpmath").summary
    assert 0 < exhaustive_worst(model, cert, make_backend("flint", 100)) <= 1


def test_left_out_moved_or_shrunk(tmp_path):
    """Left out: attn.radius (tight with it) is REJECTED, and the old rule's constants verify without it. Shrunk
    by 2^-20: REJECTED naming its obligation, on both backends, which agree on its figure to 1e-12. Swapped with
    the other block's, moved to a block that does not exist: REJECTED or BadInput. Stated for block 0 of a model
    without a position table (block 0 uses the finite value sets there): BadInput (unused)."""
    path, model = tiny(tmp_path, n_heads=4, d_head=2, d_model=8)
    cert = certificate_without(model, ".joint")
    consts = cert["evidence"]["constants"]
    names = ["L0.attn.stacked", "L1.attn.stacked"]
    for name in names:
        s, r = parse_number(consts[name], name), parse_number(consts[name[:3] + "attn.radius"], "r")
        assert s <= r <= s * (1 + Fraction(1, 2 ** 28))   # it binds (r is s rounded up once more)
        bad = copy.deepcopy(cert)
        del bad["evidence"]["constants"][name]
        with pytest.raises(Rejected, match=rf"influence: constant {name[:2]}\.attn\.radius: claimed .* is below"):
            verify(bad, path)
    verify(old_rule_certificate(cert, model), path)
    assert_shrunk_and_swapped_rejected(cert, path, names, r"influence: constant L\d\.attn\.(stacked|radius)")
    extra = copy.deepcopy(cert)
    extra["evidence"]["constants"]["L2.attn.stacked"] = consts["L1.attn.stacked"]
    with pytest.raises(BadInput, match="unused"):
        verify(extra, path)
    rpath, rotary = tiny(tmp_path, name="rot", rotary=True, n_heads=4, d_head=2, d_model=8)
    rcert = certificate_without(rotary, ".joint")
    assert "L0.attn.stacked" not in rcert["evidence"]["constants"] and "L1.attn.stacked" in rcert["evidence"]["constants"]
    rcert["evidence"]["constants"]["L0.attn.stacked"] = rcert["evidence"]["constants"]["L1.attn.stacked"]
    with pytest.raises(BadInput, match="unused"):
        verify(rcert, rpath)
