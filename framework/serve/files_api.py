"""``/v1/files``: OpenAI's Files API over :class:`~ortgen.serve.files_store.FileStore`.

Upload (``POST``, multipart: ``file`` and ``purpose``), list (``GET``: ``purpose``,
``limit``, ``order``, ``after``), one file's object, its bytes (``/content``), delete.
On only with ``ortgen serve --files-dir DIR``; without it every route answers 404
saying so. The batches a server runs read their input here and write their output
here (``batches_api``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from .errors import RequestError
from .files_store import PURPOSES, FileStore, no_file
from .paging import page, query_limit
from .state import ServerState

__all__ = ["MAX_UPLOAD_BYTES", "file_store"]

#: the largest upload (OpenAI's limit for a batch input file is 200 MB)
MAX_UPLOAD_BYTES = 200 << 20
#: what a multipart body adds around the file: boundaries, headers, ``purpose``
_FORM_OVERHEAD = 64 << 10


def file_store(state: ServerState) -> FileStore:
    """The server's files; a 404 saying how to turn them on when it has none."""
    if state.files is None:
        raise RequestError(
            "the Files and Batches API is off on this server: start ortgen serve with "
            "--files-dir DIR to keep files (and run batches) there",
            status=404,
            code="files_api_off",
        )
    return state.files


async def create_file(request: Request) -> Response:
    """Store an uploaded file; its file object."""
    store = file_store(request.app.state.ortgen)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_UPLOAD_BYTES + _FORM_OVERHEAD:
        raise _too_large()
    form = await request.form(max_files=1, max_fields=8)
    try:
        purpose = form.get("purpose")
        if not isinstance(purpose, str) or purpose not in PURPOSES:
            got = "none" if purpose is None else repr(purpose)[:60]
            raise RequestError(
                f"purpose must be one of {', '.join(PURPOSES)} (a batch's input: batch), got {got}",
                param="purpose",
            )
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise RequestError(
                "file must be the uploaded file (a multipart/form-data part with a filename)",
                param="file",
            )
        if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
            raise _too_large()
        name = upload.filename or "upload"
        entry = await asyncio.to_thread(store.add, upload.file, name, purpose)
    finally:
        await form.close()
    return JSONResponse(entry)


def _too_large() -> RequestError:
    return RequestError(
        f"the file is larger than {MAX_UPLOAD_BYTES} bytes, the most this server takes",
        param="file",
        status=413,
        code="file_too_large",
    )


async def list_files(request: Request) -> Response:
    """The files, newest first unless ``order=asc``; ``purpose`` keeps one purpose."""
    store = file_store(request.app.state.ortgen)
    query = request.query_params
    limit = query_limit(query, 10_000, 10_000)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError(f"order must be asc or desc, got {order[:40]!r}", param="order")
    entries: list[dict[str, Any]] = await asyncio.to_thread(store.listing)
    purpose = query.get("purpose")
    if purpose is not None:
        entries = [entry for entry in entries if entry.get("purpose") == purpose]
    if order == "desc":
        entries.reverse()
    return JSONResponse(page(entries, limit, query.get("after")))


async def get_file(request: Request) -> Response:
    store = file_store(request.app.state.ortgen)
    return JSONResponse(store.get(request.path_params["file_id"]))


async def file_content(request: Request) -> Response:
    """The file's bytes, as uploaded or as a batch wrote them."""
    store = file_store(request.app.state.ortgen)
    file_id = request.path_params["file_id"]
    path = store.content(file_id)
    if not path.is_file():  # deleted between the two looks
        raise no_file(file_id)
    return FileResponse(path, media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    store = file_store(request.app.state.ortgen)
    file_id = request.path_params["file_id"]
    store.delete(file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})
