"""The shipped influence certificates re-verify (both backends) and the demo section works."""

import copy
import pathlib

import pytest

from tcert.checker.verify import verify
from tcert.checker.errors import Rejected
from tcert.checker.modelfile import load_model
from tcert.testing import CERTIFICATES
from tcert.generator import certificate

SHIPPED = CERTIFICATES / "influence"
CERTS = sorted(SHIPPED.glob("*.json"))


def model_for(cert_path: pathlib.Path) -> str:
    """certificates/influence/NAME.kind.json binds to NAME.safetensors beside it."""
    return str(SHIPPED / (cert_path.name.split(".")[0] + ".safetensors"))


def test_there_are_shipped_certificates():
    names = {p.name for p in CERTS}
    assert {"maxof4_seed123.influence.json", "robust2.influence.json", "robust2.corollary.json"} <= names


@pytest.mark.parametrize("path", CERTS, ids=lambda p: p.name)
def test_shipped_certificate_verifies(path):
    ob = verify(str(path), model_for(path), "flint")
    cert = ob.certificate
    assert cert["kind"] == "influence" and ob.summary
    if not path.name.startswith("maxof4"):  # the reference backend too (Max-of-4 takes a minute there)
        ob_m = verify(str(path), model_for(path), "mpmath")
        assert ob_m.summary == ob.summary


def test_shipped_corollary_states_the_guarantee(tmp_path):
    path = SHIPPED / "robust2.corollary.json"
    ob = verify(str(path), model_for(path))
    cert = ob.certificate
    assert cert["claim"]["rate"] == "harmonic" and cert["claim"]["corollary"]["substitutions"] >= 1
    assert "survives ANY change" in ob.summary
    bad = copy.deepcopy(cert)
    bad["claim"]["corollary"]["substitutions"] += 1
    out = tmp_path / "bad.json"
    certificate.write(str(out), bad)
    with pytest.raises(Rejected):
        verify(str(out), model_for(path))


def test_demo_section_on_maxof4(tmp_path, capsys):
    from tcert.generator.influence.cli import demo_section
    model = load_model(str(SHIPPED / "maxof4_seed123.safetensors"))
    assert demo_section(model, str(tmp_path), "flint")
    out = capsys.readouterr().out
    assert "[influence]" in out and "VERIFIED" in out and "robust2" in out
    assert (tmp_path / "influence.json").exists() and (tmp_path / "influence_corollary_robust2.json").exists()
