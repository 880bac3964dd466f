"""The ``sliding_window`` KV cache: the first ``sink`` positions plus the last ones, in
flat memory however long the generation runs.

Each step attends to at most ``window`` positions counting the new token itself (the
last ``window - 1`` cached ones, as transformers' sliding-window layers keep), plus the
row's first ``sink`` tokens (StreamingLLM's attention sinks, Xiao et al. 2023). The
loop is unchanged: the cache says which past the graph sees by the mask it feeds
(``feed_mask``), and positions stay what the loop computes.

Two graph families, two ways of holding the window:

- ``concat`` (optimum) graphs take ``position_ids``, so every key keeps its true
  position. Keys sit in a ring of ``window - 1`` slots (attention does not care about
  slot order; a chunk of several tokens gets the ring in time order first). For a model
  whose config declares this sliding window (Mistral, Qwen2 with ``use_sliding_window``)
  and no sink, this is exactly what the model computes with a full cache.
- ``shared`` (fused, GroupQueryAttention) graphs take no positions: a token's position
  is its slot. When the window moves, the kept keys move back in the buffer and are
  re-rotated by the same amount (``R(-s)``, exact for rotary embeddings), so positions
  are relative to the window, as StreamingLLM does: generation can go past the model's
  trained context. That costs O(window) per step, like transformers' old SinkCache.

Anything but the first case is an approximation of full attention, and says so.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnxruntime as ort

from ortgen import GenerationContext, KVCacheFactory, Register, hookimpl
from ortgen.checks import graph_signature, is_int

from ._rope import KeyShifter, inverse_frequencies
from .caches import as_numpy, copy_arrays


def declared_window(config: Any) -> int | None:
    """The sliding window the model's config declares (None: full attention)."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or config.get("use_sliding_window") is False:
        return None
    return window


def sliding_window_cache(
    *, ctx: GenerationContext, window: int | None = None, sink: int = 0, evict: int = 1
) -> RingWindowCache | SharedWindowCache:
    """The ``sliding_window`` backend for the model's graph family (see module doc).

    Args:
        window: positions each step attends to, the new one included (default: the
            model's declared ``sliding_window``; required when it declares none).
        sink: first tokens of each row kept for good (default 0; StreamingLLM uses 4).
        evict: fused graphs: positions dropped at once when the window is full (default
            1). Moving the window costs O(window) there, so dropping 8 or 16 at a time
            divides that cost for a window that briefly spans fewer positions. Optimum
            graphs move their window for free, one position at a time, and ignore it.
    """
    signature = graph_signature(ctx, "sliding_window")
    declared = declared_window(ctx.model_config)
    window = declared if window is None else window
    if window is None:
        raise ValueError(
            "window is required: the model's config declares no sliding_window "
            "(e.g. cache={'name': 'sliding_window', 'window': 512, 'sink': 4})"
        )
    if not is_int(window) or window < 2:
        raise ValueError(f"window must be an integer of at least 2, got {window!r}")
    if not is_int(sink) or sink < 0:
        raise ValueError(f"sink must be a non-negative integer, got {sink!r}")
    if not is_int(evict) or not 1 <= evict < window:
        raise ValueError(f"evict must be an integer in [1, window), got {evict!r}")
    shared = signature.shared_kv
    exact = declared == window and sink == 0 and not shared
    if not exact:
        warnings.warn(
            f"sliding_window (window={window}, sink={sink}) approximates full attention "
            f"for this model (declared sliding window: {declared}); output differs from "
            "the full cache once the sequence outgrows the window",
            stacklevel=4,
        )
    if shared:
        return SharedWindowCache(ctx, window, sink, exact=exact, evict=evict)
    return RingWindowCache(ctx, window, sink, exact=exact)


