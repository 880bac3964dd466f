"""Picking each row's next token and stopping rows, per settings group, errors isolated.

Split out of ``generate.py`` as ``feeding.py`` and ``following.py`` are: ``Picking`` is a
mixin of ``Generation`` and uses its fields (``_groups``, ``rows``, ``length``,
``steps``, ``_solo``, ``_batch``). A step's rows are grouped by the chain that serves
them (per-row settings, the requests of a continuous batch); each group's processors,
sampler and stopping criteria see only its rows, and a component that raises fails only
those rows (finish reason ``"error"``, the error kept per row): one error model for the
library and the server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ComponentError
from ..protocols.candidates import Candidates
from . import scoring
from .chain import Chain
from .component_checks import check_ids, check_not_nan, check_stop
from .step_fields import StepFields

if TYPE_CHECKING:
    pass


class Picking(StepFields):
    """Processors → sampler → stopping criteria for every settings group of a step."""

    def _pick(
        self,
        input_ids: np.ndarray,
        logits: np.ndarray,
        forced: np.ndarray | None,
        failed: list[ComponentError],
    ) -> tuple[np.ndarray, np.ndarray | Candidates]:
        """Each settings group's processors and sampler on its rows; (next ids, scores).
        ``forced``: per row, a token it must take (-1: none), or None. A group whose
        component raises fails its rows (``failed``); the others are picked."""
        if len(self._groups) == 1 and not self.rows.errors[0]:
            try:
                return self._pick_group(self._groups[0][1], input_ids, logits, forced)
            except ComponentError as exc:
                self._fail_rows(None, exc, failed)
                return np.full(self.batch_size, self.pad_token_id, np.int64), logits
        next_ids = np.full(self.batch_size, self.pad_token_id, dtype=np.int64)
        # each group's processed scores go over its logits: after the pick nothing reads
        # the raw ones (recorded logits were copied), and a group whose chain changed
        # nothing (greedy, no processors) costs no copy at all
        scores = logits if self._batch.joins else np.array(logits)
        for rows, chain in self._groups:
            if self._has_failed(rows):
                continue
            ids, group_logits = self._group_view(rows, chain, input_ids, logits)
            group_forced = forced[rows] if forced is not None else None
            try:
                picked, group_scores = self._pick_group(chain, ids, group_logits, group_forced)
            except ComponentError as exc:
                self._fail_rows(rows, exc, failed)
                continue
            next_ids[rows] = picked
            if group_scores is not group_logits:
                scores[rows] = scoring.dense(group_scores)
        return next_ids, scores

    def _group_view(
        self, rows: np.ndarray | None, chain: Chain, input_ids: np.ndarray, scores: Any
    ) -> tuple[np.ndarray, Any]:
        """What a settings group's components see: its rows, and for a chain serving one
        row alone (a request in a continuous batch) that row without its padding, as
        the request would look on its own."""
        if rows is None:
            return input_ids, scores
        # scores None: for stopping criteria that read none (see _stop)
        if id(chain) in self._solo:
            row = int(rows[0])
            solo = None if scores is None else scores[row : row + 1]
            return input_ids[row : row + 1, self.rows.pads[row] :], solo
        return input_ids[rows], None if scores is None else scores[rows]

    def _pick_group(
        self,
        chain: Chain,
        input_ids: np.ndarray,
        logits: np.ndarray,
        forced: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | Candidates]:
        """(next ids, processed scores: dense, or Candidates when the chain left few).
        Rows with a ``forced`` token (>= 0) see a point mass on it."""
        scores = scoring.process(chain.scored, input_ids, logits, step=self.steps, call=self._call)
        # raw model logits go straight to the sampler, which checks; Candidates cannot
        # be NaN everywhere (the scores outside them are -inf)
        if chain.processors and not isinstance(scores, Candidates):
            check_not_nan(scores, chain, self.steps)
        scores = self._force_scores(scores, forced)
        next_ids = self._sample(chain, input_ids, scores)
        if forced is not None:
            self._check_forced(forced, next_ids)
        return next_ids, scores

    def _sample(
        self, chain: Chain, input_ids: np.ndarray, scores: np.ndarray | Candidates
    ) -> np.ndarray:
        """The chain's sampler on processed scores, its answer checked."""
        next_ids = scoring.pick(
            chain.sampler, chain.sparse_sampler, input_ids, scores, call=self._call
        )
        batch, vocab = scores.shape
        return check_ids(chain.sampler[0], next_ids, batch, vocab, self.steps)

    def _stop(
        self,
        scores: np.ndarray | Candidates,
        failed: list[ComponentError],
        only: Sequence[int] | None = None,
    ) -> None:
        """Each settings group's stopping criteria. Scores that were left as Candidates
        are made dense only when a criterion reads them (``Chain.stop_reads_scores``:
        one without ``uses_scores = False``); the others get None. ``only``: a joining
        row alone (its group is its own, ``scores`` its (1, V) row)."""
        input_ids = self.sequences
        if only is not None:  # the groups of the joining rows alone (all rows: the batch is
            for rows, chain in self._groups:  # one joining row, e.g. an empty batch's first)
                members = rows.tolist() if rows is not None else range(self.batch_size)
                if set(members) <= set(only) and not self._has_failed(rows):
                    ids, _ = self._group_view(rows, chain, input_ids, None)
                    dense_row = scoring.dense(scores)
                    stop = partial(self._stop_group, rows, chain, ids, dense_row)
                    self._isolated(rows, failed, stop)
            return
        dense: np.ndarray | None
        if isinstance(scores, Candidates):
            read = any(chain.stop_reads_scores for _, chain in self._groups)
            dense = scores.dense() if read else None
        else:
            dense = scores
        for rows, chain in self._groups:
            if self._has_failed(rows):
                continue
            ids, group_scores = self._group_view(rows, chain, input_ids, dense)
            self._isolated(rows, failed, partial(self._stop_group, rows, chain, ids, group_scores))
        if self.length >= self.rows.ids.shape[1] and not self._batch.grows:
            for row in np.flatnonzero(self.rows.unfinished):
                self.finish(int(row), "length")

    def _stop_group(
        self, rows: np.ndarray | None, chain: Chain, ids: np.ndarray, scores: np.ndarray
    ) -> None:
        """Run one settings group's stopping criteria and finish the rows they end."""
        for name, criterion, reason in chain.criteria:
            done = self._call("stopping criterion", name, criterion, ids, scores)
            done = check_stop(name, done, ids.shape[0], self.steps)
            newly = done.nonzero()[0]  # done is 1-D (check_stop)
            if rows is not None:
                newly = rows[newly]
            for row in newly.tolist():
                self.finish(row, reason)

    # -- errors, per settings group ------------------------------------------------------

    def _isolated(
        self, rows: np.ndarray | None, failed: list[ComponentError], work: Callable[[], Any]
    ) -> Any:
        """Run one settings group's ``work``; a component error fails only its rows."""
        try:
            return work()
        except ComponentError as exc:
            self._fail_rows(rows, exc, failed)
            return None

    def _fail_rows(
        self, rows: np.ndarray | None, error: ComponentError, failed: list[ComponentError]
    ) -> None:
        """``rows`` (None: all) end with finish reason "error" and keep ``error``."""
        failed.append(error)
        for row in range(self.batch_size) if rows is None else rows.tolist():
            if self.rows.errors[row] is None:
                self.rows.errors[row] = error
            self.finish(row, "error")

    def _has_failed(self, rows: np.ndarray | None) -> bool:
        first = 0 if rows is None else int(rows[0])
        return self.rows.errors[first] is not None

    def _call(self, kind: str, name: str, component, input_ids, scores):
        try:
            return component(input_ids, scores)
        except ComponentError:
            raise
        except Exception as exc:
            raise ComponentError(
                f"{kind} {name!r} failed at step {self.steps}: {type(exc).__name__}: {exc}"
            ) from exc
