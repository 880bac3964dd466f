"""The Files and Batches API's part of ``/openapi.json`` (``openapi``): its paths and
schemas, built from the tables its routes check with (``files_store.PURPOSES``,
``batches_api.ENDPOINTS``, the metadata limits; a test checks the request's fields are
``batches_api.BATCH_FIELDS``)."""

from __future__ import annotations

from typing import Any

from .batch_store import ACTIVE, ENDED, WINDOW
from .batches_api import ENDPOINTS, METADATA_KEY, METADATA_PAIRS, METADATA_VALUE
from .files_store import OUTPUT_PURPOSE, PURPOSES

__all__ = ["batch_paths", "batch_schemas"]

_OFF = " (404 unless the server runs with --files-dir)"
_TIME = {"type": ["integer", "null"]}
_ID = {"type": ["string", "null"]}
_FILE = {
    "type": "object",
    "required": ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "file"},
        "bytes": {"type": "integer", "minimum": 0},
        "created_at": {"type": "integer"},
        "filename": {"type": "string"},
        "purpose": {"enum": [*PURPOSES, OUTPUT_PURPOSE]},
        "status": {"enum": ["uploaded", "processed", "error"]},
        "expires_at": _TIME,
        "status_details": _ID,
    },
}
_METADATA = {
    "type": ["object", "null"],
    "maxProperties": METADATA_PAIRS,
    "propertyNames": {"maxLength": METADATA_KEY},
    "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE},
}
_BATCH_ERROR = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "param": _ID,
        "line": _TIME,
    },
}
_STAMPS = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling")
_BATCH = {
    "type": "object",
    "required": ["id", "object", "endpoint", "input_file_id", "completion_window", "status"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "batch"},
        "endpoint": {"type": "string"},
        "model": {"type": "string"},
        "errors": {
            "type": ["object", "null"],
            "properties": {"object": {"const": "list"}, "data": {"items": _BATCH_ERROR}},
        },
        "input_file_id": {"type": "string"},
        "completion_window": {"type": "string"},
        "status": {"enum": [*ACTIVE, *ENDED]},
        "output_file_id": _ID,
        "error_file_id": _ID,
        "created_at": {"type": "integer"},
        "expires_at": _TIME,
        **{f"{status}_at": _TIME for status in (*_STAMPS, "cancelled")},
        "request_counts": {
            "type": "object",
            "required": ["total", "completed", "failed"],
            "properties": {
                key: {"type": "integer", "minimum": 0} for key in ("total", "completed", "failed")
            },
        },
        "metadata": _METADATA,
    },
}
_BATCH_REQUEST = {
    "type": "object",
    "required": ["input_file_id", "endpoint", "completion_window"],
    "additionalProperties": False,
    "properties": {
        "input_file_id": {"type": "string", "description": 'a file uploaded as "batch"'},
        "endpoint": {"enum": list(ENDPOINTS)},
        "completion_window": {"enum": list(WINDOW)},
        "metadata": _METADATA,
    },
}


def _list(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["object", "data", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}},
            "first_id": _ID,
            "last_id": _ID,
            "has_more": {"type": "boolean"},
        },
    }


def batch_schemas() -> dict[str, Any]:
    return {
        "FileObject": _FILE,
        "FileList": _list("FileObject"),
        "Batch": _BATCH,
        "BatchList": _list("Batch"),
        "BatchRequest": _BATCH_REQUEST,
    }


def _json(name: str, description: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation(
    summary: str, answer: dict[str, Any], errors: tuple[int, ...], **extra: Any
) -> dict[str, Any]:
    error = _json("Error", "an OpenAI error body")
    responses = {"200": answer, **{str(status): error for status in errors}}
    return {"summary": summary + _OFF, "responses": responses, **extra}


def _in_path(name: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}]


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def batch_paths() -> dict[str, Any]:
    """The paths of ``/v1/files`` and ``/v1/batches``."""
    upload = {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"enum": list(PURPOSES)},
        },
    }
    limit = {"type": "integer", "minimum": 1}
    return {
        "/v1/files": {
            "post": _operation(
                "upload a file (a batch's input: purpose batch)",
                _json("FileObject", "the file"),
                (400, 401, 404, 413),
                requestBody={
                    "required": True,
                    "content": {"multipart/form-data": {"schema": upload}},
                },
            ),
            "get": _operation(
                "the files, newest first",
                _json("FileList", "a page of files"),
                (400, 401, 404),
                parameters=[
                    _query("purpose", {"type": "string"}),
                    _query("limit", {**limit, "maximum": 10_000}),
                    _query("order", {"enum": ["asc", "desc"]}),
                    _query("after", {"type": "string"}),
                ],
            ),
        },
        "/v1/files/{file_id}": {
            "get": _operation(
                "a file's object",
                _json("FileObject", "the file"),
                (401, 404),
                parameters=_in_path("file_id"),
            ),
            "delete": _operation(
                "delete a file",
                {
                    "description": "deleted",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                (401, 404),
                parameters=_in_path("file_id"),
            ),
        },
        "/v1/files/{file_id}/content": {
            "get": _operation(
                "a file's bytes",
                {
                    "description": "the bytes",
                    "content": {"application/octet-stream": {"schema": {"type": "string"}}},
                },
                (401, 404),
                parameters=_in_path("file_id"),
            ),
        },
        "/v1/batches": {
            "post": _operation(
                "a batch of the requests in a file, run beside live requests",
                _json("Batch", "the batch, validating"),
                (400, 401, 404, 413),
                requestBody={
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/BatchRequest"}
                        }
                    },
                },
            ),
            "get": _operation(
                "the batches, newest first",
                _json("BatchList", "a page of batches"),
                (400, 401, 404),
                parameters=[
                    _query("limit", {**limit, "maximum": 100}),
                    _query("after", {"type": "string"}),
                ],
            ),
        },
        "/v1/batches/{batch_id}": {
            "get": _operation(
                "a batch", _json("Batch", "the batch"), (401, 404), parameters=_in_path("batch_id")
            ),
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": _operation(
                "cancel a batch: no new rows; it ends cancelled with what was done",
                _json("Batch", "the batch, cancelling"),
                (401, 404, 409),
                parameters=_in_path("batch_id"),
            ),
        },
    }
