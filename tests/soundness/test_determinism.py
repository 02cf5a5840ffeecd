"""Determinism and regression (issue 8, section 3).

- Same inputs -> byte-identical certificate, for every kind: generated twice in-process, twice through
  the `tcert` CLI (fresh files), and the CLI's bytes equal the in-process bytes.
- The influence generator can derive its constants with either interval backend: same certificate.
- Every certificate under certificates/ verifies with both backends against the model it names (found
  by SHA-256 among certificates/**/*.safetensors), with the same summary line.
- Every certificate under certificates/ regenerates byte-identically from the `tcert` command line it
  records (generator.command, run from the repository root), in a scratch copy of the files it names.
"""

import json
import os
import pathlib
import shutil

import pytest

from tcert.checker.verify import verify
from tcert.checker.envelope import load_certificate
from tcert.checker.modelfile import load_model
from tcert.testing import CERTIFICATES
from tcert.testing.regeneration import float_differences
from tcert.generator import certificate
from tcert.generator.cli import main as tcert
from tcert.generator.model.files import save_model
from tcert.generator.model.random_models import random_model


def write_model(tmp_path, name, tensors_cfg):
    path = str(tmp_path / f"{name}.safetensors")
    save_model(path, *tensors_cfg)
    return path


def tiny_models(tmp_path):
    """One model file per kind's family (small: the whole file runs in seconds)."""
    from tcert.generator.influence import robust_toy_model, toy_model
    from tcert.testing.overwhelm import tiny_neox1l
    from tcert.testing.accuracy import constructed
    return {"prediction": write_model(tmp_path, "pred", random_model("preln", d_vocab=8, d_model=8, n_heads=2,
                                                                     d_head=4, d_mlp=16, n_ctx=8, n_layers=2, seed=3)),
            "overwhelm": write_model(tmp_path, "ow", tiny_neox1l(6, qk_scale=0.5)),
            "accuracy": write_model(tmp_path, "acc", constructed(6, 3, 15.0, 3.0, 0.1, 1)),
            "influence": write_model(tmp_path, "infl", toy_model(n_layers=2, d_vocab=3, n_ctx=5, d_model=6,
                                                                 n_heads=2, d_head=3, d_mlp=8, scale=0.3, eps="1")),
            "influence-corollary": write_model(tmp_path, "robust", robust_toy_model(2, d_vocab=3, n_ctx=8))}


def generate(kind, path, variant):
    """The certificate text of `kind` on the model at `path`, generated in-process."""
    model = load_model(path)
    if kind == "prediction":
        from tcert.generator.prediction import prediction_certificate
        return certificate.dumps(prediction_certificate(model, [1, 2, 3, 4, 5])[0])
    if kind == "overwhelm":
        from tcert.generator.overwhelm.naive_lp import generate as ow
        return certificate.dumps(ow(model, [1] * 20, 2, ("perm", 3, [0, 3, 4]), "lp", "table", variant)[0])
    if kind == "accuracy":
        from tcert.generator.accuracy.strategies import make_certificate
        return certificate.dumps(make_certificate(model, variant)[0])
    from tcert.generator.influence import corollary_certificate, influence_certificate
    if variant == "corollary":
        return certificate.dumps(corollary_certificate(model, [1, 2, 0, 1, 2, 0, 1, 2])[0])
    return certificate.dumps(influence_certificate(model))


CLI = {
    ("prediction", None): ["predict", "--tokens", "1,2,3,4,5"],
    ("overwhelm", "tight"): ["overwhelm", "--prefix-ids", ",".join(["1"] * 20), "--query-id", "2",
                             "--free", "perm:0,3,4", "--method", "lp", "--value-bound", "table", "--hints", "tight"],
    ("overwhelm", "float"): ["overwhelm", "--prefix-ids", ",".join(["1"] * 20), "--query-id", "2",
                             "--free", "perm:0,3,4", "--method", "lp", "--value-bound", "table", "--hints", "float"],
    ("accuracy", "brute"): ["accuracy", "--strategy", "brute"],
    ("accuracy", "cubic"): ["accuracy", "--strategy", "cubic"],
    ("accuracy", "subcubic:svd"): ["accuracy", "--strategy", "subcubic:svd"],
    ("influence", None): ["influence"],
    ("influence", "corollary"): ["influence", "--tokens", "1,2,0,1,2,0,1,2"],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.mktemp("determinism"))


@pytest.mark.parametrize("kind,variant", sorted(CLI, key=str), ids=lambda x: str(x))
def test_same_inputs_same_bytes(models, tmp_path, capsys, monkeypatch, kind, variant):
    """In-process twice, CLI twice (the same command line, run in two folders): identical bytes. The CLI's
    certificate records its command line (generator.command); apart from that field it is byte-identical
    to the in-process one. The certificate verifies."""
    path = models.get(f"{kind}-{variant}", models[kind])
    first, second = generate(kind, path, variant), generate(kind, path, variant)
    assert first == second
    argv, outs = CLI[kind, variant] + ["--model", path, "--out", "cert.json"], []
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        monkeypatch.chdir(tmp_path / str(i))
        assert tcert(argv) == 0
        outs.append((tmp_path / str(i) / "cert.json").read_bytes())
    capsys.readouterr()
    assert outs[0] == outs[1]
    cli = json.loads(outs[0])
    assert cli["generator"].pop("command") == ["tcert", *argv]
    assert certificate.dumps(cli) == first and "command" not in json.loads(first)["generator"]
    assert first != "null\n"
    verify(str(tmp_path / "0" / "cert.json"), path, "flint")


