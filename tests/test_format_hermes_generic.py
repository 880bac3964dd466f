"""The two formats the framework falls back on, read whole and in every streamed split
(``ortgen.testing.check_chat_format``), and their grammars checked on answers they must
accept: ``hermes`` (Qwen, SmolLM3) and ``generic`` (a template that knows no tools)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ortgen import CallDraft, ParsedAnswer, ToolSpec
from ortgen.plugins.chat_formats.generic import GenericFormat
from ortgen.plugins.chat_formats.hermes import HermesFormat
from ortgen.testing import check_chat_format, make_tool_spec

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}}  # fmt: skip
NOTE = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}},
    "required": ["text"]}}}  # fmt: skip
ARGS = '{"a":1,"b":2}'
#: a text answer for the kit's TEXT_SCHEMA, as the JSON the grammar writes
WEATHER = {"city": 'Oslo "N"', "temperature": -3.5}
SHAPED = '{"city":"Oslo \\"N\\"","temperature":-3.5}'
HERMES_CALL = f'<tool_call>\n{{"name":"add","arguments":{ARGS}}}\n</tool_call>'


def test_hermes_reads_text_calls_and_cut_calls_whole_and_streamed() -> None:
    golden = [
        ("Hello there.", ParsedAnswer("Hello there.")),
        (HERMES_CALL, ParsedAnswer("", [CallDraft("add", ARGS, True)])),
        (
            f'Sure.\n{HERMES_CALL}\n<tool_call>\n{{"name": "note", "arguments": '
            '{"text": "é \\"q\\""}}\n</tool_call>',
            ParsedAnswer(
                "Sure.",
                [CallDraft("add", ARGS, True), CallDraft("note", '{"text": "é \\"q\\""}', True)],
            ),
        ),
        (  # another key order: read once whole
            '<tool_call>\n{"arguments": {"a": 3, "b": 4}, "name": "add"}\n</tool_call>',
            ParsedAnswer("", [CallDraft("add", '{"a": 3, "b": 4}', True)]),
        ),
        (  # cut by the token limit inside the arguments
            '<tool_call>\n{"name":"add","arguments":{"a":1,',
            ParsedAnswer("", [CallDraft("add", '{"a":1,', False)]),
        ),
        ("Use <tool_ca if you must", ParsedAnswer("Use <tool_ca if you must")),
    ]
    accepted = [HERMES_CALL, "Just text.", f"{HERMES_CALL}\n{HERMES_CALL}"]
    report = check_chat_format(
        HermesFormat(), golden, make_tool_spec([ADD, NOTE]), grammar_accepts=accepted,
        shaped_answers=[(SHAPED, WEATHER)],
    )  # fmt: skip
    assert report["text_schema"].startswith("shaped: free text refused, 1 JSON")


def test_generic_reads_calls_responses_and_cut_answers_whole_and_streamed() -> None:
    golden = [
        ('{"response":"Hi \\u00e9 \\"you\\""}', ParsedAnswer('Hi é "you"')),
        (
            f'{{"tool_calls":[{{"name":"add","arguments":{ARGS}}},'
            '{"name":"note","arguments":{"text":"x"}}]}',
            ParsedAnswer(
                "", [CallDraft("add", ARGS, True), CallDraft("note", '{"text":"x"}', True)]
            ),
        ),
        (
            '{"tool_calls":[{"name":"add","arguments":{"a":1,"b":2}},{"name":"no',
            ParsedAnswer("", [CallDraft("add", ARGS, True), CallDraft(None)]),
        ),
        ('{"response":"cut \\u00', ParsedAnswer("cut ")),
    ]
    accepted = ['{"response":"fine"}', f'{{"tool_calls":[{{"name":"add","arguments":{ARGS}}}]}}']
    report = check_chat_format(
        GenericFormat(), golden, make_tool_spec([ADD, NOTE]), grammar_accepts=accepted,
        shaped_answers=[(f'{{"response":{SHAPED}}}', WEATHER)],
    )  # fmt: skip
    assert report["text_schema"].startswith("shaped: free text refused, 1 JSON")


def test_the_kit_catches_a_format_that_breaks_the_shapes_text_promise() -> None:
    """``check_chat_format`` refuses a format that says ``shapes_text`` but writes its
    grammar without the schema, one that reads a shaped answer back wrong, and shaped
    answers given for a format that does not say it shapes text."""

    class Ignores(HermesFormat):
        def answer_grammar(self, spec: ToolSpec) -> str:
            return super().answer_grammar(replace(spec, text_schema=None))

    class MisReads(GenericFormat):
        def parse(self, text: str, *, final: bool) -> ParsedAnswer:
            parsed = super().parse(text, final=final)
            return ParsedAnswer(parsed.content.replace("-3.5", "3.5"), parsed.calls)

    class Silent(HermesFormat):
        shapes_text = False

    spec = make_tool_spec([ADD, NOTE])
    with pytest.raises(AssertionError, match=r"ignores ToolSpec\.text_schema"):
        check_chat_format(Ignores(), [], spec)
    with pytest.raises(AssertionError, match="expected no call and content holding"):
        check_chat_format(
            MisReads(), [], spec, shaped_answers=[(f'{{"response":{SHAPED}}}', WEATHER)]
        )
    with pytest.raises(AssertionError, match="does not set shapes_text"):
        check_chat_format(Silent(), [], spec, shaped_answers=[(SHAPED, WEATHER)])
