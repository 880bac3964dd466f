"""The error every route answers with: OpenAI's ``{"error": {...}}`` body and a status
(``RequestError``, defined with the request side in ``ortgen.request.openai_errors``, since
an OpenAI batch job answers a line with it too)."""

from __future__ import annotations

from ..request.openai_errors import RequestError, no_route

__all__ = ["RequestError", "no_route", "shutting_down"]


def shutting_down(message: str = "the server is shutting down") -> RequestError:
    """503: the server drains after SIGTERM and takes nothing new."""
    return RequestError(message, status=503, kind="server_error", code="shutting_down")
