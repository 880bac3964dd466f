"""The Starlette app of ``ortgen serve``: routes, API key, body limit, errors, SSE.

Each generation request is parsed and checked here (``openai_api``), then submitted to the
:class:`~ortgen.serve.engine.Engine` as one row per choice, and answered from the rows'
pieces (``responses``): all at once, or as server-sent events while they come. Every
error is OpenAI's body (``{"error": {"message", "type", "param", "code"}}``).

A request owns its rows until it is answered (``state.ServerState``): when the client
hangs up (a non-streaming request watches ``receive`` for the disconnect; sse-starlette
cancels a stream) or the server drains after SIGTERM, what is left of them is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigError, InputError
from ..model.session import max_context, read_model_config
from ..request.outputs import StreamPiece
from . import metrics as prometheus
from .batches_api import cancel_batch, create_batch, get_batch, list_batches
from .chat_page import chat_page_routes, is_page_path
from .embeddings_route import create_embeddings
from .engine import RowHandle
from .errors import RequestError, no_route, shutting_down
from .files_api import create_file, delete_file, file_content, get_file, list_files
from .model_pool import ServedModel
from .openai_api import ParsedRequest, parse_chat, parse_completion
from .openapi import PUBLIC_PATHS, openapi_document
from .responses import Answer, Choice
from .responses_route import create_response
from .state import ServerState
from .tokenize import detokenize_body, tokenize_body, tokenizer_info

log = logging.getLogger("ortgen.serve")

#: the deepest nesting a request body may have: code that walks a value (a tool's
#: parameters, a schema) would run out of Python's recursion on a much deeper one
MAX_DEPTH = 100
#: routes as /metrics labels them (anything else is "other", to bound the label set)
ROUTES = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/models",
    "/health",
    "/metrics",
    "/openapi.json",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
    "/v1/files",
    "/v1/batches",
    "/",
)
#: routes whose sub-paths /metrics counts as the route (an id in the path)
_PREFIXED = ("/v1/models", "/v1/files", "/v1/batches")


# -- generation routes -----------------------------------------------------------------


async def completions(request: Request) -> Response:
    return await _generate(request, parse_completion)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, parse_chat)


async def _generate(request: Request, parse: Callable[..., ParsedRequest]) -> Response:
    state: ServerState = request.app.state.ortgen
    if not state.accepting:
        raise shutting_down()
    body = await _read_json(request, state.max_body_bytes)
    model = await state.models.acquire(body.get("model"))
    try:
        parsed = parse(body, model.gen, max_rows=model.max_rows)
        handles = state.admit(model, parsed)
    except BaseException:
        state.models.release(model)
        raise
    answer = Answer(parsed, model.id, model.words)
    choices = [Choice(row.index) for row in parsed.rows]
    if parsed.stream:
        events = _events(answer, handles, choices)
        return _EventStream(lambda: state.release(model, handles, choices), events)
    try:
        return await _complete(request, answer, handles, choices)
    finally:
        state.release(model, handles, choices)


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, refused (413) as soon as it is longer than ``limit``."""
    declared = request.headers.get("content-length", "")
    too_large = RequestError(
        f"the request body is larger than {limit} bytes (--max-body-bytes)",
        status=413,
        code="request_too_large",
    )
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise too_large
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the request body is JSON nested too deep to read") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if _too_deep(body, MAX_DEPTH):
        raise RequestError(f"the request body is JSON nested deeper than {MAX_DEPTH} levels")
    return body


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects deeper than ``limit`` (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _row_error(error: BaseException | None) -> RequestError:
    """A row the engine failed: the request's own fault (400) or the server's (500)."""
    if isinstance(error, ConfigError | InputError):
        return RequestError(str(error), param=error.field)
    log.error("ortgen serve: a request failed", exc_info=error)
    what = f"{type(error).__name__}: {error}" if error is not None else "unknown error"
    return RequestError(f"generation failed: {what}", status=500, kind="server_error")


async def _complete(
    request: Request, answer: Answer, handles: list[RowHandle], choices: list[Choice]
) -> Response:
    """Wait for every row, unless the client hangs up first."""

    async def pump(handle: RowHandle, choice: Choice) -> None:
        async for piece in handle.pieces():
            choice.add(piece)

    work = asyncio.gather(*(pump(h, c) for h, c in zip(handles, choices, strict=True)))
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        either: set[asyncio.Future[Any]] = {work, gone}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not work.done():  # the client left; release() cancels the rows
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return Response(status_code=499)  # nobody reads it
    for handle, choice in zip(handles, choices, strict=True):
        if choice.finish_reason == "error":
            raise _row_error(handle.error)
    if not all(choice.ended for choice in choices):
        raise shutting_down("the server shut down before this request finished")
    return JSONResponse(answer.full(choices))


async def _disconnected(receive: Receive) -> None:
    """Return when the client hangs up (the body was read: nothing else can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _data(payload: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))}


async def _events(
    answer: Answer, handles: list[RowHandle], choices: list[Choice]
) -> AsyncIterator[dict[str, str]]:
    """The SSE events of one streamed request: chunks of every row as they come, then
    usage (when asked) and ``[DONE]``; a failed row ends the stream with an error event."""
    queue: asyncio.Queue[tuple[int, StreamPiece | None]] = asyncio.Queue()

    async def pump(i: int, handle: RowHandle) -> None:
        try:
            async for piece in handle.pieces():
                queue.put_nowait((i, piece))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        for choice in choices:
            opening = answer.opening(choice)
            if opening is not None:
                yield _data(opening)
        open_rows = len(handles)
        while open_rows:
            i, piece = await queue.get()
            choice = choices[i]
            if piece is None:
                open_rows -= 1
                if not choice.ended:  # cancelled under us: the server is shutting down
                    yield _data(shutting_down("the server shut down mid-answer").body())
                    return
                continue
            choice.add(piece)
            if choice.finish_reason == "error":
                yield _data(_row_error(handles[i].error).body())
                return
            for chunk in answer.chunks(choice, piece):
                yield _data(chunk)
        if answer.request.include_usage:
            yield _data(answer.usage_chunk(choices))
        yield {"data": "[DONE]"}
    finally:
        for task in tasks:
            task.cancel()


class _EventStream(EventSourceResponse):
    """An SSE response that releases its rows however it ends: finished, failed, client
    gone, or cancelled before the generator ever ran (then its own ``finally`` cannot)."""

    def __init__(self, release: Callable[[], None], events: AsyncIterator[dict[str, str]]) -> None:
        super().__init__(events, sep="\n", ping=15)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


# -- other routes ----------------------------------------------------------------------


def _model_card(state: ServerState, model_id: str) -> dict[str, Any]:
    """OpenAI's model object, with the context length as vLLM gives it (``max_model_len``:
    prompt plus answer tokens; null when the model does not say, read from its folder so
    an unloaded model has it too) and whether it is loaded now."""
    folder = state.models.sources[model_id].path
    return {
        "id": model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "ortgen",
        "max_model_len": max_context(read_model_config(folder)),
        "status": state.models.state_of(model_id),
    }


async def tokenize(request: Request) -> Response:
    """Text (``prompt``) or a conversation (``messages``, through the chat template, as
    a chat request would see it) to token ids: vLLM's ``/tokenize`` shape; ``model``
    picks the model whose tokenizer counts (omitted: the first)."""
    state: ServerState = request.app.state.ortgen
    body = await _read_json(request, state.max_body_bytes)
    async with _using(state, body) as model:
        ids = tokenize_body(model.gen, body)
        answer: dict[str, Any] = {
            "count": len(ids),
            "max_model_len": model.gen.model.max_context,
            "tokens": ids,
        }
        if body.get("return_token_strs"):
            answer["token_strs"] = [model.words.tokenizer.id_to_token(i) for i in ids]
    return JSONResponse(answer)


async def detokenize(request: Request) -> Response:
    """Token ids to text: vLLM's ``/detokenize`` shape (``tokens`` in, ``prompt`` out)."""
    state: ServerState = request.app.state.ortgen
    body = await _read_json(request, state.max_body_bytes)
    async with _using(state, body) as model:
        return JSONResponse({"prompt": detokenize_body(model.gen, body)})


