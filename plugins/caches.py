"""Built-in KV-cache backends: ``static`` (preallocated, the default) and ``dynamic``.

Both follow the graph's KV layout (``GraphSignature.kv_layout``):

- ``shared`` graphs (fused exports) write each step's keys/values into the past
  buffer themselves, so a static cache binds one preallocated buffer as both the
  past input and the present output: nothing is allocated or copied per step.
- ``concat`` graphs (optimum exports) return a present one position longer than
  the past; a static cache gives them two preallocated buffers per tensor and
  swaps them each step (ping-pong), so onnxruntime writes into memory the cache
  owns instead of allocating a new tensor per step.

Public for composing (docs/plugins.md, "Composing a built-in cache"): ``DynamicCache``,
``StaticCache`` (their keyword arguments and the ``KVCache`` members and capabilities they
have), and the helpers ``as_numpy`` and ``copy_arrays``; a plugin may wrap or subclass
them. Their attributes starting with ``_`` are not, nor is any other module of
``ortgen.plugins``.
"""

from __future__ import annotations

import copy
import mmap
from typing import Any, Self

import numpy as np
import onnxruntime as ort

from ortgen import GenerationContext, KVCacheFactory, Register, hookimpl
from ortgen.checks import graph_signature

__all__ = ["DynamicCache", "StaticCache", "as_numpy", "copy_arrays"]


class DynamicCache:
    """Keeps the graph's present tensors as they come and feeds them back as the next past.

    onnxruntime allocates every present; holding its OrtValues means nothing is
    copied between steps. Prefill starts from zero-length past tensors. On a
    shared-buffer graph it holds one length for the whole batch, so it cannot take a
    batch of prompts of different lengths there (use ``static``).
    """

    def __init__(self, *, ctx: GenerationContext) -> None:
        signature = graph_signature(ctx, "dynamic")
        self.signature = signature  # the graph these keys/values belong to
        self._names = signature.past_inputs
        empty: np.ndarray = np.zeros(
            (ctx.batch_size, signature.num_kv_heads, 0, signature.head_dim), signature.kv_dtype
        )
        self._values: list[Any] = [empty] * len(self._names)
        self._itemsize = empty.itemsize
        self._length = 0

    def inputs(self) -> dict[str, Any]:
        return dict(zip(self._names, self._values, strict=True))

    def update(self, presents: list[Any]) -> None:
        if len(presents) != len(self._names):
            raise ValueError(f"expected {len(self._names)} present tensors, got {len(presents)}")
        self._values = list(presents)
        self._length = _shape(presents[0])[2]

    def reorder(self, rows: np.ndarray) -> None:
        self._values = [as_numpy(v)[rows] for v in self._values]

    def fork(self) -> Self:
        """An independent copy holding the same positions (``Generation.fork``)."""
        twin = copy.copy(self)
        twin._values = [np.array(as_numpy(v)) for v in self._values]
        return twin

    def crop(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot crop a cache of length {self._length} to {length}")
        self._values = [np.ascontiguousarray(as_numpy(v)[:, :, :length]) for v in self._values]
        self._length = length

    @property
    def length(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(_shape(v))) for v in self._values) * self._itemsize


def lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros in an anonymous memory map of their own: the OS maps a page only when it is
    written, and the map goes back whole when the array is freed. ``np.zeros`` (calloc)
    zeroes, and so makes resident, every page of a block glibc takes from its heap,
    which it does for blocks of many MiB too once freeing one has raised its mmap
    threshold: a server's slot buffers were then resident in full (docs/benchmarks.md,
    "Memory over a long run")."""
    size = int(np.prod(shape)) * dtype.itemsize
    if size == 0:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, size), dtype=dtype).reshape(shape)


class StaticCache:
    """Preallocated (B, kv_heads, capacity, head_dim) buffers per past tensor, bound as outputs.

    ``capacity`` defaults to the request's ``max_length``; a forward that needs more
    (a chat that goes on) grows the buffers by doubling, copying what they hold.
    Memory is reserved lazily by the OS (``lazy_zeros``), so an unused capacity costs
    no RSS.
    """

    def __init__(self, *, ctx: GenerationContext, capacity: int | None = None) -> None:
        signature = graph_signature(ctx, "static")
        self.signature = signature  # the graph these keys/values belong to
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self._names = signature.past_inputs
        self._shared = signature.shared_kv
        self._dtype = np.dtype(signature.kv_dtype)
        self._rows = ctx.batch_size
        self._heads = signature.num_kv_heads
        self._head_dim = signature.head_dim
        self._capacity = max(capacity or ctx.max_length, 1)
        self._length = 0
        self._pending = 0  # positions the forward being run will leave (set by outputs())
        self._current = 0  # which of the two concat buffers holds the past (_allocate)
        self._selected: int | None = None  # the row select() exposes (shared graphs)
        self._allocate(self._capacity)

    # -- the protocol ----------------------------------------------------------------

    def inputs(self) -> dict[str, Any]:
        if self._shared:  # the same dict while the buffers stay: the model then skips binding
            return self._feeds
        return dict(zip(self._names, self._views(self._current, self._length), strict=True))

    def outputs(self, total: int) -> list[ort.OrtValue]:
        """Present buffers for a forward that leaves ``total`` positions in the cache."""
        if total > self._capacity:
            self._grow(total)
        self._pending = total
        if self._shared:
            return self._values
        return self._views(1 - self._current, total)

    def update(self, presents: list[Any]) -> None:
        if len(presents) != len(self._names):
            raise ValueError(f"expected {len(self._names)} present tensors, got {len(presents)}")
        if self._shared:  # rows prefilled one by one leave the longest row's length
            self._length = max(self._length, self._pending)
        else:
            self._current = 1 - self._current
            self._length = self._pending

    def reorder(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        if len(rows) == self._rows:  # beam search every step: gather in place, so the
            for i in range(len(self._names)):  # bound buffers (and the binding) stay
                array = self._array(i)
                array[...] = array[rows]
            return
        held = [self._array(i)[rows] for i in range(len(self._names))]
        self._rows = len(rows)
        self._allocate(self._capacity)
        for i, array in enumerate(held):
            self._array(i)[...] = array

    def fork(self) -> Self:
        """An independent copy holding the same positions, in buffers of its own."""
        held = [self._array(i).copy() for i in range(len(self._names))]
        twin = copy.copy(self)
        twin._allocate(self._capacity)
        for i, array in enumerate(held):
            twin._array(i)[...] = array
        return twin

    def crop(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot crop a cache of length {self._length} to {length}")
        if self._shared:  # the graph reads each row up to its mask's length: nothing to move
            self._length = length
            return
        # a shorter view of the same flat memory would scramble it: copy
        kept = [self._array(i)[:, :, :length].copy() for i in range(len(self._names))]
        self._length = length
        for i, array in enumerate(kept):
            self._array(i)[...] = array

    @property
    def length(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes reserved for keys/values (both halves of the ping-pong for concat graphs)."""
        halves = 1 if self._shared else 2
        return self._rows * self._capacity * halves * self.position_bytes

    @property
    def position_bytes(self) -> int:
        """Bytes of keys/values one position of one row holds (every past tensor)."""
        return len(self._names) * self._heads * self._head_dim * self._dtype.itemsize

    def select(self, row: int | None) -> None:
        """Expose only ``row`` (None: every row) to the next forwards.

        A shared-buffer graph packs each row's keys/values from position 0, so a batch
        of prompts of different lengths is prefilled one row at a time, each into its
        own slice of the same buffers.
        """
        if not self._shared:
            raise ValueError("row selection exists only for shared-buffer graphs")
        self._selected = row
        if row is None:
            self._expose(self._all_values)
        else:
            self._expose(
                [ort.OrtValue.ortvalue_from_numpy(b[row : row + 1]) for b in self._buffers]
            )

    # -- memory --------------------------------------------------------------------

    def _allocate(self, capacity: int) -> None:
        self._capacity = capacity
        shape = (self._rows, self._heads, capacity, self._head_dim)
        if self._shared:
            self._buffers = [lazy_zeros(shape, self._dtype) for _ in self._names]
            self._all_values = [ort.OrtValue.ortvalue_from_numpy(b) for b in self._buffers]
            self.select(self._selected)  # a row selected before growing stays selected
        else:  # two flat halves per tensor; views of their prefix take any length
            size = int(np.prod(shape))
            self._flat = [[lazy_zeros((size,), self._dtype) for _ in range(2)] for _ in self._names]
            self._current = 0

    def _expose(self, values: list[ort.OrtValue]) -> None:
        """Hand out ``values`` as past and present from now on (shared-buffer graphs)."""
        self._values = values
        self._feeds = dict(zip(self._names, values, strict=True))

    def _grow(self, needed: int) -> None:
        held = [self._array(i) for i in range(len(self._names))]
        self._allocate(max(needed, 2 * self._capacity))
        for i, array in enumerate(held):
            self._array(i)[...] = array

    def _array(self, index: int) -> np.ndarray:
        """Tensor ``index``'s positions held now, (B, H, length or capacity, D)."""
        if self._shared:
            return self._buffers[index][:, :, : self._length]
        return self._shaped(self._flat[index][self._current], self._length)

    def _shaped(self, flat: np.ndarray, length: int) -> np.ndarray:
        shape = (self._rows, self._heads, length, self._head_dim)
        return flat[: int(np.prod(shape))].reshape(shape)

    def _views(self, half: int, length: int) -> list[ort.OrtValue]:
        return [
            ort.OrtValue.ortvalue_from_numpy(self._shaped(pair[half], length))
            for pair in self._flat
        ]


def copy_arrays(cache: Any) -> Any:
    """A shallow copy of ``cache`` whose numpy arrays are its own: every array among its
    attributes (also inside lists, tuples and dicts) is copied, everything else shared
    (the signature, settings, a per-model store). For a backend that keeps its keys and
    values in numpy arrays; OrtValues made from them must be rebuilt on the copy."""
    twin = copy.copy(cache)
    for name, value in vars(cache).items():
        setattr(twin, name, _copied(value))
    return twin


def _copied(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.shape) if isinstance(value, np.ndarray) else tuple(value.shape())


def as_numpy(value: Any) -> np.ndarray:
    """A present as numpy (an OrtValue's memory is viewed, not copied); the built-in
    backends receive presents as either."""
    return value.numpy() if isinstance(value, ort.OrtValue) else value


@hookimpl
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    register("static", StaticCache)
    register("dynamic", DynamicCache)
