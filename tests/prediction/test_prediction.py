"""The `prediction` kind end to end: tiny random models of every architecture, certificates from the
generator, the checker with both backends (library and CLI), and what must make it reject.

Also the forward-pass contract: on every architecture the generator's numpy float64 logits lie inside
the checker's rigorous enclosure, up to float error.
"""

import json
import os
from fractions import Fraction

import numpy as np
import pytest

from tcert.checker import cli
from tcert.checker.verify import verify
from tcert.checker.errors import BadInput, Rejected
from tcert.generator.certificate import format_number
from tcert.checker.forward import Weights, last_logits
from tcert.checker.interval import make_backend
from tcert.checker.kinds import prediction
from tcert.checker.kinds.prediction import check_claim
from tcert.checker.kinds.prediction.precision import COARSE_PREC
from tcert.checker.modelfile import load_model
from tcert.checker.obligations import Obligations
from tcert.checker.statement import statement_for
from tcert.generator import certificate
from tcert.generator.model.files import config_json, save_model
from tcert.generator.model.forward import logits as float_logits
from tcert.generator.prediction import prediction_certificate
from tcert.testing.prediction import ARCHS, build

BACKENDS = ("flint", "mpmath")


def certify(model, tmp_dir, tokens, tag="cert"):
    """Generate and write a prediction certificate; return (path, cert dict, float facts)."""
    cert, p = prediction_certificate(model, tokens)
    assert cert is not None, "near-tie on a test input; pick other tokens"
    path = os.path.join(tmp_dir, f"{tag}.json")
    certificate.write(path, cert)
    return path, cert, p


def write_cert(tmp_dir, cert, tag):
    """Write an (edited) certificate object to a file; return its path."""
    path = os.path.join(tmp_dir, f"{tag}.json")
    with open(path, "w") as f:
        json.dump(cert, f)
    return path


def run_cli(capsys, cert_path, model_path, backend="flint", *extra):
    """Run tcert-check in-process; return (exit code, the single output line)."""
    code = cli.main([cert_path, "--model", model_path, "--backend", backend, *extra])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1, out
    return code, lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One tiny random model per architecture variant (written once per test module)."""
    d = str(tmp_path_factory.mktemp("models"))
    return {name: build(d, name) for name in ARCHS}


def sample_tokens(model, seed, n=None):
    """A deterministic random input of length n (default n_ctx) for `model`."""
    rng = np.random.default_rng(seed)
    c = model.config
    return rng.integers(0, c.d_vocab, size=n or c.n_ctx).tolist()


# --- the forward-pass contract ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(ARCHS))
def test_float_logits_inside_rigorous_enclosure(models, name, backend):
    """numpy float64 logits lie in the checker's enclosures up to float error (1e-9 of the scale)."""
    model = models[name]
    B = make_backend(backend)
    W = Weights(B, model)
    for seed, n in ((1, model.config.n_ctx), (2, 3), (3, 1)):
        tokens = sample_tokens(model, seed, n)
        f = float_logits(model, np.asarray([tokens]))[0]
        enc = last_logits(B, model, tokens, W)
        assert len(enc) == len(f) == model.config.d_vocab
        tol = Fraction(1e-9) * max(1, Fraction(float(np.abs(f).max())))
        for j, (x, fj) in enumerate(zip(enc, f)):
            lo, hi = B.lower(x), B.upper(x)
            assert lo <= hi
            assert lo - tol <= Fraction(float(fj)) <= hi + tol, (name, tokens, j, float(lo), float(fj), float(hi))
            assert hi - lo < tol, f"{name}: enclosure of logit {j} is {float(hi - lo)} wide"


def test_enclosure_detects_a_wrong_semantics(models):
    """The contract test can fail: flipping the rotary pairing moves logits outside the enclosure."""
    model = models["neox1l-rotate-half"]
    other = models["neox1l-adjacent-pairs"]
    B = make_backend("flint")
    tokens = sample_tokens(model, 1)
    enc = last_logits(B, model, tokens)
    # Same weights, other pairing: the generator's view of `other` config applied to model's tensors.
    from tcert.generator.model.forward import as_model
    wrong = as_model(model.tensors, config_json(other.config))
    f = float_logits(wrong, np.asarray([tokens]))[0]
    outside = [j for j, x in enumerate(enc) if not B.lower(x) - Fraction(1, 10 ** 6) <= Fraction(float(f[j]))
               <= B.upper(x) + Fraction(1, 10 ** 6)]
    assert outside


