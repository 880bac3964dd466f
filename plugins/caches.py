"""Built-in KV-cache backends."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from ortgen import GenerationContext, hookimpl


class DynamicCache:
    """Keeps the graph's present tensors as they come and feeds them back as the next past.

    The exported graph concatenates past and new keys/values itself, so holding
    its OrtValue outputs means nothing is copied between steps; prefill starts from
    zero-length past tensors.
    """

    def __init__(self, *, ctx: GenerationContext) -> None:
        signature = ctx.signature
        if signature is None:
            raise ValueError("the dynamic cache needs the model's graph signature in ctx")
        self._names = signature.past_inputs
        empty = np.zeros(
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
        self._values = [_numpy(v)[rows] for v in self._values]

    def crop(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot crop a cache of length {self._length} to {length}")
        self._values = [np.ascontiguousarray(_numpy(v)[:, :, :length]) for v in self._values]
        self._length = length

    @property
    def length(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(_shape(v))) for v in self._values) * self._itemsize


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.shape) if isinstance(value, np.ndarray) else tuple(value.shape())


def _numpy(value: Any) -> np.ndarray:
    return value.numpy() if isinstance(value, ort.OrtValue) else value


@hookimpl
def register_kv_caches(register):
    register("dynamic", DynamicCache)
