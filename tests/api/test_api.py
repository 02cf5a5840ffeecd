"""The Python API: models from a path, a Model or a HookedTransformer; one function per kind returning a
Certificate; `check` returning a Verdict; typed exceptions that are also the checker's."""

import copy
import json

import numpy as np
import pytest

import tcert.api as tc
from tcert.checker.errors import BadInput, Rejected
from tcert.checker.modelfile import Model
from tcert.generator.certificate import dumps
from tcert.generator.model.files import in_memory_model
from tcert.generator.selftest import maxofk_tensors
from tcert.testing import CERTIFICATES
from tcert.testing.regeneration import float_differences


@pytest.fixture(scope="module")
def small():
    return tc.random_model("preln", seed=4, d_vocab=12, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=6)


def test_load_model_takes_a_path_a_model_and_refuses_the_rest(small, tmp_path):
    path = tmp_path / "m.safetensors"
    assert tc.save_model(small, path) == small.sha256
    loaded = tc.load_model(path)
    assert isinstance(loaded, Model) and loaded.sha256 == small.sha256 and tc.load_model(loaded) is loaded
    assert tc.save_model(loaded, tmp_path / "copy.safetensors") == small.sha256   # from a file: the same bytes
    for bad in (tmp_path / "missing.safetensors", 42, tmp_path):
        with pytest.raises(tc.BadInputError):
            tc.load_model(bad)
    with pytest.raises(BadInput, match="import_model"):   # a checkpoint folder goes through import_model
        tc.load_model(tmp_path)


def test_prediction_certificate_object_and_verdict(small, tmp_path):
    cert = tc.predict(small, [1, 2, 3])
    f = cert.figures
    assert cert.kind == "prediction" and cert.claim["predicted"] == f["predicted"] != f["runner_up"]
    assert 0 < f["margin"] < f["gap"] and str(f["predicted"]) in cert.statement
    path = cert.save(tmp_path / "p.json")
    assert open(path).read() == cert.to_json() == dumps(cert.data)
    for source in (cert, cert.data, path):
        v = tc.check(source, small, backend="mpmath")
        assert v and v.verified and v.kind == "prediction" and v.backend == "mpmath"
        assert [o.name for o in v.obligations] == ["prediction: logit gap", "statement: the claim in words"]
        assert float(v.figure("claim.margin")) >= f["margin"]
        assert json.loads(v.to_json())["verdict"] == "VERIFIED"
    assert tc.check(cert) and tc.check(cert).raise_for_rejection()


def test_rejection_is_a_verdict_and_typed_on_request(small):
    cert = tc.predict(small, [1, 2, 3])
    forged = copy.deepcopy(cert.data)
    forged["claim"]["margin"] = "1000"
    v = tc.check(forged, small)
    assert not v and v.obligation == "prediction: logit gap" and "1000" in v.detail and "REJECTED" in str(v)
    with pytest.raises(tc.RejectedError) as e:
        v.raise_for_rejection()
    assert isinstance(e.value, Rejected) and e.value.obligation == "prediction: logit gap"
    other = tc.random_model("preln", seed=5, d_vocab=12, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=6)
    assert tc.check(cert, other).obligation == "model binding"


@pytest.mark.parametrize("call, match", [
    (lambda m: tc.predict(m, [1, 99]), "tokens"),
    (lambda m: tc.predict(m, "1,x"), "comma-separated"),
    (lambda m: tc.predict(m, list(range(7))), "tokens"),
    (lambda m: tc.accuracy(m), "1-layer, 1-head"),
    (lambda m: tc.influence(m, substitutions=1), "substitutions needs tokens"),
    (lambda m: tc.check({"format": "nope"}, m), "certificate"),
    (lambda m: tc.check(tc.predict(m, [1]), m, backend="abacus"), "backend"),
    (lambda m: tc.check(tc.predict(m, [1]), m, prec=5), "prec"),
])
def test_bad_input_is_one_typed_exception(small, call, match):
    with pytest.raises(tc.BadInputError, match=match) as e:
        call(small)
    assert isinstance(e.value, BadInput) and isinstance(e.value, tc.TcertError)


