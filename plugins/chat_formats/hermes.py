"""``hermes``: calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Qwen2.5, Qwen3, SmolLM3 and the Hermes models (NousResearch's format, which they all
took): the template renders ``tools`` itself (a system block listing them inside
``<tools></tools>``) and the model answers with text, calls, or text then calls, each
call on its own inside the tags. The grammar allows text with no ``<tool_call>`` in it
or calls under ``auto``, calls only under ``required`` and a named function. Text and
then calls is read back but not offered by the grammar: in Qwen's vocabulary
``<tool_call>`` is one token, and llguidance's greedy lexer cannot end free text right
before a token that spans the text and the tag (measured: the answer fails at that token).
For the same reason the text may not start with whitespace or ``<``: a greedy text that
could begin with ``<think>`` would swallow a thought that comes before the answer.
"""

from __future__ import annotations

from typing import Any

from ortgen import CallDraft, ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.chat_formats import call_schema, held_back, json_grammar, read_json_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: free text: never a call's tag, never beginning with whitespace or "<" (module doc)
_TEXT = r"/[^\s<](?s:.*)/ & ~/(?s:.*<tool_call>.*)/"


class HermesFormat:
    """See module doc."""

    #: a text answer under a schema (``ToolSpec.text_schema``) is the bare JSON
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
        tools = [dict(t) for t in spec.tools] if spec is not None else None
        return messages, tools

    def answer_grammar(self, spec: ToolSpec) -> str:
        body = json_grammar(call_schema(spec.functions))
        more = f' ("\\n" call)~0..{spec.max_calls - 1}' if spec.max_calls > 1 else ""
        start = "calls" if spec.calls_only else "TEXT | calls"
        text = [f"TEXT: {_TEXT}"]
        if spec.text_schema is not None:  # JSON of the schema instead of free text
            start = "calls" if spec.calls_only else "text | calls"
            text = [f"text: {json_grammar(spec.text_schema)}"]
        return "\n".join(
            [
                f"start: {start}",
                f"calls: call{more}",
                f'call: "{OPEN}\\n" body "\\n{CLOSE}"',
                f"body: {body}",
                *text,
            ]
        )

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        start = text.find(OPEN)
        head = text if start < 0 else text[:start]
        if start < 0 and not final:
            head = head[: len(head) - held_back(head, [OPEN])]
        content = head.strip()  # a stream holds back trailing whitespace until text follows
        calls = [] if start < 0 else _calls(text[start:], final)
        return ParsedAnswer(content, calls)


def _calls(text: str, final: bool) -> list[CallDraft]:
    """The calls of ``text`` (which starts with ``<tool_call>``), the last maybe cut: each
    body read by the kit's ``read_json_call`` (name once whole, arguments as written)."""
    calls = []
    for chunk in text.split(OPEN)[1:]:
        body, closed, _ = chunk.partition(CLOSE)
        start = len(body) - len(body.lstrip())
        call, end = read_json_call(body, start) if body.strip() else (CallDraft(None), None)
        if call is None:  # a whole value that is no call: the answer's calls end here
            break
        whole = bool(closed) and end is not None and not body[end:].strip()
        calls.append(CallDraft(call.name, call.arguments, call.complete and whole))
    return calls
