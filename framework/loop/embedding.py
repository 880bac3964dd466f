"""Embeddings from a decoder: its last hidden state, pooled over each text's real tokens.

A graph built to embed (``ortgen export SOURCE OUT --embeddings``: the GGUF builder writes
it, the export extra's fused and optimum graphs get it by one graph edit) has an extra
output, ``hidden_states`` (B, T, hidden): the last layer's state after the final norm,
before the LM head. :func:`embed_rows` runs one forward over a batch of token-id rows, right-padded
to the longest, and pools each row over its own tokens only: ``last`` takes its last real
token's state (a causal model's only position that has seen the whole text), ``mean``
averages its real positions. The vectors are then cut to ``dimensions`` (if given) and
L2-normalised (if asked), in that order, as OpenAI's ``dimensions`` shortens a vector.

Right padding is what lets one forward serve rows of different lengths on both graph
families: a shared-buffer graph (GroupQueryAttention) reads each row's length from its
mask and gives its real tokens positions 0.. as alone; an optimum graph masks the padding
keys, which a causal real token never reaches anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:
    from ..model.session import ExportedModel

__all__ = ["HIDDEN_OUTPUT", "POOLINGS", "check_embedder", "embed_rows", "has_hidden_states"]

#: the graph output holding the last hidden state (as onnxruntime-genai's builder names it)
HIDDEN_OUTPUT = "hidden_states"
POOLINGS = ("last", "mean")
#: how to get a model that embeds, for errors
BUILD_HINT = (
    "build one with `ortgen export SOURCE OUT --embeddings` (a .gguf file or a Hugging "
    "Face folder; docs/gguf.md, Embeddings)"
)


def has_hidden_states(model: ExportedModel) -> bool:
    """Whether ``model``'s graph outputs ``hidden_states``."""
    return any(o.name == HIDDEN_OUTPUT for o in model.session.get_outputs())


def no_hidden_states(path: Any) -> str:
    """The message for a model whose graph cannot embed."""
    return (
        f"the model {path} cannot make embeddings: its graph has no {HIDDEN_OUTPUT!r} output "
        f"(the last hidden state); {BUILD_HINT}"
    )


def check_embedder(model: ExportedModel, path: Any, pooling: str, dimensions: int | None) -> None:
    """Refuse a model that cannot embed (naming how to build one) and bad options."""
    check_options(pooling, dimensions)
    if not has_hidden_states(model):
        raise InputError(no_hidden_states(path), field="model")


def check_options(pooling: str, dimensions: int | None) -> None:
    if pooling not in POOLINGS:
        raise InputError(
            f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}", field="pooling"
        )
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise InputError(
            f"dimensions must be a positive integer, got {dimensions!r}", field="dimensions"
        )


def hidden_states(
    model: ExportedModel, rows: Sequence[Sequence[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """One forward over ``rows`` (right-padded): the (B, T, hidden) states and each row's
    length. Padding positions hold states nobody should read."""
    lengths = np.asarray([len(r) for r in rows], dtype=np.int64)
    batch, width = len(rows), int(lengths.max())
    ids = np.zeros((batch, width), dtype=np.int64)
    mask = np.zeros((batch, width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    signature = model.signature
    feeds: dict[str, np.ndarray] = {"input_ids": ids}
    if signature.has_attention_mask:
        feeds["attention_mask"] = mask
    if signature.has_position_ids:  # each row's real tokens at 0..; padding after them
        feeds["position_ids"] = np.broadcast_to(np.arange(width, dtype=np.int64), ids.shape)
    if signature.keeps_logits:
        feeds["logits_to_keep"] = np.asarray([1], dtype=np.int64)
    empty = (batch, signature.num_kv_heads, 0, signature.head_dim)
    for name in signature.past_inputs:
        feeds[name] = np.zeros(empty, dtype=signature.kv_dtype)
    states = model.session.run([HIDDEN_OUTPUT], feeds)[0]
    return np.asarray(states, dtype=np.float32), lengths


def pool(
    states: np.ndarray,
    lengths: np.ndarray,
    pooling: str = "last",
    *,
    normalize: bool = True,
    dimensions: int | None = None,
) -> np.ndarray:
    """(B, D) float32 vectors from (B, T, hidden) states, over each row's ``lengths[i]``
    first positions only."""
    check_options(pooling, dimensions)
    rows = np.arange(states.shape[0])
    if pooling == "last":
        vectors = states[rows, lengths - 1]
    else:
        real = np.arange(states.shape[1])[None, :] < lengths[:, None]
        summed = np.einsum("bt,bth->bh", real.astype(np.float64), states.astype(np.float64))
        vectors = summed / lengths[:, None]
    vectors = np.asarray(vectors, dtype=np.float64)
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms > 0, norms, 1.0)
    return vectors.astype(np.float32)


def embed_rows(
    model: ExportedModel,
    rows: Sequence[Sequence[int]],
    *,
    pooling: str = "last",
    normalize: bool = True,
    dims: int | None = None,
) -> np.ndarray:
    """(len(rows), D) embeddings of token-id ``rows`` from one forward of ``model``
    (``dims``: keep the first that many components, before normalising)."""
    check_embedder(model, model.path, pooling, dims)
    if not rows:
        raise InputError("no input given (an empty list)", field="input")
    states, lengths = hidden_states(model, rows)
    return pool(states, lengths, pooling, normalize=normalize, dimensions=dims)
