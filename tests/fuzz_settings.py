"""How many examples a fuzz test runs (a few in `make test`, many under `make fuzz`), and
how many of them must be answered.

Not a test module. The profiles are registered in ``tests/conftest.py``;
``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) selects the long one.

A fuzz property accepts a clear refusal (an ``OrtgenError``, a 4xx) as well as an
answer, so on its own it cannot tell a server that refuses everything from one that
works. ``answering`` adds the floor: each example says what it came to (``outcome``),
and after the run a share of those that could have been answered must have been.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, settings

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


#: what the examples of the running ``answering`` test came to (None outside one)
_tally: Counter[str] | None = None
#: the ``outcome``s the floor counts; any other word is only an event
ANSWERED, REFUSED = "answered", "refused"


def outcome(what: str) -> None:
    """Record what one example came to: ``ANSWERED`` (a valid result, checked),
    ``REFUSED`` (a clear error), or another word the floor does not count. It is also a
    hypothesis event, in ``make fuzz``'s statistics."""
    event(what)
    if _tally is not None:
        _tally[what] += 1


def answering(share: float) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The floor of a fuzz test (put it above ``@fuzz`` and ``@given``): of the examples
    that were answered or refused, at least ``share`` (and at least one) must have been
    answered. Each test sets ``share`` at about half the lowest share a working build
    gave in a few runs or less (a comment says what was measured), and runs enough
    examples that such a build answers a dozen or more: a build that refuses what it
    should answer falls below the floor, a working one stays far above it."""

    def decorate(test: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(test)  # keeps hypothesis's attributes, so pytest sees its test
        def run(*args: Any, **kwargs: Any) -> None:
            global _tally
            _tally = tally = Counter()
            try:
                test(*args, **kwargs)
            finally:
                _tally = None
            counted = tally[ANSWERED] + tally[REFUSED]
            least = max(1, int(share * counted))
            assert not counted or tally[ANSWERED] >= least, (
                f"{tally[ANSWERED]} of {counted} examples that could be answered were "
                f"answered; at least {least} ({share:.0%}) must be: {dict(tally)}"
            )

        return run

    return decorate
