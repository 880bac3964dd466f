"""Tool calling through ``gen.chat(tools=...)``: plans, grammars and calls read back.

The two formats: ``hermes`` (a template that renders tools and teaches
``<tool_call>...</tool_call>``; here a tiny model given such a template, so only the
grammar makes its calls well-formed) and ``json`` (a template that knows no tools: the
default model, SmolLM2, whose calls are real answers to real questions).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

import ortgen
from ortgen.errors import InputError
from ortgen.tool_calls import closed, plan_tools, read_tool_calls
from tests.tiny_models import export_tiny

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
#: small tools for the tiny model, whose context is 128 tokens (one per character)
TINY_TOOLS = [
    {"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"c": {"type": "string", "maxLength": 3}},
        "required": ["c"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a"]}}},
]  # fmt: skip
HERMES_TEMPLATE = (
    "{% if tools %}<s>system: {{ tools | map(attribute='function') | map(attribute='name') "
    "| join(',') }} <tool_call></s>\n{% endif %}"
    "{% for m in messages %}<s>{{ m['role'] }}: "
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>\n"
    "{{ c['function'] | tojson }}\n</tool_call>{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def _arguments_valid(call: dict, tools=TOOLS) -> bool:
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == (
        call["function"]["name"]))  # fmt: skip
    jsonschema.validate(json.loads(call["function"]["arguments"]), closed(schema))
    return True


# -- plans and reading, without a model ---------------------------------------------------


def test_plans_follow_what_the_template_knows() -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain = plan_tools(messages, TOOLS, "required", None, "{{ messages }}")
    assert plain.format == "json" and plain.template_tools is None
    assert plain.messages[0]["role"] == "system" and "get_weather" in plain.messages[0]["content"]
    calls = plain.settings["json_schema"]["properties"]["tool_calls"]
    assert calls["minItems"] == 1 and calls["maxItems"] == 8
    single = plan_tools(messages, TOOLS, "auto", False, "{{ messages }}")
    assert single.settings["json_schema"]["anyOf"][0]["properties"]["tool_calls"]["maxItems"] == 1
    assert single.settings["json_schema"]["anyOf"][1]["required"] == ["response"]
    hermes = plan_tools(messages, TOOLS, None, None, HERMES_TEMPLATE)
    assert hermes.format == "hermes" and hermes.template_tools == TOOLS
    assert hermes.messages == messages and "TEXT | TEXT? calls" in hermes.settings["grammar"]
    none = plan_tools(messages, TOOLS, "none", None, HERMES_TEMPLATE)
    assert none.settings == {} and none.template_tools is None and not none.calls_allowed
    named = plan_tools(messages, TOOLS, {"type": "function", "function": {"name": "add"}}, None,
                       "x")  # fmt: skip
    assert '"const": "add"' in json.dumps(named.settings) and "get_weather" not in json.dumps(
        named.settings
    )


@pytest.mark.parametrize(
    ("tools", "choice", "parallel", "named"),
    [
        ([{"type": "function"}], None, None, r"tools\[0\]"),
        ([{"type": "function", "function": {"name": "a b"}}], None, None, "name"),
        ([WEATHER, WEATHER], None, None, "given twice"),
        (TOOLS, "sometimes", None, "tool_choice"),
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "'nope'"),
        (None, "required", None, "needs tools"),
        (TOOLS, "auto", "yes", "parallel_tool_calls"),
        ("get_weather", None, None, "list of tools"),
    ],
)
def test_bad_tools_are_named(tools, choice, parallel, named) -> None:
    with pytest.raises(InputError, match=named):
        plan_tools([{"role": "user", "content": "x"}], tools, choice, parallel, "")


def test_calls_are_read_back_in_openai_shape() -> None:
    plan = plan_tools([], TOOLS, "auto", None, "")
    content, calls = read_tool_calls(
        '{"tool_calls":[{"name":"add","arguments":{"a":1,"b":2}}]}', plan
    )
    assert content is None and len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert read_tool_calls('{"response":"Hello"}', plan) == ("Hello", [])
    twice = '{"tool_calls":[{"name":"add","arguments":{"a":1}},{"name":"add","arguments":{"a":1}}]}'
    assert len(read_tool_calls(twice, plan)[1]) == 1  # a loop's repeats are one call
    assert read_tool_calls('{"tool_calls":[{"na', plan) == ('{"tool_calls":[{"na', [])  # cut
    assert read_tool_calls('{"response":"Hel\\u00e9lo \\"', plan) == ('Helélo "', [])
    assert read_tool_calls('{"response":"Hi \\u00', plan) == ("Hi ", [])  # escape cut short
    hermes = plan_tools([], TOOLS, "auto", None, HERMES_TEMPLATE)
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, calls = read_tool_calls(text, hermes)
    assert content == "Sure." and calls[0]["function"]["name"] == "add"


def test_a_conversation_with_calls_and_results_renders_for_a_plain_template() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "1 + 2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    plan = plan_tools(messages, TOOLS, "auto", None, "{{ messages }}")
    assistant, result = plan.messages[2], plan.messages[3]
    assert json.loads(assistant["content"]) == {
        "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]
    }
    assert result["role"] == "user"
    assert json.loads(result["content"]) == {
        "tool_response": {"tool_call_id": "call_1", "content": "3"}
    }
    knows = plan_tools(messages, TOOLS, "auto", None, "{% if m.role == 'tool' %}{% endif %}")
    assert knows.messages[3]["role"] == "tool"


# -- a tiny model with a hermes template: the grammar alone makes the calls ---------------


@pytest.fixture(scope="module")
def hermes_gen(tiny_root: Path):
    folder = export_tiny("llama", tiny_root / "tools-hermes", with_tokenizer=True, graph="fused")
    copy = tiny_root / "tools-hermes-template"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(folder, copy)
    resolved = json.loads((copy / "ortgen_tokenizer.json").read_text())
    resolved["chat_template"] = HERMES_TEMPLATE
    (copy / "ortgen_tokenizer.json").write_text(json.dumps(resolved))
    (copy / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    return ortgen.load(copy, threads=1)


def test_hermes_calls_with_each_tool_choice(hermes_gen) -> None:
    messages = [{"role": "user", "content": "w?"}]
    settings = {"max_new_tokens": 80, "do_sample": True, "temperature": 0.7}
    prompt = hermes_gen.tokenizer.apply_chat_template(messages, tools=TINY_TOOLS)
    assert "w,add" in prompt  # the template rendered the tools
    for seed in (1, 2, 3):
        out = hermes_gen.chat(messages, tools=TINY_TOOLS, tool_choice="required", seed=seed,
                              parallel_tool_calls=False, **settings)  # fmt: skip
        assert out.finish_reasons == ["tool_calls"], out.text
        assert len(out.tool_calls) == 1 and _arguments_valid(out.tool_calls[0], TINY_TOOLS)
        named = hermes_gen.chat(
            messages, tools=TINY_TOOLS, parallel_tool_calls=False, seed=seed,
            tool_choice={"type": "function", "function": {"name": "add"}}, **settings,
        )  # fmt: skip
        assert [c["function"]["name"] for c in named.tool_calls] == ["add"]
        auto = hermes_gen.chat(messages, tools=TINY_TOOLS, seed=seed, **settings)
        if auto.tool_calls:
            assert auto.finish_reasons == ["tool_calls"]
            assert all(_arguments_valid(c, TINY_TOOLS) for c in auto.tool_calls)
        else:  # text that never starts a call
            assert "<tool_call>" not in auto.text
    none = hermes_gen.chat(messages, tools=TINY_TOOLS, tool_choice="none", max_new_tokens=20)
    assert none.tool_calls is None and none.finish_reasons != ["tool_calls"]


def test_tools_and_another_constraint_are_refused(hermes_gen) -> None:
    with pytest.raises(InputError, match="give one of them"):
        hermes_gen.chat([{"role": "user", "content": "x"}], tools=TINY_TOOLS, json_object=True)


# -- the default model: real calls to real questions -------------------------------------


@pytest.mark.default_model
def test_the_default_model_calls_tools_and_goes_on_after_the_result(default_gen) -> None:
    question = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    out = default_gen.chat(question, tools=TOOLS, tool_choice="required",
                           parallel_tool_calls=False, max_new_tokens=80)  # fmt: skip
    assert out.finish_reasons == ["tool_calls"] and len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call["function"]["name"] == "get_weather" and _arguments_valid(call)
    assert json.loads(call["function"]["arguments"])["city"] == "Paris"
    named = default_gen.chat(
        question, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
        max_new_tokens=80,
    )  # fmt: skip
    assert {c["function"]["name"] for c in named.tool_calls} == {"add"}
    follow = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees and sunny"},
    ]
    again = default_gen.chat(follow, tools=TOOLS, max_new_tokens=80)
    assert again.finish_reasons[0] in ("tool_calls", "eos")
    if again.finish_reasons == ["eos"]:
        assert again.tool_calls == [] and again.text
    hello = default_gen.chat([{"role": "user", "content": "Hi! How are you today?"}],
                             tools=TOOLS, max_new_tokens=60)  # fmt: skip
    assert hello.finish_reasons == ["eos"] and hello.tool_calls == [] and hello.text
