"""OpenAI's embeddings request and answer, for every application that takes one.

``ortgen serve``'s ``POST /v1/embeddings`` and an ``ortgen run`` OpenAI batch line with
that url read the body with :func:`embedding_body` (the same checks, the same errors
naming the field) and answer with :func:`embeddings_object`; :func:`embed_body` is the
work between the two (the texts encoded, one ``gen.embed`` forward).

The body is OpenAI's: ``input`` (a string, a list of strings, a list of token ids or a
list of such lists), ``model``, ``encoding_format`` (``float``, or ``base64``: each vector's
little-endian float32 bytes, as OpenAI sends them and its client decodes them),
``dimensions`` (the first N components, normalised again) and ``user`` (accepted, unused);
plus ``pooling`` (``last``, the default, or ``mean``: ``ortgen.loop.embedding``). The
answer is OpenAI's ``{"object": "list", "data": [{"object": "embedding", "index",
"embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from ..loop.embedding import POOLINGS, check_embedder, check_options
from .openai_errors import RequestError
from .openai_fields import COMMON_FIELDS

if TYPE_CHECKING:
    from ..api import TextGenerator

__all__ = [
    "EMBEDDING_ANSWER",
    "EMBEDDING_REQUEST",
    "EmbeddingBody",
    "embed_body",
    "embedding_body",
    "embedding_error",
    "embeddings_object",
]

_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
EMBEDDING_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": COMMON_FIELDS["model"],
        "input": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
                _IDS,
                {"type": "array", "items": _IDS, "minItems": 1},
            ],
            "description": "a text, texts, token ids or lists of token ids",
        },
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": {"type": "string"},
        "pooling": {
            "enum": list(POOLINGS),
            "description": "ortgen: the last token's state (default) or the mean of all",
        },
    },
    "additionalProperties": False,
}
_FLOATS = {"type": "array", "items": {"type": "number"}}
EMBEDDING_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer", "minimum": 0},
                    "embedding": {"anyOf": [_FLOATS, {"type": "string"}]},
                },
            },
        },
        "model": {"type": "string"},
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {
                "prompt_tokens": {"type": "integer", "minimum": 0},
                "total_tokens": {"type": "integer", "minimum": 0},
            },
        },
    },
}
_FIELDS = frozenset(EMBEDDING_REQUEST["properties"])


@dataclass(frozen=True)
class EmbeddingBody:
    """An embeddings body, checked without the model: its rows (texts or token-id lists)
    and options."""

    inputs: list[Any]
    pooling: str = "last"
    dimensions: int | None = None
    encoding_format: str = "float"


def embedding_body(body: Mapping[str, Any]) -> EmbeddingBody:
    """``body`` read as ``POST /v1/embeddings`` reads it, or the RequestError (400, naming
    the field) it is answered with."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}", param=unknown[0])
    pooling = body.get("pooling", "last")
    dimensions = body.get("dimensions")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise RequestError('encoding_format must be "float" or "base64"', param="encoding_format")
    if "user" in body and not isinstance(body["user"], str):
        raise RequestError("user must be a string", param="user")
    try:
        check_options(pooling, dimensions)
        inputs = _texts(body.get("input"))
    except InputError as exc:
        raise embedding_error(exc) from None
    return EmbeddingBody(inputs, pooling, dimensions, encoding)


def embed_body(gen: TextGenerator, fields: EmbeddingBody) -> tuple[np.ndarray, list[list[int]]]:
    """The (N, D) vectors of a body's rows from one forward, and the token rows they came
    from (their lengths are the usage); a RequestError naming the field (``model``: one
    that cannot embed, ``input``: an id outside the vocabulary)."""
    try:
        check_embedder(gen.model, gen.path, fields.pooling, fields.dimensions)
        rows, _, _ = gen.prompts.encode(fields.inputs)
        vectors = gen.embed(rows, pooling=fields.pooling, dimensions=fields.dimensions)
    except InputError as exc:
        raise embedding_error(exc) from None
    return vectors, rows


def embedding_error(exc: InputError) -> RequestError:
    """An InputError of the embedding path as OpenAI's 400, named by the body's field
    (the encoder names a text ``prompt``; it is ``input`` here)."""
    param = {"prompt": "input", None: "input"}.get(exc.field, exc.field)
    return RequestError(str(exc), param=param)


def embeddings_object(
    vectors: Sequence[Any] | np.ndarray, encoding: str, model: str, tokens: int
) -> dict[str, Any]:
    """OpenAI's embeddings answer: each vector as floats or base64, ``tokens`` the texts'
    token count."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(np.asarray(v), encoding)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _texts(value: Any) -> list[Any]:
    """``input`` as a list of rows (texts or token-id lists), its shape checked."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise InputError("input must be a text, texts, token ids or lists of token ids")
    if all(_is_id(x) for x in value):
        return [value]
    if all(isinstance(x, str) for x in value):
        return value
    if all(isinstance(x, list) and all(_is_id(t) for t in x) for x in value):
        return value
    raise InputError(
        "input must be a text, a list of texts, a list of token ids or a list of such lists "
        "(not a mix)"
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # OpenAI's: little-endian float32 bytes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector.astype(np.float32)]
