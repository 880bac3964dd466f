"""A third-party KV cache with the ``RowSlots`` capability, written only against the public
contract (``ortgen.KVCache`` + ``ortgen.RowSlots``): nothing from ``ortgen.plugins``.

It keeps a concat (optimum) graph's keys/values as plain numpy arrays, one
(rows, kv_heads, columns, head_dim) array per past input, and counts its calls so a test
can see it was the cache that served. Used by tests/test_serve_slots.py through
``ortgen serve --plugin tests.third_party_slots --cache my_slots``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ortgen

CALLS: dict[str, int] = {}


def _numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


class MySlots:
    """Rows join (``add_rows`` then a lone prefill under ``select(row)``) and leave
    (``keep_rows``); columns follow the loop's token buffer (``shift``)."""

    def __init__(self, *, ctx: ortgen.GenerationContext) -> None:
        signature = ctx.signature
        if signature is None or signature.shared_kv:
            raise ortgen.ConfigError("my_slots serves concat (optimum) graphs only")
        self._names = list(signature.past_inputs)
        self._empty = (signature.num_kv_heads, signature.head_dim, signature.kv_dtype)
        self._values = [self._zeros(0, 0) for _ in self._names]
        self._joining: int | None = None
        self._row: list[np.ndarray] = []

    def _zeros(self, rows: int, columns: int) -> np.ndarray:
        heads, dim, dtype = self._empty
        return np.zeros((rows, heads, columns, dim), dtype=dtype)

    def _count(self, what: str) -> None:
        CALLS[what] = CALLS.get(what, 0) + 1

    # -- KVCache ------------------------------------------------------------------------
    def inputs(self) -> dict[str, Any]:
        held = self._row if self._joining is not None else self._values
        return dict(zip(self._names, held, strict=True))

    def update(self, presents: list[Any]) -> None:
        self._count("update")
        arrays = [_numpy(p) for p in presents]
        if self._joining is not None:
            self._row = arrays
        else:
            self._values = arrays

    def reorder(self, rows: np.ndarray) -> None:
        self._values = [v[rows] for v in self._values]

    def crop(self, length: int) -> None:
        self._values = [np.ascontiguousarray(v[:, :, :length]) for v in self._values]

    @property
    def length(self) -> int:
        return int(self._values[0].shape[2])

    @property
    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self._values)

    # -- a row prefilled alone ----------------------------------------------------------
    def select(self, row: int | None) -> None:
        if row is not None:
            self._joining = row
            self._row = [self._zeros(1, 0) for _ in self._names]
            return
        if self._joining is None:
            return
        row, self._joining = self._joining, None
        placed = []
        for held, own in zip(self._values, self._row, strict=True):
            held = np.array(held)
            held[row] = 0
            held[row, :, held.shape[2] - own.shape[2] :] = own[0]
            placed.append(held)
        self._values = placed

    # -- RowSlots -------------------------------------------------------------------------
    def add_rows(self, count: int) -> None:
        self._count("add_rows")
        self._values = [
            np.concatenate([v, self._zeros(count, v.shape[2]).astype(v.dtype)])
            for v in self._values
        ]

    def keep_rows(self, order: np.ndarray) -> None:
        self._count("keep_rows")
        self.reorder(order)

    def shift(self, columns: int) -> None:
        if columns > 0:
            pad = ((0, 0), (0, 0), (columns, 0), (0, 0))
            self._values = [np.pad(v, pad) for v in self._values]
        else:
            self._values = [np.ascontiguousarray(v[:, :, -columns:]) for v in self._values]


@ortgen.hookimpl
def register_kv_caches(register: ortgen.Register) -> None:
    register("my_slots", MySlots)