class SlidingWindowFactory:
    """The registered ``sliding_window`` factory: ``sliding_window_cache`` with the
    ``LiftsContext`` capability declared as a method."""

    def __call__(
        self, *, ctx: GenerationContext, window: int | None = None, sink: int = 0, evict: int = 1
    ) -> RingWindowCache | SharedWindowCache:
        """See ``sliding_window_cache``."""
        return sliding_window_cache(ctx=ctx, window=window, sink=sink, evict=evict)

    def lifts_context(self, signature: Any) -> bool:
        """On fused graphs positions stay within the window: generation may outgrow the
        model's trained context (StreamingLLM). Optimum graphs keep true positions."""
        return bool(signature.shared_kv)


class _WindowBase:
    """What both layouts share: the parameters, the signature and the byte count."""

    arrays: list[np.ndarray]
    seen: int
    max_feed: int | None = None

    def __init__(self, ctx: GenerationContext, window: int, sink: int, *, exact: bool) -> None:
        self.signature = graph_signature(ctx, "sliding_window")
        self.window, self.sink, self.exact = window, sink, exact

    @property
    def length(self) -> int:
        """Positions seen (fed) so far, held or not."""
        return self.seen

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


class RingWindowCache(_WindowBase):
    """concat graphs: [sink slots | ring of window - 1 slots] per row, fed whole, masked."""

    def __init__(self, ctx: GenerationContext, window: int, sink: int, *, exact: bool) -> None:
        super().__init__(ctx, window, sink, exact=exact)
        sig = self.signature
        self.ring = window - 1
        slots = self.sink + self.ring
        shape = (ctx.batch_size, sig.num_kv_heads, slots, sig.head_dim)
        self.arrays = [np.zeros(shape, sig.kv_dtype) for _ in sig.past_inputs]
        self._names = sig.past_inputs
        self._slot_mask = np.zeros((ctx.batch_size, slots), dtype=np.int64)
        self._sunk = np.zeros(ctx.batch_size, dtype=np.int64)  # real tokens in sink slots
        self._sink_end = np.zeros(ctx.batch_size, dtype=np.int64)  # columns before: sunk
        self._next = 0  # ring slot the next column goes to
        self._new_mask = np.zeros((ctx.batch_size, 0), dtype=np.int64)
        self.seen = 0

    @property
    def held(self) -> int:
        return int(self._slot_mask.sum(axis=1).max(initial=0))

    def feed_mask(self, mask: np.ndarray, new: int) -> np.ndarray:
        if new > 1 and self.seen > self.ring:  # wrapped: time order for causal chunks
            self._roll_to_time_order()
        self._new_mask = mask[:, mask.shape[1] - new :]
        return np.concatenate([self._slot_mask, self._new_mask], axis=1)

    def inputs(self) -> dict[str, Any]:
        return dict(zip(self._names, self.arrays, strict=True))

    def update(self, presents: list[Any]) -> None:
        new = self._new_mask.shape[1]
        slots = self._slot_mask.shape[1]
        values = [as_numpy(p)[:, :, slots:] for p in presents]
        if self.sink and (self._sunk < self.sink).any():
            self._fill_sinks(values)
        keep = min(new, self.ring)  # only the last ring-full of a long chunk stays
        targets = self.sink + (self._next + np.arange(new - keep, new)) % self.ring
        for array, value in zip(self.arrays, values, strict=True):
            array[:, :, targets] = value[:, :, new - keep :]
        mask = self._new_mask[:, new - keep :].copy()
        if self.sink:  # a token held as a sink must not be attended twice
            column = np.arange(self.seen + new - keep, self.seen + new)
            mask[column[None, :] < self._sink_end[:, None]] = 0
        self._slot_mask[:, targets] = mask
        self._next = (self._next + new) % self.ring
        self.seen += new

    def _fill_sinks(self, values: list[np.ndarray]) -> None:
        """Copy each row's first real tokens into its sink slots (rows are padded
        differently, so this is per row; it runs only until the sinks are full)."""
        for row in np.flatnonzero(self._sunk < self.sink).tolist():
            real = np.flatnonzero(self._new_mask[row])[: self.sink - self._sunk[row]]
            if not len(real):
                continue
            slots = self._sunk[row] + np.arange(len(real))
            for array, value in zip(self.arrays, values, strict=True):
                array[row, :, slots] = value[row, :, real]  # (tokens, heads, head_dim)
            self._slot_mask[row, slots] = 1
            self._sunk[row] += len(real)
            self._sink_end[row] = self.seen + int(real[-1]) + 1

    def _roll_to_time_order(self) -> None:
        shift = -self._next
        ring = slice(self.sink, self.sink + self.ring)
        for array in self.arrays:
            array[:, :, ring] = np.roll(array[:, :, ring], shift, axis=2)
        self._slot_mask[:, ring] = np.roll(self._slot_mask[:, ring], shift, axis=1)
        self._next = 0

    def fork(self) -> RingWindowCache:
        """An independent copy holding the same window (``Generation.fork``)."""
        return copy_arrays(self)

    def reorder(self, rows: np.ndarray) -> None:
        self.arrays = [np.ascontiguousarray(a[rows]) for a in self.arrays]
        self._slot_mask = self._slot_mask[rows]
        self._sunk = self._sunk[rows]
        self._sink_end = self._sink_end[rows]

    def crop(self, length: int) -> None:
        drop = self.seen - length
        if not 0 <= drop <= self.seen:
            raise ValueError(f"cannot crop a cache of {self.seen} positions to {length}")
        if self.seen > self.ring and drop:
            raise ValueError(
                f"cannot rewind a sliding window of {self.ring + 1} past positions it already "
                f"dropped ({self.seen} seen); rewind before the window fills or use another cache"
            )
        if drop:
            self._next = length % self.ring
            self._slot_mask[:, self.sink + self._next : self.sink + self.seen] = 0
            for row in np.flatnonzero(self._sink_end > length).tolist():
                self._rebuild_sinks(row, length)  # sinks taken from dropped columns go too
        self.seen = length

    def _rebuild_sinks(self, row: int, length: int) -> None:
        """After a rewind: the row's sink tokens at columns >= length are forgotten."""
        # sink slots were filled in column order; keep those whose column is < length
        kept = int(self._sunk[row] - (self._sink_end[row] - length).clip(0, None))
        kept = max(kept, 0)
        self._slot_mask[row, kept : self.sink] = 0
        self._sunk[row] = kept
        self._sink_end[row] = min(self._sink_end[row], length)


