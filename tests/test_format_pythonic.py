"""The ``pythonic`` chat format (Llama 3.2 / Llama 4 / ToolACE): the vendored template
renders what transformers renders, answers parse whole and streamed
(``check_chat_format``), the grammar follows the parameters' JSON Schemas, and a tiny
random model of the family constrained by it writes calls whose arguments validate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import ortgen
from ortgen import CallDraft, ParsedAnswer, TemplateProbe
from ortgen.chat_formats import python_arguments, python_literal
from ortgen.errors import InputError
from ortgen.plugins.chat_formats import FORMATS
from ortgen.plugins.chat_formats.pythonic import PythonicFormat
from ortgen.protocols.chat_formats import PROBE_ARGUMENTS, PROBE_TOOL
from ortgen.testing import check_chat_format, make_tool_spec
from tests.tiny_models import export_chat_family

TEMPLATE = (
    Path(ortgen.plugins.chat_formats.__file__).parent / "templates" / "pythonic.jinja"
).read_text()
SPECIAL = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_start|>")
DATE = {"date_string": "04 Dec 2026"}  # the template reads today's date otherwise

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "hourly": {"type": "boolean"},
                "at": {
                    "type": "object",
                    "properties": {
                        "lat": {"type": "number", "minimum": -90, "maximum": 90},
                        "note": {"type": ["string", "null"], "maxLength": 5},
                    },
                    "required": ["lat"],
                },
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
            },
            "required": ["city", "days"],
        },
    },
}
NOW = {
    "type": "function",
    "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [WEATHER, NOW]
FMT = PythonicFormat()


def calls(*pairs: tuple[str, dict[str, Any]]) -> ParsedAnswer:
    return ParsedAnswer("", [CallDraft(name, json.dumps(args), True) for name, args in pairs])


GOLDEN = [
    ('[get_weather(city="Paris", days=3)]', calls(("get_weather", {"city": "Paris", "days": 3}))),
    (
        "[get_weather(city='Oslo', days=1, unit=\"celsius\", hourly=False), now()]",
        calls(
            ("get_weather", {"city": "Oslo", "days": 1, "unit": "celsius", "hourly": False}),
            ("now", {}),
        ),
    ),
    (  # Llama 4's wrapper is never content; nested literals become JSON
        '<|python_start|>[f(a=-1.5, b=[1, {"x": None}], c="it\'s")]<|python_end|>',
        calls(("f", {"a": -1.5, "b": [1, {"x": None}], "c": "it's"})),
    ),
    ("  [now()]\n", calls(("now", {}))),
    ("The weather is fine.", ParsedAnswer("The weather is fine.")),
    ("[1] is a citation.", ParsedAnswer("[1] is a citation.")),  # not a call list
    ("[f(x)]", ParsedAnswer("[f(x)]")),  # positional: not a call
    ("[f(a=len(b))]", ParsedAnswer("[f(a=len(b))]")),  # not a literal
    ("[f(a=(1, 2))]", ParsedAnswer("[f(a=(1, 2))]")),  # a tuple is no JSON value
    ("[f(a=1), g(x)]", calls(("f", {"a": 1}))),  # once a call is whole, the rest is dropped
    (  # cut short by max_new_tokens: the cut call stays incomplete
        '[now(), get_weather(city="Pa',
        ParsedAnswer("", [CallDraft("now", "{}", True), CallDraft("get_weather", "", False)]),
    ),
]
ACCEPTED = [
    '[get_weather(city="Paris", days=3)]',
    '[get_weather(city="P\\"x", unit="fahrenheit", days=7, hourly=True, '
    'at={"lat": -1.5, "note": None}, tags=["a", "b"]), now()]',
    "Sunny.",
]


def test_golden_answers_parse_whole_and_streamed_and_the_grammars_compile() -> None:
    report = check_chat_format(FMT, GOLDEN, make_tool_spec(TOOLS), grammar_accepts=ACCEPTED)
    assert report["grammar named 'now'"] == "compiles"
    assert report["grammar_accepts"] == f"accepted: {len(ACCEPTED)}"


@pytest.mark.parametrize(
    "answer",
    [
        '[get_weather(city="Paris")]',  # days is required
        '[get_weather(days=3, city="Paris")]',  # the properties' order
        '[get_weather(city="Paris", days=8)]',  # maximum
        '[get_weather(city="", days=1)]',  # minLength
        '[get_weather(city="Paris", days=1, unit="kelvin")]',  # enum
        '[get_weather(city="Paris", days=1, at={"note": "x"})]',  # lat is required
        '[get_weather(city="Paris", days=1, tags=["a", "b", "a"])]',  # maxItems
        '[get_weather(city="Paris", days=1, hourly=true)]',  # JSON, not Python
        "[get_weather(city='Paris', days=1)]",  # the grammar writes double quotes
        "[now(), now(), now(), now(), now(), now(), now(), now(), now()]",  # max_calls
        " [now()]",  # text cannot start like a call list
    ],
)
def test_the_grammar_refuses_what_the_schema_refuses(answer: str) -> None:
    with pytest.raises(AssertionError, match="grammar refuses"):
        check_chat_format(FMT, [], make_tool_spec(TOOLS), grammar_accepts=[answer])


def test_refs_and_non_identifier_parameters() -> None:
    tree = {
        "type": "function",
        "function": {
            "name": "tree",
            "parameters": {
                "type": "object",
                "$defs": {"node": {"type": "object", "properties": {"kids": {
                    "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}}},
                "properties": {"root": {"$ref": "#/$defs/node"}, "user-id": {"type": "string"}},
                "required": ["root"],
            },
        },
    }  # fmt: skip
    spec = make_tool_spec([tree])
    check_chat_format(FMT, [], spec, grammar_accepts=['[tree(root={"kids": [{}, {"kids": []}]})]'])
    with pytest.raises(AssertionError, match="grammar refuses"):  # user-id is left out
        check_chat_format(FMT, [], spec, grammar_accepts=['[tree(root={}, user-id="x")]'])
    required = json.loads(json.dumps(tree))
    required["function"]["parameters"]["required"] = ["user-id"]
    with pytest.raises(InputError, match="'user-id' cannot be written"):
        FMT.answer_grammar(make_tool_spec([required]))


def test_the_kit_reads_and_writes_python_literals() -> None:
    assert python_arguments('(a=-1, b=[True, None], c={"k": 2.5}, d="x")') == (
        '{"a": -1, "b": [true, null], "c": {"k": 2.5}, "d": "x"}'
    )
    for source in ("(1)", "(**k)", "(a=b)", "(a={1: 2})", "(a=1e999)", "(a=-True)", "(a="):
        assert python_arguments(source) is None, source
    assert python_literal({"a": [True, None, "é"]}) == '{"a": [True, None, "é"]}'


class _Leaky(PythonicFormat):
    """Shows text it should hold back: "[" is content until the call is whole."""

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        return super().parse(text, final=final) if final else ParsedAnswer(text.strip())


class _Unclosed(PythonicFormat):
    def answer_grammar(self, spec) -> str:
        return super().answer_grammar(spec).replace('"]"', '"]" missing_rule', 1)


def test_check_chat_format_names_what_a_broken_format_does() -> None:
    golden = GOLDEN[:1]
    with pytest.raises(AssertionError, match="the final parse: content '' does not extend"):
        check_chat_format(_Leaky(), golden)
    with pytest.raises(AssertionError, match="the auto grammar does not compile"):
        check_chat_format(_Unclosed(), golden)
    with pytest.raises(AssertionError, match="content is '', expected 'x'"):
        check_chat_format(FMT, [(GOLDEN[0][0], ParsedAnswer("x", GOLDEN[0][1].calls))])


# -- the prompt ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ortgen.TextGenerator]:
    """The tiny random Llama 3.2 (pythonic) model: its HF folder and the loaded export."""
    root = tmp_path_factory.mktemp("pythonic-family")
    # the end of sequence stays the tokenizer's special </s>: the family's <|eot_id|> is an
    # added token that decodes as text here, which llguidance would allow inside a
    # string (in the real tokenizer it is special)
    onnx = export_chat_family(root, "pythonic", TEMPLATE, special_tokens=SPECIAL)
    return root / "pythonic-hf", ortgen.load(onnx, threads=1)


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def _as_transformers_takes_it(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as transformers' users write it: call arguments as values."""
    out = json.loads(json.dumps(messages))
    for message in out:
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def test_the_prompt_is_what_transformers_renders(family) -> None:
    from transformers import AutoTokenizer

    hf_dir, gen = family
    messages, tools = FMT.prompt_messages(
        CONVERSATION, make_tool_spec(TOOLS), template_renders_tools=True
    )
    ours = gen.tokenizer.apply_chat_template(messages, tools=tools, **DATE)
    theirs = AutoTokenizer.from_pretrained(hf_dir).apply_chat_template(
        _as_transformers_takes_it(CONVERSATION), tools=TOOLS, tokenize=False,
        add_generation_prompt=True, **DATE,
    )  # fmt: skip
    assert ours == theirs
    assert "[get_weather(city=Paris, days=2)]<|eot_id|>" in ours  # the template's own quirk
    assert '"output": "sunny"' in ours


