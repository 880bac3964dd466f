"""The error of an OpenAI request: OpenAI's ``{"error": {...}}`` body and an HTTP status.

The server answers every route with it (``ortgen.serve``); an OpenAI batch line that
cannot run is answered with it too (``ortgen.jobs.openai_batch``), so a client reads the
same body from either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import OrtgenError

__all__ = ["RequestError", "no_route", "request_error"]


class RequestError(Exception):
    """What the client did wrong (or why the server cannot serve it), as OpenAI reports it."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def no_route(method: str, path: str, why: str = "") -> RequestError:
    """404: nothing answers ``method path`` (``why`` adds what does)."""
    message = f"no route {method} {path}" + (f": {why}" if why else "")
    return RequestError(message, status=404, code="unknown_url")


def request_error(
    exc: OrtgenError,
    names: Mapping[str, str],
    *,
    prompt: str = "prompt",
    default: str | None = None,
) -> RequestError:
    """A 400 for an ortgen error, its ``param`` the request field the error's own field
    (``ConfigError.problems``, ``InputError.field``) came from: ``names`` maps an ortgen
    setting to the OpenAI field that set it, ``prompt`` names the request's prompt field
    (``messages`` in a chat). The message is never read."""
    field = getattr(exc, "field", None)
    if field == "prompt":
        param: str | None = prompt
    elif field is not None:
        param = names.get(field, field)
    else:
        param = default
    return RequestError(str(exc), param=param)