def test_influence_generator_backend_independent(models):
    """The influence generator derives its constants with the checker's routines: with the Arb or the
    mpmath backend it writes the same claim and evidence."""
    from tcert.generator.influence import influence_parts
    model = load_model(models["influence"])
    flint = influence_parts(model, backend="flint")[:2]
    mp = influence_parts(model, backend="mpmath")[:2]
    assert flint == mp


# --- every shipped certificate, both backends ------------------------------------------------------

SHIPPED = sorted(CERTIFICATES.rglob("*.json"))


def model_by_sha() -> dict:
    """SHA-256 -> a model file under certificates/ with those bytes."""
    return {load_model(str(p)).sha256: str(p) for p in sorted(CERTIFICATES.rglob("*.safetensors"))}


def test_there_are_shipped_certificates_of_every_kind():
    kinds = {load_certificate(str(p))["kind"] for p in SHIPPED}
    assert {"overwhelm", "accuracy", "influence"} <= kinds


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(pathlib.Path(p).relative_to(CERTIFICATES)))
def test_shipped_certificate_verifies_with_both_backends(path):
    """Each shipped certificate names a model present under certificates/ and verifies against it with
    flint and mpmath, with the same summary. A change that breaks this must be deliberate."""
    sha = load_certificate(str(path))["model_sha256"]
    models = model_by_sha()
    assert sha in models, f"{path}: no model with SHA-256 {sha} under certificates/"
    ob_f = verify(str(path), models[sha], "flint")
    ob_m = verify(str(path), models[sha], "mpmath")
    assert ob_f.summary == ob_m.summary


# --- every shipped certificate, regenerated from its recorded command -----------------------------------

def regenerate(path, tmp_path) -> tuple:
    """(shipped bytes, bytes the recorded `tcert` command writes) for the shipped certificate at `path`: the
    command runs in a scratch folder holding copies of the repository files it names (models, vocabularies)
    at the same relative paths, so its --out lands there and the bytes can be compared."""
    from tcert.testing import ROOT
    shipped = pathlib.Path(path).read_bytes()
    command = json.loads(shipped)["generator"]["command"]
    assert command[0] == "tcert"
    for arg in command:
        src = ROOT / arg
        if src.is_file():
            (tmp_path / arg).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, tmp_path / arg)
            vocab = load_model(str(src)).config.tokenizer_name if src.suffix == ".safetensors" else None
            if vocab and (src.parent / vocab).is_file():
                shutil.copy(src.parent / vocab, (tmp_path / arg).parent / vocab)
    out = command[command.index("--out") + 1]
    assert (ROOT / out).resolve() == pathlib.Path(path).resolve(), f"{path} records --out {out}"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert tcert(command[1:]) == 0
    finally:
        os.chdir(cwd)
    return shipped, (tmp_path / out).read_bytes()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(pathlib.Path(p).relative_to(CERTIFICATES)))
def test_shipped_certificate_regenerates_from_its_command(path, tmp_path, capsys):
    """The recorded command line re-creates the shipped certificate (statement, claim, model description and
    command included): the shipped files are the generator's output, not hand edits. Byte for byte on the
    machine that wrote them; elsewhere an SVD or an LP solver may end in other last bits (OpenBLAS picks its
    kernel by processor: this suite has met Haswell's on AMD EPYC), so then the claim and statement must still
    be equal, every other field equal up to 2^-30 relative in its floats, and the regenerated file VERIFIED."""
    shipped, again = regenerate(path, tmp_path)
    capsys.readouterr()
    if again == shipped:
        return
    a, b = json.loads(shipped), json.loads(again)
    assert (a["claim"], a["statement"]) == (b["claim"], b["statement"]), f"{path}: another claim on regeneration"
    assert float_differences(a, b) == [], f"{path}: regenerating with its recorded command gives other content"
    out = tmp_path / "again.json"
    out.write_bytes(again)
    assert verify(str(out), model_by_sha()[a["model_sha256"]], "flint").summary     # raises Rejected if not


def test_float_differences_tolerates_last_bits_only():
    """The comparison above lets through only float noise: last bits of a hex or decimal float pass; a changed
    integer, string, key, length, or a float moved by 2^-20 is listed."""
    base = {"claim": {"n": 3}, "x": ["0x1.7c0afabd50267p+4", 0.06007165759083297, "-0x1.fe7aa8d840000p-55"]}
    noise = {"claim": {"n": 3}, "x": ["0x1.7c0afabd50266p+4", 0.06007165759083298, "-0x1.7f9eaa3610000p-53"]}
    assert float_differences(base, noise) == []
    for mutant in ({"claim": {"n": 4}, "x": base["x"]}, {"claim": {"n": 3}, "x": base["x"][:2]},
                   {"claim": {"n": 3}, "y": base["x"]}, {"claim": {"n": 3}, "x": ["0x1.7c0b0abd50267p+4"] + base["x"][1:]},
                   {"claim": {"n": 3}, "x": ["tight"] + base["x"][1:]}):
        assert float_differences(base, mutant) != []