def test_the_template_is_recognised_by_how_it_writes_a_call(family) -> None:
    _, gen = family
    call = {"type": "function", "function": {"name": PROBE_TOOL, "arguments": PROBE_ARGUMENTS}}
    probe_tool = {"type": "function", "function": {"name": PROBE_TOOL, "parameters": {}}}
    with_call = gen.tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "ok"},
        ],
        tools=[probe_tool],
    )
    probe = TemplateProbe(TEMPLATE, with_call=with_call)
    assert FMT.recognizes(probe)
    assert FMT.recognizes(TemplateProbe("{{ '<|python_start|>' }}"))
    matched = [name for name, factory in FORMATS.items() if factory().recognizes(probe)]
    assert "pythonic" in matched and "hermes" not in matched
    assert not FMT.recognizes(TemplateProbe("{{ messages }}", with_call="<tool_call>{}"))


def test_a_template_without_tools_is_told_about_them() -> None:
    messages, tools = FMT.prompt_messages(
        CONVERSATION, make_tool_spec(TOOLS), template_renders_tools=False
    )
    assert tools is None
    assert messages[0]["content"].startswith("You have access to the following functions.")
    assert (
        messages[0]["content"].endswith("Be brief.") and '"name": "now"' in messages[0]["content"]
    )
    assert messages[2] == {"role": "assistant", "content": '[get_weather(city="Paris", days=2)]'}
    assert messages[3] == CONVERSATION[3]


