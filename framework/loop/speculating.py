"""Speculative decoding in the one loop: a drafter proposes a row's next tokens, one
forward feeds them after the row's newest token, and the model is sampled at each
position exactly as plain decoding would sample it.

``Speculating`` is a mixin of ``Generation`` (as ``feeding.py`` is). A step with drafts
d1..dk feeds [last, d1..dk] in one forward (a graph with ``logits_to_keep`` computes
the k + 1 last positions' logits), then, position by position, runs the step's own
tail: the processors on the tokens kept so far, the sampler, the record, followers
told, text, stopping criteria. It stops at the first position whose picked token is not
the draft there (that token is the model's own and is kept), when the row finishes, or
when a component forces the next tokens. So every token is the one decoding without
drafts picks, a seeded sampler draws the same numbers, and components that follow the
text are told only kept tokens (nothing to rewind in them). The cache is then cropped to
the kept positions: free for the ``static`` cache (a length), a copy for ``dynamic``.

One row is verified per forward: onnxruntime's GroupQueryAttention (the fused graphs)
refuses several positions per row on top of a past for a batch ("batch_size must be 1
when sequence_length > 1 and past context is given"). So a request of several rows with
a drafter is refused (send the rows one by one), and a search strategy too. An open
batch (the server's continuous batching) speculates while it holds one row, which is a
request running alone; when others join, the rows decode together without drafts (a
batched step of 8 rows costs ~2.6x one row's, less than verifying 8 rows one by one)
and speculation resumes when one is left. Both ways give the same tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ComponentError, InputError
from ..protocols import Drafter
from .step_fields import StepFields

#: most tokens a row of an open batch drafts per step (its buffer grows to hold them)
OPEN_BATCH_DRAFTS = 16


class Speculating(StepFields):
    """Drafts, one verifying forward, and the kept tokens through the step's tail."""

    def _init_speculation(self) -> None:
        #: tokens drafters proposed, drafts the model kept, verifying forwards run
        self.drafted = 0
        self.draft_kept = 0
        self.verify_forwards = 0

    def _check_speculation(self) -> None:
        """Refuse, with the reason, a drafter this request cannot use."""
        named = [c.drafter for c in self.rows.chains if c.drafter is not None]
        if not named:
            return
        name = named[0][0]
        if any(c.search is not None for c in self.rows.chains):
            raise InputError(
                f"drafter {name!r}: speculative decoding does not combine with a "
                "search strategy (beam search)"
            )
        if self.batch_size != 1:
            raise InputError(
                f"drafter {name!r}: speculative decoding verifies one row per forward (the "
                f"fused graphs' attention takes several new positions for one row only); "
                f"this request has {self.batch_size} rows: send them one by one, or to "
                "`ortgen serve`, which speculates for a request while it runs alone"
            )

    def _row_drafter(self) -> tuple[str, Drafter] | None:
        """The drafter of the one row this step may speculate for, or None: a request
        with one row, or an open batch holding one row (see module doc)."""
        if self.batch_size != 1:
            return None
        return self.rows.chains[0].drafter

    def _draft_room(self) -> int:
        """Most drafts this step may feed: the buffer keeps room for them and the
        model's own token after them; an open batch grows its buffer instead, within
        the model's context (a drafted position past it would not exist)."""
        if not self._batch.grows:
            return self.rows.ids.shape[1] - self.length - 1
        room = OPEN_BATCH_DRAFTS
        context = self.model.max_context
        if context:  # the drafts take positions length - pad .. on
            room = min(room, context - (self.length - int(self.rows.pads[0])))
        self.reserve(self.length + room + 1)
        return room

    def _drafts(self, forced: np.ndarray | None) -> list[int]:
        """The drafter's proposal for this step, or [] to decode plainly: before the
        prompt is fed, while a component forces tokens, or with no room left."""
        drafter = self._row_drafter()
        if drafter is None or self.fed != self.length - 1 or not bool(self.rows.unfinished[0]):
            return []
        if self.steps == 0 and not self._batch.joins:  # the prompt is not fed yet (rows
            # that join were prefilled in admit())
            return []
        if forced is not None and bool((forced >= 0).any()):
            return []
        limit = self._draft_room()
        if limit < 1:
            return []
        name, component = drafter
        tokens = self.rows.ids[0, int(self.rows.pads[0]) : self.length]
        try:
            drafts = [int(t) for t in component.draft(tokens, limit)]
        except Exception as exc:
            raise ComponentError(
                f"drafter {name!r} failed at step {self.steps}: {type(exc).__name__}: {exc}"
            ) from exc
        vocab = self.model.signature.vocab_size
        if len(drafts) > limit or any(not 0 <= t < vocab for t in drafts):
            raise ComponentError(
                f"drafter {name!r} returned {drafts} at step {self.steps}; expected at most "
                f"{limit} token ids in [0, {vocab})"
            )
        return self._allowed_drafts(drafts)

    def _allowed_drafts(self, drafts: list[int]) -> list[int]:
        """The drafts up to the first one a component refuses (``ChecksDrafts``: a
        grammar), so the verifying forward feeds only tokens the model may pick."""
        for name, checker in self.rows.chains[0].draft_checkers:
            if not drafts:
                break
            try:
                allowed = checker.valid_prefix(0, drafts)
            except Exception as exc:
                raise ComponentError(
                    f"{name!r} failed in valid_prefix() at step {self.steps}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(allowed, int) or not 0 <= allowed <= len(drafts):
                raise ComponentError(
                    f"{name!r} valid_prefix() returned {allowed!r} for {len(drafts)} drafts; "
                    "expected an integer from 0 to their count"
                )
            drafts = drafts[:allowed]
        return drafts

    def _speculate(self, drafts: list[int], failed: list[ComponentError]) -> np.ndarray:
        """One verifying forward over the drafts, then the step's tail per kept token."""
        count, start = len(drafts), self.length
        self.rows.ids[0, start : start + count] = drafts
        self.rows.mask[0, start : start + count] = 1
        logits_all = self._forward_chunk(self.fed, start + count, keep=count + 1)
        self.fed = start + count
        self.verify_forwards += 1
        self.drafted += count
        logits_all = logits_all[:, -(count + 1) :]  # graphs without logits_to_keep: all
        kept = 0
        next_ids = np.full(1, self.pad_token_id, dtype=np.int64)
        for position in range(count + 1):
            logits = logits_all[:, position]
            next_ids, scores = self._pick(self.sequences, logits, None, failed)
            if failed and self.is_done:
                break
            next_ids = self._commit(next_ids, logits, scores, None, failed)
            if position == count or next_ids[0] != drafts[position] or self.is_done:
                break
            if self._forcing and self._forced_column() is not None:
                break  # forced tokens next: the plain step takes them
            kept += 1
        self.draft_kept += kept
        chain = self.rows.chains[0]  # the one row (``_row_drafter``)
        if chain.draft_feedback is not None and chain.drafter is not None:
            self._tell(chain.drafter[0], chain.draft_feedback.accepted, count, kept)
        self.rows.mask[:, self.length :] = 0  # the drafts past what was kept
        if self.fed > self.length - 1:  # forget their keys/values: the newest is unfed
            self.fed = self.length - 1
            self._cache_call(self._kv.cache.crop, self.fed)
        self._finish_step(failed)
        return next_ids

    def speculation_stats(self) -> dict[str, Any]:
        """``drafted``, ``accepted`` (drafts kept), ``verify_forwards`` and the
        acceptance rate, for ``GenerationOutput.stats``."""
        rate = self.draft_kept / self.drafted if self.drafted else 0.0
        return {
            "drafted": self.drafted,
            "accepted": self.draft_kept,
            "verify_forwards": self.verify_forwards,
            "acceptance_rate": round(rate, 4),
        }
