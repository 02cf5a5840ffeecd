"""docs/api.md's worked example runs as written: its Python code blocks are executed in order in one
namespace (a small model trained in the example, certificates, checks, a plot)."""

import re

import pytest

from tcert.testing import ROOT

pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def code_blocks(path) -> list:
    """The ```python blocks of a Markdown file, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_worked_example_runs(capsys):
    blocks = code_blocks(ROOT / "docs" / "api.md")
    assert len(blocks) >= 5
    namespace = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md block {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "VERIFIED: prediction" in out and "REJECTED: accuracy" in out and "bad input:" in out
    assert namespace["proved"]["brute"] > 0 and namespace["path"].endswith(".png")
