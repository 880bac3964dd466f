"""The chat page of ``ortgen serve``: plain HTML, CSS and JavaScript shipped inside the
package (``ortgen/serve/web/``), served at ``/`` with its files under ``/web/``.

No build step and nothing fetched from outside: the page works on a machine without
internet. It talks to the server only through the public API (``/v1/models``,
``/v1/chat/completions`` streamed), so it is a client like any other. Its own files are
public (a page behind an API key must load to ask for the key); the API stays behind it.

The page's Content-Security-Policy allows scripts, styles and connections from this
server only: even if model text ever reached the page as HTML, an injected
``<script>`` or ``onerror=`` handler would not run (the page itself only ever inserts
model text as text).
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route

__all__ = ["WEB_DIR", "chat_page_routes", "is_page_path"]

WEB_DIR = Path(__file__).with_name("web")
#: the page's files, by the name the page asks for and the type they are served as
_FILES = {
    "chat.js": "text/javascript; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
}
_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _POLICY,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # a new ortgen version's page is picked up at once
}


def is_page_path(path: str) -> bool:
    """Whether ``path`` is one of the page's own files (served without the API key)."""
    return path == "/" or (path.startswith("/web/") and path[5:] in _FILES)


async def _index(request: Request) -> Response:
    return FileResponse(WEB_DIR / "index.html", media_type="text/html", headers=_HEADERS)


def _asset(name: str) -> Route:
    media_type = _FILES[name]

    async def serve(request: Request) -> Response:
        return FileResponse(WEB_DIR / name, media_type=media_type, headers=_HEADERS)

    return Route(f"/web/{name}", serve, methods=["GET"])


def chat_page_routes() -> list[BaseRoute]:
    """``/`` and one route per file the page is made of: no path reaches another file."""
    return [Route("/", _index, methods=["GET"]), *(_asset(name) for name in _FILES)]
