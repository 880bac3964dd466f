"""Tool calling: tools in the prompt, calls constrained by a grammar, calls read back.

OpenAI's shape on both sides: ``tools`` (``{"type": "function", "function": {"name",
"description", "parameters"}}``), ``tool_choice`` (``"none"``, ``"auto"``,
``"required"`` or ``{"type": "function", "function": {"name": ...}}``) and
``parallel_tool_calls`` in; ``tool_calls`` (``{"id", "type": "function", "function":
{"name", "arguments": "<JSON text>"}}``) out. How the model writes a call depends on
what its chat template knows, as in llama.cpp's server:

- ``hermes``: the template renders ``tools`` itself and teaches the model to answer
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen 2.5, Hermes,
  SmolLM3). The tools go to the template; the answer is text, calls, or text then calls.
- ``json``: a template that knows no tools (SmolLM2's). ortgen describes the tools in the
  system message and the whole answer is one JSON object, ``{"tool_calls": [{"name",
  "arguments"}]}`` or ``{"response": "text"}`` (llama.cpp's generic format), so a small
  model that has never seen tools still answers in a shape that can be read.

Either way the answer is constrained by a grammar built from the tools' JSON Schemas
(each object closed to keys it does not list, as OpenAI's strict mode): ``required``
and a named function allow only calls (to that function), ``auto`` allows both
branches, ``parallel_tool_calls=false`` one call (else at most ``MAX_PARALLEL_CALLS``).
``none`` hides the tools and constrains nothing. The arguments a call carries are
valid JSON for its function's ``parameters``, as far as llguidance implements JSON
Schema.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

#: most calls one answer may make: a small model that has made its call tends to repeat
#: it until max_new_tokens; bounded, it ends with its calls instead
MAX_PARALLEL_CALLS = 8
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_JSON_INSTRUCTIONS = (
    "You can call the following tools to answer the user. Answer with one JSON object: "
    'either {{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}} to call '
    '{which}, or {{"response": "<your answer>"}} to answer directly.\n\nTools:\n{tools}'
)
_JSON_CALLS_ONLY = (
    "You can call the following tools to answer the user. Answer with one JSON object "
    'calling {which}: {{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}}'
    "\n\nTools:\n{tools}"
)


@dataclass
class ToolPlan:
    """How one chat request with tools runs (see module doc)."""

    format: str  # "hermes" or "json"
    messages: list[dict[str, Any]]  # the conversation as the template should see it
    template_tools: list[dict[str, Any]] | None  # what the template's ``tools`` get
    settings: dict[str, Any] = field(default_factory=dict)  # the constraint, if any
    calls_allowed: bool = False  # whether the answer may hold calls (not ``none``)


def plan_tools(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    template: str | None = None,
) -> ToolPlan:
    """The plan for ``messages`` with ``tools``, given the chat template's source."""
    template = template or ""
    hermes = "<tool_call>" in template
    format_ = "hermes" if hermes else "json"
    functions = _check_tools(tools) if tools else {}
    choice = _check_choice(tool_choice, functions)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InputError(
            f"parallel_tool_calls must be true or false, got {parallel_tool_calls!r}",
            field="parallel_tool_calls",
        )
    parallel = parallel_tool_calls is not False
    conversation = [dict(m) for m in messages]  # callers check their shape first
    if not hermes:
        conversation = _for_plain_template(conversation, template)
    if not functions or choice == "none":
        tools_out = [dict(t) for t in tools] if (tools and hermes and choice != "none") else None
        return ToolPlan(format_, conversation, tools_out)
    named = None if choice in ("auto", "required") else choice
    callable_ = {named: functions[named]} if named else functions
    calls_only = choice != "auto"
    if hermes:
        grammar = _hermes_grammar(callable_, calls_only=calls_only, parallel=parallel)
        return ToolPlan(
            format_, conversation, [dict(t) for t in tools or ()], {"grammar": grammar}, True
        )
    schema = _json_schema(callable_, calls_only=calls_only, parallel=parallel)
    described = _describe(functions, named, calls_only)
    return ToolPlan(format_, _with_system(conversation, described), None, {"json_schema": schema},
                    True)  # fmt: skip


