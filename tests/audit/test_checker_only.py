"""The checker-only install: `pip install .` (the base install, no extra) in a fresh virtual environment
without system site-packages installs tcert with numpy, mpmath and python-flint and nothing else, with no
dependency-conflict message; every kind checks there; `tcert` says in one line what to install; without
python-flint the default backend is exit 2 with a hint and --backend mpmath still checks.

The project is installed from a copy of its sources, offline from this machine's package index when it has
one (/opt/pypi/simple), else from the default index."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tcert.testing import CERTIFICATES, ROOT

pytestmark = pytest.mark.slow     # about a minute: a venv, an offline install, a dozen checks

LOCAL_INDEX = Path("/opt/pypi/simple")
SOURCES = ("pyproject.toml", "README.md", "checker", "generator", "audit", "api", "tests/support")


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(bin folder, seconds to create, seconds to install) of a fresh venv with the base install."""
    root = tmp_path_factory.mktemp("checker_only")
    src = root / "src"
    (src / "tests").mkdir(parents=True)
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}))
    start = time.perf_counter()
    proc = run([sys.executable, "-m", "venv", root / "venv"])
    assert proc.returncode == 0, proc.stderr
    made = time.perf_counter() - start
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="", PIP_DISABLE_PIP_VERSION_CHECK="1")
    index = ["--index-url", LOCAL_INDEX.as_uri()] if LOCAL_INDEX.is_dir() else []
    start = time.perf_counter()
    proc = run([root / "venv" / "bin" / "python", "-m", "pip", "install", *index, src], env=env)
    installed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"\nchecker-only venv: created in {made:.1f} s, `pip install .` in {installed:.1f} s")
    return root / "venv" / "bin", proc.stdout + proc.stderr


def test_installs_exactly_the_checkers_three_libraries(venv):
    bin_, log = venv
    for word in ("conflict", "incompatible", "ERROR", "requires"):
        assert word not in log, log[-3000:]
    freeze = run([bin_ / "python", "-m", "pip", "freeze", "--all"]).stdout.splitlines()
    names = {line.split("==")[0].split(" @ ")[0].lower() for line in freeze}
    assert names - {"pip", "setuptools", "wheel"} == {"tcert", "numpy", "mpmath", "python-flint"}, freeze
    assert run([bin_ / "python", "-m", "pip", "check"]).returncode == 0


def test_every_shipped_certificate_checks_there(venv, tmp_path):
    bin_, _ = venv
    models = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in sorted(CERTIFICATES.rglob("*.safetensors"))}
    kinds = set()
    for cert in sorted(CERTIFICATES.rglob("*.json")):
        doc = json.loads(cert.read_text())
        proc = run([bin_ / "tcert-check", cert, "--model", models[doc["model_sha256"]], "--quiet"], cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout.startswith("VERIFIED: "), (cert, proc.stdout, proc.stderr)
        kinds.add(doc["kind"])
    assert kinds == {"overwhelm", "accuracy", "influence"}
    cert, model = CERTIFICATES / "overwhelm" / "perm_lp.json", CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors"
    proc = run([bin_ / "tcert-check", cert, "--model", model, "--backend", "mpmath", "--report", tmp_path / "r.html"])
    assert proc.returncode == 0 and "VERIFIED" in (tmp_path / "r.html").read_text()
    assert run([bin_ / "tcert-check", "--version"]).stdout.startswith("tcert-check 0.1.0 (python ")


def test_the_generator_says_what_to_install(venv, tmp_path):
    bin_, _ = venv
    for argv in ([], ["demo"], ["predict", "--model", "m", "--tokens", "1", "--out", "x.json"]):
        proc = run([bin_ / "tcert", *argv], cwd=tmp_path)
        assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc
        assert "pip install 'tcert[generator]'" in proc.stderr and "Traceback" not in proc.stderr


def test_without_python_flint(venv, tmp_path):
    """Last in this module: it uninstalls python-flint from the fixture's venv."""
    bin_, _ = venv
    assert run([bin_ / "python", "-m", "pip", "uninstall", "-y", "python-flint"]).returncode == 0
    cert, model = CERTIFICATES / "overwhelm" / "perm_lp.json", CERTIFICATES / "overwhelm" / "neox1l_tiny.safetensors"
    proc = run([bin_ / "tcert-check", cert, "--model", model], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == "" and "pip install python-flint, or use --backend mpmath" in proc.stdout
    proc = run([bin_ / "tcert-check", cert, "--model", model, "--backend", "mpmath"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("VERIFIED: overwhelm")

