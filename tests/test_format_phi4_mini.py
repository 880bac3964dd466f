"""The ``phi4_mini`` chat format: with Phi-4-mini-instruct's own template (vendored) the
prompt is what transformers renders for the conversation as Phi-4-mini's users write it
(tools in the system message's ``tools``, calls as ``functools[...]``), answers parse
whole and streamed (``check_chat_format``), and a tiny random model of the family
constrained by the grammar writes calls whose arguments validate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import ortgen
from ortgen import CallDraft, ParsedAnswer, TemplateProbe
from ortgen.plugins.chat_formats import FORMATS
from ortgen.plugins.chat_formats.phi4_mini import Phi4MiniFormat
from ortgen.testing import check_chat_format, make_tool_spec
from ortgen.testing.chat_format import _accepts  # the checker's byte-level matcher
from tests.tiny_models import export_chat_family

TEMPLATE = (
    Path(ortgen.plugins.chat_formats.__file__).parent / "templates" / "phi4_mini.jinja"
).read_text()
SPECIAL = ("<|system|>", "<|end|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|/tool|>")

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
FMT = Phi4MiniFormat()


def call(name: str | None, arguments: str, complete: bool = True) -> CallDraft:
    return CallDraft(name, arguments, complete)


GOLDEN = [
    (
        'functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
        ParsedAnswer("", [call("get_weather", '{"city": "Paris", "days": 3}')]),
    ),
    (
        'functools[{"name":"get_weather","arguments":{"city":"Oslo","days":1}}, '
        '{"name":"now","arguments":{}}]',
        ParsedAnswer("", [call("get_weather", '{"city":"Oslo","days":1}'), call("now", "{}")]),
    ),
    (
        'Let me check.\nfunctools[{"name": "now", "arguments": {}}]',
        ParsedAnswer("Let me check.", [call("now", "{}")]),
    ),
    (  # brackets and the marker inside a string are the string's
        'functools[{"name": "f", "arguments": {"s": "a\\"]} functools[ \\u00e9"}}]',
        ParsedAnswer("", [call("f", '{"s": "a\\"]} functools[ \\u00e9"}')]),
    ),
    (  # another key order, or "parameters": read once whole
        'functools[{"arguments": {"a": 1}, "name": "f"}, {"name": "g", "parameters": {}}]',
        ParsedAnswer("", [call("f", '{"a": 1}'), call("g", "{}")]),
    ),
    ("Use functools.partial here.", ParsedAnswer("Use functools.partial here.")),
    ("functools[]", ParsedAnswer("functools[]")),  # the marker and no call: text
    (  # cut short by max_new_tokens
        'functools[{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": '
        '{"city": "Pa',
        ParsedAnswer("", [call("now", "{}"), call("get_weather", '{"city": "Pa', False)]),
    ),
]
ACCEPTED = [
    'functools[{"name":"get_weather","arguments":{"city":"Paris","days":3}}]',
    'Sure.\nfunctools[{"name":"now","arguments":{}}, {"name":"now","arguments":{}}]',
    "Use functools.partial here.",
]


def test_golden_answers_parse_whole_and_streamed_and_the_grammars_compile() -> None:
    shaped = [('{"city":"functools","temperature":1e3}', {"city": "functools", "temperature": 1e3})]
    report = check_chat_format(
        FMT, GOLDEN, make_tool_spec(TOOLS), grammar_accepts=ACCEPTED, shaped_answers=shaped
    )
    assert report["text_schema"].startswith("shaped: free text refused, 1 JSON")
    assert report["grammar named 'get_weather'"] == "compiles"
    assert report["grammar_accepts"] == f"accepted: {len(ACCEPTED)}"


@pytest.mark.parametrize(
    ("choice", "answer"),
    [
        ("auto", 'functools[{"name":"get_weather","arguments":{"city":"Paris"}}]'),  # days
        ("auto", 'functools[{"name": "now", "arguments": {}}]'),  # compact JSON only
        ("auto", 'functools[{"name":"now","arguments":{"x":1}}]'),  # closed arguments
        ("auto", "functools[]"),
        ("required", 'Sure. functools[{"name":"now","arguments":{}}]'),  # calls only
        ("required", "Sunny."),
        ("get_weather", 'functools[{"name":"now","arguments":{}}]'),  # the named one
    ],
)
def test_the_grammar_refuses_what_the_spec_refuses(choice: str, answer: str) -> None:
    spec = make_tool_spec(TOOLS, choice)
    grammar = FMT.answer_grammar(spec)
    with pytest.raises(AssertionError, match="grammar refuses"):
        _accepts(grammar, answer, choice)


# -- the prompt ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ortgen.TextGenerator]:
    """The tiny random Phi-4-mini model: its HF folder and the loaded export."""
    root = tmp_path_factory.mktemp("phi4-family")
    # the end of sequence stays the tokenizer's special </s>: the family's <|end|> is an
    # added token that decodes as text here, which llguidance would allow inside a
    # string (in the real tokenizer it is special)
    onnx = export_chat_family(root, "phi4", TEMPLATE, special_tokens=SPECIAL)
    return root / "phi4-hf", ortgen.load(onnx, threads=1)


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
LISTED = json.dumps([t["function"] for t in TOOLS])
#: the same conversation as Phi-4-mini's model card writes it
AS_WRITTEN: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief.", "tools": LISTED},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": 'functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


@pytest.mark.parametrize("system", [True, False])
def test_the_prompt_is_what_transformers_renders(family, system: bool) -> None:
    from transformers import AutoTokenizer

    hf_dir, gen = family
    conversation = CONVERSATION if system else CONVERSATION[1:]
    written = AS_WRITTEN if system else [
        {"role": "system", "content": "You are a helpful assistant with some tools.",
         "tools": LISTED},
        *AS_WRITTEN[1:],
    ]  # fmt: skip
    messages, tools = FMT.prompt_messages(
        conversation, make_tool_spec(TOOLS), template_renders_tools=False
    )
    assert tools is None
    ours = gen.tokenizer.apply_chat_template(messages)
    theirs = AutoTokenizer.from_pretrained(hf_dir).apply_chat_template(
        written, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs
    assert f"<|tool|>{LISTED}<|/tool|><|end|><|user|>Weather in Paris?<|end|>" in ours
    assert ours.endswith("<|tool|>sunny<|end|><|assistant|>")


def test_without_tools_earlier_calls_still_render_and_a_rendering_template_gets_tools() -> None:
    messages, tools = FMT.prompt_messages(CONVERSATION, None, template_renders_tools=False)
    assert tools is None and "tools" not in messages[0]
    assert messages[2] == AS_WRITTEN[2]
    result = {"role": "tool", "content": {"temp": 21}}
    assert FMT.prompt_messages([result], None, template_renders_tools=False)[0] == [
        {"role": "tool", "content": '{"temp": 21}'}
    ]
    spec = make_tool_spec(TOOLS)
    messages, tools = FMT.prompt_messages(CONVERSATION, spec, template_renders_tools=True)
    assert messages == CONVERSATION and tools == TOOLS


def test_the_template_is_recognised() -> None:
    probe = TemplateProbe(TEMPLATE)
    matched = [name for name, factory in FORMATS.items() if factory().recognizes(probe)]
    assert matched == ["phi4_mini"]
    assert FMT.recognizes(TemplateProbe("prefix function calls with functools marker"))
    assert not FMT.recognizes(TemplateProbe("{{ messages }}"))


# -- a tiny random model, constrained by the grammar -------------------------------------


@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
def test_a_random_model_writes_calls_that_validate(family, choice: str) -> None:
    _, gen = family
    spec = make_tool_spec(TOOLS, choice)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    messages, _ = FMT.prompt_messages(
        [{"role": "user", "content": "Weather?"}], spec, template_renders_tools=False
    )
    prompt = gen.tokenizer.encode_chat(messages)
    grammar = FMT.answer_grammar(spec)
    made = 0
    for seed in range(6):
        out = gen.generate([prompt], grammar=grammar, do_sample=True, seed=seed,
                           max_new_tokens=160)  # fmt: skip
        tokens, reason = out.tokens[0], out.finish_reasons[0]
        text = gen.tokenizer.decode(tokens[:-1] if reason == "eos" else tokens)
        answer = FMT.parse(text, final=True)
        if spec.calls_only:
            assert answer.content == "" and answer.calls, text
        for drafted in answer.calls:
            if not drafted.complete:  # only a call cut by max_new_tokens
                assert reason == "length", text
                continue
            assert drafted.name in spec.functions, text
            jsonschema.validate(json.loads(drafted.arguments), schemas[drafted.name])
            made += 1
    if spec.calls_only:
        assert made, "no call was whole in any seed"
