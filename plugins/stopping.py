"""Built-in stopping criteria: ``eos``, ``max_length`` and ``max_time``.

Each is called after the new token was appended (``input_ids`` includes it) and
returns one bool per row, True where that row is finished, as Hugging Face's
``EosTokenCriteria``, ``MaxLengthCriteria`` and ``MaxTimeCriteria`` do. The
``finish_reason`` class attribute is what the loop reports for those rows.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable

import numpy as np

from ortgen import ConfigError, GenerationContext, Register, StoppingCriterionFactory, hookimpl
from ortgen.checks import eos_ids, is_int


@hookimpl
def register_stopping_criteria(register: Register[StoppingCriterionFactory]) -> None:
    register("eos", EosCriterion)
    register("max_length", MaxLengthCriterion)
    register("max_time", MaxTimeCriterion)


class EosCriterion:
    """True where the last token is one of the EOS ids (EosTokenCriteria).

    ``eos_token_id`` is an int or a non-empty list of ints; when it is None the
    request's EOS ids (``ctx.eos_token_ids``) are used, and there must be some.
    """

    finish_reason = "eos"
    uses_scores = False  # the loop need not build dense scores for it

    def __init__(
        self, eos_token_id: int | list[int] | None = None, *, ctx: GenerationContext | None = None
    ) -> None:
        if eos_token_id is None and ctx is None:
            raise ConfigError(
                "`eos_token_id` has to be a non-negative integer or a non-empty list of them, "
                "but is None"
            )
        ids = eos_ids(eos_token_id, ctx)
        if len(ids) == 0:
            given = "the request has no EOS ids" if eos_token_id is None else "it is []"
            raise ConfigError(
                "`eos_token_id` has to name at least one token for the `eos` criterion, "
                f"but {given}"
            )
        self.eos_token_id = tuple(int(i) for i in ids)
        self._ids = np.array(self.eos_token_id, dtype=np.int64)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        last = input_ids[:, -1]
        if self._ids.size == 1:
            return last == self._ids[0]
        return (last[:, None] == self._ids).any(axis=-1)  # np.isin is slower for a few ids


class MaxLengthCriterion:
    """All rows finished once prompt + new tokens reach ``max_length`` (MaxLengthCriteria)."""

    finish_reason = "length"
    uses_scores = False  # the loop need not build dense scores for it

    def __init__(self, max_length: int) -> None:
        if not is_int(max_length) or max_length < 1:
            raise ConfigError(
                f"`max_length` has to be a positive integer (>= 1), but is {max_length!r}"
            )
        self.max_length = int(max_length)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        fill = np.ones if input_ids.shape[1] >= self.max_length else np.zeros  # one C call
        return fill(input_ids.shape[0], dtype=bool)


class MaxTimeCriterion:
    """All rows finished once ``max_time`` seconds passed since construction (MaxTimeCriteria).

    The factory runs when the request starts, so the clock covers the whole
    request; it uses ``time.monotonic`` (HF uses the wall clock). A row is finished
    once the elapsed time is strictly greater than ``max_time``, as in Hugging Face.

    ``clock`` (seconds, a zero-argument callable) is read once at construction and
    once per call. It is a class attribute rather than a factory parameter, so it
    is not a setting users can pass; tests inject a fake clock with a subclass.
    """

    finish_reason = "time"
    uses_scores = False  # the loop need not build dense scores for it
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, max_time: float) -> None:
        ok = isinstance(max_time, numbers.Real) and not isinstance(max_time, bool)
        if not ok or not (math.isfinite(max_time) and max_time >= 0):
            raise ConfigError(
                f"`max_time` has to be a non-negative number of seconds, but is {max_time!r}"
            )
        self.max_time = float(max_time)
        self.start = self.clock()

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        done = self.clock() - self.start > self.max_time
        return np.full(input_ids.shape[0], done, dtype=bool)
