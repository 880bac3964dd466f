"""Continuous batching: requests join a running batch at a step boundary and leave it
the moment they finish.

A shared-buffer (fused) graph keeps each row's keys/values from position 0 and reads
each row's length from its attention mask, so rows of one batch need not line up: a new
request is prefilled alone into a free row of the cache (its prompt all but the last
token), and from the next step it decodes with the others, one token per row per
forward. Its components see its row alone, without the batch's left padding (``solo``
chains), so a request gives what it gives sent alone; a component that raises fails
only its own row.

The cache (:class:`~ortgen.serve.slots.SlotCache`) is preallocated for ``max_batch`` rows;
the OS backs only the pages rows touch, and a row that leaves is filled by the last row,
so leaving moves one row's keys/values, not the batch's. A joining row starts from the
longest prompt prefix any slot holds (a shared system prompt, the template's header) and
prefills only the rest (see ``slots``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ortgen.plugins.caches import DynamicCache, as_numpy

from .. import scoring
from ..chain import Chain
from ..errors import InputError
from ..generate import Generation
from ..model import ExportedModel
from ..step_record import log_softmax
from ..text import RowText, Tokenizer
from .slots import SlotCache


class ConcatSlots(DynamicCache):
    """The batch's keys/values on a concat (optimum) graph: a dynamic cache (one
    (rows, kv_heads, L, head_dim) tensor per past tensor, ``L`` the token buffer's
    columns fed so far) whose rows join and leave.

    On these graphs a row's keys/values follow its columns of the (left-padded) token
    buffer, and the graph concatenates each step's new position onto the past. A joining
    row is prefilled alone and placed right-aligned, its columns before masked off; the
    columns every row has as padding are trimmed when rows leave (``shift``).
    """

    def __init__(self, *, ctx: Any) -> None:
        if ctx.signature is None or ctx.signature.shared_kv:
            raise InputError("ConcatSlots is for concat (optimum) graphs")
        super().__init__(ctx=ctx)  # ctx is for one row: the empty past of a new batch
        self._empty = self._values[0]

    def empty_past(self) -> dict[str, np.ndarray]:
        """The past of one row with no positions yet (a joining row's prefill)."""
        return dict.fromkeys(self._names, self._empty)

    def set_active(self, rows: int) -> None:
        """Start over with one row and no positions (a new batch)."""
        if rows != 1:
            raise InputError("rows join a concat batch through add_row()")
        self._values = [self._empty] * len(self._names)
        self._length = 0

    def add_row(self, arrays: list[np.ndarray]) -> None:
        """A new last row with ``arrays`` (1, kv_heads, n, head_dim) as its last ``n``
        columns; the columns before are zeros (masked)."""
        joined = []
        for held, row in zip(map(as_numpy, self._values), arrays, strict=True):
            padded = np.zeros((1, *held.shape[1:]), dtype=held.dtype)
            padded[:, :, held.shape[2] - row.shape[2] :] = row
            joined.append(np.concatenate([held, padded]))
        self._values = joined

    def keep(self, order: np.ndarray) -> None:
        """Row ``i`` becomes row ``order[i]``; the others are dropped."""
        self.reorder(order)

    def shift(self, columns: int) -> None:
        """Add ``columns`` zero columns on the left (negative: drop that many)."""
        if columns > 0:
            pad = ((0, 0), (0, 0), (columns, 0), (0, 0))
            self._values = [np.pad(as_numpy(v), pad) for v in self._values]
        else:  # columns that are padding for every row
            kept = (as_numpy(v)[:, :, -columns:] for v in self._values)
            self._values = [np.ascontiguousarray(v) for v in kept]
        self._length += columns


class RowLogs:
    """Per row, the logprob of the token just chosen and its best alternatives, computed
    only for rows that asked (``top`` >= 0: that many alternatives)."""

    active = True

    def __init__(self) -> None:
        self.top: list[int] = []
        self.last: list[tuple[float, list[tuple[int, float]]] | None] = []

    def reserve(self, capacity: int) -> None:  # the loop's StepRecord hook; nothing to grow
        pass

    def forget_steps(self, count: int) -> None:
        pass

    def record(self, position: int, next_ids: np.ndarray, logits: Any, scores: Any) -> None:
        for row, top in enumerate(self.top):
            if top >= 0:
                self.record_row(row, int(next_ids[row]), scores[row])

    def record_row(self, row: int, token: int, scores: np.ndarray) -> None:
        """The logprob of ``token`` under ``scores`` (V,) and the ``top[row]`` best."""
        top = self.top[row]
        logprobs = log_softmax(scores[None, :])[0]
        best: list[tuple[int, float]] = []
        if top:
            ids = np.argpartition(-logprobs, top - 1)[:top]
            order = np.lexsort((ids, -logprobs[ids]))
            best = [(int(i), float(logprobs[i])) for i in ids[order]]
        self.last[row] = (float(logprobs[token]), best)


class ContinuousBatch(Generation):
    """A ``Generation`` whose rows are independent requests that join and leave."""

    def __init__(
        self,
        model: ExportedModel,
        chain: Chain,
        prompt: list[int],
        *,
        pad_token_id: int,
        tokenizer: Tokenizer | None,
        logprobs: int = -1,
    ) -> None:
        self._shared = model.signature.shared_kv
        if not isinstance(chain.cache, SlotCache if self._shared else ConcatSlots):
            raise InputError(
                "continuous batching needs the batch's own cache (SlotCache on fused "
                "graphs, ConcatSlots on optimum graphs)"
            )
        chain.cache.set_active(1)  # a cache kept from an earlier batch starts over
        self.errors: list[Exception | None] = [None]  # why each row failed, if it did
        super().__init__(
            model, chain, [prompt], max_length=len(prompt) + 2, pad_token_id=pad_token_id,
            tokenizer=tokenizer,
        )  # fmt: skip
        self._row_chains = [chain]
        self.record = RowLogs()  # type: ignore[assignment]
        self.record.top.append(logprobs)
        self.record.last.append(None)
        self._regroup()
        # prompt -> (its prefill's last logits, the row holding its keys/values): a row
        # joining with the same prompt (the n choices of one request) copies them
        self._prefilled: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
        self._first_prompt = tuple(prompt)
        self.shared_prefills = 0
        #: prompt tokens rows took from a prefix a slot held instead of feeding them
        self.reused_tokens = 0

    # -- joining and leaving ------------------------------------------------------------

    def join(self, prompt: list[int], chain: Chain, *, logprobs: int = -1) -> int:
        """Add a request as the last row: prefill its whole prompt alone (as ``generate``
        would), pick its first token with its own components, and place it so that token
        is this row's unfed one, in the column every other row's newest token is in.
        Returns the row; the row may already be finished (EOS, a one-token limit). Call
        between steps, after the first."""
        if not prompt:
            raise InputError("an empty prompt cannot join")
        if len(prompt) + 1 > self.length:  # room on the left for the prompt and a token
            self._shift(len(prompt) + 1 - self.length)
        row = self.batch_size
        end = self.length - 1  # the prompt ends where the others' unfed tokens are
        pad = end - len(prompt)
        if self._shared:
            self.chain.cache.set_active(row + 1)
        self.reserve(self.length + 2)
        width = self.ids.shape[1]
        ids = np.full((1, width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((1, width), dtype=np.int64)
        ids[0, pad:end] = prompt
        mask[0, pad : end + 1] = 1
        self.ids = np.concatenate([self.ids, ids])
        self.mask = np.concatenate([self.mask, mask])
        for name, value in (("_pads", pad), ("_reused", 0), ("_prompt_end", end)):
            setattr(self, name, np.append(getattr(self, name), value))
        self.unfinished = np.append(self.unfinished, True)
        self.finish_reasons.append(None)
        if self.tokenizer is not None:
            self._texts.append(RowText(self.tokenizer, chain.stop_strings, history=[]))
        self._row_chains.append(chain)
        self._forced.append([])
        self.errors.append(None)
        self.record.top.append(logprobs)
        self.record.last.append(None)
        self._regroup()
        key = tuple(prompt)
        if not self._shared:  # prefilled alone, then placed in the batch's columns
            logits, arrays = self._prefill_alone(prompt)
            self.chain.cache.add_row(arrays)
        elif key in self._prefilled:  # the same prompt is held: the same keys/values, exactly
            logits, source = self._prefilled[key]
            self.chain.cache.copy_row(source, row, len(prompt))
            self.shared_prefills += 1
        else:  # from the longest prefix a slot holds, if any: the rest is fed
            taken = self.chain.cache.share_prefix(prompt, row, self.prefill_chunk)
            logits = self._prefill_row(row, pad + taken, end)
            self.chain.cache.note_prefill(row, prompt, taken, self.prefill_chunk)
            self.reused_tokens += taken
            self._prefilled[key] = (logits, row)
        self._first_token(row, logits)
        return row

    def last_token(self, row: int) -> int:
        """The newest token of ``row`` (its first one right after it joined)."""
        return int(self.ids[row, self._end(row) - 1])

    def _first_token(self, row: int, logits: np.ndarray) -> None:
        """The joining row's step 0, alone: its components on its prompt, the token
        written into the column the next batched forward feeds, its text and stopping."""
        chain = self._row_chains[row]
        pad, end = int(self._pads[row]), int(self._prompt_end[row])
        rows = np.asarray([row])
        try:
            self._refresh_forced([row])
            forced = np.asarray([self._forced[row][0] if self._forced[row] else -1])
            ids = self.ids[row : row + 1, pad:end]
            picked, held = self._pick_group(chain, ids, logits, forced)
            scores = scoring.dense(held)
            token = int(picked[0])
            self.ids[row, end] = token
            self._advance_row(row, token)
            if forced[0] >= 0:
                self._forced[row].pop(0)
            self._refresh_forced([row])
        except Exception as exc:  # its own component: only this row fails
            self.errors[row] = exc
            self.finish(row, "error")
            return
        if self.record.top[row] >= 0:
            self.record.record_row(row, token, scores[0])
        stopped = bool(self._texts) and self._texts[row].push(token)
        self._stop_group(rows, chain, self.ids[row : row + 1, pad : end + 1], scores)
        if self.errors[row] is not None:
            self.finish(row, "error")
        elif stopped:
            self.finish(row, "stop_string")

    def leave(self, rows: list[int]) -> list[int]:
        """Drop finished rows: each freed slot takes the last rows, so few rows move.
        Returns the new order: new row ``i`` is old row ``order[i]``."""
        gone = set(rows)
        keep = [r for r in range(self.batch_size) if r not in gone]
        size = len(keep)
        order = list(range(size))
        holes = [r for r in sorted(gone) if r < size]
        tail = [r for r in keep if r >= size]
        for hole, source in zip(holes, tail, strict=True):
            order[hole] = source
        index = np.asarray(order, dtype=np.int64)
        self.chain.cache.keep(index)
        self.ids, self.mask = self.ids[index], self.mask[index]
        for name in ("_pads", "_reused", "_prompt_end", "unfinished"):
            setattr(self, name, getattr(self, name)[index])
        for name in ("finish_reasons", "_texts", "_row_chains", "errors", "_forced"):
            values = getattr(self, name)
            if values:
                setattr(self, name, [values[i] for i in order])
        moved = {old: new for new, old in enumerate(order)}
        self._prefilled = {
            key: (logits, moved[row])
            for key, (logits, row) in self._prefilled.items()
            if row in moved
        }
        self.record.top = [self.record.top[i] for i in order]
        self.record.last = [self.record.last[i] for i in order]
        self._finished_at = {}
        self._regroup()
        if size and int(self._pads.min()) > 0:  # columns now padding for every row
            self._shift(-int(self._pads.min()))
        return order

    # -- one step -----------------------------------------------------------------------

    def step(self) -> np.ndarray:
        """One token per row; a row whose component raised finishes with "error"."""
        self.reserve(self.length + 2)  # rows end by their own limits, not the buffer's
        next_ids = super().step()
        for row, error in enumerate(self.errors):
            if error is not None and self.unfinished[row]:
                self.finish(row, "error")
        return next_ids

    def _forward(self) -> np.ndarray:
        first = self.steps == 0 and self._shared
        taken = int(self._reused[0]) if first else 0  # what the slot's prefix spared
        logits = super()._forward()
        if first:  # the first row's prefill: copies may share it, and later prompts its prefix
            self._prefilled[self._first_prompt] = (np.array(logits[:1], dtype=np.float32), 0)
            self.chain.cache.note_prefill(0, self._first_prompt, taken, self.prefill_chunk)
            self.reused_tokens += taken
        return logits

    def _skips_forward(self, forced: np.ndarray) -> bool:
        """Forced tokens cost a forward each here: a step without one would run every
        row's sampler outside the per-row error isolation of ``_pick``."""
        return False

    def _advance(self, tokens: list[list[int]]) -> None:
        """Tell each row's followers its tokens; a follower that fails ends its row only."""
        for row, chain in enumerate(self._row_chains):
            if not chain.followers or self.errors[row] is not None or not tokens[row]:
                continue
            try:
                for name, component in chain.followers:
                    self._tell("advance", name, component, [tokens[row]])
            except Exception as exc:
                self.errors[row] = exc

    def _refresh_forced(self, rows) -> None:
        """Ask each row's forcers apart, so one that fails ends its row only."""
        for row in list(rows):
            if self.errors[row] is not None:
                continue
            try:
                super()._refresh_forced([row])
            except Exception as exc:
                self.errors[row] = exc

    def _advance_row(self, row: int, token: int) -> None:
        """Tell the row's followers its first token (the batch's step tells the rest)."""
        tokens: list[list[int]] = [[] for _ in range(self.batch_size)]
        tokens[row] = [token]
        self._advance(tokens)

    def _pick(
        self, input_ids: np.ndarray, logits: np.ndarray, forced: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        next_ids = np.full(self.batch_size, self.pad_token_id, dtype=np.int64)
        # each row's processed scores go over its logits: after the pick nothing reads
        # the raw ones (the first row's prefill logits were copied), and a row whose
        # chain changed nothing (greedy, no processors) costs no copy at all
        scores = logits
        for rows, chain in self._groups:
            row = int(rows[0])
            if self.errors[row] is not None:
                continue
            try:
                ids, row_logits = self._group_view(rows, chain, input_ids, logits)
                row_forced = forced[rows] if forced is not None else None
                picked, row_scores = self._pick_group(chain, ids, row_logits, row_forced)
            except Exception as exc:  # this request's component: only its row fails
                self.errors[row] = exc
                continue
            next_ids[row] = picked[0]
            if row_scores is not row_logits:
                scores[row] = scoring.dense(row_scores)[0]
        return next_ids, scores

    def _stop_group(self, rows, chain, ids, scores) -> None:  # type: ignore[override]
        row = int(rows[0])
        if self.errors[row] is not None:
            return
        try:
            super()._stop_group(rows, chain, ids, scores)
        except Exception as exc:
            self.errors[row] = exc

    # -- internals ------------------------------------------------------------------------

    def _regroup(self) -> None:
        self._groups = [(np.asarray([r]), c) for r, c in enumerate(self._row_chains)]
        self._solo = {id(c) for c in self._row_chains}
        self._note_components()

    def _prefill_row(self, row: int, start: int, end: int) -> np.ndarray:
        """Feed the row's columns [start, end) alone, in chunks of ``prefill_chunk`` as
        ``generate`` does; returns the last position's logits (1, V)."""
        try:
            for first in range(start, end, self.prefill_chunk):
                logits = self._run_row(row, first, min(end, first + self.prefill_chunk))
        finally:
            self._cache_call("select", None)
        return np.array(logits[:, -1, :], dtype=np.float32)

    def _prefill_alone(self, prompt: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        """A concat graph's prefill of ``prompt`` as a request alone (positions from 0, in
        chunks of ``prefill_chunk``): the last position's logits (1, V) and its keys and
        values (1, kv_heads, len(prompt), head_dim) per past tensor."""
        has_positions = self.model.signature.has_position_ids
        past = self.chain.cache.empty_past()
        ids = np.asarray([prompt], dtype=np.int64)
        for first in range(0, len(prompt), self.prefill_chunk):
            last = min(len(prompt), first + self.prefill_chunk)
            positions = np.arange(first, last)[None] if has_positions else None
            mask = np.ones((1, last), dtype=np.int64)
            logits, presents = self.model.forward(ids[:, first:last], mask, positions, past)
            past = dict(zip(past, (as_numpy(p) for p in presents), strict=True))
        arrays = list(past.values())
        return np.array(logits[:, -1, :], dtype=np.float32), arrays

    def _shift(self, columns: int) -> None:
        """Add ``columns`` padding columns on the left (negative: drop them). On a
        shared-buffer graph the keys and values do not move (they never followed the
        columns); on a concat graph they do."""
        if not self._shared:
            self.chain.cache.shift(columns)
        if columns > 0:
            self.ids = np.pad(self.ids, ((0, 0), (columns, 0)), constant_values=self.pad_token_id)
            self.mask = np.pad(self.mask, ((0, 0), (columns, 0)))
        else:
            self.ids, self.mask = self.ids[:, -columns:], self.mask[:, -columns:]
        self.length += columns
        self.fed += columns
        self.prompt_length += columns
        self._pads += columns
        self._prompt_end += columns
