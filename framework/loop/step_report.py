"""What one ``step()`` (or one ``admit()``) did, per row: the caller reads it instead of
diffing the step object's counters before and after (vLLM's engine core returns its
per-step outputs the same way).

A report keeps two small snapshots, before and after the step (a few numbers and three
per-row arrays copied: ~5 us a step), and works out each row's columns only when asked,
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

    __slots__ = (
        "_after_finished_at",
        "_after_length",
        "_after_unfinished",
        "_before",
        "drafted",
        "ids",
        "kept",
    )

    def __init__(self, before: StepStart, state: Generation, ids: np.ndarray) -> None:
        self.ids = ids
        self._before = before
        self._after_length = state.length
        self._after_finished_at = state.rows.finished_at.copy()
        self._after_unfinished = state.rows.unfinished.copy()
        self.drafted = state.drafted - before.drafted
        self.kept = state.draft_kept - before.kept

    @property
    def starts(self) -> np.ndarray:
        before = self._before
        return np.where(before.finished_at >= 0, before.finished_at, before.length)

    @property
    def ends(self) -> np.ndarray:
        after = self._after_finished_at
        return np.where(after >= 0, after, self._after_length)

    @property
    def finished(self) -> np.ndarray:
        return self._before.unfinished & ~self._after_unfinished

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
