"""``mistral``: calls as ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.

Mistral 7B Instruct v0.3, Mistral Nemo and Mistral Small 3.1 (tokenizers before v11):
the template renders the tools itself (``[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]``) and
the model answers with text, or with ``[TOOL_CALLS]`` and a JSON list of calls. Text
before ``[TOOL_CALLS]`` is content, as vLLM's ``mistral`` parser and llama.cpp's
``mistral_nemo`` read it, so ``auto`` allows text, calls, or text then calls;
``required`` and a named function allow calls only. Reading also takes the newer shapes
(v11 and later tokenizers: Magistral, Devstral, Mistral Small 3.2), one
``[TOOL_CALLS]name{...}`` or ``[TOOL_CALLS]name[ARGS]{...}`` per call, and a call
object's ``id`` (llama.cpp's grammar has Nemo write one); the grammar writes the list,
without ids.

The family's templates render an earlier call with ``function | tojson`` (so the
arguments go as a value, not OpenAI's JSON text) and refuse a call id that is not 9
characters long (mistral-common's rule: 9 letters or digits), so each OpenAI id
(``call_`` and 24 hex digits) is given to them as 9 letters or digits, the same for the
call and its result.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ortgen import CallDraft, ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.chat_formats import (
    call_schema,
    calls_for_template,
    held_back,
    json_grammar,
    json_value_end,
    partial_json_text,
    read_json_call,
    regex_literal,
    text_then,
    with_system,
)

OPEN, ARGS = "[TOOL_CALLS]", "[ARGS]"
#: a call of the newer shapes: its name, up to the arguments (``{``) or ``[ARGS]``
_NAMED = re.compile(rf"\s*([^\s\[{{]+)\s*(?:{re.escape(ARGS)}\s*)?(?=\{{)")
_INSTRUCTIONS = (
    "You can call these tools. To call them, answer with [TOOL_CALLS] and a JSON list of "
    'the calls: [TOOL_CALLS][{{"name": <tool name>, "arguments": <arguments>}}{more}].'
    "\n\nTools:\n{tools}"
)


class MistralFormat:
    """See module doc."""

    #: a text answer under a schema (``ToolSpec.text_schema``) is the bare JSON, and
    #: calls come without text before them
    shapes_text = True

    def recognizes(self, probe: TemplateProbe) -> bool:
        return OPEN in (probe.with_call or "") or OPEN in probe.source

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        spec: ToolSpec | None,
        *,
        template_renders_tools: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        conversation = calls_for_template(messages, rename_id=mistral_id)
        if spec is None:
            return conversation, None
        tools = [dict(t) for t in spec.tools]
        if template_renders_tools:
            return conversation, tools
        more = ", ..." if spec.max_calls > 1 else ""
        text = _INSTRUCTIONS.format(more=more, tools=json.dumps(tools, ensure_ascii=False))
        return with_system(conversation, text), None

    def answer_grammar(self, spec: ToolSpec) -> str:
        calls = {
            "type": "array",
            "items": call_schema(spec.functions),
            "minItems": 1,
            "maxItems": spec.max_calls,
        }
        if spec.calls_only:
            return f'start: "{OPEN}" list\nlist: {json_grammar(calls)}'
        if spec.text_schema is not None:
            return "\n".join(
                [
                    f'start: text | "{OPEN}" list',
                    f"list: {json_grammar(calls)}",
                    f"text: {json_grammar(spec.text_schema)}",
                ]
            )
        return "\n".join(
            [
                "start: TEXT | head list",  # text, or text (maybe none) then the calls
                text_then("head", OPEN),
                f"list: {json_grammar(calls)}",
                f"TEXT: /(?s:.+)/ & ~/(?s:.*{regex_literal(OPEN)}.*)/",
            ]
        )

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        start = text.find(OPEN)
        head = text if start < 0 else text[:start]
        if start < 0 and not final:
            head = head[: len(head) - held_back(head, [OPEN])]
        content = head.strip()  # a stream holds back trailing whitespace until text follows
        if start < 0:
            return ParsedAnswer(content)
        return ParsedAnswer(content, _calls(text, start + len(OPEN)))


def _calls(text: str, index: int) -> list[CallDraft]:
    """The calls written after ``[TOOL_CALLS]`` (``text[index:]``), the last maybe cut."""
    rest = text[index:].lstrip()
    index = len(text) - len(rest)
    if rest.startswith("["):  # the list: objects joined by commas
        return _objects(text, index + 1)
    if rest.startswith("{"):  # one object, or several, without the list
        return _objects(text, index)
    return _named(text, index)


def _objects(text: str, index: int) -> list[CallDraft]:
    """The call objects from ``text[index]`` on, joined by commas, the last maybe cut."""
    calls: list[CallDraft] = []
    while True:
        index += len(text[index:]) - len(text[index:].lstrip())
        if not text.startswith("{", index):
            return calls or [CallDraft(None)]  # the first still to come, or no call
        call, end = read_json_call(text, index)
        if call is None:
            return calls or [CallDraft(None)]  # JSON, but no call: ends the calls
        calls.append(call)
        following = re.match(r"\s*,", text[end:]) if end is not None else None
        if end is None or following is None:
            return calls
        index = end + following.end()


def _named(text: str, index: int) -> list[CallDraft]:
    """Calls of the newer shapes, ``name{...}`` or ``name[ARGS]{...}``, each after
    ``[TOOL_CALLS]`` (the first's already read), the last maybe cut."""
    calls: list[CallDraft] = []
    while True:
        named = _NAMED.match(text, index)
        if named is None:
            calls.append(CallDraft(None))  # the name is not whole yet
            return calls
        start = named.end()
        end = json_value_end(text, start)
        if end is None:
            calls.append(CallDraft(named.group(1), partial_json_text(text[start:])))
            return calls
        arguments = text[start:end]
        calls.append(CallDraft(named.group(1), arguments, arguments.startswith("{")))
        following = re.match(rf"\s*{re.escape(OPEN)}", text[end:])
        if following is None:
            return calls
        index = end + following.end()


def mistral_id(call_id: str) -> str:
    """A call id as the family's templates take it: 9 letters or digits. An id that is
    one already stays; another becomes the last 9 of its letters and digits (OpenAI's
    ``call_`` and 24 hex digits: the last 9 hex digits), or, with fewer than 9, 9 hex
    digits of its hash. Always the same for one id, so a call and its result agree."""
    letters = "".join(char for char in call_id if char.isascii() and char.isalnum())
    if len(letters) >= 9:
        return letters[-9:]
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]
