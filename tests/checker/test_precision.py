"""Precision belongs to the backend: two backends at different precisions in one process, used in turn
(and one inside the other's block), give exactly what each gives alone in a fresh process.

Compared exactly: every logit's Fraction endpoints from the rigorous forward pass, and verify()'s
verdict (summary or rejection, with its numbers) and recorded figures. The precisions are 30 and 200
bits: at 30 the certificate's margin is lost (the prediction kind then raises its precision itself), at
200 it verifies at once, and the endpoints differ, so any leak of one backend's precision into the other
shows.
"""

import json
import subprocess
import sys
from fractions import Fraction

import flint
import pytest

from tcert.checker.errors import Rejected
from tcert.checker.forward import last_logits
from tcert.checker.interval import BACKENDS, DEFAULT_PREC, make_backend
from tcert.checker.verify import verify
from tcert.generator import certificate
from tcert.generator.prediction import prediction_certificate
from tcert.testing.prediction import build

TOKENS = [1, 5, 2, 7, 3]
PRECS = (30, 200)

# One backend alone in a fresh process: its logit endpoints and its verify() record, as JSON.
ISOLATED = """
import json, sys
from tcert.checker.errors import Rejected
from tcert.checker.forward import last_logits
from tcert.checker.interval import make_backend
from tcert.checker.modelfile import load_model
from tcert.checker.verify import verify
name, prec, model_path, cert_path, tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
B, model = make_backend(name, prec), load_model(model_path)
with B.precision():
    ends = [[str(B.lower(x)), str(B.upper(x))] for x in last_logits(B, model, tokens)]
try:
    ob = verify(cert_path, model, B)
    verdict, figures = ob.summary, [[o.name, {k: str(v) for k, v in o.figures.items()}] for o in ob.done]
except Rejected as e:
    verdict, figures = "REJECTED: " + str(e), []
print(json.dumps({"ends": ends, "verdict": verdict, "figures": figures}))
"""


def endpoints(B, model) -> list:
    """The exact endpoints of the last position's logits, computed inside B's precision block."""
    with B.precision():
        return [[str(B.lower(x)), str(B.upper(x))] for x in last_logits(B, model, TOKENS)]


def record(cert_path, model, B) -> tuple:
    """verify()'s summary and figures, or its rejection, as the isolated script prints them."""
    try:
        ob = verify(cert_path, model, B)
    except Rejected as e:
        return "REJECTED: " + str(e), []
    return ob.summary, [[o.name, {k: str(v) for k, v in o.figures.items()}] for o in ob.done]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A tiny GELU model (erf: the mpmath backend's own working-precision changes are exercised too),
    a prediction certificate on it, and each backend's isolated result at each precision."""
    d = tmp_path_factory.mktemp("precision")
    model = build(str(d), "preln-gelu", seed=4)
    cert, _ = prediction_certificate(model, TOKENS)
    cert_path = str(d / "cert.json")
    certificate.write(cert_path, cert)
    isolated = {}
    for name in BACKENDS:
        for prec in PRECS:
            out = subprocess.run([sys.executable, "-c", ISOLATED, name, str(prec), model.path, cert_path,
                                  json.dumps(TOKENS)], capture_output=True, text=True, check=True)
            isolated[name, prec] = json.loads(out.stdout)
    return model, cert_path, isolated


@pytest.mark.parametrize("name", BACKENDS)
def test_two_precisions_interleaved_match_isolated_runs(setting, name):
    """Backends at 30 and 200 bits, built together and used in turn, each give their isolated results."""
    model, cert_path, isolated = setting
    low, high = (make_backend(name, p) for p in PRECS)
    for _ in range(2):
        for B in (low, high, low):
            want = isolated[name, B.prec]
            assert endpoints(B, model) == want["ends"], (name, B.prec)
            assert record(cert_path, model, B) == (want["verdict"], want["figures"]), (name, B.prec)
    # the test can see a leak: the precisions give other endpoints, and at 30 bits the margin is lost, so
    # the prediction kind raises its precision (its summary names the one that decided)
    assert isolated[name, 30]["ends"] != isolated[name, 200]["ends"]
    assert "ahead" in isolated[name, 30]["verdict"] and "at 30 bits" not in isolated[name, 30]["verdict"]
    assert "at 200 bits" in isolated[name, 200]["verdict"]


@pytest.mark.parametrize("name", BACKENDS)
def test_a_backend_inside_another_backends_block(setting, name):
    """Inside one backend's precision block (as during its check), the other backend's primitives and
    checks still give their own results, and the outer block's results are untouched by them."""
    model, cert_path, isolated = setting
    low, high = (make_backend(name, p) for p in PRECS)
    with low.precision():
        assert endpoints(high, model) == isolated[name, 200]["ends"]
        assert record(cert_path, model, high)[0] == isolated[name, 200]["verdict"]
        assert [[str(low.lower(x)), str(low.upper(x))] for x in last_logits(low, model, TOKENS)] \
            == isolated[name, 30]["ends"]


def test_flint_primitives_restore_the_global_precision():
    """A flint primitive or block installs its backend's precision and restores the previous value; outside
    any block, a primitive still works at its own backend's precision."""
    assert flint.ctx.prec == DEFAULT_PREC           # set once when the flint backend is imported
    low, high = make_backend("flint", 30), make_backend("flint", 200)
    assert flint.ctx.prec == DEFAULT_PREC           # building a backend changes nothing
    third = Fraction(1, 3)
    width_low = low.upper(low.num(third)) - low.lower(low.num(third))
    width_high = high.upper(high.num(third)) - high.lower(high.num(third))
    assert flint.ctx.prec == DEFAULT_PREC
    assert Fraction(1, 2 ** 32) < width_low <= Fraction(1, 2 ** 29)
    assert 0 < width_high <= Fraction(1, 2 ** 199)
    with high.precision():
        assert flint.ctx.prec == 200
        low.exp(low.num(1))
        assert flint.ctx.prec == 200
        with low.precision():
            assert flint.ctx.prec == 30
        assert flint.ctx.prec == 200
    assert flint.ctx.prec == DEFAULT_PREC
    with pytest.raises(ZeroDivisionError), high.precision():
        raise ZeroDivisionError      # restored on the way out of an exception too
    assert flint.ctx.prec == DEFAULT_PREC


def test_mpmath_backends_own_their_contexts():
    """Each mpmath backend has its own interval context; values carry it."""
    low, high = make_backend("mpmath", 30), make_backend("mpmath", 200)
    assert low.iv is not high.iv and (low.iv.prec, high.iv.prec) == (30, 200)
    x = low.num(Fraction(1, 3)) * 3
    assert x.ctx is low.iv
    assert Fraction(1, 2 ** 32) < low.upper(x) - low.lower(x) <= Fraction(1, 2 ** 27)
