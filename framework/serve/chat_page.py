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

__all__ = ["PAGE_FILES", "WEB_DIR", "chat_page_routes", "is_page_path"]

WEB_DIR = Path(__file__).with_name("web")
#: the page's files: the path they are served at -> (file in WEB_DIR, media type); the
#: routes, the API key's exemption and the OpenAPI document all read this one table
PAGE_FILES = {
    "/": ("index.html", "text/html"),
    "/web/chat.js": ("chat.js", "text/javascript"),
    "/web/chat.css": ("chat.css", "text/css"),
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
    return path in PAGE_FILES


def _file_route(path: str, name: str, media_type: str) -> Route:
    async def serve(request: Request) -> Response:
        return FileResponse(WEB_DIR / name, media_type=media_type, headers=_HEADERS)

    return Route(path, serve, methods=["GET"])


def chat_page_routes() -> list[BaseRoute]:
    """One route per file the page is made of: no path reaches another file."""
    return [_file_route(path, *served) for path, served in PAGE_FILES.items()]
