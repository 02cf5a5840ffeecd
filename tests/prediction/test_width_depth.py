"""Prediction certificates at d_model 768 verify with the default commands, at 1, 2 and 12 layers.

Random pre-LN models (`tcert model random --arch preln`, gelu, final LN), d_vocab 50 and 6 input tokens to
keep them fast: at 1 and 2 layers GPT-2-small width (d_model 768, 12 heads of 64, d_mlp 3072); at 12
layers d_model 768 with one head of 16 and d_mlp 64 (GPT-2-small width at 12 layers converts 85M weights
per pass, ~10 CPU minutes for generator and checker together: that run is in benchmarks/bench_depth.py).
The generator's claim (`tcert predict`) must verify with `tcert-check` (at its default 64 bits where they
suffice; the kind raises its precision by itself where not), and the enclosure must keep precision: the
decisive gap's enclosure stays within 2^(FIRST_LAYER_BITS + PER_LAYER_BITS (layers - 1)) ulps of 2^-prec
(the error-ball pass; per-coordinate intervals lost ~2^20-2^30 per block), and the claim is within 1e-6
relative of the certified gap.
"""

import json
from fractions import Fraction

from tcert.checker import cli as check_cli
from tcert.checker.kinds.prediction.precision import COARSE_PREC
from tcert.checker.numbers import parse_number
from tcert.checker.verify import verify
from tcert.generator.cli import main as tcert_main

WIDTH = ["--d-model", "768", "--n-heads", "12", "--d-head", "64", "--d-mlp", "3072", "--d-vocab", "50",
         "--n-ctx", "16"]
DEEP = ["--d-model", "768", "--n-heads", "1", "--d-head", "16", "--d-mlp", "64", "--d-vocab", "50", "--n-ctx", "16"]
TOKENS = "3,14,15,9,26,5"
FIRST_LAYER_BITS = 24    # measured: ~2^19-2^20 ulps after 1 layer
PER_LAYER_BITS = 12      # "a few thousand ulps per layer"; measured ~2^9 per further GPT-2-width layer, 2^7 (DEEP)


def generate(tmp_path, layers: int, width=WIDTH):
    """`tcert model random` and `tcert predict` with default settings; (certificate path, model path)."""
    model, cert = str(tmp_path / f"m{layers}.safetensors"), str(tmp_path / f"c{layers}.json")
    assert tcert_main(["model", "random", "--arch", "preln", "--n-layers", str(layers), *width, "--seed", "1",
                       "--out", model]) == 0
    assert tcert_main(["predict", "--model", model, "--tokens", TOKENS, "--out", cert]) == 0
    return cert, model


def assert_verified_tight(cert, model, layers, prec_wanted=(COARSE_PREC, 64)):
    """verify() with its defaults (what tcert-check runs): VERIFIED at one of the precisions prec_wanted (the
    coarse pass's or the first rung's; None: any, the kind raised its precision itself), the enclosure within 2^(FIRST_LAYER_BITS + PER_LAYER_BITS (layers - 1)) ulps of
    2^-prec, the claim within 1e-6 relative of the certified gap; returns the Obligations."""
    ob = verify(cert, model)
    lower, upper, prec = ob.figure("claim.margin"), ob.figure("claim.margin.upper"), ob.figure("claim.precision")
    assert (prec_wanted is None or prec in prec_wanted) and 0 < lower <= upper and f"at {prec} bits" in ob.summary
    budget = FIRST_LAYER_BITS + PER_LAYER_BITS * (layers - 1)
    assert (upper - lower) * 2 ** prec < 2 ** budget, float((upper - lower) * 2 ** prec)
    claimed = parse_number(json.load(open(cert))["claim"]["margin"], "margin")
    assert claimed <= lower and upper - claimed < lower * Fraction(1, 10 ** 6)
    return ob


def test_gpt2_small_width_one_layer_cli(tmp_path, capsys):
    """The default commands end to end, tcert-check included (exit 0, VERIFIED, the precision named)."""
    cert, model = generate(tmp_path, 1)
    capsys.readouterr()
    assert check_cli.main([cert, "--model", model]) == 0
    out = capsys.readouterr().out
    assert out.startswith("VERIFIED") and f"at {COARSE_PREC} bits" in out, out     # the coarse pass decides
    assert_verified_tight(cert, model, 1)


def test_gpt2_small_width_two_layers(tmp_path):
    cert, model = generate(tmp_path, 2)
    assert_verified_tight(cert, model, 2)


def test_d_model_768_12_layers(tmp_path):
    """At 12 layers 64 bits do not suffice (~2^99 ulps of 2^-64): the generator and the checker both raise
    their precision, and the summary (what tcert-check prints) names the precision that decided."""
    cert, model = generate(tmp_path, 12, DEEP)
    ob = assert_verified_tight(cert, model, 12, prec_wanted=None)
    assert ob.figure("claim.precision") > 64 and f"at {ob.figure('claim.precision')} bits" in ob.summary