# -- a tiny random model, constrained by the grammar -------------------------------------


def _answers(gen: ortgen.TextGenerator, spec, seeds: range, new: int) -> list[tuple[str, str]]:
    messages, tools = FMT.prompt_messages(
        [{"role": "user", "content": "Weather?"}], spec, template_renders_tools=True
    )
    prompt = gen.tokenizer.encode_chat(messages, tools=tools, **DATE)
    grammar = FMT.answer_grammar(spec)
    out = []
    for seed in seeds:
        result = gen.generate([prompt], grammar=grammar, do_sample=True, seed=seed,
                              max_new_tokens=new)  # fmt: skip
        tokens = result.tokens[0]
        reason = result.finish_reasons[0]
        if reason == "eos":
            tokens = tokens[:-1]
        out.append((gen.tokenizer.decode(tokens), reason))
    return out


@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
def test_a_random_model_writes_calls_that_validate(family, choice: str) -> None:
    _, gen = family
    spec = make_tool_spec(TOOLS, choice)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    made = 0
    for text, reason in _answers(gen, spec, range(6), 160):
        answer = FMT.parse(text, final=True)
        if spec.calls_only:
            assert answer.content == "" and answer.calls, text
        for call in answer.calls:
            if not call.complete:  # only a call cut by max_new_tokens
                assert reason == "length", text
                continue
            assert call.name in spec.functions, text
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
            made += 1
    if spec.calls_only:
        assert made, "no call was whole in any seed"
