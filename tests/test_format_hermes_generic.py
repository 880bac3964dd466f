"""The two formats the framework falls back on, read whole and in every streamed split
(``ortgen.testing.check_chat_format``), and their grammars checked on answers they must
accept: ``hermes`` (Qwen, SmolLM3) and ``generic`` (a template that knows no tools)."""

from __future__ import annotations

from ortgen import CallDraft, ParsedAnswer
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
