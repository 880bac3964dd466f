"""``llama3_json``: the whole answer is ``{"name": ..., "parameters": {...}}``.

Llama 3.1, 3.2 and 3.3 with JSON tool calls (Meta's "JSON based tool calling"): the
template renders the tools itself and the model answers either with text or with calls
only, each a bare JSON object keyed ``parameters`` (Meta's key; ``arguments`` is read
too, as vLLM's ``llama3_json`` parser does), maybe after ``<|python_tag|>``, several
joined by ``; `` (vLLM's reading; Meta's templates write one call per turn). A call is
read only at the start of the answer, as llama.cpp does: text that goes on to show JSON
is text. The grammar writes the calls bare (as the templates render them, no tag), and
for ``auto`` text that does not begin like a call.

The family's templates render an earlier call with ``arguments | tojson`` (so the
arguments go as a value, not OpenAI's JSON text) and one call per assistant turn (more
raise), so an answer that made several calls is given to the template as one turn per
call, each followed by its result.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ortgen import CallDraft, ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.chat_formats import (
    call_schema,
    calls_for_template,
    json_grammar,
    read_json_call,
    regex_literal,
    with_system,
)
from ortgen.protocols.chat_formats import PROBE_ARGUMENTS, PROBE_TOOL

TAG = "<|python_tag|>"
#: where a call's arguments may be: Meta's key, then the one vLLM also reads
_KEYS = ("parameters", "arguments")
_SEPARATOR = re.compile(r"\s*;\s*")
#: the probe's call as the family writes it, maybe after the tag: its arguments a value
#: (or JSON text), so the tool's own definition (its "parameters" a schema) is not it
_PROBE_CALL = re.compile(
    rf'(?:{re.escape(TAG)}\s*)?\{{\s*"name"\s*:\s*"{re.escape(PROBE_TOOL)}"\s*,\s*'
    rf'"parameters"\s*:\s*"?\{{\s*\\?"{re.escape(next(iter(PROBE_ARGUMENTS)))}\\?"'
)
#: how a call may begin, whitespace aside: what a cut final answer is read as a call by
_STARTS = ('{"name":"', '{"type":"function","name":"')
_INSTRUCTIONS = (
    "You can call these functions. To call one, answer with only its JSON call: "
    '{{"name": <function name>, "parameters": <dictionary of arguments>}}{more}.'
    "\n\nFunctions:\n{tools}"
)


class Llama3JsonFormat:
    """See module doc."""

    def recognizes(self, probe: TemplateProbe) -> bool:
        if probe.with_call is not None:
            return _PROBE_CALL.search(probe.with_call) is not None
        # the call did not render (a template strict about something the probe has):
        # the source teaches the "parameters" call shape in Llama 3's turns
        source = probe.source
        return (
            probe.with_tools is not None
            and '"parameters"' in source
            and "<|start_header_id|>" in source
            and "<|eot_id|>" in source
        )

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        spec: ToolSpec | None,
        *,
        template_renders_tools: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        conversation = _one_call_per_turn(calls_for_template(messages))
        if spec is None:
            return conversation, None
        tools = [dict(t) for t in spec.tools]
        if template_renders_tools:
            return conversation, tools
        more = "; several calls joined by '; '" if spec.max_calls > 1 else ""
        listed = "\n\n".join(json.dumps(t, ensure_ascii=False, indent=2) for t in tools)
        text = _INSTRUCTIONS.format(more=more, tools=listed)
        return with_system(conversation, text), None

    def answer_grammar(self, spec: ToolSpec) -> str:
        body = json_grammar(call_schema(spec.functions, arguments_key="parameters"))
        more = f' ("; " call)~0..{spec.max_calls - 1}' if spec.max_calls > 1 else ""
        start = "calls" if spec.calls_only else "TEXT | calls"
        return "\n".join(
            [
                f"start: {start}",
                f"calls: call{more}",
                f"call: {body}",
                # text never begins like a call: not "{", not the tag, after any spaces
                rf"TEXT: /(?s:.+)/ & ~/(?s:\s*(\{{|{regex_literal(TAG)}).*)/",
            ]
        )

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        start = len(text) - len(text.lstrip())
        if text.startswith(TAG, start):
            start += len(TAG)
            start += len(text[start:]) - len(text[start:].lstrip())
        elif not final and TAG.startswith(text[start:]):
            return ParsedAnswer()  # the tag, maybe, or nothing yet
        if not text.startswith("{", start):
            return ParsedAnswer(text[start:].strip())  # the tag, a wrapper, is not content
        calls = _calls(text, start)
        if not calls:  # whole JSON, and no call: text, as it will stay
            return ParsedAnswer(text[start:].strip())
        if not final or calls[0].name or len(calls) > 1 or _may_start_a_call(text[start:]):
            return ParsedAnswer("", calls)  # the last maybe cut (before its name was whole)
        return ParsedAnswer(text[start:].strip())  # a brace, then no call


def _calls(text: str, index: int) -> list[CallDraft]:
    """The calls from ``text[index]`` (a ``{``) on, joined by ``;``, the last maybe cut.
    A whole JSON value that is no call ends them (the first: there are none)."""
    calls: list[CallDraft] = []
    while True:
        call, end = read_json_call(text, index, arguments_keys=_KEYS)
        if call is None:
            return calls
        calls.append(call)
        if end is None:
            return calls
        joined = _SEPARATOR.match(text, end)
        if joined is None or not text.startswith("{", joined.end()):
            return calls  # the last call, or another still to come
        index = joined.end()


def _may_start_a_call(text: str) -> bool:
    """Whether ``text`` (cut short) is the beginning of a call, whitespace aside."""
    squeezed = re.sub(r"\s+", "", text)
    return any(start.startswith(squeezed) or squeezed.startswith(start) for start in _STARTS)


def _one_call_per_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant turn with several calls as one turn per call, each followed by its
    result: the one naming its id (``tool_call_id``), else the next naming no call."""
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        calls = message.get("tool_calls")
        if message.get("role") != "assistant" or not isinstance(calls, list) or len(calls) < 2:
            out.append(message)
            continue
        results: list[dict[str, Any]] = []
        while index < len(messages) and messages[index].get("role") == "tool":
            results.append(messages[index])
            index += 1
        ids = [call.get("id") if isinstance(call, dict) else None for call in calls]
        answers: list[list[dict[str, Any]]] = [[] for _ in calls]
        unnamed = []
        for result in results:
            named = result.get("tool_call_id")
            if named is not None and named in ids:
                answers[ids.index(named)].append(result)
            else:
                unnamed.append(result)
        for number, call in enumerate(calls):
            if not answers[number] and unnamed:
                answers[number].append(unnamed.pop(0))
            out.append({**message, "tool_calls": [call], **({"content": ""} if number else {})})
            out.extend(answers[number])
        out.extend(unnamed)
    return out
