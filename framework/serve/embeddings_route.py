"""``POST /v1/embeddings``: OpenAI's embeddings request, answered by ``gen.embed``.

The body is read, embedded and answered by ``ortgen.request.openai_embeddings`` (an
``ortgen run`` OpenAI batch line with this url goes through the same code). The texts of
one request go through one forward, on a worker thread (onnxruntime takes concurrent runs
on one session), beside the engine's decode loop. A model whose graph has no hidden-state
output is a 400 naming ``model``, with how to build one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..api import TextGenerator
from ..request.openai_embeddings import (
    EMBEDDING_ANSWER,
    EMBEDDING_REQUEST,
    embed_body,
    embedding_body,
    embeddings_object,
)
from .state import ServerState

__all__ = ["EMBEDDING_ANSWER", "EMBEDDING_REQUEST", "create_embeddings", "embeddings_answer"]


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
    fields = embedding_body(body)
    vectors, rows = embed_body(gen, fields)
    return embeddings_object(vectors, fields.encoding_format, model_id, sum(map(len, rows)))