async def get_tokenizer_info(request: Request) -> Response:
    """The tokenizer's configuration in vLLM's ``/tokenizer_info`` shape (``tokenize``);
    ``?model=`` picks the model (omitted: the first)."""
    state: ServerState = request.app.state.ortgen
    async with _using(state, {"model": request.query_params.get("model")}) as model:
        return JSONResponse(tokenizer_info(model.gen))


@contextlib.asynccontextmanager
async def _using(state: ServerState, body: dict[str, Any]) -> AsyncIterator[ServedModel]:
    """The model a body names, held while a route uses it."""
    if not state.accepting:
        raise shutting_down()
    model = await state.models.acquire(body.get("model"))
    try:
        yield model
    finally:
        state.models.release(model)


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.ortgen
    cards = [_model_card(state, model_id) for model_id in state.models.sources]
    return JSONResponse({"object": "list", "data": cards})


async def get_model(request: Request) -> Response:
    state: ServerState = request.app.state.ortgen
    model_id = state.models.resolve(request.path_params["model_id"], optional=False)
    return JSONResponse(_model_card(state, model_id))


async def health(request: Request) -> Response:
    """ok while every loaded model's decode loop runs (a dead one: 503 naming it, since
    nothing queued on it would ever run); the state of each model alongside."""
    state: ServerState = request.app.state.ortgen
    models = {model_id: state.models.state_of(model_id) for model_id in state.models.sources}
    if not state.accepting:
        return JSONResponse({"status": "shutting_down", "models": models}, status_code=503)
    dead = [model.id for model in state.models.loaded() if not model.engine.alive]
    if dead:
        answer = {"status": "engine_stopped", "stopped": dead, "models": models}
        return JSONResponse(answer, status_code=503)
    return JSONResponse({"status": "ok", "models": models})


