"""The set-up the README promises: CI runs exactly the README's test command, and `tcert` looks for exactly
the packages of the `generator` extra."""

import re
import tomllib

from tcert.generator.cli import GENERATOR_REQUIRES
from tcert.testing import ROOT


def fenced_commands(text: str) -> list:
    """The one-line code blocks of a Markdown text."""
    return [m.group(1) for m in re.finditer(r"^```\n([^\n]+)\n```$", text, flags=re.M)]


def test_ci_runs_exactly_the_readme_test_command():
    readme = fenced_commands((ROOT / "README.md").read_text())
    tests = [c for c in readme if "pytest" in c]
    assert len(tests) == 1, tests
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == tests[0]
    assert any(line.startswith("apt-get update") and "apt-get install -y -q chromium" in line for line in ci)


def test_the_generator_extra_is_what_tcert_looks_for():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["generator"]
    assert [re.match(r"[A-Za-z0-9_.-]+", req).group(0) for req in extra] == list(GENERATOR_REQUIRES)
