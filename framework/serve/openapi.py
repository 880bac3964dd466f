"""The OpenAPI 3.1 document of ``ortgen serve``, served at ``GET /openapi.json``.

Built from the tables the server parses requests with, so it cannot drift from them:
the OpenAI fields and their ranges (``ortgen.request.openai_fields``: ``COMPLETION_FIELDS``,
``CHAT_FIELDS``; ``openai_ignored``: ``NO_EFFECT``, ``UNSUPPORTED``, with the reasons;
``responses_api``: ``RESPONSES_FIELDS`` and the fields accepted only at some values)
and the ortgen settings a request may add (``ortgen.config.FIELDS``, typed by
``ortgen.config.values``; the Hugging Face fields ortgen ignores or accepts only at
their default). Value ranges of the ortgen settings are checked by ``resolve_config``
and not repeated here: a value of the right type may still be refused, with a 400
naming it. Clients and schemathesis read it
(``tests/test_fuzz_server.py`` fuzzes the server from it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import FIELDS, IGNORED_HF_FIELDS, UNSUPPORTED_HF_FIELDS
from ..config.values import BOOL_FIELDS, FLOAT_FIELDS, INT_FIELDS, TOKEN_LIST_FIELDS
from ..request.openai_fields import CHAT_FIELDS, COMMON_FIELDS, COMPLETION_FIELDS, OPENAI_FIELDS
from ..request.openai_ignored import NO_EFFECT, UNSUPPORTED
from ..version import __version__
from .chat_page import PAGE_FILES
from .embeddings_route import EMBEDDING_ANSWER, EMBEDDING_REQUEST
from .openapi_batches import batch_paths, batch_schemas
from .responses_api import RESPONSES_FIELDS, accepted_fields
from .tokenize import (
    DETOKENIZE_ANSWER,
    DETOKENIZE_REQUEST,
    TOKENIZE_ANSWER,
    TOKENIZE_REQUEST,
    TOKENIZER_INFO,
)

__all__ = ["openapi_document"]

#: routes that answer without the API key (``app._Guard``)
PUBLIC_PATHS = ("/health", "/openapi.json")

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "examples": ["invalid_request_error", "server_error"]},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        key: {"type": "integer", "minimum": 0}
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    },
}
_FINISH = {"type": ["string", "null"], "examples": ["stop", "length", "tool_calls"]}
_PROMPT_LOGPROBS = {
    "type": ["array", "null"],
    "description": "with prompt_logprobs: null for the first prompt token, then per token "
    '{"<token id>": {"logprob", "rank", "decoded_token"}} for it and its best alternatives',
    "items": {
        "type": ["object", "null"],
        "additionalProperties": {
            "type": "object",
            "required": ["logprob", "rank", "decoded_token"],
            "properties": {
                "logprob": {"type": "number"},
                "rank": {"type": "integer", "minimum": 1},
                "decoded_token": {"type": "string"},
            },
        },
    },
}


def _answer(obj: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": obj},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": choice},
            "usage": _USAGE,
        },
    }


_COMPLETION = _answer(
    "text_completion",
    {
        "type": "object",
        "required": ["index", "text", "finish_reason"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "text": {"type": "string"},
            "finish_reason": _FINISH,
            "logprobs": {"type": ["object", "null"]},
            "prompt_logprobs": _PROMPT_LOGPROBS,
        },
    },
)
_CHAT_COMPLETION = _answer(
    "chat.completion",
    {
        "type": "object",
        "required": ["index", "message", "finish_reason"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "message": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"const": "assistant"},
                    "content": {"type": ["string", "null"]},
                    "tool_calls": {"type": "array", "items": {"type": "object"}},
                },
            },
            "finish_reason": _FINISH,
            "logprobs": {"type": ["object", "null"]},
        },
    },
)
_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete"]},
        "incomplete_details": {
            "type": ["object", "null"],
            "properties": {"reason": {"const": "max_output_tokens"}},
        },
        "model": {"type": "string"},
        "output": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "id"],
                "properties": {
                    "type": {"enum": ["reasoning", "message", "function_call"]},
                    "id": {"type": "string"},
                    "status": {"enum": ["completed", "incomplete"]},
                },
            },
        },
        "usage": {
            "type": "object",
            "required": ["input_tokens", "output_tokens", "total_tokens"],
            "properties": {
                key: {"type": "integer", "minimum": 0}
                for key in ("input_tokens", "output_tokens", "total_tokens")
            },
        },
    },
}
_CHAT_COMPLETION["properties"]["prompt_logprobs"] = _PROMPT_LOGPROBS  # one prompt: top level
_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "max_model_len": {
            "type": ["integer", "null"],
            "description": "the context length in tokens (prompt and answer), as vLLM gives it",
        },
        "status": {
            "enum": ["loaded", "loading", "unloading", "unloaded"],
            "description": "models load on first use; past --max-loaded the least recently "
            "used one is unloaded",
        },
    },
}
_MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}},
}
_HEALTH = {
    "type": "object",
    "required": ["status", "models"],
    "properties": {
        "status": {"enum": ["ok", "shutting_down", "engine_stopped"]},
        "models": {
            "type": "object",
            "description": "each served model's state (as in /v1/models)",
            "additionalProperties": {"type": "string"},
        },
        "stopped": {
            "type": "array",
            "items": {"type": "string"},
            "description": "the models whose decode loop stopped (engine_stopped)",
        },
    },
}
_MODEL_FIELD = COMMON_FIELDS["model"]  # the same field on every route


def _setting_schema(name: str) -> dict[str, Any]:
    """The JSON type of one ortgen setting (its range is resolve_config's to check)."""
    nullable = FIELDS[name].default is None or name == "max_new_tokens"
    if name in INT_FIELDS:
        schema: dict[str, Any] = {"type": "integer"}
    elif name in FLOAT_FIELDS:
        schema = {"type": "number"}
    elif name in BOOL_FIELDS:
        schema = {"type": "boolean"}
    elif name in TOKEN_LIST_FIELDS:
        schema = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    else:  # lists, tables, components, constraints: their shapes are in docs/config.md
        return {"description": "an ortgen setting (docs/config.md)"}
    if nullable:
        schema["type"] = [schema["type"], "null"]
    return {**schema, "description": "an ortgen setting (docs/config.md)"}


def _extra_fields() -> dict[str, dict[str, Any]]:
    """What a request may carry besides the OpenAI fields: ortgen settings (the OpenAI
    client's ``extra_body``), and fields accepted and ignored or accepted at a default."""
    out: dict[str, dict[str, Any]] = {
        name: _setting_schema(name) for name in FIELDS if name not in OPENAI_FIELDS
    }
    for name in IGNORED_HF_FIELDS:
        out[name] = {"description": "a Hugging Face field ortgen ignores (a warning)"}
    for name, (default, why) in UNSUPPORTED_HF_FIELDS.items():
        out[name] = {"enum": [default], "description": f"only the default: {why}"}
    for name, (schema, why) in NO_EFFECT.items():
        out[name] = {**schema, "description": f"accepted, no effect here: {why}"}
    for name, (allowed, why) in UNSUPPORTED.items():
        out[name] = {"enum": list(allowed), "description": f"only these values: {why}"}
    return out


def _request(fields: dict[str, dict[str, Any]], required: str) -> dict[str, Any]:
    extra = _extra_fields()
    for name in OPENAI_FIELDS - set(fields):  # settings_of skips them on either route
        extra[name] = {"description": "a field of the other route: accepted and ignored"}
    return {
        "type": "object",
        "required": [required],
        "properties": {**extra, **fields},
        "additionalProperties": False,
    }


def _responses_request() -> dict[str, Any]:
    """``/v1/responses``: its own fields, those accepted with no effect or only at some
    values (with the reason), and every ortgen setting; Chat Completions' other fields
    are refused there (a 400 naming the Responses spelling), so they are not listed."""
    extra = {
        name: schema
        for name, schema in _extra_fields().items()
        if name not in NO_EFFECT and name not in UNSUPPORTED and name not in OPENAI_FIELDS
    }
    extra.update(accepted_fields())
    return {
        "type": "object",
        "required": ["input"],
        "properties": {**extra, **RESPONSES_FIELDS},
        "additionalProperties": False,
    }


def _naming(request: dict[str, Any], models: Sequence[str]) -> dict[str, Any]:
    """A request schema whose ``model`` lists the served ids (a copy: the tables stay)."""
    if not models:
        return request
    field = {**request["properties"]["model"], "enum": list(models)}
    return {**request, "properties": {**request["properties"], "model": field}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    error = {"$ref": "#/components/schemas/Error"}
    return {str(status): _json(error, "an OpenAI error body") for status in statuses}


def _generation(
    request: str,
    answer: str,
    summary: str,
    stream: str = "server-sent events of chunks, then data: [DONE]",
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}
                },
            },
            "responses": {
                "200": {
                    "description": f"the answer; with stream=true, {stream}",
                    "content": {
                        "application/json": {"schema": {"$ref": f"#/components/schemas/{answer}"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **_errors(400, 401, 404, 413, 429, 500, 503),
            },
        }
    }


def _post(summary: str, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {"200": _json(answer, summary), **_errors(400, 401, 404, 413, 500, 503)},
        }
    }


def _page_file(media_type: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": "the chat page (no API key needed; `--no-web` turns it off)",
            "responses": {
                "200": {
                    "description": "a file of the page",
                    "content": {media_type: {"schema": {"type": "string"}}},
                }
            },
        }
    }


