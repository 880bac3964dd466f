"""Helpers every chat format shares (see the package doc): schemas and grammars for
calls, and reading JSON that may still be cut short."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

#: most calls one answer may make when parallel calls are allowed: a small model that
#: has made its call tends to repeat it until ``max_new_tokens``; bounded, it ends
MAX_PARALLEL_CALLS = 8

_DECODER = json.JSONDecoder()


def closed(schema: Any) -> Any:
    """``schema`` with every object that lists ``properties`` closed to others
    (``additionalProperties: false``) unless it says otherwise, as OpenAI's strict mode
    requires: left open, a small model fills arguments with keys nobody asked for."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in out and not {"additionalProperties", "patternProperties"} & set(out):
        out["additionalProperties"] = False
    return out


def call_schema(
    functions: Mapping[str, Mapping[str, Any]],
    *,
    name_key: str = "name",
    arguments_key: str = "arguments",
) -> dict[str, Any]:
    """The JSON Schema of one call object of any of ``functions`` (name -> parameters
    schema): ``{name_key: <its name>, arguments_key: <arguments for that name>}``, the
    name first, so a stream knows the function before its arguments begin."""
    options = [
        {
            "type": "object",
            "properties": {name_key: {"const": name}, arguments_key: dict(parameters)},
            "required": [name_key, arguments_key],
            "additionalProperties": False,
        }
        for name, parameters in functions.items()
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def json_grammar(schema: Mapping[str, Any]) -> str:
    """A Lark rule body for JSON following ``schema``, compact (no whitespace between
    tokens: with flexible whitespace a small model drifts into endless spaces)."""
    compact = {"x-guidance": {"whitespace_flexible": False}}
    return f"%json {json.dumps({**schema, **compact}, ensure_ascii=False)}"


def json_value_end(text: str, start: int = 0) -> int | None:
    """The index just past the JSON value that starts at ``text[start]`` (after any
    whitespace), or None when the text holds no whole value there yet."""
    index = start
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    try:
        _, end = _DECODER.raw_decode(text, index)
    except ValueError:
        return None
    return end


def partial_json_text(text: str) -> str:
    """The leading part of ``text`` (JSON being written) that a stream may send: all of
    it, trailing whitespace aside. JSON text only grows, so what is sent stays true."""
    return text.rstrip()


def held_back(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``text`` may be the start of one of
    ``markers`` (``<tool_`` of ``<tool_call>``): a stream holds them back until the
    next text says whether they are."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def call_id() -> str:
    """A new call id in OpenAI's shape (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"
