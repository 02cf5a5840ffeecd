"""A non-editable install holds the whole checker, generator and tcert.testing: the `packages` list in
pyproject.toml equals the package folders, and a wheel built offline from a copy of the sources
contains every module (an editable install would hide a subpackage left out of the list)."""

import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from tcert.testing import ROOT

PACKAGE_DIRS = {"tcert.checker": "checker", "tcert.generator": "generator", "tcert.testing": "tests/support",
                "tcert.api": "api"}


def setuptools_config() -> dict:
    """The [tool.setuptools] table of pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def folder_packages() -> dict:
    """import name -> folder, for every folder under checker/, generator/ and tests/support holding Python."""
    out = {}
    for name, top in PACKAGE_DIRS.items():
        for init in sorted((ROOT / top).rglob("*.py")):
            folder = init.parent
            if "__pycache__" not in folder.parts:
                rel = folder.relative_to(ROOT / top).parts
                out[".".join((name, *rel))] = folder
    return out


def test_packages_list_equals_the_package_folders():
    """Every folder with Python files is listed (and has an __init__.py), and nothing else is."""
    cfg = setuptools_config()
    assert cfg["package-dir"] == PACKAGE_DIRS
    found = folder_packages()
    assert sorted(cfg["packages"]) == sorted(found), (set(found) ^ set(cfg["packages"]))
    for name, folder in found.items():
        assert (folder / "__init__.py").exists(), f"{name}: {folder} has modules but no __init__.py"


def test_wheel_holds_every_module(tmp_path):
    """`pip wheel --no-deps` (offline, no build isolation) of a copy of the sources: every module of every
    listed package is in the wheel under its import name, and both console scripts are declared."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for top in PACKAGE_DIRS.values():
        shutil.copytree(ROOT / top, src / top, ignore=ignore)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", str(src), "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    if out.returncode and "bdist_wheel" in out.stdout + out.stderr:
        pytest.fail("building a wheel needs setuptools >= 70.1 or the `wheel` package (pip install -e '.[test]')")
    assert out.returncode == 0, out.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("tcert-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package, folder in folder_packages().items():
        for module in folder.glob("*.py"):
            member = "/".join(package.split(".") + [module.name])
            assert member in names, f"{member} missing from the wheel"
    assert "tcert/checker/verify.py" in names and "tcert/testing/size.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "tcert-check = tcert.checker.cli:run" in text and "tcert = tcert.generator.cli:run" in text