# --- valid certificates verify -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ARCHS))
def test_prediction_verifies_both_backends(models, name, tmp_path):
    """A generated certificate is VERIFIED by verify with both backends, which agree."""
    model = models[name]
    path, cert, p = certify(model, str(tmp_path), sample_tokens(model, 7))
    certified = {}
    for backend in BACKENDS:
        ob = verify(path, model.path, backend)
        got = ob.certificate
        assert got["kind"] == "prediction" and f"next token is {p['predicted']}" in ob.summary
        assert [o.name for o in ob.done] == ["prediction: logit gap", "statement: the claim in words"]
        certified[backend] = check_claim(make_backend(backend), model, cert["claim"], Obligations())
        assert ob.figure("claim.margin") == certified[backend]     # the certified min gap, as a figure
    # Both certified margins are within float error of the float gap and above the claim.
    margin = Fraction(float.fromhex(cert["claim"]["margin"]))
    for value in certified.values():
        assert margin <= value <= Fraction(p["gap"]) + Fraction(1, 10 ** 6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cli_exit_codes(models, tmp_path, capsys, backend):
    """CLI: exit 0 with one VERIFIED line (and --json), 1 REJECTED, 2 ERROR."""
    model = models["neox1l-rotate-half"]
    path, cert, p = certify(model, str(tmp_path), sample_tokens(model, 7))
    code, line = run_cli(capsys, path, model.path, backend)
    assert code == 0 and line.startswith("VERIFIED: prediction: on 8 input tokens the next token is")
    code, line = run_cli(capsys, path, model.path, backend, "--json")
    doc = json.loads(line)
    assert code == 0 and doc["verdict"] == "VERIFIED" and doc["obligations"][0]["name"] == "prediction: logit gap"
    bad = dict(cert, claim=dict(cert["claim"], predicted=p["runner_up"]))
    code, line = run_cli(capsys, write_cert(str(tmp_path), bad, "bad"), model.path, backend)
    assert code == 1 and line.startswith("REJECTED: prediction: logit gap: ")
    code, line = run_cli(capsys, str(tmp_path / "missing.json"), model.path, backend)
    assert code == 2 and line.startswith("ERROR: certificate: cannot read")


def test_tcert_predict_command(models, tmp_path, capsys):
    """`tcert predict` writes a certificate that `tcert-check` verifies; same input, same bytes."""
    from tcert.generator.cli import main as tcert_main
    model = models["preln-gelu"]
    tokens = ",".join(map(str, sample_tokens(model, 7)))
    outs = [str(tmp_path / f"c{i}.json") for i in range(2)]
    for out in outs:
        assert tcert_main(["predict", "--model", model.path, "--tokens", tokens, "--out", out]) == 0
    capsys.readouterr()
    made = [json.loads(open(out, "rb").read()) for out in outs]     # each records its own command line
    assert [m["generator"].pop("command")[-1] for m in made] == outs and made[0] == made[1]
    code, line = run_cli(capsys, outs[0], model.path)
    assert code == 0, line


# --- unsafe changes are rejected ---------------------------------------------------------------------

def restated(cert: dict, model) -> dict:
    """`cert` with its statement written for its (edited) claim: the kind's obligations judge the edit."""
    return dict(cert, statement=statement_for(cert["kind"], cert["claim"], model))


def verdict(path, model_path, backend="flint"):
    """'VERIFIED', or the Rejected obligation name; BadInput propagates."""
    try:
        verify(path, model_path, backend)
        return "VERIFIED"
    except Rejected as e:
        return e.obligation


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["neox1l-rotate-half", "preln-relu-no-final-ln", "attn-only"])
def test_margin_above_true_gap_rejected(models, tmp_path, name, backend, monkeypatch):
    """m just above the checker's upper bound of the true gap (figure claim.margin.upper), even by 2^-60
    relative, is REJECTED as refuted; m at the 64-bit certified gap passes at 64 bits (or by the coarse
    pass at 48, where the exact layer is on), half of it by the first pass (48 bits where the coarse pass
    runs, else 64); m just above the 64-bit certified gap (but below the true one) passes after the checker
    raises its precision, which the figures and the summary report."""
    model = models[name]
    _, cert, p = certify(model, str(tmp_path), sample_tokens(model, 7))
    ob, B = Obligations(), make_backend(backend)
    first = COARSE_PREC if B.exact else 64
    with monkeypatch.context() as m:       # the 64-bit pass alone (no coarse pass)
        m.setattr(prediction, "coarse_gap", lambda *args: None)
        certified = check_claim(B, model, cert["claim"], ob)
    upper = ob.figure("claim.margin.upper")
    assert certified <= upper and ob.figure("claim.precision") == 64
    cases = {
        "certified": (certified, "VERIFIED", (first, 64)),
        "half": (certified / 2, "VERIFIED", (first,)),
        "certified+2^-60 rel": (certified * (1 + Fraction(1, 2 ** 60)), "VERIFIED", None),
        "upper+2^-60 rel": (upper * (1 + Fraction(1, 2 ** 60)), "prediction: logit gap", None),
        "float gap": (Fraction(p["gap"]) * (1 + Fraction(1, 10 ** 6)), "prediction: logit gap", None),
        "double": (certified * 2, "prediction: logit gap", None),
    }
    for tag, (margin, expected, prec) in cases.items():
        edited = restated(dict(cert, claim=dict(cert["claim"], margin=format_number(margin))), model)
        if expected != "VERIFIED":
            with pytest.raises(Rejected, match="the claim is false") as e:
                verify(edited, model, backend)
            assert e.value.obligation == expected, tag
            continue
        ob = verify(edited, model, backend)
        used = ob.figure("claim.precision")
        assert (used in prec if prec else used > 64) and f"at {used} bits" in ob.summary, (tag, used)


