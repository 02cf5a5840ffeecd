"""Shared test settings: hypothesis profiles and paths.

Profiles: "ci" (default; sized so the whole suite stays well under 15 minutes on 2 cores) and
"large" (by hand: TCERT_HYPOTHESIS_PROFILE=large pytest ...). Tests that need many examples in CI
set max_examples explicitly with @settings.
"""

import os
import pathlib

from hypothesis import HealthCheck, settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
CERTIFICATES = ROOT / "certificates"

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("large", deadline=None, max_examples=2000, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("TCERT_HYPOTHESIS_PROFILE", "ci"))


def example_scale(ci_examples: int) -> int:
    """Number of examples for a property test: its CI size, or 10x under the large profile."""
    return ci_examples * (10 if os.environ.get("TCERT_HYPOTHESIS_PROFILE") == "large" else 1)