def read_tool_calls(text: str, plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text content (None when it is only calls) and its calls, in OpenAI's
    shape; a call repeated word for word (same function, same arguments: a small model
    looping) is kept once. An answer that is not whole (cut by ``max_new_tokens``) is
    returned as text."""
    content, calls = _read(text, plan)
    seen: set[tuple[Any, str]] = set()
    unique = []
    for call in calls:
        key = (call["function"]["name"], call["function"]["arguments"])
        if key not in seen:
            seen.add(key)
            unique.append(call)
    return content, unique


def _read(text: str, plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    if not plan.calls_allowed:
        return text, []
    if plan.format == "hermes":
        calls = []
        for body in _HERMES_CALL.findall(text):
            try:
                call = json.loads(body)
            except ValueError:
                return text, []
            calls.append(_call(call))
        if not calls:
            return text, []
        content = text[: text.find("<tool_call>")].strip()
        return content or None, calls
    try:
        answer = json.loads(text)
    except ValueError:
        return _partial_response(text), []
    if isinstance(answer, dict) and isinstance(answer.get("tool_calls"), list):
        return None, [_call(call) for call in answer["tool_calls"]]
    if isinstance(answer, dict) and isinstance(answer.get("response"), str):
        return answer["response"], []
    return text, []


def _partial_response(text: str) -> str:
    """The text of a ``{"response": "...`` answer cut before its end (``max_new_tokens``);
    any other unfinished answer as it stands."""
    head = '{"response":"'
    if not text.startswith(head):
        return text
    body = text[len(head) :]
    for cut in range(len(body), max(len(body) - 6, -1), -1):  # an escape may be cut short
        try:
            return json.loads(f'"{body[:cut]}"')
        except ValueError:
            continue
    return text


# -- checks ------------------------------------------------------------------------------


def _check_tools(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """name -> parameters schema, each tool checked (OpenAI's shape)."""
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise InputError(
            f"tools must be a list of tools, got {type(tools).__name__}", field="tools"
        )
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(function, Mapping)
        ):
            raise InputError(
                f'{where} must be {{"type": "function", "function": {{"name": ..., '
                f'"parameters": {{...}}}}}}, got {tool!r:.80}',
                field="tools",
            )
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
            raise InputError(
                f"{where}.function.name must be 1-64 letters, digits, '_', '.', ':' or '-', "
                f"got {name!r}",
                field="tools",
            )
        if name in functions:
            raise InputError(f"{where}.function.name {name!r} is given twice", field="tools")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping):
            raise InputError(
                f"{where}.function.parameters must be a JSON Schema object", field="tools"
            )
        functions[name] = dict(parameters)
    return functions


def _check_choice(choice: Any, functions: Mapping[str, Any]) -> str:
    """ "none", "auto", "required" or a function's name."""
    if choice is None:
        return "auto" if functions else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not functions:
            raise InputError('tool_choice "required" needs tools', field="tool_choice")
        return choice
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or not name:
        raise InputError(
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            f'"function": {{"name": ...}}}}, got {choice!r:.80}',
            field="tool_choice",
        )
    if name not in functions:
        raise InputError(
            f"tool_choice names {name!r}, which is not among the tools", field="tool_choice"
        )
    return name


# -- the grammar ---------------------------------------------------------------------------


def _one_call(functions: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A call of any of ``functions``: its name, and arguments for that name."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": closed(parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in functions.items()
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


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


def _json_schema(
    functions: Mapping[str, Mapping[str, Any]], *, calls_only: bool, parallel: bool
) -> dict[str, Any]:
    calls: dict[str, Any] = {
        "type": "array",
        "items": _one_call(functions),
        "minItems": 1,
        "maxItems": MAX_PARALLEL_CALLS if parallel else 1,
    }
    call_answer = {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if calls_only:
        return call_answer
    text_answer = {
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    return {"anyOf": [call_answer, text_answer]}


def _hermes_grammar(
    functions: Mapping[str, Mapping[str, Any]], *, calls_only: bool, parallel: bool
) -> str:
    compact = {"x-guidance": {"whitespace_flexible": False}}  # as json_schema: no drift
    body = json.dumps({**_one_call(functions), **compact})
    more = f'("\\n" call)~0..{MAX_PARALLEL_CALLS - 1}'
    calls = f"call {more}" if parallel else "call"
    start = "calls" if calls_only else "TEXT | TEXT? calls"
    return "\n".join(
        [
            f"start: {start}",
            f"calls: {calls}",
            'call: "<tool_call>\\n" body "\\n</tool_call>"',
            f"body: %json {body}",
            r"TEXT: /(?s:.+)/ & ~/(?s:.*<tool_call>.*)/",
        ]
    )


# -- the conversation ---------------------------------------------------------------------


def _describe(functions: Mapping[str, Any], named: str | None, calls_only: bool) -> str:
    listed = json.dumps(
        [{"name": name, "parameters": schema} for name, schema in functions.items()],
        ensure_ascii=False,
    )
    which = f"the tool {named!r}" if named else "tools"
    template = _JSON_CALLS_ONLY if calls_only else _JSON_INSTRUCTIONS
    return template.format(which=which, tools=listed)


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``text`` at the end of the system message (a new one first if there is none)."""
    if (
        messages
        and messages[0].get("role") == "system"
        and isinstance(messages[0].get("content"), str)
    ):
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{text}"
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _for_plain_template(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """A conversation with calls and tool results, for a template that renders only
    roles and string contents: a call becomes the JSON the model wrote, a result a
    ``tool_response`` message (as ``user`` unless the template knows a ``tool`` role)."""
    knows_tool_role = "'tool'" in template or '"tool"' in template
    out: list[dict[str, Any]] = []
    for message in messages:
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls:
            written = [_written(call, len(out)) for call in calls]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": written})})
        elif message.get("role") == "tool":
            content = message.get("content")
            response = {"tool_call_id": message.get("tool_call_id"), "content": content}
            text = json.dumps({"tool_response": response}, ensure_ascii=False)
            out.append({"role": "tool" if knows_tool_role else "user", "content": text})
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
    return {"name": function["name"], "arguments": _arguments(function)}


def _arguments(function: Mapping[str, Any]) -> Any:
    """A call's arguments as a value (OpenAI sends them as JSON text)."""
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _call(call: Any) -> dict[str, Any]:
    """One call the model wrote, in OpenAI's shape (arguments as JSON text)."""
    name = call.get("name") if isinstance(call, Mapping) else None
    arguments = call.get("arguments", {}) if isinstance(call, Mapping) else {}
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": name,
            "arguments": arguments
            if isinstance(arguments, str)
            else json.dumps(arguments, ensure_ascii=False),
        },
    }
