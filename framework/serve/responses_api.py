"""``POST /v1/responses`` in: OpenAI's Responses request as a chat request.

The Responses API is a second spelling of a chat: ``instructions`` and ``input`` items
are the messages, flat function tools are chat tools, ``text.format`` is
``response_format``, ``max_output_tokens`` is ``max_completion_tokens``. So a request is
rewritten into a Chat Completions body and parsed by ``openai_api.parse_chat``: the same
request builder (``build_chat``), checks, engine rows, batching, limits and prefix reuse
as ``/v1/chat/completions``, and nothing here decides anything about generation. What
this module owns is the translation and its errors: every ``param`` names the field as
the client sent it (``input[2].call_id``, ``text.format``, ``max_output_tokens``), also
for errors found later in the chat path (``_remapped``).

The server keeps no state (``store``), so what needs a stored response is refused with
a 400 naming the field: ``previous_response_id``, ``store: true``, ``conversation``,
``item_reference`` items, stored ``prompt`` templates, ``background``. So are the
Chat Completions fields that have a Responses spelling (``max_tokens``: use
``max_output_tokens``), to keep one way of saying each thing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api import TextGenerator
from ..request.openai_fields import (
    CHAT_FIELDS,
    COMMON_FIELDS,
    NUMBERS,
    OPENAI_FIELDS,
    REASONING_EFFORTS,
    VERBOSITIES,
    boolean,
    integer,
    number,
)
from ..request.openai_ignored import NO_EFFECT, UNSUPPORTED
from .errors import RequestError
from .openai_api import ParsedRequest, parse_chat
from .responses_input import conversation, tool_choice, tools

__all__ = ["RESPONSES_FIELDS", "ResponsesRequest", "parse_responses"]

_STRING = {"type": ["string", "null"]}
_OBJECT = {"type": ["object", "null"]}

#: Chat Completions fields a Responses request may carry too (the OpenAI client's
#: ``extra_body``, as vLLM takes them): sampling knobs the Responses API has no spelling
#: for. They go to the chat path as they are.
EXTENSIONS = (
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "chat_template_kwargs",
)
#: what the Responses API calls a field the chat path names (``param`` in errors)
_RENAMED = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
    "verbosity": "text.verbosity",
}
#: Chat Completions fields with a Responses spelling: refused, naming that spelling
_SPELLED = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
    "verbosity": "text.verbosity",
    "n": "one response per request (send several requests)",
}
#: fields this server cannot honour (most need stored responses): accepted only at the
#: values that ask for nothing, any other is a 400 naming the field and why
_AT_DEFAULT: dict[str, tuple[tuple[Any, ...], str]] = {
    "previous_response_id": (
        (None,),
        "this server stores no responses: send the whole conversation as input items",
    ),
    "store": ((None, False), "this server stores no responses (give store: false or omit it)"),
    "conversation": ((None,), "this server keeps no conversations: send the input items"),
    "background": ((None, False), "responses run while the request waits (no stored jobs)"),
    "prompt": ((None,), "stored prompt templates need OpenAI's storage"),
    "truncation": (
        (None, "disabled"),
        'only "disabled": an input that does not fit the context is a 400, never cut',
    ),
    "include": ((None, []), "no extra output (encrypted reasoning, logprobs) is produced"),
    "top_logprobs": ((None, 0), "logprobs are not given on /v1/responses"),
    "max_tool_calls": ((None,), "use parallel_tool_calls: false for one call at most"),
    "context_management": ((None, []), "the input is never compacted"),
    "moderation": ((None,), "the server runs no moderation model"),
    "image": ((None,), "the server reads text only"),
    "access_programs": ((None,), "OpenAI's access programs have no meaning here"),
}
_REASONING_KEYS = ("effort", "summary", "generate_summary")
_SUMMARIES = (None, "auto", "concise", "detailed")

_INPUT = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "description": "a message or a typed item"},
        },
    ],
    "description": "text (one user message) or input items: messages ({role, content}), "
    "function_call, function_call_output and reasoning items",
}
_FLAT_TOOL = {
    "type": "object",
    "required": ["type", "name"],
    "properties": {
        "type": {"const": "function"},
        "name": {"type": "string"},
        "description": _STRING,
        "parameters": _OBJECT,
        "strict": {"type": ["boolean", "null"]},
    },
}
_FORMAT = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "name": {"type": "string"},
        "schema": {"type": "object"},
        "description": {"type": "string"},
        "strict": {"type": ["boolean", "null"]},
    },
}
#: The fields ``/v1/responses`` reads, with the JSON schema of each value (published by
#: ``openapi``); any other key is an ortgen setting or refused by name.
RESPONSES_FIELDS: dict[str, dict[str, Any]] = {
    "model": COMMON_FIELDS["model"],
    "input": _INPUT,
    "instructions": {**_STRING, "description": "a system message before the input"},
    "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": COMMON_FIELDS["temperature"],
    "top_p": COMMON_FIELDS["top_p"],
    "tools": {"type": ["array", "null"], "items": _FLAT_TOOL},
    "tool_choice": {
        "anyOf": [
            {"enum": ["none", "auto", "required", None]},
            {
                "type": "object",
                "required": ["type", "name"],
                "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
            },
        ]
    },
    "parallel_tool_calls": {"type": ["boolean", "null"]},
    "text": {
        "type": ["object", "null"],
        "properties": {"format": _FORMAT, "verbosity": {"enum": [*VERBOSITIES, None]}},
        "additionalProperties": False,
    },
    "reasoning": {
        "type": ["object", "null"],
        "properties": {
            "effort": {"enum": [*REASONING_EFFORTS, None]},
            "summary": {"enum": list(_SUMMARIES)},
            "generate_summary": {"enum": list(_SUMMARIES)},
        },
        "additionalProperties": False,
    },
    "stream": {"type": ["boolean", "null"]},
    "stream_options": {
        "type": ["object", "null"],
        "properties": {"include_obfuscation": {"type": ["boolean", "null"]}},
        "additionalProperties": False,
    },
    **{key: CHAT_FIELDS[key] for key in EXTENSIONS},
}
#: accepted with no effect here (OpenAI's service fields; reasons in ``openai_ignored``)
_NO_EFFECT = (
    "user",
    "safety_identifier",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
)


def accepted_fields() -> dict[str, dict[str, Any]]:
    """The fields accepted with no effect or only at some values: the JSON schema of
    what is accepted, its description saying why (for ``openapi``)."""
    out: dict[str, dict[str, Any]] = {}
    for key in _NO_EFFECT:
        schema, why = NO_EFFECT[key]
        out[key] = {**schema, "description": f"accepted, no effect here: {why}"}
    for key, (allowed, why) in _AT_DEFAULT.items():
        out[key] = {"enum": list(allowed), "description": f"only these values: {why}"}
    return out


@dataclass
class ResponsesRequest:
    """A checked Responses request: its chat request (rows, reading plan) and what the
    response object echoes back."""

    chat: ParsedRequest
    #: the request's own fields as the Response object repeats them (instructions, tools..)
    echo: dict[str, Any]


def parse_responses(
    body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int
) -> ResponsesRequest:
    """A Responses body, checked, as the chat request it means (see module doc)."""
    _refuse(body)
    if "input" not in body:
        raise RequestError("input is required (text, or a list of input items)", param="input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions must be a string", param="instructions")
    messages, origins = conversation(body["input"], instructions)
    chat: dict[str, Any] = {
        key: value for key, value in body.items() if key not in RESPONSES_FIELDS
    }  # ortgen settings (extra_body): resolve_config judges them, naming any unknown key
    for key in (*_NO_EFFECT, *_AT_DEFAULT):
        chat.pop(key, None)
    for key in ("model", "temperature", "top_p", "stream", "parallel_tool_calls", *EXTENSIONS):
        if key in body:
            chat[key] = body[key]
    chat["messages"] = messages
    _stream_options(body)
    length = integer(body, "max_output_tokens", 1)
    if length is not None:
        chat["max_completion_tokens"] = length
    for key in ("temperature", "top_p"):
        number(body, key, *NUMBERS[key])
    boolean(body, "parallel_tool_calls")
    chat_tools = tools(body.get("tools"))
    if chat_tools is not None:
        chat["tools"] = chat_tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = tool_choice(body["tool_choice"])
    chat.update(_text(body.get("text")))
    effort = _reasoning(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    try:
        parsed = parse_chat(chat, gen, max_rows=max_rows)
    except RequestError as exc:
        raise _remapped(exc, origins) from None
    parsed.names = {k: _name(v, origins) for k, v in parsed.names.items()}
    parsed.prompt_field = "input"
    return ResponsesRequest(parsed, _echo(body, instructions))


def _refuse(body: Mapping[str, Any]) -> None:
    """What this server cannot honour, each a 400 naming the field and why."""
    for key, (allowed, why) in _AT_DEFAULT.items():
        value = body.get(key)
        if value not in allowed:
            raise RequestError(f"{key}={value!r:.80} is not supported: {why}", param=key)
    for key in body:
        if key in _SPELLED:
            raise RequestError(
                f"{key} is a Chat Completions field; /v1/responses takes {_SPELLED[key]}",
                param=key,
            )
        chat_only = key in OPENAI_FIELDS or key in UNSUPPORTED or key in NO_EFFECT
        ours = key in RESPONSES_FIELDS or key in _NO_EFFECT or key in _AT_DEFAULT
        if chat_only and not ours:
            raise RequestError(
                f"{key} is a Chat Completions field that /v1/responses does not take",
                param=key,
            )


def _stream_options(body: Mapping[str, Any]) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if not body.get("stream"):
        raise RequestError(
            "stream_options is only allowed with stream=true", param="stream_options"
        )
    if not isinstance(options, Mapping) or set(options) - {"include_obfuscation"}:
        raise RequestError(
            'stream_options takes only {"include_obfuscation": bool} (no padding is added)',
            param="stream_options",
        )


def _text(text: Any) -> dict[str, Any]:
    """``text`` (``format``, ``verbosity``) as the chat fields ``response_format`` and
    ``verbosity``."""
    if text is None:
        return {}
    if not isinstance(text, Mapping):
        raise RequestError('text must be an object like {"format": {...}}', param="text")
    out: dict[str, Any] = {}
    for key, value in text.items():
        if key == "verbosity":
            if value is not None and value not in VERBOSITIES:
                raise RequestError(
                    f"text.verbosity must be one of {', '.join(VERBOSITIES)} or null",
                    param="text.verbosity",
                )
            out["verbosity"] = value
        elif key == "format":
            if value is not None:
                out["response_format"] = _format(value)
        else:
            raise RequestError(f"text.{key} is not a field of text", param=f"text.{key}")
    return out


def _format(spec: Any) -> dict[str, Any]:
    """Responses' flat ``text.format`` as Chat Completions' nested ``response_format``."""
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise RequestError(
            'text.format must be {"type": "text" | "json_object" | "json_schema", ...}, '
            f"got {spec!r:.80}",
            param="text.format",
        )
    assert isinstance(spec, Mapping)
    name = spec.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise RequestError(
            "text.format.name must be 1-64 letters, digits, _ or -", param="text.format.name"
        )
    if not isinstance(spec.get("schema"), Mapping):
        raise RequestError(
            "text.format.schema must be a JSON Schema object", param="text.format.schema"
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise RequestError("text.format.strict must be true or false", param="text.format.strict")
    inner = {"name": name, "schema": spec["schema"], "strict": strict}
    return {"type": "json_schema", "json_schema": inner}


def _reasoning(reasoning: Any) -> str | None:
    """``reasoning.effort``, checked; a summary is accepted and changes nothing (the thought
    comes back whole as the reasoning item's text)."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, Mapping):
        raise RequestError('reasoning must be an object like {"effort": "low"}', param="reasoning")
    for key, value in reasoning.items():
        if key not in _REASONING_KEYS:
            raise RequestError(
                f"reasoning.{key} is not supported (only {', '.join(_REASONING_KEYS)})",
                param=f"reasoning.{key}",
            )
        allowed = (None, *REASONING_EFFORTS) if key == "effort" else _SUMMARIES
        if value not in allowed:
            shown = ", ".join(repr(v) for v in allowed)
            raise RequestError(f"reasoning.{key} must be one of {shown}", param=f"reasoning.{key}")
    effort = reasoning.get("effort")
    return effort if isinstance(effort, str) else None


def _name(field: str, origins: list[str]) -> str:
    """A chat path's field name as the Responses request spelled it:
    ``messages[3].content[0]`` -> ``input[2].content[0]`` (the item that message came
    from), ``max_completion_tokens`` -> ``max_output_tokens``."""
    found = re.match(r"messages\[(\d+)\](.*)", field)
    if found is not None:
        index = int(found.group(1))
        if index < len(origins):
            return origins[index] + found.group(2)
        return "input"
    head, dot, rest = field.partition(".")
    return _RENAMED.get(head, head) + dot + rest


def _remapped(exc: RequestError, origins: list[str]) -> RequestError:
    if exc.param is None:
        return exc
    return RequestError(
        exc.message,
        param=_name(exc.param, origins),
        status=exc.status,
        kind=exc.kind,
        code=exc.code,
    )


def _echo(body: Mapping[str, Any], instructions: str | None) -> dict[str, Any]:
    """The request fields a Response object repeats (those the SDK's ``Response`` model
    requires, and those it shows when given)."""
    text = dict(body.get("text") or {})
    text.setdefault("format", {"type": "text"})
    if text["format"] is None:
        text["format"] = {"type": "text"}
    reasoning = body.get("reasoning") or {}
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, Mapping) or not all(isinstance(v, str) for v in metadata.values()):
        raise RequestError("metadata must be an object of strings", param="metadata")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError("user must be a string", param="user")
    echo = {
        "instructions": instructions,
        "tools": list(body.get("tools") or ()),
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "text": text,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "metadata": metadata,
        "user": user,
        "truncation": "disabled",
        "previous_response_id": None,
        "background": False,
        "store": False,
    }
    for key, value in echo.items():  # sent back: JSON has no NaN or Infinity
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise RequestError(
                f"{key} holds a number JSON cannot carry (NaN or Infinity)", param=key
            ) from None
    return echo