class SharedWindowCache(_WindowBase):
    """fused graphs: one buffer per tensor bound as past and present (the graph writes
    the new keys/values at each row's slot); the window moves by shifting and
    re-rotating the kept keys.

    All layers' keys live in one array and all values in another, so moving the window
    is a few numpy operations whatever the layer count; ``evict`` positions go at once,
    so that work happens once every ``evict`` steps (the window then spans between
    ``window - evict + 1`` and ``window`` positions).
    """

    def __init__(
        self, ctx: GenerationContext, window: int, sink: int, *, exact: bool, evict: int = 1
    ) -> None:
        super().__init__(ctx, window, sink, exact=exact)
        sig = self.signature
        self.capacity = self.sink + self.window  # the window's tokens plus the new one
        self.evict = evict
        layers = sig.num_layers
        shape = (layers, ctx.batch_size, sig.num_kv_heads, self.capacity, sig.head_dim)
        self._k: np.ndarray = np.zeros(shape, sig.kv_dtype)
        self._v: np.ndarray = np.zeros(shape, sig.kv_dtype)
        self._shifter = KeyShifter(
            inverse_frequencies(ctx.model_config, sig.head_dim), np.dtype(sig.kv_dtype)
        )
        self._names = sig.past_inputs
        self._counts = np.zeros(ctx.batch_size, dtype=np.int64)  # positions held per row
        self._seen = np.zeros(ctx.batch_size, dtype=np.int64)  # positions fed per row
        self._evicted = False
        self._selected: int | None = None
        self._pending = 0
        # a chunk may take half the window: each of its tokens still sees at least the
        # other half of the window (decode steps see all of it)
        self.max_feed = max(1, self.window // 2)
        self._bind()

    @property
    def arrays(self) -> list[np.ndarray]:  # type: ignore[override]
        return [self._k, self._v]

    @property
    def held(self) -> int:
        return int(self._counts.max(initial=0))

    @property
    def seen(self) -> int:  # type: ignore[override]
        return int(self._seen.max(initial=0))

    def _bind(self, row: int | None = None) -> None:
        rows = slice(None) if row is None else slice(row, row + 1)
        views = []
        for name in self._names:  # past_key_values.{layer}.{key|value}
            layer = int(name.split(".")[1])
            views.append((self._k if name.endswith(".key") else self._v)[layer, rows])
        self._values = [ort.OrtValue.ortvalue_from_numpy(v) for v in views]
        self._feeds = dict(zip(self._names, self._values, strict=True))

    def select(self, row: int | None) -> None:
        self._selected = row
        self._bind(row)

    def fork(self) -> SharedWindowCache:
        """An independent copy holding the same window, bound to buffers of its own."""
        twin = copy_arrays(self)
        twin._bind(twin._selected)
        return twin

    def _rows(self) -> np.ndarray:
        return (
            np.arange(len(self._counts)) if self._selected is None else np.array([self._selected])
        )

    def feed_mask(self, mask: np.ndarray, new: int) -> np.ndarray:
        rows = self._rows()
        room = self.capacity - new
        for row in rows[self._counts[rows] > room].tolist():
            needed = int(self._counts[row]) - room
            self._evict(row, min(max(needed, self.evict), int(self._counts[row]) - self.sink))
        counts = self._counts[rows] + new
        self._pending = new
        return (np.arange(int(counts.max())) < counts[:, None]).astype(np.int64)

    def _evict(self, row: int, drop: int) -> None:
        """Forget the row's ``drop`` oldest non-sink positions: shift the rest back."""
        start, end = self.sink + drop, int(self._counts[row])
        kept = slice(self.sink, end - drop)
        self._v[:, row, :, kept] = self._v[:, row, :, start:end]
        keys = self._k[:, row, :, kept]
        keys[...] = self._k[:, row, :, start:end]
        self._shifter.shift_back(keys, drop)
        self._counts[row] = end - drop
        self._evicted = True

    def inputs(self) -> dict[str, Any]:
        return self._feeds

    def outputs(self, total: int) -> list[ort.OrtValue]:
        if total > self.capacity:
            raise ValueError(f"a forward of {total} positions exceeds the window's {self.capacity}")
        return self._values

    def update(self, presents: list[Any]) -> None:
        rows = self._rows()
        self._counts[rows] += self._pending
        self._seen[rows] += self._pending

    def reorder(self, rows: np.ndarray) -> None:
        if len(rows) == len(self._counts):  # in place: the bound buffers stay
            self._k[...] = self._k[:, rows]
            self._v[...] = self._v[:, rows]
        else:
            self._k = np.ascontiguousarray(self._k[:, rows])
            self._v = np.ascontiguousarray(self._v[:, rows])
        self._counts = self._counts[rows]
        self._seen = self._seen[rows]
        self._bind()

    def crop(self, length: int) -> None:
        drop = self.seen - length
        if drop < 0:
            raise ValueError(f"cannot crop a cache of {self.seen} positions to {length}")
        if drop and self._evicted:
            raise ValueError(
                f"cannot rewind a sliding window of {self.window} past positions it already "
                f"dropped ({self.seen} seen); rewind before the window fills or use another cache"
            )
        self._counts = np.maximum(self._counts - drop, 0)  # rows move together after prefill
        self._seen = np.maximum(self._seen - drop, 0)


@hookimpl
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    register("sliding_window", SlidingWindowFactory())