async def openapi(request: Request) -> Response:
    """The OpenAPI document (``openapi``): open like /health, so tools can read it."""
    state: ServerState = request.app.state.ortgen
    document = openapi_document(
        api_key=state.api_key is not None, web=state.web, models=list(state.models.sources)
    )
    return JSONResponse(document)


async def metrics(request: Request) -> Response:
    text = prometheus.render(request.app.state.metrics)
    return Response(text, media_type=prometheus.CONTENT_TYPE)


# -- errors, API key, counting ---------------------------------------------------------


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    # a full queue frees within a few decode steps: clients that honour Retry-After
    # (the OpenAI client does) come back then instead of at once
    headers = {"Retry-After": "1"} if exc.status == 429 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error = no_route(request.method, request.url.path)
    else:
        error = RequestError(str(exc.detail), status=exc.status_code)
    return JSONResponse(error.body(), status_code=error.status, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    error = RequestError(f"internal error: {type(exc).__name__}", status=500, kind="server_error")
    return JSONResponse(error.body(), status_code=500)


class _Guard:
    """Checks ``Authorization: Bearer KEY`` on every route but ``/health`` and
    ``/openapi.json`` (when the server has a key) and counts responses by route and
    status for ``/metrics``."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        self._expected = f"Bearer {state.api_key}".encode() if state.api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = next((r for r in _PREFIXED if path.startswith(f"{r}/")), path)
        status = 500

        async def counting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if (
                self._expected is not None
                and path not in PUBLIC_PATHS
                and not (self.state.web and is_page_path(path))
                and not self._authorised(scope)
            ):
                error = RequestError(
                    "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                    status=401,
                    code="invalid_api_key",
                )
                await JSONResponse(error.body(), status_code=401)(scope, receive, counting)
                return
            await self.app(scope, receive, counting)
        finally:
            self.state.http.count(route if route in ROUTES else "other", status)

    def _authorised(self, scope: Scope) -> bool:
        assert self._expected is not None
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self._expected)
        return False


def build_app(state: ServerState) -> Starlette:
    """The ASGI app; its lifespan starts the engine and stops it at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.models.start()
        if state.batch_worker is not None:
            state.batch_worker.start()
        try:
            yield
        finally:
            state.accepting = False
            state.cancel_all()
            if state.batch_worker is not None:
                await state.batch_worker.stop()
            await state.models.close(5.0)

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/embeddings", create_embeddings, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/tokenizer_info", get_tokenizer_info, methods=["GET"]),
            Route("/v1/files", create_file, methods=["POST"]),
            Route("/v1/files", list_files, methods=["GET"]),
            Route("/v1/files/{file_id}", get_file, methods=["GET"]),
            Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
            Route("/v1/batches", create_batch, methods=["POST"]),
            Route("/v1/batches", list_batches, methods=["GET"]),
            Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
            *(chat_page_routes() if state.web else ()),
        ],
        middleware=[Middleware(_Guard, state=state)],
        exception_handlers={
            RequestError: _request_error,
            HTTPException: _http_error,
            Exception: _server_error,
        },
        lifespan=lifespan,
    )
    app.state.ortgen = state
    app.state.metrics = prometheus.registry(state.models, state.http)  # this app's own
    return app
