"""Telling stateful components what happened to each row, and taking the tokens they force.

Split out of ``generate.py`` as ``feeding.py`` is: the step object reads as the loop, and
this file as the rules for components that follow the text (``FollowsTokens``: a
grammar) and may know a row's next tokens (``ForcesTokens``). ``Following`` is a mixin of
``Generation`` and uses its fields (``_groups``, ``rows``, ``length``, ``steps``,
``record``); each row's queue of forced tokens is ``rows.forced``.

A forced token is taken, not sampled: after the processors, the forced row's scores
become a point mass on it and the sampler picks it (drawing its random number, so a
seeded row draws the same numbers whichever way its tokens were fed). When every
running row is forced and nothing asked for the raw logits, the step runs no forward at
all: its tokens are fed together with the next sampled token, in one forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, ParamSpec, TypeVar

import numpy as np

from ..errors import ComponentError
from ..protocols.candidates import Candidates
from .chain import Chain
from .step_fields import StepFields

_P = ParamSpec("_P")
_R = TypeVar("_R")


class Following(StepFields):
    """How a step object keeps stateful components in step (see module doc).

    Every call is made per settings group and isolated like the loop's own (a component
    that raises fails the rows it serves, through ``_isolated``); ``failed`` collects the
    errors of the current step, which ``step()`` raises unless the batch is open.
    """

    def _init_following(self) -> None:
        #: tokens appended by forced steps that ran no forward of their own
        self.fast_forward_tokens = 0
        self._note_components()
        failed: list[ComponentError] = []
        self._refresh_forced(range(self.batch_size), failed)
        self._prepare_next(failed)
        if failed:
            raise failed[0]

    def _note_components(self) -> None:
        """Whether any chain has components to tell (a request without pays nothing)."""
        self._following = any(chain.followers for _, chain in self._groups)
        self._preparing = any(chain.preparers for _, chain in self._groups)
        self._forcing = any(chain.forcers for _, chain in self._groups) and not self.is_search

    def _group_rows(self) -> Iterator[tuple[np.ndarray | None, list[int], Chain]]:
        """(group, batch rows in the chain's own order, chain) for chains that follow
        tokens and whose rows have not failed."""
        for group, chain in self._groups:
            if chain.followers and not self._has_failed(group):
                rows = list(range(self.batch_size)) if group is None else group.tolist()
                yield group, rows, chain

    def _tell(self, name: str, method: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``method(*args)``, a bound method of component ``name`` (typed by the protocol
        that declares it); what it raises becomes a ComponentError naming the component,
        the method and the step."""
        try:
            return method(*args, **kwargs)
        except ComponentError:
            raise
        except Exception as exc:
            raise ComponentError(
                f"component {name!r} failed in {method.__name__}() at step {self.steps}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _advance_group(self, chain: Chain, told: Sequence[Sequence[int]]) -> None:
        for name, component in chain.followers:
            self._tell(name, component.advance, told)

    def _prepare_group(self, chain: Chain) -> None:
        for name, component in chain.preparers:
            self._tell(name, component.prepare)

    # -- what happened --------------------------------------------------------------

    def _advance(self, tokens: list[list[int]], failed: list | None = None) -> None:
        """Tell followers the tokens each batch row gained (``tokens[row]``)."""
        if not self._following:
            return
        errors: list[ComponentError] = [] if failed is None else failed
        for group, rows, chain in self._group_rows():
            if any(tokens[row] for row in rows):
                told = [tokens[r] for r in rows]
                self._isolated(group, errors, partial(self._advance_group, chain, told))
        if failed is None and errors:
            raise errors[0]

    def _advance_column(self, next_ids: np.ndarray, active: np.ndarray, failed: list) -> None:
        """Tell followers the token each running row gained this step."""
        if self._following:
            ids = next_ids.tolist()
            tokens = [[ids[row]] if active[row] else [] for row in range(len(ids))]
            self._advance(tokens, failed)

    def _rewind_followers(self, new_length: int) -> None:
        """Before the buffer is cut to ``new_length``: each row forgets the tokens it
        told followers that are cut (a finished row's padding was never told)."""
        if not self._following:
            return
        counts = []
        for row in range(self.batch_size):
            end, start = self.row_end(row), int(self.rows.prompt_end[row])
            counts.append(max(0, end - start) - max(0, min(end, new_length) - start))
        for _, rows, chain in self._group_rows():
            for name, component in chain.followers:
                self._tell(name, component.rewind, [counts[row] for row in rows])

    def _reorder_followers(self, parents: np.ndarray) -> None:
        """Rows became copies of ``parents`` (a search strategy's beams); the per-row
        forced queues moved with ``RowState.take``: copy the lists they now share."""
        self.rows.forced = [list(queue) for queue in self.rows.forced]
        if not self._following:
            return
        for _, rows, chain in self._group_rows():
            if len(rows) != self.batch_size:
                raise ComponentError(
                    "a search strategy moved rows across settings groups; components that "
                    "follow tokens cannot follow them there"
                )
            for name, component in chain.followers:
                self._tell(name, component.reorder, parents)

    # -- forced tokens ----------------------------------------------------------------

    def _refresh_forced(self, rows: Any, failed: list) -> None:
        """Ask forcers for the next tokens of ``rows`` whose queue is used up."""
        if not self._forcing:
            return
        queues, running = self.rows.forced, self.rows.unfinished
        wanted = {row for row in rows if running[row] and not queues[row]}
        if not wanted:
            return
        for group, group_rows, chain in self._group_rows():
            if chain.forcers and wanted.intersection(group_rows):
                self._isolated(group, failed, partial(self._ask, chain, group_rows, wanted))

    def _ask(self, chain: Chain, group_rows: list[int], wanted: set[int]) -> None:
        for index, row in enumerate(group_rows):
            if row not in wanted:
                continue
            for name, forcer in chain.forcers:
                tokens = self._tell(name, forcer.forced_tokens, index)
                if len(tokens):
                    self.rows.forced[row] = [int(t) for t in tokens]
                    break

    def _forced_column(self) -> np.ndarray | None:
        """This step's forced token per row (-1: the row samples), or None for none."""
        if not self._forcing:
            return None
        running = self.rows.unfinished
        heads = [q[0] if q and running[row] else -1 for row, q in enumerate(self.rows.forced)]
        if not heads or max(heads) < 0:
            return None
        return np.asarray(heads, dtype=np.int64)

    def _skips_forward(self, forced: np.ndarray) -> bool:
        """Whether this step needs no forward: past the prefill, every running row forced,
        and no raw logits asked for (there would be none to record). Not in an open
        batch: its rows joined at different places, and a forward of several tokens on
        a past goes row by row on fused graphs, which costs more than it saves there."""
        if self._batch.joins:  # rows at different places: every step feeds one token per row
            return False
        running = self.rows.unfinished
        return self.steps > 0 and bool((forced[running] >= 0).all()) and not self.record.want_logits

    def _forced_pick(self, forced: np.ndarray, failed: list) -> tuple[np.ndarray, Candidates]:
        """A step without a forward: every running row takes its forced token (finished
        rows their padding) through its sampler, which sees a point mass."""
        tokens = np.where(forced >= 0, forced, self.pad_token_id)
        vocab = self.model.signature.vocab_size
        scores = Candidates.point(tokens, vocab)
        input_ids = self.sequences
        next_ids = tokens.copy()
        for rows, chain in self._groups:
            if self._has_failed(rows):
                continue
            if rows is None:
                self._isolated(rows, failed, partial(self._sample, chain, input_ids, scores))
                continue
            ids, _ = self._group_view(rows, chain, input_ids, None)
            point = Candidates.point(tokens[rows], vocab)
            picked = self._isolated(rows, failed, partial(self._sample, chain, ids, point))
            if picked is not None:
                next_ids[rows] = picked
        self._isolated(None, failed, partial(self._check_forced, forced, next_ids))
        self.fast_forward_tokens += int(self.rows.unfinished.sum())
        return next_ids, scores

    def _force_scores(self, scores: Any, forced: np.ndarray | None) -> Any:
        """Processed scores with each forced row (``forced[i] >= 0``) a point mass on its
        token; the raw logits are never written."""
        if forced is None or not (forced >= 0).any():
            return scores
        dense = scores.dense() if isinstance(scores, Candidates) else np.array(scores)
        rows = np.flatnonzero(forced >= 0)
        dense[rows] = -np.inf
        dense[rows, forced[rows]] = 0.0
        return dense

    def _check_forced(self, forced: np.ndarray, next_ids: np.ndarray) -> None:
        rows = np.flatnonzero(forced >= 0)
        wrong = rows[next_ids[rows] != forced[rows]]
        if wrong.size:
            row = int(wrong[0])
            raise ComponentError(
                f"the sampler picked token {int(next_ids[row])} for row {row} at step "
                f"{self.steps}, where token {int(forced[row])} was certain (a point mass)"
            )

    def _take_forced(
        self, forced: np.ndarray | None, failed: list, rows: Sequence[int] | None = None
    ) -> None:
        """Drop the forced tokens this step used, and ask for more where they ran out
        (``rows``: a joining row alone; None: every row)."""
        if not self._forcing:
            return
        if forced is not None:
            for row in np.flatnonzero(forced >= 0).tolist():
                if self.rows.forced[row]:
                    self.rows.forced[row].pop(0)
        self._refresh_forced(range(self.batch_size) if rows is None else rows, failed)

    def _reset_forced(self) -> None:
        """Forget every queue (the rows changed under it) and ask again."""
        self.rows.forced = [[] for _ in range(self.batch_size)]
        failed: list[ComponentError] = []
        self._refresh_forced(range(self.batch_size), failed)
        self._prepare_next(failed)
        if failed and not self._batch.isolates_errors:
            raise failed[0]

    def _prepare_next(self, failed: list) -> None:
        """Let followers with ``prepare()`` (``PreparesAhead``) start their work for the next
        step now, so it runs beside the forward (onnxruntime releases the GIL): only when
        the next step runs a forward, since a forced step without one needs no mask."""
        if not self._preparing or self.is_done:
            return
        forced = self._forced_column()
        if forced is not None and self._skips_forward(forced):
            return
        for group, _, chain in self._group_rows():
            if chain.preparers:
                self._isolated(group, failed, partial(self._prepare_group, chain))
