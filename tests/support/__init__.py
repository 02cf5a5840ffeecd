"""Helpers shared by the tests, the benchmarks and `tcert selftest` (installed as `tcert.testing`).

Paths point into the repository (a source checkout or an editable install); the model builders and
oracles need nothing but numpy and the generator.
"""

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
CERTIFICATES = ROOT / "certificates"


def example_scale(ci_examples: int) -> int:
    """Number of examples for a property test: its CI size, or 10x under the large profile."""
    return ci_examples * (10 if os.environ.get("TCERT_HYPOTHESIS_PROFILE") == "large" else 1)
