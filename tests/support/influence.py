"""Influence test helpers the optional constants' soundness tests share: tiny toy models, the generator's ledger
without the optional constants (the old rule), and the exhaustive rigorous oracle; for the search tests, their toy
model and benchmarks/influence_worst_found.py as a module."""

import copy
import importlib.util
import itertools
from fractions import Fraction

from tcert.checker.interval import make_backend
from tcert.checker.kinds.influence import certified_needs
from tcert.checker.forward import Weights, final_residual, last_logits, softmax
from tcert.checker.kinds.influence.rates import rate
from tcert.checker.modelfile import load_model
from tcert.checker.numbers import parse_number
from tcert.generator import certificate
from tcert.generator.influence import toy_model
from tcert.generator.influence.constants import influence_parts
from tcert.generator.influence.ledger import FillLedger
from tcert.generator.model.files import save_model
from tcert.generator.model.forward import as_model
from tcert.testing import ROOT


class WithoutOptional(FillLedger):
    """The generator's ledger with every optional constant left out: the old rule."""

    def optional(self, name, bound):
        return None


class Without(FillLedger):
    """The generator's ledger with the optional constants whose names end with one of `suffixes` left out."""

    def __init__(self, *suffixes):
        super().__init__()
        self.suffixes = suffixes

    def optional(self, name, bound):
        return None if name.endswith(self.suffixes) else self.const(name, bound)


def certificate_without(model, *suffixes) -> dict:
    """The generator's certificate for `model` with the optional constants ending with `suffixes` left out (so a
    test of one optional constant sees the derivation it was written for, not a later one that supersedes it)."""
    claim, evidence, _ = influence_parts(model, ledger=Without(*suffixes))
    return certificate.envelope("influence", model, claim, evidence)


def tiny_toy(tmp_path, name="m", **kw):
    """(path, model): a tiny 2-layer pre-LN toy model (`toy_model`; `kw` overrides the defaults) saved under tmp_path."""
    kw = {"n_layers": 2, "d_vocab": 3, "n_ctx": 4, "d_model": 6, "n_heads": 2, "d_head": 3, "d_mlp": 8,
          "scale": 0.3, "eps": "1/100", **kw}
    t, cfg = toy_model(**kw)
    path = str(tmp_path / f"{name}.safetensors")
    save_model(path, t, cfg)
    return path, load_model(path)


def exhaustive_worst(model, cert, B) -> float:
    """Every single non-final change at every n in range (Arb, 100 bits): asserts ||y - y'|| and ||p - p'||_1
    within the certified bounds; returns the largest ratio ||y - y'|| / bound."""
    cfg, claim, W = model.config, cert["claim"], Weights(B, model)
    c = {k: parse_number(claim[k], k) for k in ("C", "C_prob", "C_abs", "C_prob_abs")}
    worst = 0.0
    for n in range(claim["n_min"], claim["n_max"] + 1):
        r = rate(claim["rate"], n, cfg.n_layers)
        by, bp = min(c["C"] * r, c["C_abs"]), min(c["C_prob"] * r, c["C_prob_abs"])
        outs = {x: (final_residual(B, model, list(x), W), softmax(B, last_logits(B, model, list(x), W)))
                for x in itertools.product(range(cfg.d_vocab), repeat=n)}
        for x, (y, p) in outs.items():
            for i, tok in itertools.product(range(n - 1), range(cfg.d_vocab)):
                if tok > x[i]:
                    y2, p2 = outs[x[:i] + (tok,) + x[i + 1:]]
                    dy = B.upper(B.sqrt(B.fsum((a - b) * (a - b) for a, b in zip(y, y2))))
                    assert dy <= by and sum(B.abs_upper(a - b) for a, b in zip(p, p2)) <= bp, (n, x, i, tok)
                    worst = max(worst, float(dy / by))
    return worst


def old_rule_certificate(cert, model) -> dict:
    """`cert` restated by the old rule: the constants of the ledger without the optional ones, the claim's four
    bounds that rule's values raised by 2^-20 (no statement: it quotes the claim's numbers). It must verify:
    an optional constant is optional."""
    relaxed, ld = copy.deepcopy(cert), WithoutOptional()
    old = certified_needs(model, make_backend("flint"), ld, 4, 6)
    relaxed["evidence"]["constants"] = {k: certificate.num(float(v)) for k, v in ld.claimed.items()}
    for key in ("C", "C_prob", "C_abs", "C_prob_abs"):
        relaxed["claim"][key] = certificate.num(old[key] * (1 + Fraction(1, 2 ** 20)))
    del relaxed["statement"]
    return relaxed


def assert_shrunk_and_swapped_rejected(cert, path, names, swap_match: str) -> None:
    """Each optional constant in `names` shrunk by 2^-20 is REJECTED under its own obligation on both backends,
    whose figures for it agree to 1e-12 and lie below the claimed value; the first two swapped are REJECTED
    with a message matching `swap_match`."""
    import pytest   # tests only: tcert.testing is also read by benchmarks, which do not need pytest
    from tcert.checker.errors import Rejected
    from tcert.checker.verify import verify
    consts = cert["evidence"]["constants"]
    for name in names:
        bad = copy.deepcopy(cert)
        bad["evidence"]["constants"][name] = certificate.num(parse_number(consts[name], name) * (1 - Fraction(1, 2 ** 20)))
        figs = []
        for backend in ("flint", "mpmath"):
            with pytest.raises(Rejected, match=rf"influence: constant {name.replace('.', '[.]')}: claimed .* is below"):
                verify(bad, path, backend)
            figs.append(verify(cert, path, backend).figure(f"evidence.constants.{name}"))
        assert abs(figs[0] - figs[1]) <= Fraction(1, 10 ** 12) * figs[0] <= parse_number(consts[name], name)
    swapped = copy.deepcopy(cert)
    swapped["evidence"]["constants"][names[0]], swapped["evidence"]["constants"][names[1]] = \
        consts[names[1]], consts[names[0]]
    with pytest.raises(Rejected, match=swap_match):
        verify(swapped, path)


def search_toy(d_vocab=8, n_ctx=12, seed=0, **kw):
    """A seeded 2-layer toy model in memory for the search tests (`toy_model`), causal, rotary and parallel unless
    told."""
    kw = dict(dict(rotary=True, parallel=True), **kw)
    t, cfg = toy_model(n_layers=2, d_vocab=d_vocab, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=n_ctx, seed=seed,
                       scale=0.6, **kw)
    return as_model(t, cfg)


def worst_found_bench():
    """benchmarks/influence_worst_found.py loaded as a module (its `main(argv)` runs a search and prints JSON lines)."""
    spec = importlib.util.spec_from_file_location("influence_worst_found",
                                                  ROOT / "benchmarks" / "influence_worst_found.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench
