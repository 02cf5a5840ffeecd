"""`tcert selftest`: a small campaign passes on the real checker, and the campaign CAN fail: with an obligation
broken (in this test only) it reports false VERIFIED and exits non-zero. Its oracle shares no code with the
checker and agrees with the generator's float forward pass."""

import ast
import json

import numpy as np
import pytest

import tcert.api as tc
from tcert.generator.cli import main
from tcert.generator.exact_oracle import ExactModel
from tcert.generator.model.forward import logits
from tcert.testing import ROOT


def run(capsys, *argv):
    code = main(["selftest", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_small_campaign_passes(capsys):
    code, out = run(capsys, "--examples", "1", "--seed", "3")
    assert out["command"] == "selftest" and out["verdict"] == "passed" and code == 0, out["message"]
    kinds = out["figures"]["kinds"]
    assert set(kinds) == {"prediction", "overwhelm", "accuracy", "influence"}
    for k, row in kinds.items():
        assert row["tried"] == 1 and row["false VERIFIED"] == 0 and row["backend disagreements"] == 0, k
        assert row["verified"] <= row["certified"] and row["confirmed"] <= row["verified"] + 1
        if row["certified"]:
            assert row["mutants"] > 0 and row["mutants rejected"] > 0


def test_campaign_catches_a_broken_checker(capsys, monkeypatch):
    """An obligation that always holds: every logit gap 'certified' as 1000 (the prediction kind's gap_bounds,
    which every prediction check goes through). The false claims the campaign
    makes on purpose (and any mutated claim) then verify, and the oracle calls them false."""
    from fractions import Fraction
    import tcert.checker.kinds.prediction as prediction
    monkeypatch.setattr(prediction, "gap_bounds",
                        lambda B, model, tokens, k, W=None: [(Fraction(0),) * 2 if j == k else (Fraction(1000),) * 2
                                                             for j in range(model.config.d_vocab)])
    code, out = run(capsys, "--examples", "2", "--kinds", "prediction")
    row = out["figures"]["kinds"]["prediction"]
    assert code == 1 and out["verdict"] == "failed" and row["false VERIFIED"] >= 2
    assert any("false (exhaustive oracle)" in p for p in out["figures"]["problems"])
    assert main(["selftest", "--examples", "1", "--kinds", "prediction"]) == 1
    assert "selftest FAILED" in capsys.readouterr().out


def test_bad_arguments(capsys):
    for kinds in (["prediction,astrology"], ["prediction", "astrology"]):
        assert main(["selftest", "--kinds", *kinds]) == 2
        assert "--kinds" in capsys.readouterr().err
    code, out = run(capsys, "--examples", "0")
    assert code == 2 and out["verdict"] == "error"


def test_oracle_imports_nothing_of_tcert():
    tree = ast.parse((ROOT / "generator" / "exact_oracle.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.startswith("tcert")], names


@pytest.mark.parametrize("arch, extra", [("preln", dict(act_fn="gelu", n_layers=2)),
                                         ("preln", dict(act_fn="gelu_new", attention_dir="bidirectional")),
                                         ("preln", dict(positional_embedding_type="rotary", rotary_adjacent_pairs=True)),
                                         ("attn-only", {}), ("neox1l", {})])
def test_oracle_agrees_with_the_float_forward_pass(arch, extra):
    m = tc.random_model(arch, seed=3, d_vocab=8, d_model=8, n_heads=2, d_head=4, d_mlp=8, n_ctx=6, **extra)
    tokens = [1, 5, 2, 7]
    exact = np.array([float(x) for x in ExactModel(m).logits(tokens)])
    assert np.abs(exact - logits(m, np.array([tokens]))[0]).max() < 1e-12
