"""``pythonic``: calls as a Python list, ``[get_weather(city="Paris", days=3), now()]``.

Llama 3.2 and Llama 4 with vLLM's pythonic templates, and ToolACE: the template lists the
tools as JSON and asks for "a python list of the calls"; the model answers with text, or
with the list alone (Llama 4 may wrap it in ``<|python_start|>...<|python_end|>``, which
is read and never content). Each call is a name and keyword arguments whose values are
Python literals: strings, numbers, ``True``/``False``/``None``, lists and dicts with
string keys. Anything else (a positional argument, a variable, a tuple, ``**kwargs``)
is not a call; a list whose first call is not one is text.

Reading (vLLM's pythonic parser does the same): a call counts once its closing
parenthesis is written; its arguments are read with :mod:`ast`, literals only
(:func:`~ortgen.chat_formats.python_arguments`), and given as JSON text in the order
written. So a stream sends a call's name and its whole arguments at once, when that call
is whole, and nothing of a call before that. Once one call is whole the answer is calls:
text after the list, or after a call that does not parse, is dropped. A final text cut
inside a call gives that call ``complete=False``.

Writing: the earlier turns keep their calls as ``tool_calls`` with the arguments as
values (what templates iterate over), and the template renders them (vLLM's Llama 3.2
template prints string values without quotes, as transformers renders it too). A template
that renders no tools is told about them in the system message, with the earlier calls
written as the text the model would have written.

The grammar: ``auto`` allows text that does not start (after spaces) with ``[`` or the
wrapper, or the calls; ``required`` and a named function the calls only: ``[``, one to
``spec.max_calls`` calls separated by ``", "``, ``]``, each call one of the functions in
Python call syntax, its keyword arguments in the order of its ``properties`` (required
ones always, the others optionally), each value a Python literal following the
parameter's JSON Schema. :class:`~ortgen.chat_formats.PythonCallRules` writes those and
says which parts of JSON Schema it follows (strings with their lengths, numbers with
their bounds, booleans, ``None``, ``enum``/``const``, ``anyOf``, arrays with their
lengths, nested objects as dict literals, local ``$ref``) and which it lets through
looser (``pattern``, ``format``, ``oneOf`` as ``anyOf``, ...). The grammar writes no
wrapper: the parser reads one, the grammar keeps to the bare list.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ortgen import CallDraft, ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.chat_formats import PythonCallRules, python_arguments, python_literal
from ortgen.protocols.chat_formats import PROBE_TOOL

START, END = "<|python_start|>", "<|python_end|>"
_SPACE = " \t\r\n"
#: a function's name as ortgen accepts one (letters, digits, ``_.:-``)
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
#: text that is not a call list: not starting (after spaces) with ``[`` or the wrapper
_TEXT = r"TEXT: /(?s:.+)/ & ~/(?s:[ \t\r\n]*(?:\[|<\|python_start\|>).*)/"
_INSTRUCTIONS = (
    "You have access to the following functions. To call functions, please respond with a "
    "python list of the calls. Respond in the format [func_name1(params_name1=params_value1, "
    "params_name2=params_value2...), func_name2(params)] Do not use variables.\n\n"
)


class PythonicFormat:
    """See module doc."""

    def recognizes(self, probe: TemplateProbe) -> bool:
        written = f"{PROBE_TOOL}(probe_argument=" in (probe.with_call or "")
        return written or any(m in probe.source for m in ("pythonic", START, "[func_name1("))

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        spec: ToolSpec | None,
        *,
        template_renders_tools: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        if template_renders_tools:
            tools = [dict(t) for t in spec.tools] if spec is not None else None
            return [_with_argument_values(m) for m in messages], tools
        written = [_as_text(m) for m in messages]
        if spec is None:
            return written, None
        listed = "".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in spec.tools)
        return _with_system(written, _INSTRUCTIONS + listed), None

    def answer_grammar(self, spec: ToolSpec) -> str:
        rules = PythonCallRules()
        calls = [rules.call(name, schema) for name, schema in spec.functions.items()]
        more = f' (", " call)~0..{spec.max_calls - 1}' if spec.max_calls > 1 else ""
        start = "calls" if spec.calls_only else "TEXT | calls"
        lines = [f"start: {start}", f'calls: "[" call{more} "]"', f"call: {' | '.join(calls)}"]
        return "\n".join([*lines, *rules.lines, _TEXT])

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        stripped = text.lstrip(_SPACE)
        body = stripped
        if stripped.startswith(START):
            body = stripped[len(START) :].lstrip(_SPACE)
        elif not final and START.startswith(stripped):
            return ParsedAnswer()  # nothing yet, or the wrapper being written
        if not final and body == "":
            return ParsedAnswer()
        calls = _read_list(body, final) if body.startswith("[") else None
        if calls is None:
            return ParsedAnswer(text.strip())
        return ParsedAnswer("", calls)


# -- reading ---------------------------------------------------------------------------


def _read_list(text: str, final: bool) -> list[CallDraft] | None:
    """The calls of ``text`` (which starts with ``[``) as far as written, or None when it
    is not a list of calls. A call is listed without a name until it is whole; in a
    final text, one cut short keeps its name (once its ``(`` is written) and
    ``complete=False``."""
    calls: list[CallDraft] = []
    at = 1
    while True:
        at = _skip(text, at)
        named = _NAME.match(text, at)
        if at == len(text) or (named is not None and named.end() == len(text)):
            return [*calls, CallDraft(None)]  # the next call's name is being written
        if named is None or text[named.end()] != "(":
            return calls or None
        end = _closing(text, named.end())
        if end is None:  # its arguments are being written
            return [*calls, CallDraft(named.group() if final else None)]
        arguments = python_arguments(text[named.end() : end]) if end > 0 else None
        if arguments is None:
            return calls or None
        calls.append(CallDraft(named.group(), arguments, True))
        at = _skip(text, end)
        if at == len(text) or text[at] != ",":
            return calls  # the list ends (or goes on in a way that is not a call)
        at += 1


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _closing(text: str, start: int) -> int | None:
    """The index just past the parenthesis closing the one at ``text[start]``, None when
    the text ends first, -1 when a bracket closes one it does not match."""
    expected: list[str] = []
    quote = ""
    at = start
    while at < len(text):
        char = text[at]
        if quote:
            if char == "\\":
                at += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char in _CLOSERS:
            expected.append(_CLOSERS[char])
        elif char in ")]}":
            if not expected or expected.pop() != char:
                return -1
            if not expected:
                return at + 1
        at += 1
    return None


# -- writing -------------------------------------------------------------------------------


def _function(call: Mapping[str, Any]) -> Mapping[str, Any]:
    """A call's function, in OpenAI's shape or the plain one."""
    function = call.get("function", call)
    return function if isinstance(function, Mapping) else call


def _argument_values(function: Mapping[str, Any]) -> Any:
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _with_argument_values(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with its calls' arguments as values, not JSON text."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        function = {**_function(call), "arguments": _argument_values(_function(call))}
        out.append({**call, "function": function} if "function" in call else function)
    return {**message, "tool_calls": out}


def _as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's calls as the text the model writes them in."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    written = []
    for call in calls:
        function = _function(call)
        arguments = _argument_values(function)
        pairs = arguments.items() if isinstance(arguments, dict) else ()
        keywords = ", ".join(f"{key}={python_literal(value)}" for key, value in pairs)
        written.append(f"{function.get('name')}({keywords})")
    content = message.get("content")
    head = f"{content}\n\n" if isinstance(content, str) and content else ""
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": head + "[" + ", ".join(written) + "]"}


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``text`` before the system message's (a new system message if there is none)."""
    if messages and messages[0].get("role") == "system":
        content = messages[0].get("content")
        if isinstance(content, str):
            return [{**messages[0], "content": text + content}, *messages[1:]]
    return [{"role": "system", "content": text.rstrip()}, *messages]
