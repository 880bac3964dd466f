"""How many examples a fuzz test runs: a few in `make test`, many under `make fuzz`.

Not a test module. The profiles are registered in ``tests/conftest.py``;
``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) selects the long one.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: `make fuzz`: the "fuzz" profile is loaded
FUZZING = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]


def fuzz(quick: int, *, long: int | None = None) -> settings:
    """``quick`` examples in `make test` (no database: each run draws afresh, bounded
    time); under `make fuzz`, ``long`` examples or else the profile's count."""
    if FUZZING:
        if long is None:
            return settings(deadline=None, suppress_health_check=_SLOW_IS_FINE)
        return settings(max_examples=long, deadline=None, suppress_health_check=_SLOW_IS_FINE)
    return settings(
        max_examples=quick, deadline=None, database=None, suppress_health_check=_SLOW_IS_FINE
    )