def openapi_document(
    *, api_key: bool = False, web: bool = True, models: Sequence[str] = ()
) -> dict[str, Any]:
    """The OpenAPI 3.1 document; with ``api_key``, the routes that need the key say so
    (``/health``, ``/openapi.json`` and the chat page's files are open); with ``web``,
    the chat page's files are listed; with ``models``, a request's ``model`` field lists
    the ids this server serves."""
    paths: dict[str, Any] = {
        "/v1/completions": _generation("CompletionRequest", "Completion", "a text completion"),
        "/v1/chat/completions": _generation(
            "ChatCompletionRequest", "ChatCompletion", "an answer to a conversation"
        ),
        "/v1/responses": _generation(
            "ResponseRequest",
            "Response",
            "a response to input items (OpenAI's Responses API, stateless)",
            "server-sent typed events (response.created ... response.completed)",
        ),
        "/v1/embeddings": _post(
            "embeddings of texts (a model built with --embeddings)",
            {"$ref": "#/components/schemas/EmbeddingRequest"},
            {"$ref": "#/components/schemas/EmbeddingList"},
        ),
        "/v1/models": {
            "get": {
                "summary": "the models this server serves, loaded or not",
                "responses": {
                    "200": _json({"$ref": "#/components/schemas/ModelList"}, "the models"),
                    **_errors(401),
                },
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "summary": "the model, by its id",
                "parameters": [
                    {
                        "name": "model_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {
                    "200": _json({"$ref": "#/components/schemas/Model"}, "the model"),
                    **_errors(401, 404),
                },
            }
        },
        "/health": {
            "get": {
                "summary": "whether the server takes requests (no API key needed)",
                "responses": {
                    "200": _json(_HEALTH, "serving"),
                    "503": _json(_HEALTH, "draining after SIGTERM, or a decode loop stopped"),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "the Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_errors(401),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document (no API key needed)",
                "responses": {"200": _json({"type": "object"}, "the OpenAPI document")},
            }
        },
        "/tokenize": _post(
            "token ids of a text or a conversation",
            _naming(TOKENIZE_REQUEST, models),
            TOKENIZE_ANSWER,
        ),
        "/detokenize": _post(
            "the text of token ids", _naming(DETOKENIZE_REQUEST, models), DETOKENIZE_ANSWER
        ),
        "/tokenizer_info": {
            "get": {
                "summary": "the tokenizer's configuration (vLLM's shape)",
                "parameters": [
                    {"name": "model", "in": "query", "required": False, "schema": _MODEL_FIELD}
                ],
                "responses": {
                    "200": _json(TOKENIZER_INFO, "the tokenizer's configuration"),
                    **_errors(401, 404, 503),
                },
            }
        },
    }
    paths.update(batch_paths())  # answered 404 without --files-dir, listed all the same
    if web:
        paths.update({path: _page_file(kind) for path, (_, kind) in PAGE_FILES.items()})
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "ortgen serve",
            "version": __version__,
            "description": "OpenAI-compatible text generation on ONNX Runtime (docs/server.md)",
        },
        "paths": paths,
        "components": {
            "schemas": {
                "CompletionRequest": _naming(_request(COMPLETION_FIELDS, "prompt"), models),
                "ChatCompletionRequest": _naming(_request(CHAT_FIELDS, "messages"), models),
                "Completion": _COMPLETION,
                "ChatCompletion": _CHAT_COMPLETION,
                "ResponseRequest": _naming(_responses_request(), models),
                "Response": _RESPONSE,
                "EmbeddingRequest": _naming(EMBEDDING_REQUEST, models),
                "EmbeddingList": EMBEDDING_ANSWER,
                "Model": _MODEL,
                "ModelList": _MODEL_LIST,
                "Error": _ERROR,
                **batch_schemas(),
            }
        },
    }
    if api_key:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, item in paths.items():
            if path not in PUBLIC_PATHS and path not in PAGE_FILES:
                for operation in item.values():
                    operation["security"] = [{"bearer": []}]
    return document