@pytest.mark.parametrize("name", ["neox1l-adjacent-pairs", "preln-relu-no-final-ln", "attn-only"])
def test_other_predicted_token_rejected(models, tmp_path, name):
    """Claiming any token other than the greedy one is REJECTED (its gap to the true top is < 0)."""
    model = models[name]
    _, cert, p = certify(model, str(tmp_path), sample_tokens(model, 7))
    for k in range(model.config.d_vocab):
        if k == p["predicted"]:
            continue
        edited = dict(cert, claim=dict(cert["claim"], predicted=k))
        assert verdict(write_cert(str(tmp_path), edited, f"k{k}"), model.path) == "prediction: logit gap"


@pytest.mark.parametrize("name", ["neox1l-rotate-half", "preln-gelu_new", "attn-only-2l-bidirectional"])
def test_changed_input_token(models, tmp_path, name):
    """Changing a token of x: the verdict must follow the truth on the new input (float oracle).

    Where the claimed token no longer leads by the margin (by more than float error) the checker must
    reject; every change that verifies must be true. At least one change must reject.
    """
    model = models[name]
    tokens = sample_tokens(model, 7)
    _, cert, p = certify(model, str(tmp_path), tokens)
    k, margin = p["predicted"], Fraction(float.fromhex(cert["claim"]["margin"]))
    rejected = 0
    for pos in (0, len(tokens) // 2, len(tokens) - 1):
        for t in range(model.config.d_vocab):
            if t == tokens[pos]:
                continue
            new = list(tokens)
            new[pos] = t
            f = float_logits(model, np.asarray([new]))[0]
            gap = Fraction(float(f[k] - np.delete(f, k).max()))
            edited = restated(dict(cert, claim=dict(cert["claim"], tokens=new)), model)
            got = verdict(write_cert(str(tmp_path), edited, "x"), model.path)
            if gap < margin - Fraction(1, 10 ** 6):
                assert got == "prediction: logit gap", (pos, t, float(gap))
                rejected += 1
            elif gap > margin + Fraction(1, 10 ** 6):
                assert got == "VERIFIED", (pos, t, float(gap))
    assert rejected > 0


def test_model_one_byte_different(models, tmp_path, capsys):
    """A model file with one weight byte flipped: REJECTED "model binding" (library and CLI)."""
    model = models["neox1l-rotate-half"]
    path, cert, p = certify(model, str(tmp_path), sample_tokens(model, 7))
    data = bytearray(open(model.path, "rb").read())
    header_len = int.from_bytes(data[:8], "little")
    for offset in (8 + header_len, len(data) - 4):  # low mantissa byte of the first and last weight
        flipped = bytearray(data)
        flipped[offset] ^= 0x01
        other = tmp_path / f"flipped{offset}.safetensors"
        other.write_bytes(bytes(flipped))
        assert load_model(str(other)).sha256 != model.sha256
        with pytest.raises(Rejected) as e:
            verify(path, str(other))
        assert e.value.obligation == "model binding"
        code, line = run_cli(capsys, path, str(other))
        assert code == 1 and line.startswith("REJECTED: model binding: ")


def test_other_model_same_shape_rejected(tmp_path, models):
    """A certificate checked against another model of the same architecture: model binding."""
    a = models["preln-gelu"]
    b = build(str(tmp_path), "preln-gelu", seed=1)
    path, _, _ = certify(a, str(tmp_path), sample_tokens(a, 7))
    assert verdict(path, b.path) == "model binding"


# --- form errors: exit 2 -----------------------------------------------------------------------------

FORM_ERRORS = {  # claim/evidence edits that make the certificate unusable (exit 2)
    "margin JSON float": lambda c: c["claim"].update(margin=0.5),
    "margin decimal string": lambda c: c["claim"].update(margin="0.5"),
    "margin exponent string": lambda c: c["claim"].update(margin="1e-3"),
    "margin nan string": lambda c: c["claim"].update(margin="nan"),
    "margin inf string": lambda c: c["claim"].update(margin="inf"),
    "margin zero": lambda c: c["claim"].update(margin="0"),
    "margin negative": lambda c: c["claim"].update(margin="-1/2"),
    "margin zero denominator": lambda c: c["claim"].update(margin="1/0"),
    "margin bool": lambda c: c["claim"].update(margin=True),
    "margin list": lambda c: c["claim"].update(margin=["1"]),
    "token string": lambda c: c["claim"]["tokens"].__setitem__(0, "3"),
    "token float": lambda c: c["claim"]["tokens"].__setitem__(0, 3.0),
    "token negative": lambda c: c["claim"]["tokens"].__setitem__(0, -1),
    "token = d_vocab": lambda c: c["claim"]["tokens"].__setitem__(0, 16),
    "token bool": lambda c: c["claim"]["tokens"].__setitem__(0, True),
    "tokens empty": lambda c: c["claim"].update(tokens=[]),
    "tokens longer than n_ctx": lambda c: c["claim"].update(tokens=[1] * 9),
    "tokens not a list": lambda c: c["claim"].update(tokens="1,2"),
    "predicted out of range": lambda c: c["claim"].update(predicted=16),
    "predicted string": lambda c: c["claim"].update(predicted="1"),
    "claim extra field": lambda c: c["claim"].update(note="x"),
    "claim missing margin": lambda c: c["claim"].pop("margin"),
    "evidence not empty": lambda c: c["evidence"].update(hint="1"),
    "kind unknown": lambda c: c.update(kind="telepathy"),
    "version 2": lambda c: c.update(version=2),
}


@pytest.mark.parametrize("case", sorted(FORM_ERRORS))
def test_form_errors_exit_2(models, tmp_path, capsys, case):
    """Malformed numbers, tokens and fields: exit 2 with one ERROR line naming the place."""
    model = models["neox1l-rotate-half"]
    _, cert, _ = certify(model, str(tmp_path), sample_tokens(model, 7))
    edited = json.loads(json.dumps(cert))
    FORM_ERRORS[case](edited)
    path = write_cert(str(tmp_path), edited, "bad")
    with pytest.raises(BadInput):
        verify(path, model.path)
    code, line = run_cli(capsys, path, model.path)
    assert code == 2 and line.startswith("ERROR: "), line


def test_single_token_vocabulary_is_bad_input(tmp_path, capsys):
    """d_vocab = 1: no other token to be ahead of (the min gap would be over an empty set). The checker:
    ERROR, exit 2, one line; the generator's `tcert predict`: exit 2."""
    from tcert.generator.model.random_models import random_model
    path = str(tmp_path / "v1.safetensors")
    save_model(path, *random_model("preln", d_vocab=1, d_model=8, n_heads=2, d_head=4, d_mlp=16, n_ctx=4,
                                   n_layers=1, seed=0))
    model = load_model(path)
    cert = certificate.envelope("prediction", model, {"tokens": [0, 0], "predicted": 0, "margin": "1"}, {})
    cpath = write_cert(str(tmp_path), cert, "v1")
    with pytest.raises(BadInput, match="d_vocab = 1"):
        verify(cpath, path)
    code, line = run_cli(capsys, cpath, path)
    assert code == 2 and line.startswith("ERROR: claim: the model has d_vocab = 1"), line
    from tcert.generator.cli import main as tcert_main     # the generator refuses too (exit 2, no traceback)
    assert tcert_main(["predict", "--model", path, "--tokens", "0,0", "--out", str(tmp_path / "p.json")]) == 2


def test_equivalent_number_forms_verify(models, tmp_path):
    """The same margin written as hex float, p/q or (scaled) integer ratio means the same number."""
    model = models["attn-only"]
    _, cert, _ = certify(model, str(tmp_path), sample_tokens(model, 7))
    m = Fraction(float.fromhex(cert["claim"]["margin"]))
    for text in (cert["claim"]["margin"], format_number(m), f"{m.numerator * 3}/{m.denominator * 3}"):
        edited = dict(cert, claim=dict(cert["claim"], margin=text))
        assert verdict(write_cert(str(tmp_path), edited, "forms"), model.path) == "VERIFIED", text
