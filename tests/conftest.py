"""Shared test settings: hypothesis profiles.

Profiles: "ci" (default; sized so the whole suite stays well under 15 minutes on 2 cores) and
"large" (by hand: TCERT_HYPOTHESIS_PROFILE=large pytest ...). Tests that need many examples in CI
set max_examples explicitly with @settings. Paths and helpers live in `tcert.testing` (tests/support).
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("large", deadline=None, max_examples=2000, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("TCERT_HYPOTHESIS_PROFILE", "ci"))
