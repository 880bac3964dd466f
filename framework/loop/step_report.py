"""What one ``step()`` (or one ``admit()``) did, per row: the caller reads it instead of
diffing the step object's counters before and after (vLLM's engine core returns its
per-step outputs the same way).

Built from two small snapshots, before and after, with array operations only: a step pays
O(rows) numpy work for it, never per-row Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .generate import Generation


@dataclass(frozen=True)
class StepStart:
    """The counters a report is measured from, taken just before a step."""

    length: int
    finished_at: np.ndarray
    unfinished: np.ndarray
    drafted: int
    kept: int

    @classmethod
    def of(cls, state: Generation) -> StepStart:
        rows = state.rows
        return cls(
            state.length,
            rows.finished_at.copy(),
            rows.unfinished.copy(),
            state.drafted,
            state.draft_kept,
        )


@dataclass(frozen=True)
class StepReport:
    """One step's outcome. ``ids``: the last token each row got, as appended (padding for
    rows finished before); row ``r``'s new tokens are buffer columns ``starts[r]:ends[r]`` (a
    speculative step may keep several; none for a row finished before the step)."""

    ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    #: rows that ended in this step (their reason: ``state.finish_reasons``; a row that
    #: ended with an error of its own component has it in ``state.errors``)
    finished: np.ndarray
    #: tokens a drafter proposed, and how many the model kept, in this step
    drafted: int
    kept: int

    @classmethod
    def between(cls, before: StepStart, state: Generation, ids: np.ndarray) -> StepReport:
        finished_at = state.rows.finished_at
        starts = np.where(before.finished_at >= 0, before.finished_at, before.length)
        ends = np.where(finished_at >= 0, finished_at, state.length)
        return cls(
            ids=ids,
            starts=starts,
            ends=ends,
            finished=before.unfinished & ~state.rows.unfinished,
            drafted=state.drafted - before.drafted,
            kept=state.draft_kept - before.kept,
        )

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
