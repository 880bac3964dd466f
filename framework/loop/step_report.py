"""What one ``step()`` (or one ``admit()``) did, per row: the caller reads it instead of
diffing the step object's counters before and after (vLLM's engine core returns its
per-step outputs the same way).

A report keeps two small snapshots, before and after the step (a few numbers and two
per-row arrays copied each: ~1.5 us a step), and works out each row's columns once, when asked,
so ``generate()``, which reads no report, pays almost nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .generate import Generation


class StepStart:
    """The counters a report is measured from, taken just before a step."""

    __slots__ = ("drafted", "finished_at", "kept", "length", "unfinished")

    def __init__(self, state: Generation) -> None:
        self.length = state.length
        self.finished_at = state.rows.finished_at.copy()
        self.unfinished = state.rows.unfinished.copy()
        self.drafted = state.drafted
        self.kept = state.draft_kept


class StepReport:
    """One step's outcome. ``ids``: the last token each row got, as appended (padding for
    rows finished before); row ``r``'s new tokens are buffer columns
    ``starts[r]:ends[r]`` (a speculative step may keep several; none for a row finished
    before the step); ``finished``: the rows that ended in this step (their reason is in
    ``state.finish_reasons``, a component's error in ``state.errors``); ``drafted`` and
    ``kept``: the tokens a drafter proposed in this step, and how many the model kept."""

    __slots__ = ("_after", "_before", "_ends", "_starts", "drafted", "ids", "kept")

    def __init__(self, before: StepStart, state: Generation, ids: np.ndarray) -> None:
        self.ids = ids
        self._before = before
        self._after = StepStart(state)  # the same counters, just after the step
        self.drafted = self._after.drafted - before.drafted
        self.kept = self._after.kept - before.kept
        self._starts: np.ndarray | None = None  # worked out on first use, then kept
        self._ends: np.ndarray | None = None

    @property
    def starts(self) -> np.ndarray:
        if self._starts is None:
            before = self._before
            self._starts = np.where(before.finished_at >= 0, before.finished_at, before.length)
        return self._starts

    @property
    def ends(self) -> np.ndarray:
        if self._ends is None:
            after = self._after
            self._ends = np.where(after.finished_at >= 0, after.finished_at, after.length)
        return self._ends

    @property
    def finished(self) -> np.ndarray:
        return self._before.unfinished & ~self._after.unfinished

    def new_tokens(self, row: int) -> int:
        """How many tokens ``row`` got in this step."""
        return int(self.ends[row] - self.starts[row])

    @property
    def produced(self) -> int:
        """Tokens every row got in this step together."""
        return int((self.ends - self.starts).sum())


@dataclass(frozen=True)
class Admitted:
    """What ``admit()`` did: the row the request became (it may already be finished,
    or failed: ``state.errors[row]``), whether it copied a held row's prefill of the same
    prompt, and how many prompt tokens it took from prefixes the cache held."""

    row: int
    shared_prefill: bool
    reused_tokens: int
