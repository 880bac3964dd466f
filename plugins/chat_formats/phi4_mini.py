"""``phi4_mini``: calls as ``functools[{"name": ..., "arguments": {...}}, ...]``.

Phi-4-mini-instruct (Microsoft): its own template renders no ``tools``; a system message
carries them in a ``tools`` field, JSON text of the functions (name, description,
parameters), which the template writes into the system turn as
``<|system|>...<|tool|>[...]<|/tool|><|end|>``. The model answers with text, or with its
calls as one JSON list after the ``functools`` marker (vLLM's ``phi4_mini_json`` parser
reads the same). vLLM's example template for it renders ``tools`` itself; with such a
template the tools go to it as they are.

Writing (a template that renders no tools): the tools go into the system message's
``tools`` field (a system message "You are a helpful assistant with some tools." first
when there is none), each earlier call into its assistant turn's text as the model wrote
it (``functools[...]`` after any text), and a tool result stays a ``tool`` turn, its
content as text (Microsoft's template writes it ``<|tool|>...<|end|>``; the model card
shows no tool-result turn). A template that renders tools gets the conversation as it is.

Reading: text before ``functools[`` is content (a stream holds back what may be the start
of the marker); after it, each call's name is sent once the arguments begin and the
arguments as written (the JSON text itself, so they only grow). A call written in
another key order (``{"arguments": ..., "name": ...}``, or ``parameters`` for
``arguments``) counts once whole. A final text whose list holds no call at all is
content; one cut inside a call gives that call ``complete=False``.

The grammar: ``auto`` allows text without the marker, or text (maybe none) up to the
marker and then the calls; ``required`` and a named function allow the calls only:
``functools[``, one to ``spec.max_calls`` call objects (compact JSON, each its
function's arguments, via llguidance's JSON Schema) separated by ``", "``, ``]``.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ortgen import CallDraft, ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.chat_formats import (
    call_schema,
    held_back,
    json_grammar,
    read_json_call,
)

MARKER = "functools["
_SYSTEM = "You are a helpful assistant with some tools."
_SPACE = " \t\r\n"
#: where a call's arguments may be: the model card's key, then the one vLLM also reads
_KEYS = ("arguments", "parameters")


class Phi4MiniFormat:
    """See module doc."""

    #: a text answer under a schema (``ToolSpec.text_schema``) is the bare JSON, and
    #: calls come without text before them
    shapes_text = True

    def recognizes(self, probe: TemplateProbe) -> bool:
        return "functools" in probe.source or "<|tool|>" in probe.source

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        spec: ToolSpec | None,
        *,
        template_renders_tools: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        if template_renders_tools:
            return messages, [dict(t) for t in spec.tools] if spec is not None else None
        out = [_as_text(m) for m in messages]
        if spec is None:
            return out, None
        functions = [t.get("function", t) for t in spec.tools]
        listed = json.dumps(functions, ensure_ascii=False)
        if out and out[0].get("role") == "system":
            return [{**out[0], "tools": listed}, *out[1:]], None
        return [{"role": "system", "content": _SYSTEM, "tools": listed}, *out], None

    def answer_grammar(self, spec: ToolSpec) -> str:
        more = f' (", " call)~0..{spec.max_calls - 1}' if spec.max_calls > 1 else ""
        # text then calls: a lazy lexeme ends at the first marker (a greedy TEXT would
        # swallow "functools" and find no way on at "[")
        start = f'"{MARKER}" calls' if spec.calls_only else "TEXT | lead calls"
        if spec.text_schema is not None and not spec.calls_only:
            start = f'text | "{MARKER}" calls\ntext: {json_grammar(spec.text_schema)}'
        return "\n".join(
            [
                f"start: {start}",
                f'calls: call{more} "]"',
                f"call: {json_grammar(call_schema(spec.functions))}",
                r"lead[lazy]: /(?s:.*)functools\[/",
                r"TEXT: /(?s:.+)/ & ~/(?s:.*functools\[.*)/",
            ]
        )

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        start = text.find(MARKER)
        if start < 0:
            head = text if final else text[: len(text) - held_back(text, [MARKER])]
            return ParsedAnswer(head.strip())
        calls = _calls(text[start + len(MARKER) :])
        if final and not calls:  # the marker and no call: text after all
            return ParsedAnswer(text.strip())
        return ParsedAnswer(text[:start].strip(), calls)


def _calls(text: str) -> list[CallDraft]:
    """The calls of the list ``text`` (what follows ``functools[``) as far as written,
    each read by the kit's ``read_json_call``; the last one, cut short, ends the list with
    ``complete=False``."""
    calls: list[CallDraft] = []
    at = 0
    while True:
        at = _skip(text, at)
        if at == len(text):
            return [*calls, CallDraft(None)]  # the next call not begun
        if text[at] != "{":
            return calls
        call, end = read_json_call(text, at, arguments_keys=_KEYS)
        if call is None:  # a whole value that is no call: the list's calls end here
            return calls
        calls.append(call)
        if end is None:
            return calls
        at = _skip(text, end)
        if at == len(text) or text[at] != ",":
            return calls
        at += 1


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's calls as the text the model wrote, a tool result as text."""
    if message.get("role") == "tool" and isinstance(message.get("content"), dict):
        return {**message, "content": json.dumps(message["content"], ensure_ascii=False)}
    calls = message.get("tool_calls")
    if not calls:
        return message
    written = []
    for call in calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # not JSON: written as the text it is
                arguments = json.loads(arguments)
        written.append({"name": function.get("name"), "arguments": arguments})
    content = message.get("content")
    head = f"{content}\n" if isinstance(content, str) and content else ""
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": head + "functools" + json.dumps(written, ensure_ascii=False)}
