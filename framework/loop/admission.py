"""Rows that join a running batch and leave it: continuous batching on the one step object.

An *open* ``Generation`` (``Generation.open()``) starts with no rows. ``admit()`` adds a
request as the last row: its prompt is prefilled alone through the feeding path every
prefill takes (``_run_row``: the cache exposes that row), its first token is picked by the
same processors, sampler, forced tokens, text and stopping code as every step, and it
is placed so that token is its unfed one, in the column every other row's newest token
is in; from the next ``step()`` it decodes with the others. ``release()`` drops finished
rows, filling their places with the last rows so few rows move. Each row runs its own
components and sees itself alone, without the batch's left padding (``solo`` chains), so
a request gives what it gives sent alone; a component that raises fails only its row
(``errors[row]``).

The KV cache must hold rows that come and go (the ``RowSlots`` capability: ``add_rows``,
``keep_rows``) and feed one of them alone (``SelectsRow``); it may shift its keys/values
with the columns (``ShiftsColumns``, as on concat graphs), and take prompt prefixes
other rows left (``ReusesRowPrefixes``, ``CopiesRows``).
The built-ins are ``slots`` (fused graphs) and ``concat_slots`` (optimum graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Self

import numpy as np

from ..errors import ComponentError, InputError
from ..model.session import ExportedModel
from ..protocols import RowSlots
from ..text import RowText, Tokenizer
from . import scoring
from .batch_kind import OPEN
from .cache_view import CacheView
from .chain import Chain
from .rows import RowState, one_row
from .step_fields import StepFields
from .step_record import StepRecord
from .step_report import Admitted

#: columns an open batch starts with (grown by doubling as rows need)
_START_COLUMNS = 64


class Admission(StepFields):
    """Rows joining and leaving a ``Generation`` (see module doc)."""

    @classmethod
    def open(
        cls,
        model: ExportedModel,
        cache: Chain,
        *,
        pad_token_id: int,
        tokenizer: Tokenizer | None = None,
    ) -> Self:
        """An empty batch whose rows join with ``admit()`` and leave with ``release()``;
        ``cache`` is a chain holding the KV cache every row shares (it must have the
        ``RowSlots`` and ``SelectsRow`` capabilities)."""
        kv = CacheView.of(cache.cache, cache.cache_name)
        if kv.slots is None or kv.selects is None:
            missing = "add_rows()/keep_rows(), the RowSlots" if kv.slots is None else ""
            missing = missing or "select(), the SelectsRow"
            raise InputError(
                f"kv cache {cache.cache_name!r} cannot hold rows that join and leave a batch "
                f"(it has no {missing} capability): continuous batching needs one, such as "
                "the built-in 'slots' or 'concat_slots'"
            )
        return cls(  # type: ignore[call-arg]  # Generation's constructor (the mixin's class)
            model, cache, (), max_length=0, pad_token_id=pad_token_id, tokenizer=tokenizer,
            batch=OPEN,
        )  # fmt: skip

    def _init_open(self) -> None:
        """An open batch's own fields (the constructor's ``OPEN`` branch)."""
        self.rows = RowState.empty(_START_COLUMNS, self.pad_token_id)
        self.length = 1  # column 0 is padding: a joining prompt always has room before it
        self.prompt_length = 0  # every real token's position is its column less its padding
        self.prefill_tokens = 0
        self._packed_prefill = False
        self._groups = []
        self.record = StepRecord(0, _START_COLUMNS)
        self._prefilled = {}
        #: rows that copied a held row's prefill of the same prompt (the n choices of one
        #: request), and prompt tokens rows took from prefixes the cache held
        self.shared_prefills = 0
        self.reused_tokens = 0
        self._init_following()
        self._init_speculation()

    def admit(self, prompt: Sequence[int], chain: Chain) -> Admitted:
        """Add a request as the last row (see module doc); returns what that did
        (``Admitted``: its row, which may already be finished by EOS or a one-token
        limit, or failed: ``errors[row]``; the prefill it shared or reused)."""
        with self._driver.hold("admit"):
            shared, reused = self.shared_prefills, self.reused_tokens
            row = self._admit(list(prompt), chain)
            return Admitted(row, self.shared_prefills > shared, self.reused_tokens - reused)

    def _admit(self, prompt: list[int], chain: Chain) -> int:
        if not self._batch.joins:
            raise InputError("admit() needs an open batch (Generation.open())")
        if not prompt:
            raise InputError("an empty prompt cannot join")
        if chain.cache is not self.chain.cache:
            raise InputError("a joining row must share the batch's KV cache")
        if self.fed >= self.length:  # every row held ended in a step that appended no
            self._open_column()  # column (all failed): the newcomer's token needs one
        if len(prompt) + 1 > self.length:  # room on the left for the prompt and a token
            self._shift_columns(len(prompt) + 1 - self.length)
        self.reserve(self.length + 2)
        row, end = self.batch_size, self.length - 1  # the prompt ends at the unfed column
        pad = end - len(prompt)
        ids = np.full(self.rows.ids.shape[1], self.pad_token_id, dtype=np.int64)
        mask = np.zeros(self.rows.ids.shape[1], dtype=np.int64)
        ids[pad:end] = prompt
        mask[pad : end + 1] = 1  # its first token goes into column ``end``
        text = (
            RowText(self.tokenizer, chain.stop_strings, history=[])
            if self.tokenizer is not None
            else None
        )
        self.rows.extend(one_row(ids, mask, pad, end, chain, text))
        self.record.extend(StepRecord(1, self.rows.ids.shape[1], **chain.record))
        self._solo.add(id(chain))
        self._regroup()
        self._note_components()
        self._cache_call(self._slots().add_rows, 1)
        failed: list[ComponentError] = []
        try:
            logits = self._prefill_joined(row, prompt, pad, end)
        except ComponentError as exc:  # the model refused this row's prompt: only it fails
            self._fail_rows(np.asarray([row]), exc, failed)
            return row
        self._first_pick(row, logits, failed)
        return row

    def _open_column(self) -> None:
        """One more column, padding for every row held, to be fed by the next step."""
        self.reserve(self.length + 1)
        self.rows.ids[:, self.length] = self.pad_token_id
        self.rows.mask[:, self.length] = 0
        self.length += 1

    def _prefill_joined(self, row: int, prompt: list[int], pad: int, end: int) -> np.ndarray:
        """The joining row's prompt fed alone (what the cache already holds skipped,
        unless the row asked for prompt logprobs: those need every position's logits);
        the last position's logits (1, V)."""
        kv = self._kv
        key = tuple(prompt)
        scoring = bool(self.record.prompt_tops[row] >= 0)
        held = self._prefilled.get(key) if not scoring else None
        if held is not None and kv.copies is not None:  # the same keys/values, exactly
            logits, source = held
            self._cache_call(kv.copies.copy_row, source, row, len(prompt))
            self.shared_prefills += 1
            return logits.copy()
        taken = 0
        if kv.row_prefixes is not None:
            if scoring:  # nothing taken; what the slot held before is forgotten
                self._cache_call(kv.row_prefixes.note_row, row, (), 0, self.prefill_chunk)
            else:
                reuse_row = kv.row_prefixes.reuse_row
                taken = int(self._cache_call(reuse_row, row, prompt, self.prefill_chunk))
        rows = np.asarray([row])
        try:
            for first in range(pad + taken, end, self.prefill_chunk):
                stop = min(end, first + self.prefill_chunk)
                logits = self._run_row(row, first, stop, stop - first if scoring else 1)
                if scoring:
                    self._score_prompt(logits, rows, first)
        finally:
            self._select(None)
        last = np.array(logits[:, -1, :], dtype=np.float32)
        if kv.row_prefixes is not None:
            note_row = kv.row_prefixes.note_row
            self._cache_call(note_row, row, prompt, taken, self.prefill_chunk)
        self.reused_tokens += taken
        self._prefilled[key] = (last, row)
        return last

    def _first_pick(self, row: int, logits: np.ndarray, failed: list[ComponentError]) -> None:
        """The joining row's step 0, alone, through the step's own code: its components
        on its prompt, the token written into the column the next batched forward
        feeds, what it asked to record, followers told, its text and stopping."""
        chain = self.rows.chains[row]
        rows = np.asarray([row])
        pad, end = int(self.rows.pads[row]), int(self.rows.prompt_end[row])
        self._refresh_forced([row], failed)
        queue = self.rows.forced[row]
        forced = np.asarray([queue[0] if queue else -1], dtype=np.int64)
        ids = self.rows.ids[row : row + 1, pad:end]
        picked = self._isolated(rows, failed, partial(self._pick_group, chain, ids, logits, forced))
        if picked is None:
            return
        next_ids, scores = picked
        token = int(next_ids[0])
        self.rows.ids[row, end] = token
        if self.record.wanted[row]:
            self.record.reserve(self.rows.ids.shape[1])
            self.record.record_row(end, row, token, scoring.dense(scores))
        # the rest through the step's own code, for this row alone
        column = np.full(self.batch_size, self.pad_token_id, dtype=np.int64)
        column[row] = token
        active = np.zeros(self.batch_size, dtype=bool)
        active[row] = True
        self._settle(column, active, scores, failed, only=(row,))
        used = np.full(self.batch_size, -1, dtype=np.int64)
        used[row] = forced[0]
        self._take_forced(used, failed, rows=[row])

    def _slots(self) -> RowSlots:
        """The cache's ``RowSlots`` capability (``open()`` checked that it has it)."""
        slots = self._kv.slots
        if slots is None:
            raise InputError("rows join and leave an open batch only (Generation.open())")
        return slots

    def release(self, rows: Sequence[int]) -> list[int]:
        """Drop ``rows``: each freed place takes one of the last rows, so few rows move.
        Returns the new order: new row ``i`` is old row ``order[i]``."""
        with self._driver.hold("release"):
            return self._release(rows)

    def _release(self, rows: Sequence[int]) -> list[int]:
        gone = set(rows)
        keep = [r for r in range(self.batch_size) if r not in gone]
        size = len(keep)
        order = list(range(size))
        holes = [r for r in sorted(gone) if r < size]
        tail = [r for r in keep if r >= size]
        for hole, source in zip(holes, tail, strict=True):
            order[hole] = source
        index = np.asarray(order, dtype=np.int64)
        self._cache_call(self._slots().keep_rows, index)
        self.rows.take(index)
        self.record.take(index)
        moved = {old: new for new, old in enumerate(order)}
        self._prefilled = {
            key: (logits, moved[row])
            for key, (logits, row) in self._prefilled.items()
            if row in moved
        }
        self._solo = {id(chain) for chain in self.rows.chains}
        self._regroup()
        self._note_components()
        if not size:  # a fresh binding: the old one held the cache's buffers it bound,
            self._binding = self.model.binding()  # which a cache may have let go (compact)
        # columns now padding for every row; nobody left: the next row starts afresh
        drop = int(self.rows.pads.min()) if size else self.length - 1
        if drop > 0:
            self._shift_columns(-drop)
        return order

    def _shift_columns(self, columns: int) -> None:
        """Add ``columns`` padding columns on the left (negative: drop them). On a
        shared-buffer graph the keys and values do not move (they never followed the
        columns); a cache whose positions follow the columns shifts too (``ShiftsColumns``)."""
        if self._kv.shifts is not None:
            self._cache_call(self._kv.shifts.shift, columns)
        self.rows.shift(columns, self.pad_token_id)
        self.record.shift(columns)
        self.length += columns
        self.fed += columns
