"""A numpy stand-in for an exported decoder graph, so a KV cache can be tested without the
export stack (no torch, no optimum, no ONNX file).

``FakeModel`` behaves as the two graph families ortgen runs do, at the level a cache sees:

- ``concat`` (optimum exports): ``position_ids`` in, and each present is the past with
  the new positions appended; rows are left-padded and the mask's zeros hide padding.
- ``shared`` (fused exports, GroupQueryAttention): no ``position_ids``; each row's keys
  and values start at position 0 of its own slot, a row's length is its mask's row sum,
  and the new positions are written into the past buffer there (past and present may
  be one buffer, as a ``static`` cache hands out); what a buffer holds past a row's
  length is never read.

Its "attention" is real attention over every key and value a position may see (causal,
masked), with keys and values that depend on the token, its position and the layer, and
logits that add up all layers: a cache that feeds a wrong, stale, misplaced or missing
position changes the logits. Shapes and dtypes are checked as onnxruntime would, with a
``ValueError`` naming the input. Small and deterministic (seeded weights).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..model.session import GraphSignature

LAYOUTS = ("concat", "shared")


def _numpy(value: Any) -> np.ndarray:
    """An array or an ``onnxruntime.OrtValue`` as numpy (an OrtValue's memory is viewed)."""
    return value if isinstance(value, np.ndarray) else value.numpy()


class FakeModel:
    """What ``TextGenerator(folder, model=FakeModel(...))`` needs of a model: ``signature``,
    ``binding()``, ``config``, ``max_context`` and ``path`` (an empty folder: no tokenizer,
    no generation config)."""

    def __init__(
        self,
        *,
        layout: str = "concat",
        vocab_size: int = 48,
        num_layers: int = 2,
        num_kv_heads: int = 2,
        head_dim: int = 8,
        max_context: int = 256,
        seed: int = 0,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        names = [(f"past_key_values.{i}.{kv}", f"present.{i}.{kv}")
                 for i in range(num_layers) for kv in ("key", "value")]  # fmt: skip
        concat = layout == "concat"
        self.signature = GraphSignature(
            input_names=(
                "input_ids",
                "attention_mask",
                *(["position_ids"] if concat else []),
                *(past for past, _ in names),
            ),
            past_inputs=tuple(past for past, _ in names),
            present_outputs=tuple(present for _, present in names),
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            kv_dtype=np.float32,
            vocab_size=vocab_size,
            has_position_ids=concat,
            has_attention_mask=True,
            kv_layout=layout,
        )
        self.max_context = max_context
        self.config: dict[str, Any] = {"model_type": "fake", "max_position_embeddings": max_context}
        self.path = Path(tempfile.mkdtemp(prefix="ortgen-fake-model-"))
        rng = np.random.default_rng(seed)
        shape = (num_kv_heads, head_dim)
        self._token = {part: rng.standard_normal((vocab_size, *shape), dtype=np.float32)
                       for part in "qkv"}  # fmt: skip
        self._position = {part: rng.standard_normal((max_context, *shape), dtype=np.float32)
                          for part in "qkv"}  # fmt: skip
        self._head = rng.standard_normal((num_kv_heads * head_dim, vocab_size), dtype=np.float32)
        self.forwards = 0  # forwards run, all bindings together

    def binding(self) -> FakeBinding:
        return FakeBinding(self)

    def project(self, part: str, ids: np.ndarray, positions: np.ndarray, layer: int) -> np.ndarray:
        """Queries, keys or values (``part``) of tokens at positions: (B, H, T, D)."""
        if positions.min(initial=0) < 0 or positions.max(initial=0) >= self.max_context:
            raise ValueError(f"a position outside [0, {self.max_context}): {positions.tolist()}")
        out = (self._token[part][ids] + self._position[part][positions]) * (1.0 + 0.5 * layer)
        return np.ascontiguousarray(out.transpose(0, 2, 1, 3))


class FakeBinding:
    """One request's binding: ``forward`` as ``ortgen.model.session.ForwardBinding`` runs it."""

    def __init__(self, model: FakeModel) -> None:
        self.model = model
        self.release_after = True  # set by the loop as on ForwardBinding; nothing to free

    def __deepcopy__(self, memo: dict[int, Any]) -> FakeBinding:
        return FakeBinding(self.model)

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray | None,
        past: dict[str, Any],
        presents: list[Any] | None = None,
        *,
        keep: int = 1,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits (B, T, V) float32 for every fed position (a ``concat``-style graph
        ignores ``keep``), and the presents."""
        signature = self.model.signature
        self.model.forwards += 1
        if list(past) != list(signature.past_inputs):
            raise ValueError(f"past inputs {list(past)}; the graph takes {signature.past_inputs}")
        arrays = [_numpy(value) for value in past.values()]
        batch = input_ids.shape[0]
        for name, array in zip(past, arrays, strict=True):
            rows, heads, _, dim = array.shape if array.ndim == 4 else (None,) * 4
            if array.ndim != 4 or (rows, heads, dim) != (batch, signature.num_kv_heads,
                                                          signature.head_dim):  # fmt: skip
                raise ValueError(
                    f"{name}: shape {array.shape}; expected ({batch}, "
                    f"{signature.num_kv_heads}, past, {signature.head_dim})"
                )
            if array.dtype != np.float32:
                raise ValueError(f"{name}: dtype {array.dtype}; expected float32")
        if presents is not None and len(presents) != len(arrays):
            raise ValueError(f"{len(presents)} present buffers for {len(arrays)} outputs")
        mask = np.asarray(attention_mask)
        if signature.kv_layout == "concat":
            return self._concat(input_ids, mask, position_ids, arrays, presents)
        return self._shared(input_ids, mask, arrays, presents)

    def _concat(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray | None,
        past: list[np.ndarray],
        presents: list[Any] | None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        batch, width = ids.shape
        held = past[0].shape[2]
        if any(p.shape[2] != held for p in past):
            raise ValueError(f"past lengths differ: {[p.shape[2] for p in past]}")
        if mask.shape != (batch, held + width):
            raise ValueError(
                f"attention_mask shape {mask.shape}; expected ({batch}, {held + width}) "
                f"(past {held} + {width} new)"
            )
        if positions is None:
            raise ValueError("this graph takes position_ids")
        positions = np.asarray(positions)
        total = held + width
        out: list[np.ndarray] = []
        for index, array in enumerate(past):
            layer, part = divmod(index, 2)
            new = self.model.project("kv"[part], ids, positions, layer)
            full = np.concatenate([array, new], axis=2)
            if presents is not None:
                target = _numpy(presents[index])
                if target.shape != full.shape:
                    raise ValueError(
                        f"present buffer {index}: shape {target.shape}; expected {full.shape}"
                    )
                target[...] = full
                full = target
            out.append(full)
        query_at = held + np.arange(width)  # column of each fed position
        visible = (mask[:, None, :] == 1) & (np.arange(total)[None, None, :] <= query_at[:, None])
        return self._logits(ids, positions, out, visible), out

    def _shared(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        past: list[np.ndarray],
        presents: list[Any] | None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        batch, width = ids.shape
        if mask.shape[0] != batch:
            raise ValueError(f"attention_mask has {mask.shape[0]} rows for {batch}")
        lengths = mask.sum(axis=1).astype(np.int64)  # each row's positions after this forward
        starts = lengths - width
        if starts.min() < 0:
            raise ValueError(f"a row's mask holds fewer than the {width} positions fed")
        need = int(lengths.max())
        out: list[np.ndarray] = []
        for index, array in enumerate(past):
            if presents is not None:
                buffer = _numpy(presents[index])
                if buffer.shape[:2] != array.shape[:2] or buffer.shape[2] < need:
                    raise ValueError(
                        f"present buffer {index}: shape {buffer.shape} cannot hold {need} "
                        "positions of these rows"
                    )
                if not np.shares_memory(buffer, array):
                    buffer[:, :, : array.shape[2]] = array[:, :, : buffer.shape[2]]
            else:  # onnxruntime allocates the present: the past, grown to fit
                buffer = np.zeros(
                    (*array.shape[:2], max(array.shape[2], need), array.shape[3]), np.float32
                )
                buffer[:, :, : array.shape[2]] = array
            out.append(buffer)
        positions = starts[:, None] + np.arange(width)[None, :]
        for index, buffer in enumerate(out):
            layer, part = divmod(index, 2)
            new = self.model.project("kv"[part], ids, positions, layer)
            for row in range(batch):
                buffer[row, :, starts[row] : lengths[row]] = new[row]
        columns = np.arange(out[0].shape[2])
        visible = columns[None, None, :] <= positions[:, :, None]
        # GroupQueryAttention reads a row up to its length and no further: what a buffer
        # holds past it (uninitialised memory, another forward's leftovers) is never read
        read = (columns[None, :] < lengths[:, None])[:, None, :, None]
        kv = [np.where(read, buffer[:, :, : len(columns)], np.float32(0)) for buffer in out]
        return self._logits(ids, positions, kv, visible), out

    def _logits(
        self,
        ids: np.ndarray,
        positions: np.ndarray,
        kv: list[np.ndarray],
        visible: np.ndarray,
    ) -> np.ndarray:
        """Masked softmax attention per layer, summed over layers, through the head."""
        model = self.model
        total = None
        for layer in range(len(kv) // 2):
            keys, values = kv[2 * layer], kv[2 * layer + 1]
            query = model.project("q", ids, positions, layer)  # (B, H, T, D)
            scores = np.einsum("bhtd,bhsd->bhts", query, keys) / np.sqrt(query.shape[-1])
            scores = np.where(visible[:, None], scores, -np.inf)
            top = scores.max(axis=-1, keepdims=True)
            top = np.where(np.isfinite(top), top, 0.0)
            weights = np.where(visible[:, None], np.exp(scores - top), 0.0)
            weights /= np.maximum(weights.sum(axis=-1, keepdims=True), 1e-30)
            attended = np.einsum("bhts,bhsd->bhtd", weights, values)
            total = attended if total is None else total + attended
        assert total is not None
        batch, heads, width, dim = total.shape
        flat = total.transpose(0, 2, 1, 3).reshape(batch, width, heads * dim)
        return (flat @ model._head).astype(np.float32)
