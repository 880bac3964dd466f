"""``/v1/batches``: OpenAI's Batches API (create, retrieve, list, cancel).

A batch is a file of requests (uploaded with ``purpose: "batch"``, ``files_api``) the
server answers in the background, beside its live requests, through the same serving
engine (``batch_worker``); its objects are kept by ``batch_store``. On only with
``ortgen serve --files-dir DIR``, as the files are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..jobs.openai_batch import CHAT_URL, COMPLETIONS_URL
from .batch_store import WINDOW
from .batch_worker import BatchWorker
from .errors import RequestError
from .files_api import file_store
from .paging import page, query_limit
from .state import ServerState

__all__ = ["BATCH_FIELDS", "ENDPOINTS"]

#: the endpoints a batch may be made of (each line answered as ``ortgen run`` answers
#: it, ``ortgen.jobs.openai_batch``)
ENDPOINTS = (CHAT_URL, COMPLETIONS_URL, "/v1/embeddings")
#: what a create body takes
BATCH_FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
#: OpenAI's limits on ``metadata``
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512


def _worker(state: ServerState) -> BatchWorker:
    file_store(state)  # the 404 saying how to turn the API on
    assert state.batch_worker is not None  # made with the file store
    return state.batch_worker


async def create_batch(request: Request) -> Response:
    """A new batch of the requests in an uploaded ``batch`` file; it starts validating."""
    from . import app as http  # app.py registers this route, so it is imported here

    state: ServerState = request.app.state.ortgen
    worker = _worker(state)
    body = await http._read_json(request, state.max_body_bytes)
    unknown = [key for key in body if key not in BATCH_FIELDS]
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r:.80}: a batch takes {', '.join(BATCH_FIELDS)}",
            param=str(unknown[0])[:80],
        )
    file_id = _required_string(body, "input_file_id")
    entry = worker.files.get(file_id, param="input_file_id")
    if entry.get("purpose") != "batch":
        raise RequestError(
            f"the file {file_id} was uploaded with purpose {entry.get('purpose')!r}; a "
            'batch reads a file uploaded with purpose "batch"',
            param="input_file_id",
        )
    endpoint = _required_string(body, "endpoint")
    if endpoint not in ENDPOINTS:
        raise RequestError(
            f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint[:80]!r}",
            param="endpoint",
        )
    window = _required_string(body, "completion_window")
    if window not in WINDOW:
        raise RequestError(
            f"completion_window must be {', '.join(map(repr, WINDOW))}, got {window[:40]!r}",
            param="completion_window",
        )
    metadata = _metadata(body.get("metadata"))
    batch = worker.batches.create(file_id, endpoint, window, metadata, state.models.default_id)
    worker.submit(batch)
    return JSONResponse(batch)


def _required_string(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        got = "none" if value is None else repr(value)[:60]
        raise RequestError(f"{name} must be a non-empty string, got {got}", param=name)
    return value


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's ``metadata``: up to 16 string pairs (keys up to 64 characters, values up
    to 512), or null."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > METADATA_PAIRS:
        raise RequestError(
            f"metadata must be an object of at most {METADATA_PAIRS} string pairs",
            param="metadata",
        )
    for key, item in value.items():
        if len(key) > METADATA_KEY or not isinstance(item, str) or len(item) > METADATA_VALUE:
            raise RequestError(
                f"metadata {key[:80]!r}: keys are strings of at most {METADATA_KEY} "
                f"characters, values strings of at most {METADATA_VALUE}",
                param="metadata",
            )
    return value


async def get_batch(request: Request) -> Response:
    worker = _worker(request.app.state.ortgen)
    return JSONResponse(worker.batches.get(request.path_params["batch_id"]))


async def list_batches(request: Request) -> Response:
    """The batches, newest first: ``limit`` (1 to 100, 20 by default) after ``after``."""
    worker = _worker(request.app.state.ortgen)
    query = request.query_params
    limit = query_limit(query, 20, 100)
    return JSONResponse(page(worker.batches.newest_first(), limit, query.get("after")))


async def cancel_batch(request: Request) -> Response:
    """Stop submitting the batch's rows; it is ``cancelling`` until those in the engine
    end, then ``cancelled`` with the files of what was done."""
    worker = _worker(request.app.state.ortgen)
    batch = worker.batches.get(request.path_params["batch_id"])
    worker.cancel(batch)
    return JSONResponse(batch)
