"""The ``POST /v1/responses`` route: a Responses request run as the chat request it
means (``responses_api``), answered as a Response object or its typed events
(``responses_events``).

It runs like a chat completion of one choice, with the app's own pieces: the body
reader and its limits, the model pool, ``ServerState.admit`` (the same checks and
engine rows), the wait that a client's hang-up cancels, and the SSE response that
releases the row however the stream ends. Stream events are sent as OpenAI does, with
the event's type as the SSE ``event:`` name; there is no ``[DONE]`` (the Responses
stream ends with ``response.completed``, ``response.incomplete`` or ``error``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from starlette.requests import Request
from starlette.responses import Response

from .engine import RowHandle
from .errors import shutting_down
from .responses import Choice
from .responses_api import parse_responses
from .responses_events import ResponseBuilder, ResponseEvents
from .state import ServerState

if TYPE_CHECKING:
    from .responses import Answer

__all__ = ["create_response"]


async def create_response(request: Request) -> Response:
    """``POST /v1/responses`` (see module doc)."""
    from . import app as http  # app.py registers this route, so it is imported here

    state: ServerState = request.app.state.ortgen
    if not state.accepting:
        raise shutting_down()
    body = await http._read_json(request, state.max_body_bytes)
    model = await state.models.acquire(body.get("model"))
    try:
        parsed = parse_responses(body, model.gen, max_rows=model.max_rows)
        handles = state.admit(model, parsed.chat)
    except BaseException:
        state.models.release(model)
        raise
    builder = ResponseBuilder(parsed, model.id)
    choices = [Choice(row.index) for row in parsed.chat.rows]  # one: no n on this route

    def release() -> None:
        state.release(model, handles, choices)

    if parsed.chat.stream:
        return http._EventStream(release, _events(builder, handles[0], choices[0]))
    try:  # the chat route's wait (a client that hangs up cancels the row)
        return await http._complete(request, cast("Answer", _Whole(builder)), handles, choices)
    finally:
        release()


class _Whole:
    """What ``app._complete`` asks of an answer once every row ended: its body."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder

    def full(self, choices: list[Choice]) -> dict[str, Any]:
        return self.builder.full(choices[0])


def _sse(event: dict[str, Any]) -> dict[str, str]:
    data = json.dumps(event, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return {"event": event["type"], "data": data}


async def _events(
    builder: ResponseBuilder, handle: RowHandle, choice: Choice
) -> AsyncIterator[dict[str, str]]:
    """The stream's events as the row's pieces come; a row that fails (or that the drain
    cancels) ends it with an ``error`` event naming why."""
    from . import app as http

    writer = ResponseEvents(builder)
    for event in writer.opening():
        yield _sse(event)
    async for piece in handle.pieces():
        choice.add(piece)
        if choice.finish_reason == "error":
            error = http._row_error(handle.error)
            yield _sse(writer.error(error.message, error.code or error.kind, error.param))
            return
        for event in writer.feed(choice, piece):
            yield _sse(event)
    if not choice.ended:  # cancelled under us: the server is shutting down
        yield _sse(writer.error("the server shut down mid-answer", "shutting_down", None))
