"""``POST /v1/embeddings``: OpenAI's embeddings request, answered by ``gen.embed``.

The body is OpenAI's: ``input`` (a string, a list of strings, a list of token ids or a
list of such lists), ``model``, ``encoding_format`` (``float``, or ``base64``: each vector's
little-endian float32 bytes, as OpenAI sends them and its client decodes them),
``dimensions`` (the first N components, normalised again) and ``user`` (accepted, unused);
plus ``pooling`` (``last``, the default, or ``mean``: ``ortgen.loop.embedding``). The
answer is OpenAI's ``{"object": "list", "data": [{"object": "embedding", "index",
"embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``.

The texts of one request go through one forward, on a worker thread (onnxruntime takes
concurrent runs on one session), beside the engine's decode loop. A model whose graph
has no hidden-state output is a 400 naming ``model``, with how to build one.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api import TextGenerator
from ..errors import InputError
from ..loop.embedding import POOLINGS, check_embedder
from ..request.openai_fields import COMMON_FIELDS
from .errors import RequestError
from .state import ServerState

__all__ = ["EMBEDDING_ANSWER", "EMBEDDING_REQUEST", "create_embeddings", "embeddings_answer"]

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


async def create_embeddings(request: Request) -> Response:
    """``POST /v1/embeddings`` (see module doc)."""
    from . import app as http  # app.py registers this route, so it is imported here

    state: ServerState = request.app.state.ortgen
    body = await http._read_json(request, state.max_body_bytes)
    async with http._using(state, body) as model:
        answer = await asyncio.to_thread(embeddings_answer, model.gen, body, model.id)
    return JSONResponse(answer)


def embeddings_answer(gen: TextGenerator, body: Mapping[str, Any], model_id: str) -> dict:
    """OpenAI's embeddings answer to ``body`` from ``gen`` (run off the event loop)."""
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
        check_embedder(gen.model, gen.path, pooling, dimensions)
        rows, _, _ = gen.prompts.encode(_texts(body.get("input")))
        vectors = gen.embed(rows, pooling=pooling, dimensions=dimensions)
    except InputError as exc:
        param = {"prompt": "input", None: "input"}.get(exc.field, exc.field)
        raise RequestError(str(exc), param=param) from None
    tokens = sum(len(row) for row in rows)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, encoding)}
            for i, v in enumerate(vectors)
        ],
        "model": model_id,
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
    return [float(x) for x in vector]
