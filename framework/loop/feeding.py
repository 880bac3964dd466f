"""Feeding the model: what a ``Generation`` sends through the graph, and the cache's view.

Split out of ``generate.py`` so the step object reads as the loop (forward → processors
→ sampler → append → stop) and this file as the feeding rules: prefill in chunks, rows
one at a time where a shared-buffer graph needs it, what a cache already holds
(``reuse``), and what it lets the graph see (``feed_mask``), and the prompt logprobs a
request may ask of its prefill (``prompt_scoring``). ``Feeding`` is a mixin of
``Generation`` and uses its buffers (``rows``: ids, mask, pads, reused; ``length``,
``fed``, ``chain``, ``model``, ``_binding``, ``steps``, ``record``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np

from ..errors import ComponentError, InputError
from ..model.session import ExportedModel
from .cache_view import CacheView
from .prompt_scoring import score_positions
from .step_fields import StepFields

#: Most positions fed to the model in one forward (see ``Feeding._forward``).
PREFILL_CHUNK = 256

_P = ParamSpec("_P")
_R = TypeVar("_R")


class Feeding(StepFields):
    """How a step object feeds its model (see module doc)."""

    # -- the cache's view ------------------------------------------------------------

    def _check_cache_signature(self, kv: CacheView, name: str, model: ExportedModel) -> None:
        """A cache belongs to the graph it was made for: keys/values of another model
        (other layers, heads or sizes, or other weights' meaning) are never valid input."""
        signature = kv.graph.signature if kv.graph is not None else None
        if signature is not None and signature != model.signature:
            raise InputError(
                f"kv cache {name!r} was made for another model's graph and "
                f"cannot be used with {model.path}: a KV cache holds one model's keys/values"
            )

    def _reuse(self, prompts: list[list[int]]) -> np.ndarray:
        """Ask a cache that keeps keys/values across requests how much of each prompt it
        holds already (``reuse(prompts)``, at most all but the last token of each row)."""
        held = np.zeros(len(prompts), dtype=np.int64)
        if self._kv.prefixes is None:
            return held
        counts = self._cache_call(self._kv.prefixes.reuse, prompts)
        if len(counts) != len(prompts) or any(
            not 0 <= int(c) < max(len(p), 1) for c, p in zip(counts, prompts, strict=True)
        ):
            raise ComponentError(
                f"kv cache {self.chain.cache_name!r} reuse() returned {list(counts)}; expected "
                "one count per row, each below that row's prompt length"
            )
        held[:] = counts
        return held

    def _first_unfed(self) -> int:
        """The buffer index feeding starts at when rows share one sequence axis (concat
        graphs, or shared-buffer graphs whose rows line up): reused prefixes count only as
        far as every row has one; the cache forgets the rest."""
        if not self.rows.reused.any():
            return 0
        starts = self.rows.pads + self.rows.reused
        fed = int(starts.min())
        if (starts != fed).any():
            self._cache_call(self._kv.cache.crop, fed)
        return fed

    def _held_rows(self) -> list[list[int]]:
        """Each row's real tokens whose keys/values the cache holds (no padding)."""
        rows = []
        for row in range(self.batch_size):
            pad = int(self.rows.pads[row])
            rows.append(self.rows.ids[row, pad : min(self.row_end(row), self.fed)].tolist())
        return rows

    def _forward(self) -> np.ndarray:
        """Feed what the cache has not seen, in chunks; return the last position's logits (B, V).

        The graph returns logits for every fed position, (B, T, V) float32: 200 MB for a
        1,024-token prompt with a 49k vocabulary. Feeding at most ``prefill_chunk``
        positions per forward bounds that, and the cache makes the chunks add up to
        the same result as one forward.
        """
        limit = self._kv.feed_limit  # read here, not through _chunk(): once per step
        chunk = min(self.prefill_chunk, (limit.max_feed if limit is not None else None) or 1 << 30)
        while True:
            start = self.fed
            end = min(self.length, start + chunk)
            # a prefill's last chunk gives back what its chunks took (ForwardBinding);
            # a decode step clears it, so a verifying forward after one does not
            self._binding.release_after = end == self.length and end - start > 1
            logits = self._forward_chunk(start, end)
            self.fed = end
            if end == self.length:
                if start < self.prompt_length:  # a reused prefix is part of the prompt
                    self.rows.reused[:] = 0  # prefilled: from now on every row's cache is complete
                return logits[:, -1, :]

    def _chunk(self) -> int:
        """Most positions to feed per forward: ``prefill_chunk``, or fewer when the cache
        limits a forward (``LimitsFeed``)."""
        return min(self.prefill_chunk, self._kv.max_feed() or 1 << 30)

    def _forward_chunk(self, start: int, end: int, keep: int = 1) -> np.ndarray:
        """Feed columns [start, end); logits of the last ``keep`` positions at least (a
        graph with ``logits_to_keep`` gives exactly those, others every fed position).
        A prefill chunk of a request that asked for prompt logprobs gets every
        position's logits, and scores the prompt tokens they predict."""
        scoring = self._scoring and start < self.prompt_length
        if self._by_rows(start, end):
            return self._forward_rows(start, end, scoring)
        positions = None
        if self.model.signature.has_position_ids:
            positions = self._positions(start, end)
        ids, mask = self.rows.ids[:, start:end], self.rows.mask[:, :end]
        logits = self._run(ids, mask, positions, end - start if scoring else keep)
        if scoring:
            self._score_prompt(logits, np.arange(self.batch_size), start)
        return logits

    def _score_prompt(self, logits: np.ndarray, rows: np.ndarray, first: int) -> None:
        """Score the prompt tokens that ``logits`` (R, T, V) predict: ``logits[i, j]`` is
        at row ``rows[i]``'s column ``first + j`` and predicts the token in the next
        column, scored when that row asked and the token is one of its prompt's after the
        first (``prompt_scoring``; kept in ``record``)."""
        record = self.record
        targets = first + 1 + np.arange(logits.shape[1])  # the column each predicts
        real = targets[None, :] > self.rows.pads[rows, None]  # not padding nor the first
        prompt = targets[None, :] < self.rows.prompt_end[rows, None]
        asked = record.prompt_tops[rows, None] >= 0
        which, steps = np.nonzero(real & prompt & asked)
        if not len(which):
            return
        columns = targets[steps]
        tokens = self.rows.ids[rows[which], columns]
        top = int(record.prompt_tops[rows].max())
        record.keep_prompt(rows[which], columns, score_positions(logits, which, steps, tokens, top))

    def _by_rows(self, start: int, end: int) -> bool:
        """Whether positions [start, end) go row by row: on a shared-buffer graph, for
        rows packed differently (padding, reused prefixes), and for any several-token
        forward of a batch on top of a past (GroupQueryAttention takes those only for
        one row: later prefill chunks, appended turns)."""
        if not self.model.signature.shared_kv:
            return False
        several = self.batch_size > 1 and start > 0 and end - start > 1
        if several and self._kv.selects is None:  # packed: checked at start
            raise InputError(
                f"kv cache {self.chain.cache_name!r} cannot feed a batch row by row, which "
                f"this graph ({self.model.path}) needs for {end - start} tokens per row on top "
                "of a past; use cache='static' (the default)"
            )
        return several or (self._packed_prefill and start < self.prompt_length)

    def _positions(self, start: int, end: int) -> np.ndarray:
        """Hugging Face's position ids for positions [start, end) of every row."""
        if start < self.prompt_length:  # cumsum(mask) - 1, and 1 at pads
            seen = self.rows.mask[:, :end]
            return np.where(seen == 0, 1, np.cumsum(seen, axis=1) - 1)[:, start:]
        # every token from the prompt on is real: a position is its column less the padding
        return start - self.rows.pads[:, None] + np.arange(end - start)

    def _forward_rows(self, start: int, end: int, scoring: bool = False) -> np.ndarray:
        """Prefill positions [start, end) row by row, without the left padding.

        A shared-buffer graph keeps each row's keys/values from position 0 and reads a
        row's length from its mask, so a padded row is fed only its real tokens; the
        cache exposes one row at a time. Returns each row's last logits, (B, 1, V).
        ``scoring``: every position's logits, and the prompt tokens they predict scored.
        """
        last = end == self.length  # only the last chunk's logits are used
        rows = []
        try:
            for row in range(self.batch_size):
                pad = int(self.rows.pads[row])
                first = max(start, pad + int(self.rows.reused[row]))  # reused: already held
                if first >= end:  # this chunk is all padding for the row (never the last)
                    continue
                logits = self._run_row(row, first, end, end - first if scoring else 1)
                if scoring:
                    self._score_prompt(logits, np.asarray([row]), first)
                if last:
                    rows.append(logits[:, -1:].copy())
        finally:
            self._select(None)
        if not last:
            return np.empty((self.batch_size, 1, 0), dtype=np.float32)
        return np.concatenate(rows, axis=0)

    def _run_row(self, row: int, first: int, end: int, keep: int = 1) -> np.ndarray:
        """Feed ``row``'s columns [first, end) alone: the cache exposes that row (the
        caller selects all rows again when done), and the row is seen without its left
        padding, as the request alone (the mask is its real length so far, the
        positions count from its first real token)."""
        self._select(row)
        pad = int(self.rows.pads[row])
        mask = np.ones((1, end - pad), dtype=np.int64)
        positions = None
        if self.model.signature.has_position_ids:
            positions = np.arange(first - pad, end - pad, dtype=np.int64)[None]
        return self._run(self.rows.ids[row : row + 1, first:end], mask, positions, keep)

    def _run(
        self, input_ids: np.ndarray, mask: np.ndarray, positions: np.ndarray | None, keep: int = 1
    ) -> np.ndarray:
        """One forward: past (and present buffers, if the cache owns them) from the cache.

        The present buffers are asked for first: a cache that must grow to hold the
        forward's positions does so there, and then feeds its grown buffers as the past.
        """
        kv = self._kv
        if kv.masks is not None:  # the cache holds a subset: it says what the graph sees
            mask = self._cache_call(kv.masks.feed_mask, mask, input_ids.shape[1])
        presents = None
        if kv.presents is not None:
            presents = self._cache_call(kv.presents.outputs, mask.shape[1])
        past = self._cache_call(kv.cache.inputs)
        try:
            logits, presents = self._binding.forward(
                input_ids, mask, positions, past, presents, keep=keep
            )
        except Exception as exc:  # onnxruntime rejects what the cache fed, typically
            raise ComponentError(
                f"model forward failed at step {self.steps} with kv cache "
                f"{self.chain.cache_name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        self._cache_call(kv.cache.update, presents)
        return logits

    def _select(self, row: int | None) -> None:
        """``select(row)`` on a cache that feeds rows one by one (``SelectsRow``)."""
        if self._kv.selects is None:
            raise InputError(
                f"kv cache {self.chain.cache_name!r} cannot feed one row of a batch alone "
                "(it has no select(), the SelectsRow capability)"
            )
        self._cache_call(self._kv.selects.select, row)

    def _cache_call(self, method: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``method(*args)``, a bound method of the cache (typed by the protocol that
        declares it); what it raises becomes a ComponentError naming the cache, the
        method and the step."""
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            raise ComponentError(
                f"kv cache {self.chain.cache_name!r} failed in {method.__name__}() at step "
                f"{self.steps}: {type(exc).__name__}: {exc}"
            ) from exc
