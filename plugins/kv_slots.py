"""KV caches whose rows come and go: ``slots`` (fused graphs) and ``concat_slots``
(optimum graphs), for continuous batching (``Generation.open()``, ``ortgen serve``).

Both have the ``RowSlots`` capability (``add_rows``/``keep_rows``): a request joins as a
new row, is prefilled alone through ``select(row)``, decodes with the others, and its row
is dropped when it ends.

``slots``: a shared-buffer graph keeps each row's keys/values from position 0 of its own
slot, so a slot's first ``n`` positions hold the keys/values of the first ``n`` tokens
fed into it, whatever request fed them: they depend on those tokens alone. A request
whose prompt starts with tokens some slot holds (a system prompt, the chat template's
header, an earlier turn of the same conversation) copies them into its own slot and
prefills only the rest (``reuse_row``). Slots keep what they hold after their request
ended, until a new row is placed in them, so requests sent one after another share a
prefix too (as llama.cpp's server reuses a slot's cached prompt). Only what a *prefill*
computed counts as held: the positions of several-token forwards. A decode step computes
its position through another path of the attention kernel, whose floats may differ in
the last bits, so generated tokens are never shared, and a prompt is only continued in
several-token forwards: the rest fed after a shared prefix is at least two tokens, and
never ends in a one-token chunk unless the request alone would too. On fp32 graphs the
result then equals a prefill of the whole prompt to float rounding (as any chunking
does); on int8-activation graphs it is bit-identical where onnxruntime's MatMulNBits
computes each row alone (checked by the tests on the machine they run on).

``concat_slots``: on a concat graph a row's keys/values follow its columns of the
(left-padded) token buffer and the graph concatenates each step's position onto the past.
A joining row is prefilled alone (``select(row)``: its own past, from empty) and placed
right-aligned in the batch, its earlier columns masked off; columns that are padding for
every row are trimmed when rows leave (``shift``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from ortgen import GenerationContext, KVCacheFactory, Register, hookimpl

from .caches import DynamicCache, StaticCache, as_numpy
from .kv_prefix import common_prefix_length

#: most positions one forward feeds (the loop's prefill chunk, ``ortgen.loop.feeding``)
DEFAULT_CHUNK = 256


def shareable_count(common: int, length: int, chunk: int = DEFAULT_CHUNK) -> int:
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


def exact_length(length: int, taken: int, chunk: int = DEFAULT_CHUNK) -> int:
    """Positions of a ``length``-token prefill (``taken`` of them copied in first) that
    several-token forwards computed: all but a last one-token chunk."""
    return length - 1 if (length - taken) % chunk == 1 else length


class SlotCache(StaticCache):
    """A static cache on a shared-buffer graph with room for ``ctx.batch_size`` rows, of
    which the first ``active`` are fed; each slot remembers the prompt prefix it holds.

    Args:
        capacity: positions per slot to start with (grown by doubling as rows need;
            default the context's ``max_length``).
        share: whether a joining row starts from a prefix another slot holds.
        compact: when the last row leaves, keep only the prefix of the slot that held
            the longest one of the rows leaving (the conversation that just ended; its
            next turn still starts from it), in buffers of the fewest positions that
            hold it (``capacity`` doubled as needed). The other slots' keys/values go
            back to the OS, so an idle server's RSS does not stay at ``max_batch`` long
            prompts. False: every slot keeps its prefix and the buffers keep their size.
        keep_bytes: with ``compact``, the most bytes of keys/values the kept prefix may
            hold: a longer one is cut to its first ``keep_bytes // position_bytes``
            tokens (a next turn then shares those and prefills the rest). None: no cap.
    """

    def __init__(
        self,
        *,
        ctx: GenerationContext,
        capacity: int | None = None,
        share: bool = True,
        compact: bool = True,
        keep_bytes: int | None = None,
    ) -> None:
        for name, value in (("share", share), ("compact", compact)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        if keep_bytes is not None and (
            isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int) or keep_bytes < 0
        ):
            raise ValueError(
                f"keep_bytes must be a non-negative integer (or unset), got {keep_bytes!r}"
            )
        self._held: list[tuple[int, ...]] = [()] * ctx.batch_size
        self.active = 0  # before the buffers: allocating exposes the active rows
        super().__init__(ctx=ctx, capacity=capacity)
        if not self._shared:
            raise ValueError(
                "the slots cache is for shared-buffer (fused) graphs; use concat_slots"
            )
        self.share = share
        self.compact = compact
        self.keep_bytes = keep_bytes
        self._first_capacity = self._capacity

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
        if row is None:  # the active rows, not every slot
            self._selected = None
            self._expose(
                [ort.OrtValue.ortvalue_from_numpy(b[: self.active]) for b in self._buffers]
            )
        else:
            super().select(row)

    # -- rows that come and go (RowSlots) ------------------------------------------------

    def add_rows(self, count: int) -> None:
        """``count`` more rows are fed (a request joined: it is the last row)."""
        if self.active + count > self._rows:
            raise ValueError(f"the batch is full ({self._rows} rows)")
        self.active += count
        self.select(None)

    def keep_rows(self, order: np.ndarray) -> None:
        """Row ``i`` becomes row ``order[i]``; rows past ``len(order)`` are dropped.
        ``order`` moves rows only down (a tail row into a freed slot), so copying in
        place never overwrites a row still to be moved. A slot no row moved into keeps
        its keys/values, and so the prefix it holds."""
        sources = [int(source) for source in order]
        if not sources and self.compact:
            self._keep_one(self.active)
            return
        held = self._length  # no row holds more: the positions past it stay untouched
        for target, source in enumerate(sources):
            if source != target:
                for buffer in self._buffers:
                    buffer[target, :, :held] = buffer[source, :, :held]
        self._held = [self._held[s] for s in sources] + self._held[len(sources) :]
        self.active = len(sources)
        self.select(None)

    def _keep_one(self, leaving: int) -> None:
        """Every row left (the first ``leaving`` slots held them): slot 0 keeps the
        longest prefix of theirs (cut to ``keep_bytes``), in new buffers of the fewest
        positions that hold it; the old buffers are freed (``compact``)."""
        slot = max(range(leaving), key=lambda s: len(self._held[s]), default=0)
        kept = self._held[slot] if leaving else ()
        if self.keep_bytes is not None:  # any prefix of a prefill's positions is exact too
            kept = kept[: self.keep_bytes // self.position_bytes]
        saved = [b[slot, :, : len(kept)].copy() for b in self._buffers]
        capacity = self._first_capacity
        while capacity < len(kept):
            capacity *= 2
        self.active = 0
        self._selected = None
        self._allocate(capacity)
        for buffer, positions in zip(self._buffers, saved, strict=True):
            buffer[0, :, : len(kept)] = positions
        self._held = [kept] + [()] * (self._rows - 1)
        self._length = len(kept)

    def copy_row(self, source: int, target: int, positions: int) -> None:
        """Row ``target`` takes row ``source``'s first ``positions`` keys/values."""
        if source != target:
            for buffer in self._buffers:
                buffer[target, :, :positions] = buffer[source, :, :positions]
        self._held[target] = self._held[source][:positions]
        self._length = max(self._length, positions)

    def reuse_row(self, row: int, prompt: Sequence[int], chunk: int = DEFAULT_CHUNK) -> int:
        """Put the longest shareable prefix of ``prompt`` any slot holds into ``row``
        (its own earlier prompt included); return how many tokens it holds now (0: the
        whole prompt is to be fed). Whatever else ``row`` held is forgotten."""
        best, source = 0, row
        if self.share:
            for other, tokens in enumerate(self._held):
                common = common_prefix_length(tokens, prompt)
                if common > best or (common == best and other == row):
                    best, source = common, other
        count = shareable_count(best, len(prompt), chunk)
        if count:
            self.copy_row(source, row, count)
        else:
            self._held[row] = ()
        return count

    def note_row(
        self, row: int, prompt: Sequence[int], taken: int, chunk: int = DEFAULT_CHUNK
    ) -> None:
        """``row`` was prefilled with ``prompt``, its first ``taken`` tokens shared."""
        self._held[row] = tuple(prompt[: exact_length(len(prompt), taken, chunk)])

    def reorder(self, rows: np.ndarray) -> None:
        """Rows gathered (as beam search would): each slot's prefix goes with its row."""
        held = [self._held[int(r)] for r in np.asarray(rows).tolist()]
        super().reorder(rows)
        self._held = held + [()] * (self._rows - len(held))


class ConcatSlots(DynamicCache):
    """The batch's keys/values on a concat (optimum) graph: one (rows, kv_heads, L,
    head_dim) tensor per past tensor, ``L`` the token buffer's columns fed so far, whose
    rows join and leave (see module doc). Starts with no rows."""

    def __init__(self, *, ctx: GenerationContext) -> None:
        if ctx.signature is None or ctx.signature.shared_kv:
            raise ValueError("the concat_slots cache is for concat (optimum) graphs; use slots")
        super().__init__(ctx=ctx)
        self._values = [np.asarray(v)[:0] for v in self._values]
        self._joining: int | None = None  # the row being prefilled alone
        self._row_values: list[Any] = []

    def inputs(self) -> dict[str, Any]:
        if self._joining is not None:
            return dict(zip(self._names, self._row_values, strict=True))
        return super().inputs()

    def update(self, presents: list[Any]) -> None:
        if self._joining is not None:
            self._row_values = [as_numpy(p) for p in presents]
            return
        super().update(presents)

    def select(self, row: int | None) -> None:
        """``row``: prefill it alone, from an empty past; None: place what it computed
        right-aligned in its row (its columns end where the batch's fed columns end)."""
        if row is not None:
            self._joining = row
            empty = self._values[0]
            shape = (1, empty.shape[1], 0, empty.shape[3])
            self._row_values = [np.zeros(shape, dtype=empty.dtype) for _ in self._names]
            return
        if self._joining is None:
            return
        row, self._joining = self._joining, None
        placed = []
        for held, own in zip(map(as_numpy, self._values), self._row_values, strict=True):
            held = np.array(held)  # the batch's past as an array of its own, to write into
            held[row] = 0
            held[row, :, held.shape[2] - own.shape[2] :] = own[0]
            placed.append(held)
        self._values = placed

    def add_rows(self, count: int) -> None:
        """``count`` new last rows, their columns all zeros (masked until prefilled)."""
        grown = []
        for held in map(as_numpy, self._values):
            zeros = np.zeros((count, *held.shape[1:]), dtype=held.dtype)
            grown.append(np.concatenate([held, zeros]))
        self._values = grown

    def keep_rows(self, order: np.ndarray) -> None:
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


@hookimpl
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    register("slots", SlotCache)
    register("concat_slots", ConcatSlots)
