"""The serving engine's cache on fused graphs: one row slot per request, and the prompt
prefixes the slots hold, which a new request may start from instead of feeding them.

A shared-buffer graph keeps each row's keys/values from position 0 of its own slot, so a
slot's first ``n`` positions hold the keys/values of the first ``n`` tokens that were fed
into it, whatever row of which request fed them: they depend on those tokens alone. A
request whose prompt starts with tokens some slot holds (a system prompt, the chat
template's header, an earlier turn of the same conversation) copies them into its own slot
and prefills only the rest. Slots keep what they hold after their request has ended, until
a new request is placed in them, so requests sent one after another share a prefix too
(as llama.cpp's server reuses a slot's cached prompt).

What counts as held is only what a *prefill* computed: the positions of several-token
forwards. A decode step (one token per row) computes its position through another path
of the attention kernel, whose floats may differ in the last bits, so generated tokens are
never shared, and a prompt is only ever continued in several-token forwards: the rest of
a prompt fed after a shared prefix is at least two tokens long, and never ends in a
one-token chunk unless the request alone would too. On fp32 graphs the result then equals
a prefill of the whole prompt to float rounding (as any chunking does); on int8-activation
graphs it is bit-identical where onnxruntime's MatMulNBits computes each row alone (checked
by the tests on the machine they run on), and elsewhere may flip a near-tie, as a
different chunking of one prompt does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from ortgen.plugins.caches import StaticCache
from ortgen.plugins.kv_prefix import common_prefix_length

from ..errors import InputError
from ..feeding import PREFILL_CHUNK

__all__ = ["SlotCache", "exact_length", "shareable_count"]


def shareable_count(common: int, length: int, chunk: int = PREFILL_CHUNK) -> int:
    """How many of a ``length``-token prompt's first ``common`` tokens (those a slot holds)
    may be taken instead of fed, keeping every position a several-token forward's.

    Alone, the prompt is fed in chunks of ``chunk`` from position 0; with ``c`` tokens
    taken, in chunks of ``chunk`` from ``c``. The rest must be at least two tokens, and
    neither way may end in a one-token chunk: a prompt whose own last chunk would be one
    token (``length % chunk == 1``) shares nothing, and ``c`` steps back one token where
    the rest would end so.
    """
    if length % chunk == 1:
        return 0
    count = max(0, min(common, length - 2))
    if count and (length - count) % chunk == 1:
        count -= 1
    return count


def exact_length(length: int, taken: int, chunk: int = PREFILL_CHUNK) -> int:
    """Positions of a ``length``-token prefill (``taken`` of them copied in first) that
    several-token forwards computed: all but a last one-token chunk."""
    return length - 1 if (length - taken) % chunk == 1 else length


class SlotCache(StaticCache):
    """A static cache on a shared-buffer graph with room for ``max_batch`` rows, of which
    the first ``active`` are fed; each slot remembers the prompt prefix it holds."""

    def __init__(self, *, ctx: Any, capacity: int | None = None, share: bool = True) -> None:
        self._held: list[tuple[int, ...]] = [()] * ctx.batch_size
        super().__init__(ctx=ctx, capacity=capacity)
        if not self._shared:
            raise InputError("continuous batching needs a shared-buffer (fused) graph")
        #: whether requests start from prefixes other requests left (``--no-prefix-sharing``)
        self.share = share
        self.active = 1
        self.select(None)

    def _allocate(self, capacity: int) -> None:
        super()._allocate(capacity)
        if hasattr(self, "active"):  # grown: expose the active rows of the new buffers
            self.select(None)

    def _grow(self, needed: int) -> None:
        """Double the positions, copying only the rows in use: the free rows' pages
        stay untouched (GroupQueryAttention's prefill costs grow with the buffer's
        length, so the cache starts short and grows, rather than holding the whole
        context from the start). Free slots forget the prefixes they held."""
        held = [b[: self.active, :, : self._length].copy() for b in self._buffers]
        self._allocate(max(needed, 2 * self._capacity))
        for buffer, kept in zip(self._buffers, held, strict=True):
            buffer[: self.active, :, : kept.shape[2]] = kept
        self._held = [
            tokens[: self._length] if slot < self.active else ()
            for slot, tokens in enumerate(self._held)
        ]

    def select(self, row: int | None) -> None:
        if row is None:
            self._expose(
                [ort.OrtValue.ortvalue_from_numpy(b[: self.active]) for b in self._buffers]
            )
        else:
            super().select(row)

    def set_active(self, rows: int) -> None:
        """Feed the first ``rows`` rows (a row joined: it is the last one)."""
        if rows > self._rows:
            raise InputError(f"the batch is full ({self._rows} rows)")
        self.active = rows
        self.select(None)

    def copy_row(self, source: int, target: int, positions: int) -> None:
        """Row ``target`` takes row ``source``'s first ``positions`` keys/values."""
        if source != target:
            for buffer in self._buffers:
                buffer[target, :, :positions] = buffer[source, :, :positions]
        self._held[target] = self._held[source][:positions]
        self._length = max(self._length, positions)

    def keep(self, order: np.ndarray) -> None:
        """Row ``i`` becomes row ``order[i]``; rows past ``len(order)`` are dropped.
        ``order`` moves rows only down (a tail row into a freed slot), so copying in
        place never overwrites a row still to be moved. A slot no row moved into keeps
        its keys/values, and so the prefix it holds."""
        order = [int(source) for source in order]
        for target, source in enumerate(order):
            if source != target:
                for buffer in self._buffers:
                    buffer[target] = buffer[source]
        self._held = [self._held[s] for s in order] + self._held[len(order) :]
        self.set_active(len(order))

    def reorder(self, rows: np.ndarray) -> None:
        """Rows gathered (as beam search would): each slot's prefix goes with its row."""
        held = [self._held[int(r)] for r in np.asarray(rows).tolist()]
        super().reorder(rows)
        self._held = held + [()] * (self._rows - len(held))

    # -- prompt prefixes ------------------------------------------------------------

    def share_prefix(self, prompt: Sequence[int], slot: int, chunk: int = PREFILL_CHUNK) -> int:
        """Put the longest shareable prefix of ``prompt`` any slot holds into ``slot``
        (its own earlier prompt included); return how many tokens it holds now (0: the
        whole prompt is to be fed). Whatever else ``slot`` held is forgotten."""
        best, source = 0, slot
        if self.share:
            for other, tokens in enumerate(self._held):
                common = common_prefix_length(tokens, prompt)
                if common > best or (common == best and other == slot):
                    best, source = common, other
        count = shareable_count(best, len(prompt), chunk)
        if count:
            self.copy_row(source, slot, count)
        else:
            self._held[slot] = ()
        return count

    def note_prefill(
        self, slot: int, prompt: Sequence[int], taken: int, chunk: int = PREFILL_CHUNK
    ) -> None:
        """``slot`` was prefilled with ``prompt``, its first ``taken`` tokens shared."""
        self._held[slot] = tuple(prompt[: exact_length(len(prompt), taken, chunk)])

    def reuse(self, prompts: list[list[int]]) -> list[int]:
        """The prefix cache hook of ``Generation``: the first row of a new batch (slot 0)
        starts from the longest prefix a slot holds."""
        if len(prompts) != 1 or self.active != 1:
            return [0] * len(prompts)
        return [self.share_prefix(prompts[0], 0)]
