"""The error every route answers with: OpenAI's ``{"error": {...}}`` body and a status."""

from __future__ import annotations

from typing import Any


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


def shutting_down(message: str = "the server is shutting down") -> RequestError:
    """503: the server drains after SIGTERM and takes nothing new."""
    return RequestError(message, status=503, kind="server_error", code="shutting_down")
