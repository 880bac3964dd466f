"""Helpers every chat format shares (see the package doc): schemas and grammars for
calls, reading JSON (and calls) that may still be cut short, and the conversation as
chat templates read it."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..protocols.chat_formats import CallDraft

#: most calls one answer may make when parallel calls are allowed: a small model that
#: has made its call tends to repeat it until ``max_new_tokens``; bounded, it ends
MAX_PARALLEL_CALLS = 8

_DECODER = json.JSONDecoder()
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")
#: a call object's beginning up to its whole name (maybe after ``"type": "function"``)
_CALL_NAME = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


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
            "properties": {
                name_key: {"const": name},
                arguments_key: _own_resource(name, parameters),
            },
            "required": [name_key, arguments_key],
            "additionalProperties": False,
        }
        for name, parameters in functions.items()
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _own_resource(name: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``parameters`` as a schema resource of its own (an ``$id``), so its local
    references (``#/$defs/...``, ``#/definitions/...``, ``#``: what Pydantic writes for a
    nested model) still point into it once it is nested inside the call's schema; without
    one they resolve against the whole answer's schema and llguidance refuses it."""
    if "$id" in parameters:
        return dict(parameters)
    return {"$id": f"urn:ortgen:tool:{name}", **parameters}


def json_grammar(schema: Mapping[str, Any]) -> str:
    """A Lark rule body for JSON following ``schema``, compact (no whitespace between
    tokens: with flexible whitespace a small model drifts into endless spaces)."""
    compact = {"x-guidance": {"whitespace_flexible": False}}
    return f"%json {json.dumps({**schema, **compact}, ensure_ascii=False)}"


def regex_literal(text: str) -> str:
    """``text`` as a regex matching it literally inside a Lark ``/.../`` (llguidance's
    Rust syntax: its meta characters escaped, and the ``/`` that would end the regex)."""
    return "".join(f"\\{char}" if char in _REGEX_META else char for char in text)


def text_then(name: str, marker: str) -> str:
    """A Lark rule ``name`` for any text, maybe none, and then ``marker``, ending at the
    first ``marker``: what a grammar writes for text before a call's opening tag.

    ``TEXT? "<marker>"`` with ``TEXT`` any text holding no marker does not do it: an
    llguidance terminal is greedy, so text that may hold the marker's first characters
    (``[`` of ``[TOOL_CALLS]``) takes them and dies on the marker's last one, and the
    marker can never begin. A lazy terminal ends as soon as it can, at the marker.
    """
    return f"{name}[lazy]: /(?s:.*{regex_literal(marker)})/"


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


def read_json_call(
    text: str, index: int, *, arguments_keys: Sequence[str] = ("arguments",)
) -> tuple[CallDraft | None, int | None]:
    """The call written as a JSON object from ``text[index]`` (a ``{``) on, as far as it
    is written, and the index just past the object (None while it is not whole).

    The grammars' shape, ``{"name": ..., <one of arguments_keys>: {...}}`` (maybe after
    ``"type": "function"``), is read as it streams: the name once its string is whole,
    then the arguments as the text written, so they only grow; the call is complete once
    the object is whole (keys after the arguments, an ``id`` say, are skipped) and the
    arguments are an object. Another shape (keys in another order) is read once whole: a
    call if it has a string ``name`` (its arguments under the first of
    ``arguments_keys`` it has, as a value or as JSON text; none is ``{}``). The draft is
    None when the whole value is no call.
    """
    end = json_value_end(text, index)
    named = _CALL_NAME.match(text, index)
    name = _json_string(named.group(1)) if named is not None else None
    keys = "|".join(re.escape(key) for key in arguments_keys)
    key = re.compile(rf'\s*,\s*"(?:{keys})"\s*:\s*').match(text, named.end()) if named else None
    if key is None:  # not (yet) that shape: read once whole
        if end is None:
            return CallDraft(name), None
        return _loose_call(text[index:end], arguments_keys), end
    value_end = json_value_end(text, key.end())
    if value_end is None:
        return CallDraft(name, partial_json_text(text[key.end() :])), None
    arguments = text[key.end() : value_end]
    return CallDraft(name, arguments, end is not None and _is_object(arguments)), end


def _loose_call(body: str, arguments_keys: Sequence[str]) -> CallDraft | None:
    """A whole JSON value as a call in any key order (see :func:`read_json_call`)."""
    value = json.loads(body)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    key = next((key for key in arguments_keys if key in value), None)
    arguments = value[key] if key is not None else {}
    if isinstance(arguments, str):
        return CallDraft(value["name"], arguments, _is_object(arguments))
    if not isinstance(arguments, dict):
        return CallDraft(value["name"])  # no arguments a call can take: never complete
    return CallDraft(value["name"], json.dumps(arguments, ensure_ascii=False), True)


def _json_string(body: str) -> str | None:
    """A JSON string's body decoded (None: not valid JSON)."""
    try:
        return str(json.loads(f'"{body}"'))
    except ValueError:
        return None


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


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


def with_system(messages: Sequence[Mapping[str, Any]], text: str) -> list[dict[str, Any]]:
    """``messages`` with ``text`` at the end of the system message, or in a new one first
    when there is none (or its content is not text): where a format describes the tools
    to a template that does not render them."""
    out = [dict(message) for message in messages]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{text}"
        return out
    return [{"role": "system", "content": text}, *out]


def call_id() -> str:
    """A new call id in OpenAI's shape (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def arguments_value(arguments: Any) -> Any:
    """A call's arguments as a JSON value: OpenAI sends them as JSON text, while chat
    templates render a mapping (``arguments | tojson``); text that is not JSON stays."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            return json.loads(arguments)
    return arguments


def calls_for_template(
    messages: Sequence[Mapping[str, Any]],
    *,
    rename_id: Callable[[str], str] | None = None,
) -> list[dict[str, Any]]:
    """``messages`` with their earlier calls as most families' templates read them: each
    call's ``arguments`` a value (:func:`arguments_value`), a ``tool_calls`` that is
    None or empty dropped (templates test whether the key is there, not what it holds),
    and, with ``rename_id``, every call's ``id`` and every tool result's
    ``tool_call_id`` rewritten by it (a family whose ids have a shape of their own).
    Each message (and each call in it) is a copy: ``messages`` stay as given."""
    out: list[dict[str, Any]] = []
    for message in messages:
        copy = dict(message)
        if "tool_calls" in copy and not copy["tool_calls"]:
            del copy["tool_calls"]
        if copy.get("tool_calls"):
            copy["tool_calls"] = [_call_for_template(c, rename_id) for c in copy["tool_calls"]]
        if rename_id is not None and isinstance(copy.get("tool_call_id"), str):
            copy["tool_call_id"] = rename_id(copy["tool_call_id"])
        out.append(copy)
    return out


def _call_for_template(call: Any, rename_id: Callable[[str], str] | None) -> Any:
    if not isinstance(call, Mapping):
        return call  # the template (or the request's checks) says what is wrong with it
    copy = dict(call)
    function = copy.get("function")
    if isinstance(function, Mapping) and "arguments" in function:
        copy["function"] = {**function, "arguments": arguments_value(function["arguments"])}
    if rename_id is not None and isinstance(copy.get("id"), str):
        copy["id"] = rename_id(copy["id"])
    return copy
