"""The statement (the claim in words, tcert.checker.statement) and the informational fields.

The checker regenerates a certificate's statement from its claim and requires the two texts to be equal,
so a forged or stale statement is REJECTED; numbers in words are rounded in the safe direction; token
texts come from the vocabulary file the model names, bound by its SHA-256 in the statement; the
informational `model` and `generator` sections are read by no rule.
"""

import hashlib
import json
import re
import shutil
import tomllib
from fractions import Fraction

import pytest
from hypothesis import given, strategies as st

from tcert.checker.errors import BadInput, Rejected
from tcert.checker.modelfile import load_model
from tcert.checker.numbers import parse_number
from tcert.checker.statement import decimal, statement_for
from tcert.checker.verify import verify
from tcert.checker import __version__
from tcert.generator import certificate
from tcert.generator.prediction import prediction_certificate
from tcert.testing import CERTIFICATES, ROOT

SHIPPED = sorted(CERTIFICATES.rglob("*.json"))
MODELS = {load_model(str(p)).sha256: str(p) for p in sorted(CERTIFICATES.rglob("*.safetensors"))}
PERM_LP = CERTIFICATES / "overwhelm" / "perm_lp.json"
NEOX = CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors"


def rejection(cert, model):
    with pytest.raises(Rejected) as e:
        verify(cert, model, "flint")
    return e.value


@given(st.fractions(min_value=-10 ** 30, max_value=10 ** 30).filter(lambda q: q != 0), st.integers(1, 12))
def test_decimal_rounds_in_the_asked_direction(q, digits):
    """decimal(q, -1) <= q <= decimal(q, +1) exactly, each with at most `digits` significant digits."""
    down, up = decimal(q, -1, digits), decimal(q, +1, digits)
    d, u = Fraction(down), Fraction(up)
    assert d <= q <= u
    for text in (down, up):
        mantissa = re.sub(r"e[+-]\d+$", "", text).lstrip("-").replace(".", "").strip("0")
        assert len(mantissa) <= digits, text
    if d == q:
        assert u == q      # an exactly printable number is printed the same both ways


def test_decimal_examples():
    assert decimal(Fraction(2, 3), -1) == "0.666666" and decimal(Fraction(2, 3), +1) == "0.666667"
    assert decimal(Fraction(-2, 3), -1) == "-0.666667" and decimal(Fraction(9999995, 10 ** 6), +1) == "10"
    assert decimal(16024486, -1) == "16024400" and decimal(Fraction(1, 10 ** 7), -1) == "1e-7"
    assert decimal(Fraction(10 ** 20 + 1), +1) == "1.00001e+20" and decimal(0, +1) == "0"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CERTIFICATES)))
def test_shipped_statements_are_the_checkers(path):
    """Every shipped certificate carries a statement, and it is the checker's text for its claim."""
    cert = json.loads(path.read_text())
    model = load_model(MODELS[cert["model_sha256"]])
    assert cert["statement"] == statement_for(cert["kind"], cert["claim"], model)
    assert set(cert["model"]) == {"file", "architecture", "parameters", "provenance"}
    assert cert["generator"]["command"][0] == "tcert" and cert["generator"]["version"] == __version__


def test_forged_statement_is_rejected(capsys):
    cert = json.loads(PERM_LP.read_text())
    cert["statement"] = cert["statement"].replace("greedy next token after prefix + t + query is 10",
                                                  "greedy next token after prefix + t + query is 11")
    e = rejection(cert, NEOX)
    assert e.obligation == "statement: the claim in words" and "is 11" in e.detail and "is 10" in e.detail


def test_stale_statement_is_rejected_and_a_missing_one_is_the_checkers():
    """A claim edited without its statement (here a weaker, still true, margin) is REJECTED at the statement;
    without a statement the certificate verifies and the checker's own text is reported."""
    m = load_model(str(CERTIFICATES / "models" / "maxof4_seed123.safetensors"))
    cert, _ = prediction_certificate(m, [3, 10, 17, 24])
    margin = parse_number(cert["claim"]["margin"], "m")
    stale = json.loads(json.dumps(cert))
    stale["claim"]["margin"] = certificate.format_number(margin / 2)
    e = rejection(stale, m)
    assert e.obligation == "statement: the claim in words"
    del stale["statement"]
    ob = verify(stale, m, "flint")
    assert ob.statement == statement_for("prediction", stale["claim"], m) != cert["statement"]
    assert [o.name for o in ob.done][-1] == "statement: the claim in words"


def test_numbers_in_words_keep_the_sentence_true():
    """A lower bound is written rounded down, an upper bound rounded up."""
    m = load_model(str(CERTIFICATES / "models" / "maxof4_seed123.safetensors"))
    cert, _ = prediction_certificate(m, [3, 10, 17, 24])
    said = re.search(r"by at least ([0-9.e+-]+)\.", cert["statement"]).group(1)
    assert Fraction(said) <= parse_number(cert["claim"]["margin"], "m")
    infl = json.loads((CERTIFICATES / "influence" / "toy2_bidir.influence.json").read_text())
    c_said = re.search(r"at most min\(([0-9.e+-]+) r\(n\)", infl["statement"]).group(1)
    assert Fraction(c_said) >= parse_number(infl["claim"]["C"], "C")


