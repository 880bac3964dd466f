"""``generic``: one JSON object, ``{"tool_calls": [...]}`` or ``{"response": "..."}``.

For a template that knows no tools (SmolLM2's, and any format no other one recognises):
llama.cpp's generic format. The tools are described in the system message and the whole
answer is one JSON object, so a small model that has never seen tools still answers in
a shape that can be read. Earlier calls and tool results in the conversation become the
JSON the model wrote and ``tool_response`` messages (as ``user`` unless the template
knows a ``tool`` role). With a ``response_format`` beside the tools
(``ToolSpec.text_schema``) the ``response`` is JSON of its schema instead of a string,
as llama.cpp's generic format writes it, and the system message gives the schema.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from ortgen import CallDraft, InputError, ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.chat_formats import (
    call_schema,
    json_grammar,
    json_value_end,
    partial_json_text,
    read_json_call,
    with_system,
)

_INSTRUCTIONS = (
    "You can call the following tools to answer the user. Answer with one JSON object: "
    'either {{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}} to call '
    "{which}, {answer}.\n\nTools:\n{tools}"
)
_FREE = 'or {"response": "<your answer>"} to answer directly'
_CALLS_ONLY = (
    "You can call the following tools to answer the user. Answer with one JSON object "
    'calling {which}: {{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}}'
    "\n\nTools:\n{tools}"
)
_SHAPED = (
    'or {{"response": <your answer>}} to answer directly, <your answer> being JSON '
    "that follows this schema: {schema}"
)
_RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*')
_CALLS = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[\s*')


class GenericFormat:
    """See module doc."""

    #: a text answer under a schema (``ToolSpec.text_schema``) is the ``response`` value
    shapes_text = True

    def recognizes(self, probe: TemplateProbe) -> bool:
        return False  # the fallback: picked when no other format recognises a template

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        spec: ToolSpec | None,
        *,
        template_renders_tools: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        conversation = _plain_history(messages)
        if spec is None:
            return conversation, None
        listed = json.dumps([_listed(t["function"], spec) for t in spec.tools], ensure_ascii=False)
        which = f"the tool {spec.named!r}" if spec.named else "tools"
        answer = _FREE
        if spec.text_schema is not None:
            answer = _SHAPED.format(schema=json.dumps(spec.text_schema, ensure_ascii=False))
        template = _CALLS_ONLY if spec.calls_only else _INSTRUCTIONS
        text = template.format(which=which, tools=listed, answer=answer)
        return with_system(conversation, text), None

    def answer_grammar(self, spec: ToolSpec) -> str:
        calls: dict[str, Any] = {
            "type": "array",
            "items": call_schema(spec.functions),
            "minItems": 1,
            "maxItems": spec.max_calls,
        }
        call_answer = {
            "type": "object",
            "properties": {"tool_calls": calls},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        if spec.calls_only:
            return f"start: {json_grammar(call_answer)}"
        text_answer = {
            "type": "object",
            "properties": {"response": _own_resource(spec.text_schema)},
            "required": ["response"],
            "additionalProperties": False,
        }
        return f"start: {json_grammar({'anyOf': [call_answer, text_answer]})}"

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        response = _RESPONSE.match(text)
        if response is not None and text.startswith('"', response.end()):
            return ParsedAnswer(_string_prefix(text[response.end() + 1 :]))
        if response is not None and response.end() < len(text):  # JSON for a text_schema
            return ParsedAnswer(_value_prefix(text, response.end()))
        listed = _CALLS.match(text)
        if listed is not None:
            return ParsedAnswer("", _calls(text, listed.end()))
        if final and json_value_end(text) is None and not text.lstrip().startswith("{"):
            return ParsedAnswer(text.strip())  # not this format's JSON: text as written
        return ParsedAnswer("")


def _listed(function: Mapping[str, Any], spec: ToolSpec) -> dict[str, Any]:
    """One tool as the system message lists it: its name, what it does (the client's
    description: often all a model has to pick a tool by, as llama.cpp's generic format
    keeps it) and its parameters as the grammar closes them."""
    name = function["name"]
    entry: dict[str, Any] = {"name": name}
    if isinstance(function.get("description"), str) and function["description"]:
        entry["description"] = function["description"]
    entry["parameters"] = spec.functions.get(name, function.get("parameters", {}))
    return entry


def _own_resource(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``response`` value's schema: a string, or the request's text schema as a
    resource of its own (its ``#/$defs/...`` still point into it once nested)."""
    if schema is None:
        return {"type": "string"}
    return dict(schema) if "$id" in schema else {"$id": "urn:ortgen:response", **schema}


def _value_prefix(text: str, start: int) -> str:
    """The JSON ``response`` value from ``text[start]`` on as far as written: all of it
    once whole (the envelope's closing brace is not content), else what is written so
    far (it only grows)."""
    end = json_value_end(text, start)
    return text[start:end] if end is not None else partial_json_text(text[start:])


def _string_prefix(body: str) -> str:
    """The decoded part of a JSON string's body written so far (an escape cut in the
    middle waits for its end; the closing quote ends it)."""
    out: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char == '"':
            break
        if char != "\\":
            out.append(char)
            index += 1
            continue
        escape = (
            body[index : index + 6]
            if body[index + 1 : index + 2] == "u"
            else body[index : index + 2]
        )
        if len(escape) < 2 or (escape[1] == "u" and len(escape) < 6):
            break
        try:
            out.append(json.loads(f'"{escape}"'))
        except ValueError:
            break
        index += len(escape)
    return "".join(out)


def _calls(text: str, index: int) -> list[CallDraft]:
    """The calls of the ``tool_calls`` list that starts at ``text[index]``, each read by
    the kit's ``read_json_call``; the last one, cut short, is ``complete=False``."""
    calls: list[CallDraft] = []
    while index < len(text):
        call, end = read_json_call(text, index)
        if call is None:
            break
        calls.append(call)
        if end is None:
            break
        following = re.match(r"\s*,\s*", text[end:])
        if following is None:
            break
        index = end + following.end()
    return calls


def _plain_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation with calls and tool results for a template that renders only roles
    and string contents: a call becomes the JSON the model wrote, a result a
    ``tool_response`` message (``user``: a template of this format knows no ``tool`` role
    that could tell the model what it is)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls:
            written = [_written(call, len(out)) for call in calls]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": written})})
        elif message.get("role") == "tool":
            response = {
                "tool_call_id": message.get("tool_call_id"),
                "content": message.get("content"),
            }
            text = json.dumps({"tool_response": response}, ensure_ascii=False)
            out.append({"role": "user", "content": text})
        else:
            out.append(message)
    return out


def _written(call: Any, index: int) -> dict[str, Any]:
    """An earlier call of the conversation as the model wrote it (name and arguments)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InputError(
            f'messages[{index}].tool_calls: each call must be {{"type": "function", '
            f'"function": {{"name": ..., "arguments": ...}}}}, got {call!r:.80}',
            field=f"messages[{index}]",
        )
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return {"name": function["name"], "arguments": arguments}
