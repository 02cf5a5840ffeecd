"""The checker is the trusted base: it must not import the generator, and it depends only on the
standard library, numpy, mpmath and python-flint. Its size is a contract: code lines per part (kernel,
each family) within a budget, quoted by the docs from one generated page (docs/checker-size.md).
"""

import ast
import importlib
import io
import sys

import pytest

from tcert.testing import ROOT, size

CHECKER = ROOT / "checker"
ALLOWED_THIRD_PARTY = {"numpy", "mpmath", "flint"}
FILES = sorted(CHECKER.rglob("*.py"))


def module_name(path) -> str:
    """Dotted module name of a file under checker/ ("tcert.checker.kinds.prediction")."""
    parts = ["tcert"] + list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path) -> list:
    """Every module a file imports: (absolute dotted name, line) for import statements (relative ones
    resolved against the file's package) and for constant-string importlib/__import__ calls."""
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    found.append(("<relative import above the top package>", node.lineno))
                    continue
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((target, node.lineno))
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names
                      if target.startswith("tcert") or "generator" in target.split(".")]
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((arg.value, node.lineno))
                elif isinstance(arg, ast.JoinedStr):
                    head = arg.values[0]
                    text = head.value if isinstance(head, ast.Constant) else "<dynamic>"
                    found.append((f"<f-string:{text}>", node.lineno))
    return found


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_no_generator_import(path):
    """No form of importing the generator appears anywhere in checker/."""
    for name, line in imports_of(path):
        assert not name.startswith(("generator", "tcert.generator", "tcert.testing")), \
            f"{path.name}:{line} imports {name}"
        assert "generator" not in name.split(":")[-1].split("."), f"{path.name}:{line} imports {name}"
        assert name != "<relative import above the top package>", f"{path.name}:{line}"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_only_allowed_third_party_imports(path):
    """Top-level packages imported: the standard library, checker itself, numpy, mpmath, flint."""
    for name, line in imports_of(path):
        if name.startswith("<f-string:"):  # dynamic: see test_dynamic_imports_stay_in_checker
            continue
        top = name.split(".")[0]
        inside = name == "tcert.checker" or name.startswith("tcert.checker.")
        assert inside or top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY, \
            f"{path.name}:{line} imports {name}"


def test_dynamic_imports_stay_in_checker():
    """The kinds registry's dynamic import is relative to checker.kinds (f"{__name__}.{kind}")."""
    for path in FILES:
        source = path.read_text()
        for name, line in imports_of(path):
            if name.startswith("<f-string:"):
                assert 'f"{__name__}.' in source, f"{path.name}:{line}: dynamic import {name}"
    kinds = importlib.import_module("tcert.checker.kinds")
    assert kinds.__name__ == "tcert.checker.kinds"


def test_detector_catches_generator_imports(tmp_path, monkeypatch):
    """The detector itself works: each way of importing the generator is found."""
    import sys
    me = sys.modules[__name__]
    monkeypatch.setattr(me, "ROOT", tmp_path)
    pkg = tmp_path / "checker" / "kinds"
    pkg.mkdir(parents=True)
    cases = ["import tcert.generator", "import tcert.generator.model.forward as f",
             "from tcert.generator import certificate", "from tcert.generator.model.forward import logits",
             "importlib.import_module('tcert.generator.model.forward')", "__import__('tcert.generator')",
             "from tcert import generator", "from .... import generator", "import tcert.testing"]
    for i, src in enumerate(cases):
        p = pkg / f"m{i}.py"
        p.write_text(src + "\n")
        names = [n for n, _ in me.imports_of(p)]
        assert any("generator" in n.split(".") or n.startswith(("<relative", "tcert.testing")) for n in names), \
            (src, names)


def test_report_size_and_import_graph(capsys):
    """Print the checker's code lines (docstrings excluded) per part and per module, with each module's
    internal import graph."""
    out, modules = io.StringIO(), {module_name(f) for f in FILES}
    for part, (n, per_file) in size.counts().items():
        print(f"{part}: {n} code lines (budget {size.BUDGETS[part]})", file=out)
        for rel, lines in per_file.items():
            path = ROOT / rel
            internal = sorted({name for name, _ in imports_of(path) if name in modules} - {module_name(path)})
            print(f"  {module_name(path):40s} {lines:5d}  -> {', '.join(internal) or '-'}", file=out)
    with capsys.disabled():
        print(f"\nchecker/: {len(FILES)} files, {sum(n for n, _ in size.counts().values())} code lines "
              "(blank, comment and docstring lines excluded)")
        print(out.getvalue(), end="")


def test_every_checker_file_is_in_one_part():
    """The parts (kernel, one per family) cover checker/ exactly: a new module always counts somewhere."""
    listed = [f for files in size.parts().values() for f in files]
    assert sorted(listed) == FILES and len(set(listed)) == len(listed)


@pytest.mark.parametrize("part", sorted(size.BUDGETS))
def test_part_within_its_budget(part):
    """Each part of the trusted base stays within its code-line budget (tcert.testing.size.BUDGETS)."""
    n, per_file = size.counts()[part]
    assert n <= size.BUDGETS[part], f"{part}: {n} code lines, budget {size.BUDGETS[part]}: {per_file}"


def test_size_page_is_generated_from_the_code():
    """docs/checker-size.md is exactly what `python -m tcert.testing.size --write docs/checker-size.md` writes."""
    page = ROOT / "docs" / "checker-size.md"
    assert page.read_text(encoding="utf-8") == size.table(), \
        "docs/checker-size.md is stale: run python -m tcert.testing.size --write docs/checker-size.md"


def test_code_line_counter():
    """The counter skips blank lines, comments and every docstring, and counts the rest (also multi-line
    statements and strings that are not docstrings)."""
    import pathlib
    import tempfile
    src = '''"""Module
docstring."""
# a comment

X = """not a
docstring"""


class A:
    """Class docstring."""

    def f(self):
        """Function
        docstring."""
        return (1 +
                2)   # trailing comment
'''
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "m.py"
        path.write_text(src)
        assert size.code_lines(path) == 6     # X = """...""" (2), class A:, def f, return (2)