def test_influence_local_statement_is_checked_like_every_other(tmp_path):
    """The local claim form (one input of a 1-layer model) has its sentence: numbers rounded the safe way,
    the R-substitution clause only when R > 0, and a claim edited under it (R lowered: weaker, still
    true) REJECTED at the statement."""
    from tcert.generator.influence import toy_model
    from tcert.generator.influence.local import local_certificate
    from tcert.generator.model.files import save_model
    t, cfg = toy_model(n_layers=1, d_vocab=3, n_ctx=6, d_model=6, n_heads=2, d_head=4, d_mlp=8, scale=0.3,
                       eps="1/10", rotary=True, parallel=True, seed=4)
    path = str(tmp_path / "m.safetensors")
    save_model(path, t, cfg)
    m = load_model(path)
    cert, info = local_certificate(m, [2, 2, 2, 2, 2])
    R = info["R"]   # 3 since the per-competitor gap rule (2 before it)
    assert R >= 2 and verify(cert, m, "flint").statement == cert["statement"]
    local = cert["claim"]["local"]
    said = re.search(r"at most ([0-9.e+-]+) in L2 norm, and its next-token distribution by at most ([0-9.e+-]+) "
                     r"in L1", cert["statement"])
    assert Fraction(said.group(1)) >= parse_number(local["change"], "c")
    assert Fraction(said.group(2)) >= parse_number(local["change_prob"], "c")
    assert f"any {R} or fewer positions" in cert["statement"]
    none, _ = local_certificate(m, [2, 2, 2, 2, 2], 0)
    assert "or fewer positions" not in none["statement"] and verify(none, m, "flint")
    stale = json.loads(json.dumps(cert))
    stale["claim"]["local"]["substitutions"] = R - 1
    assert rejection(stale, m).obligation == "statement: the claim in words"


@pytest.fixture()
def text_model(tmp_path):
    """The shipped small text model and its vocabulary, copied to a scratch folder."""
    for name in ("text_small.safetensors", "text_small.vocab.txt"):
        shutil.copy(CERTIFICATES / "models" / name, tmp_path / name)
    return tmp_path / "text_small.safetensors"


def test_token_texts_come_from_the_vocabulary_named_by_hash(text_model):
    vocab = text_model.parent / "text_small.vocab.txt"
    m = load_model(str(text_model))
    texts = vocab.read_text(encoding="utf-8").split("\n")
    cert, p = prediction_certificate(m, [5, 100, 200, 300])
    st_ = cert["statement"]
    assert hashlib.sha256(vocab.read_bytes()).hexdigest() in st_
    assert f'is {p["predicted"]} ("{texts[p["predicted"]]}")' in st_
    assert texts[100].startswith("##") and f'("{texts[5]}{texts[100][2:]} {texts[200]} {texts[300]}")' in st_
    verify(cert, m, "flint")
    # another vocabulary (two token texts swapped): other words, REJECTED
    swapped = list(texts)
    swapped[100], swapped[200] = swapped[200], swapped[100]
    vocab.write_text("\n".join(swapped), encoding="utf-8")
    assert rejection(cert, m).obligation == "statement: the claim in words"
    # no vocabulary beside the model: REJECTED, saying what is missing
    vocab.unlink()
    e = rejection(cert, m)
    assert "put the vocabulary file 'text_small.vocab.txt' beside the model file" in e.detail
    # a vocabulary with the wrong number of tokens is unusable input
    vocab.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(BadInput, match="2 tokens, the model has d_vocab 3072"):
        verify(cert, m, "flint")


def test_informational_fields_are_read_by_no_rule(capsys):
    """Junk in `model` and `generator` (floats, wrong facts, markup) changes nothing but itself."""
    cert = json.loads(PERM_LP.read_text())
    base = verify(cert, NEOX, "flint")
    cert["model"] = {"file": "<b>other</b>", "architecture": 1.5, "parameters": -1, "provenance": [0.1]}
    cert["generator"] = {"name": "x", "command": ["rm", "-rf", "/"], "version": 2.5, "deviation_float": 1e300}
    ob = verify(cert, NEOX, "flint")
    assert (ob.summary, ob.statement) == (base.summary, base.statement)
    for key, bad in (("model", []), ("generator", "x"), ("statement", 7)):
        with pytest.raises(BadInput, match=f"{key} must be"):
            verify(dict(cert, **{key: bad}), NEOX, "flint")


def test_one_version_everywhere():
    with open(ROOT / "pyproject.toml", "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert __version__ == certificate.GENERATOR_VERSION == version
