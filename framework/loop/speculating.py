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

One row at a time for now: a batch, an open batch (the server) and search strategies
decode without drafts, and a request that asks for a drafter there gets an error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ComponentError, InputError
from .step_fields import StepFields


class Speculating(StepFields):
    """Drafts, one verifying forward, and the kept tokens through the step's tail."""

    def _init_speculation(self) -> None:
        #: tokens drafters proposed, drafts the model kept, verifying forwards run
        self.drafted = 0
        self.draft_kept = 0
        self.verify_forwards = 0

    def _check_speculation(self) -> None:
        """Refuse, with the reason, a drafter this request cannot use."""
        drafter = self.chain.drafter
        if drafter is None:
            return
        if self.chain.search is not None:
            raise InputError(
                f"drafter {drafter[0]!r}: speculative decoding does not combine with a "
                "search strategy (beam search)"
            )
        if self.batch_size != 1 or len(self._groups) != 1:
            raise InputError(
                f"drafter {drafter[0]!r}: speculative decoding runs one row at a time for "
                f"now; this request has {self.batch_size} rows (send them one by one)"
            )

    def _drafts(self, forced: np.ndarray | None) -> list[int]:
        """The drafter's proposal for this step, or [] to decode plainly: before the
        prompt is fed, while a component forces tokens, or with no room left."""
        drafter = self.chain.drafter
        if drafter is None or self._open or self.steps == 0 or self.fed != self.length - 1:
            return []
        if forced is not None and bool((forced >= 0).any()):
            return []
        limit = self.rows.ids.shape[1] - self.length - 1  # room for what may be kept
        if limit < 1 or not bool(self.rows.unfinished[0]):
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
        accepted = getattr(self.chain.drafter[1], "accepted", None) if self.chain.drafter else None
        if accepted is not None:
            accepted(count, kept)
        self.rows.mask[:, self.length :] = 0  # the drafts past what was kept
        if self.fed > self.length - 1:  # forget their keys/values: the newest is unfed
            self.fed = self.length - 1
            self._cache_call("crop", self.fed)
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