def test_inconclusive_near_tie_and_vacuous_accuracy():
    tensors = {k: np.array(v) for k, v in tc.random_model("attn-only", seed=1, d_vocab=6, d_model=8, n_heads=1,
                                                          d_head=8, n_ctx=4).tensors.items()}
    tensors["unembed.W_U"][:] = tensors["unembed.W_U"][:, :1]   # every logit equal: a tie everywhere
    tensors["unembed.b_U"][:] = 0
    from tcert.generator.model.random_models import random_model
    _, cfg = random_model("attn-only", seed=1, d_vocab=6, d_model=8, n_heads=1, d_head=8, n_ctx=4)
    tie = in_memory_model(tensors, cfg)
    with pytest.raises(tc.InconclusiveError, match="near-tie") as e:
        tc.predict(tie, [1, 2])
    assert e.value.figures["gap"] == 0
    t, c = maxofk_tensors(5, 3, 0.01, 0)
    t["unembed.W_U"] = -t["unembed.W_U"]   # the largest token gets the smallest logit: never correct
    noisy = in_memory_model(t, c)
    with pytest.raises(tc.InconclusiveError, match="vacuous") as e:
        tc.accuracy(noisy, "cubic")
    assert e.value.figures["bound"] == 0
    cert = tc.accuracy(noisy, "cubic", allow_vacuous=True)
    assert cert.claim["correct_at_least"] == 0 and tc.check(cert)


def test_every_kind_round_trips_through_check():
    shipped = CERTIFICATES / "overwhelm"
    claim = json.loads((shipped / "perm_lp.json").read_text())["claim"]
    m = tc.load_model(shipped / "neox1l_tiny.safetensors")
    perm = "perm:" + ",".join(map(str, claim["free"]["tokens"]))
    cert = tc.overwhelm(m, claim["prefix"], claim["query"], perm, "lp")
    made, cli = json.loads(cert.to_json()), json.loads((shipped / "perm_lp.json").read_text())
    cli["generator"].pop("command")     # the CLI's bytes, deterministically, but for the command line it records
    assert float_differences(cli, made) == []      # equal but for another machine's BLAS last bits
    assert tc.check(cert).figure("evidence.deviation") >= 0
    with pytest.raises(tc.BadInputError, match="permutation set"):   # lp on any:N used to run naive silently
        tc.overwhelm(m, claim["prefix"], claim["query"], "any:1", "lp")
    with pytest.raises(tc.InconclusiveError) as e:
        tc.overwhelm(m, claim["prefix"], claim["query"], perm, "naive")
    assert e.value.figures["verdict"] == "Inconclusive"
    maxofk = in_memory_model(*maxofk_tensors(5, 3, 0.05, 1))
    acc = tc.accuracy(maxofk, "brute")
    assert tc.check(acc).figure("claim.correct_at_least") == acc.figures["bound"] > 0
    inf = tc.influence(tc.random_model("preln", seed=2, d_vocab=5, d_model=8, n_heads=2, d_head=4, d_mlp=8, n_ctx=5))
    assert tc.check(inf, backend="mpmath") and inf.figures["C"] > 0 and "differ in exactly one position other than the last" in inf.statement


def test_a_hooked_transformer_is_a_model():
    torch = pytest.importorskip("torch")
    tl = pytest.importorskip("transformer_lens")
    cfg = tl.HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=10, d_head=4, n_heads=4, d_mlp=24, d_vocab=13,
                                     act_fn="gelu", seed=0)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ht = tl.HookedTransformer(cfg).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ht.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model = tc.load_model(ht)
    cert = tc.predict(ht, [1, 2, 3])
    assert cert.data["model_sha256"] == model.sha256
    with torch.no_grad():
        assert cert.claim["predicted"] == int(ht(torch.tensor([[1, 2, 3]]))[0, -1].argmax())
    assert tc.check(cert) and tc.check(cert, model)
