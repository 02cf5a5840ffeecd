"""The hostile-input fuzz campaign at CI size, and the resource model's contract.

The campaign (tcert.testing.fuzz; at a large size: benchmarks/fuzz_campaign.py) builds cases of every
class (extreme exponents in weights and numbers, sharp and flat attention, huge declared contexts,
degenerate vocabularies and dimensions, deep and wide JSON) and checks each with both backends: exit
0/1/2 with one line (never a traceback or exit 3), the same exit code on both, each run under the time
cap and the memory cap above the baseline RSS. CI runs FUZZ_CASES per class (about 30 s here).

The resource model (checker/resources.py, kinds/<kind>/cost.py): its defaults admit every paper-scale
benchmark case; a refusal is one line naming the estimate, the limits and the options; the estimators
read unvalidated claims and evidence and must never raise.
"""

import dataclasses
import functools
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcert.checker import resources
from tcert.checker.errors import BadInput
from tcert.checker.kinds import cost_for
from tcert.checker.modelfile import load_model
from tcert.testing import CERTIFICATES, example_scale
from tcert.testing.fuzz import CLASSES, run_case, tally

FUZZ_CASES = int(os.environ.get("TCERT_FUZZ_CASES", example_scale(3)))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("fuzz"))
    return [run_case(cls, i, 0, workdir) for cls in CLASSES for i in range(FUZZ_CASES)]


@pytest.mark.parametrize("cls", CLASSES)
def test_fuzz_class_proper_verdicts(records, cls):
    """Every case of the class: a proper, agreeing verdict within the caps (the tally is printed)."""
    mine = [r for r in records if r["class"] == cls]
    print(tally(mine))
    bad = [r for r in mine if not r["passed"]]
    assert not bad, bad


# --- the resource model ----------------------------------------------------------------------------

PAPER = dict(d_vocab=30522, d_model=512, n_heads=8, d_head=64, d_mlp=2048, n_ctx=2048)


@functools.cache
def tiny_config():
    return load_model(str(CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors")).config


def paper_config(**changes):
    """The paper-scale neox1l's configuration (benchmarks: tcert.testing.bench.SHAPE) with `changes`."""
    return dataclasses.replace(tiny_config(), **{**PAPER, **changes})


def overwhelm_claim(n_fix, kind, n_free):
    free = {"kind": kind, "tokens": [0] * n_free} if kind == "perm" else {"kind": kind, "length": n_free}
    return {"prefix": [0] * n_fix, "free": free}


PAPER_CASES = {   # name -> (kind, config, claim, evidence): the benchmarks' paper-scale certificates
    "bench_prediction paper (1024 tokens)": ("prediction", paper_config(n_ctx=1024), {"tokens": [0] * 1024}, {}),
    "bench_overwhelm perm (lp, n_fix 1500)": ("overwhelm", paper_config(), overwhelm_claim(1500, "perm", 35),
                                              {"method": "lp", "value_bound": "table"}),
    "bench_overwhelm any:16 (naive, n_fix 1000)": ("overwhelm", paper_config(), overwhelm_claim(1000, "any", 16),
                                                   {"method": "naive", "value_bound": "norm"}),
    "bench_overwhelm_tight (n_fix 1500, 1000 exact)": ("overwhelm", paper_config(), overwhelm_claim(1500, "perm", 35),
                                                       {"method": "tight", "exact": [{}] * 1000}),
    "bench_overwhelm_upto upto:16 (n_fix 1000)": ("overwhelm", paper_config(), overwhelm_claim(1000, "upto", 16),
                                                  {"lengths": [{}] + [{"method": "naive", "value_bound": "norm"}] * 16}),
    "bench_influence --speed (4 layers)": ("influence", paper_config(n_layers=4, n_ctx=512), {"n_max": 512},
                                           {"power": 8}),
    "bench_accuracy brute (64^4 inputs)": ("accuracy", paper_config(d_vocab=64, d_model=32, n_heads=1, d_head=32,
                                                                    d_mlp=None, n_ctx=4), {}, {"strategy": "brute"}),
}


@pytest.mark.parametrize("name", sorted(PAPER_CASES))
def test_defaults_admit_paper_scale_benchmarks(name):
    kind, cfg, claim, evidence = PAPER_CASES[name]
    cost = cost_for(kind)(cfg, claim, evidence)
    resources.require_within(cost, resources.Limits())
    assert cost.work > 0 and cost.memory > 0


def test_refusal_is_one_line_with_the_options():
    cost = cost_for("prediction")(paper_config(n_layers=2, n_ctx=1 << 22), {"tokens": [0] * 100_000}, {})
    with pytest.raises(BadInput) as e:
        resources.require_within(cost, resources.Limits())
    text = str(e.value)
    assert "\n" not in text and "--max-work" in text and "--max-memory" in text and "100000 tokens" in text


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["tokens", "prefix", "free", "kind", "length", "tokens", "method",
                                         "exact", "lengths", "value_bound", "strategy", "cases", "power",
                                         "n_max", "corollary", "prediction", "perm", "upto", "tight", "naive",
                                         "table", "norm", "brute", "cubic"]) | st.text(max_size=3),
                        inner, max_size=4), max_leaves=20)


@settings(max_examples=example_scale(60), deadline=None)
@given(kind=st.sampled_from(["prediction", "overwhelm", "accuracy", "influence"]), claim=JSON, evidence=JSON)
def test_estimators_never_raise_on_malformed_input(kind, claim, evidence):
    """The estimate runs before the kind validates anything: any JSON value gives a finite Cost."""
    cost = cost_for(kind)(tiny_config(), claim, evidence)
    assert 0 <= cost.work < float("inf") and 0 <= cost.memory < float("inf")


def test_shipped_certificates_within_defaults():
    """Every shipped certificate's estimate is within the defaults (and verify() passes it: determinism
    tests); its JSON reader estimate within the reader's limit."""
    from tcert.checker.envelope import MAX_JSON_MEMORY, parse_memory
    models = {load_model(str(p)).sha256: load_model(str(p)) for p in CERTIFICATES.rglob("*.safetensors")}
    for path in sorted(CERTIFICATES.rglob("*.json")):
        cert = json.loads(path.read_text())
        resources.require_within(cost_for(cert["kind"])(models[cert["model_sha256"]].config, cert["claim"],
                                                        cert["evidence"]), resources.Limits())
        assert parse_memory(path.read_bytes()) < MAX_JSON_MEMORY
