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
from ortgen.chat_formats import closed
from ortgen.chat_formats.reply import ReplyPlan, read_reply
from ortgen.chat_formats.tools import tool_spec
from ortgen.errors import InputError
from ortgen.request.formats import pick_format
from ortgen.text import Tokenizer
from tests import server_plugin
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


def _backend():
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    return Backend(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))


def plan(template: str, tools=TOOLS, choice=None, parallel=None) -> ReplyPlan:
    """How a request with ``tools`` on a model whose chat template is ``template`` is read:
    the format the template's rendering picks (through a tokenizer that has it)."""
    from ortgen.plugin_host.manager import build_registry, make_plugin_manager

    registry = build_registry(make_plugin_manager())
    tokenizer = Tokenizer(_backend(), chat_template=template)
    name, fmt = pick_format(registry, tokenizer, None)
    return ReplyPlan(name, fmt, tool_spec(tools, choice, parallel))


def read_tool_calls(text: str, plan: ReplyPlan, reason: str = "eos"):
    reply = read_reply(text, plan, reason)
    return reply.content, reply.tool_calls


def test_plans_follow_what_the_template_knows() -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain = plan("{{ messages }}", TOOLS, "required")
    assert plain.format_name == "generic"
    shown, template_tools = plain.format.prompt_messages(
        messages, plain.spec, template_renders_tools=False
    )
    assert template_tools is None
    assert shown[0]["role"] == "system" and "get_weather" in shown[0]["content"]
    # what each tool does, as the client described it (agents send their docstrings)
    assert '"description": "The current weather in a city"' in shown[0]["content"]
    assert '"maxItems": 8' in plain.format.answer_grammar(plain.spec)
    single = plan("{{ messages }}", TOOLS, "auto", False)
    grammar = single.format.answer_grammar(single.spec)
    assert '"maxItems": 1' in grammar and '"required": ["response"]' in grammar
    one_tool = plan("{{ messages }}", [ADD], "auto")  # one tool, parallel unset: one call
    assert one_tool.spec.max_calls == 1
    hermes = plan(HERMES_TEMPLATE, TOOLS)
    assert hermes.format_name == "hermes"
    assert hermes.format.prompt_messages(messages, hermes.spec, template_renders_tools=True) == (
        messages, TOOLS)  # fmt: skip
    assert "TEXT | calls" in hermes.format.answer_grammar(hermes.spec)
    assert plan(HERMES_TEMPLATE, TOOLS, "none").spec is None
    named = plan("x", TOOLS, {"type": "function", "function": {"name": "add"}})
    grammar = named.format.answer_grammar(named.spec)
    assert '"const": "add"' in grammar and "get_weather" not in grammar
    assert named.spec.max_calls == 1


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
        tool_spec(tools, choice, parallel)


def test_calls_are_read_back_in_openai_shape() -> None:
    generic = plan("")
    content, calls = read_tool_calls(
        '{"tool_calls":[{"name":"add","arguments":{"a":1,"b":2}}]}', generic
    )
    assert content is None and len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a":1,"b":2}'}
    assert read_tool_calls('{"response":"Hello"}', generic) == ("Hello", [])
    twice = '{"tool_calls":[{"name":"add","arguments":{"a":1}},{"name":"add","arguments":{"a":1}}]}'
    assert len(read_tool_calls(twice, generic)[1]) == 1  # a loop's repeats are one call
    # a call cut by the token limit: no calls, and never the wrapper as text
    cut = read_reply('{"tool_calls":[{"na', generic, "length")
    assert (cut.content, cut.tool_calls, cut.finish_reason) == ("", [], "length")
    assert read_tool_calls('{"response":"Hel\\u00e9lo \\"', generic) == ('Helélo "', [])
    assert read_tool_calls('{"response":"Hi \\u00', generic) == ("Hi ", [])  # escape cut short
    hermes = plan(HERMES_TEMPLATE)
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, calls = read_tool_calls(text, hermes)
    assert content == "Sure." and calls[0]["function"]["name"] == "add"


def test_a_call_cut_by_the_limit_keeps_the_whole_calls_before_it() -> None:
    generic = plan("")
    text = '{"tool_calls":[{"name":"add","arguments":{"a":1,"b":2}},{"name":"get_weather","ar'
    reply = read_reply(text, generic, "length")
    assert reply.finish_reason == "length" and reply.content is None
    assert read_back(reply.tool_calls) == [("add", {"a": 1, "b": 2})]


#: three distinct calls (two functions, one of them twice with other arguments): what a
#: reader that kept only some of an answer's calls would drop
THREE_CALLS = [
    ("add", {"a": 1, "b": 2}),
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("add", {"a": -7, "b": 40}),
]


def written(calls, format_: str) -> str:
    """``calls`` (name, arguments) as a model writes them in ``format_``, compact as the
    grammar makes them."""
    bodies = [{"name": name, "arguments": arguments} for name, arguments in calls]
    if format_ == "json":
        return json.dumps({"tool_calls": bodies}, separators=(",", ":"))
    return "\n".join(
        f"<tool_call>\n{json.dumps(body, separators=(',', ':'))}\n</tool_call>" for body in bodies
    )


def read_back(calls) -> list[tuple[str, object]]:
    """(name, arguments) of calls in OpenAI's shape, the arguments parsed."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("format_", ["json", "hermes"])
def test_every_distinct_call_is_read_back_in_order(format_, count) -> None:
    """An answer with several different calls gives all of them, in the order written,
    each with its own id; only a word-for-word repeat (a loop) is dropped."""
    read = plan(HERMES_TEMPLATE if format_ == "hermes" else "")
    assert read.format_name == ("generic" if format_ == "json" else format_)
    calls = THREE_CALLS[:count]
    content, got = read_tool_calls(written(calls, format_), read)
    assert content is None and read_back(got) == calls
    assert len({c["id"] for c in got}) == count
    looped = [*calls, calls[0], *calls]  # the model started over: the same calls again
    assert read_back(read_tool_calls(written(looped, format_), read)[1]) == calls


def test_a_conversation_with_calls_and_results_renders_for_a_plain_template() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "1 + 2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    generic = plan("{{ messages }}")
    shown, _ = generic.format.prompt_messages(messages, generic.spec, template_renders_tools=False)
    assistant, result = shown[2], shown[3]
    assert json.loads(assistant["content"]) == {
        "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]
    }
    assert result["role"] == "user"
    assert json.loads(result["content"]) == {
        "tool_response": {"tool_call_id": "call_1", "content": "3"}
    }


# -- a tiny model with a hermes template: the grammar alone makes the calls ---------------


def with_template(folder: Path, copy: Path, template: str) -> Path:
    """A copy of the model ``folder`` whose chat template is ``template`` (the other files
    linked, not copied: the default model's weights are 145 MB)."""
    if copy.exists():
        shutil.rmtree(copy)
    copy.mkdir(parents=True)
    for file in folder.iterdir():
        (copy / file.name).symlink_to(file.resolve())
    for name in ("ortgen_tokenizer.json", "chat_template.jinja"):
        (copy / name).unlink(missing_ok=True)
    resolved = json.loads((folder / "ortgen_tokenizer.json").read_text())
    resolved["chat_template"] = template
    (copy / "ortgen_tokenizer.json").write_text(json.dumps(resolved))
    (copy / "chat_template.jinja").write_text(template)
    return copy


@pytest.fixture(scope="module")
def hermes_folder(tiny_root: Path) -> Path:
    return export_tiny("llama", tiny_root / "tools-hermes", with_tokenizer=True, graph="fused")


@pytest.fixture(scope="module")
def hermes_gen(tiny_root: Path, hermes_folder: Path):
    copy = with_template(hermes_folder, tiny_root / "tools-hermes-template", HERMES_TEMPLATE)
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


def test_a_forced_call_leaves_response_format_for_a_later_turn(hermes_gen) -> None:
    """Agents send their output schema with every turn (openai-agents' ``output_type``
    beside tools): a forced call has no text for it to shape, so the answer is the call
    (under ``auto`` it shapes the text answer: tests/test_tools_with_schema.py)."""
    messages = [{"role": "user", "content": "w?"}]
    schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    settings = {"max_new_tokens": 80, "do_sample": True, "temperature": 0.7, "seed": 1}
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        out = hermes_gen.chat(messages, tools=TINY_TOOLS, tool_choice=choice,
                              response_format=schema, parallel_tool_calls=False,
                              **settings)  # fmt: skip
        assert out.finish_reasons == ["tool_calls"], out.text
        assert all(_arguments_valid(c, TINY_TOOLS) for c in out.tool_calls)


#: a hermes template as short as one can be (only the last message), so that two calls
#: fit the tiny model's 128 positions: 2 for the prompt and 120 for the answer
SHORT_HERMES_TEMPLATE = "{#<tool_call>#}{{ messages[-1]['content'] }}"


def test_an_answer_with_two_distinct_calls_returns_both(tiny_root, hermes_folder) -> None:
    """The model's answer is forced (tests/server_plugin.py's ``says``) to two calls of
    different functions: ``chat`` returns exactly those two, in order. (Three calls do not
    fit the tiny context; the default model's tests below and in
    tests/test_structured_server.py make three.)"""
    copy = with_template(hermes_folder, tiny_root / "tools-hermes-short", SHORT_HERMES_TEMPLATE)
    gen = ortgen.load(copy, threads=1, plugins=[server_plugin])
    calls = [("w", {"c": "ab"}), ("add", {"a": 3})]
    says = {"name": "says", "text": written(calls, "hermes")}
    for choice in ("required", "auto"):
        out = gen.chat([{"role": "user", "content": "w?"}], tools=TINY_TOOLS, tool_choice=choice,
                       logits_processors=[says], max_new_tokens=126)  # fmt: skip
        assert out.finish_reasons == ["tool_calls"] and out.text == "", (choice, out.text)
        assert read_back(out.tool_calls) == calls, choice


# -- the default model: real calls to real questions -------------------------------------


@pytest.mark.default_model
@pytest.mark.parametrize("graph", ["float32", "int8"])
def test_the_default_model_calls_tools_and_goes_on_after_the_result(
    graph, default_gen, reference_gen
) -> None:
    """Real calls to real questions. What the request guarantees holds on both graphs: one
    valid call of the forced tool, calls of the named one, finish reasons that match. What
    the calls say (Paris; a greeting answered in words) is asserted on the float32 graph,
    whose arithmetic differs between CPUs by float rounding alone; the int8 default model
    may take another turn at a near-tie on another CPU (docs/architecture.md)."""
    gen = reference_gen if graph == "float32" else default_gen
    question = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    out = gen.chat(question, tools=TOOLS, tool_choice="required",
                   parallel_tool_calls=False, max_new_tokens=80)  # fmt: skip
    assert out.finish_reasons == ["tool_calls"] and len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call["function"]["name"] == "get_weather" and _arguments_valid(call)
    if graph == "float32":
        assert json.loads(call["function"]["arguments"])["city"] == "Paris"
    named = gen.chat(
        question, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
        max_new_tokens=80,
    )  # fmt: skip
    assert {c["function"]["name"] for c in named.tool_calls} == {"add"}
    follow = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees and sunny"},
    ]
    again = gen.chat(follow, tools=TOOLS, max_new_tokens=80)
    assert again.finish_reasons[0] in ("tool_calls", "eos", "length")
    if again.finish_reasons == ["eos"]:
        assert again.tool_calls == [] and again.text
    hello = gen.chat([{"role": "user", "content": "Hi! How are you today?"}],
                     tools=TOOLS, max_new_tokens=60)  # fmt: skip
    assert (hello.finish_reasons == ["tool_calls"]) == bool(hello.tool_calls)
    if graph == "float32":  # answered in words (it then repeats itself past 60 tokens)
        assert hello.tool_calls == [] and hello.text.startswith("I'm doing great")


@pytest.mark.parametrize("format_", ["json", "hermes"])
def test_the_default_model_returns_every_call_its_answer_makes(
    default_model_dir, tmp_path, format_
) -> None:
    """The default model's answer forced to three distinct calls, in its own template's
    format (json) and in hermes (its folder given HERMES_TEMPLATE): ``chat`` returns
    exactly those three, in order. The tokens ``says`` asks for are BPE pieces of the text
    while the grammar forces its own split of the fixed parts, so this also reads calls
    written in tokens that are not ``encode(text)``'s."""
    folder = default_model_dir
    if format_ == "hermes":
        folder = with_template(default_model_dir, tmp_path / "hermes", HERMES_TEMPLATE)
    gen = ortgen.load(folder, threads=1, plugins=[server_plugin])
    question = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    says = {"name": "says", "text": written(THREE_CALLS, format_)}
    out = gen.chat(question, tools=TOOLS, tool_choice="required", logits_processors=[says],
                   max_new_tokens=200)  # fmt: skip
    assert out.finish_reasons == ["tool_calls"] and out.text == "", out.text
    assert read_back(out.tool_calls) == THREE_CALLS


@pytest.mark.parametrize("format_", ["json", "hermes"])
def test_a_stream_sends_the_calls_the_whole_reply_keeps(format_) -> None:
    """Streamed a character at a time, an answer that starts over (its calls again) and
    one past the call limit send exactly the calls ``read_reply`` keeps: a repeat is never
    announced, and nothing after it or past the limit is sent."""
    from ortgen.chat_formats.reply import ReplyStream

    template = HERMES_TEMPLATE if format_ == "hermes" else ""
    for parallel, calls in ((None, [*THREE_CALLS[:2], THREE_CALLS[0]]), (False, THREE_CALLS)):
        read = plan(template, TOOLS, "auto", parallel)
        text = written(calls, format_)
        stream = ReplyStream(read)
        deltas = [d for char in text for d in stream.feed(char)]
        more, reason = stream.finish("eos")
        sent: dict[int, dict] = {}
        for delta in [*deltas, *more]:
            for fragment in delta.get("tool_calls", ()):
                call = sent.setdefault(fragment["index"], {"name": "", "arguments": ""})
                call["name"] += fragment["function"].get("name", "")
                call["arguments"] += fragment["function"].get("arguments", "")
        whole = read_reply(text, read, "eos")
        assert reason == whole.finish_reason == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in sent.values()] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls
        ], (parallel, format_)


#: a tool whose parameters refer to their own parts, as Pydantic writes a nested model
#: (``$defs``) and a recursive one (``#``): pydantic-ai's ``output_type=list[City]``
NESTED = {"type": "function", "function": {"name": "final_result", "parameters": {
    "type": "object", "$defs": {"City": {"type": "object", "properties": {
        "name": {"type": "string"}}, "required": ["name"]}},
    "properties": {"cities": {"type": "array", "items": {"$ref": "#/$defs/City"}},
                   "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
    "required": ["cities", "next"]}}}  # fmt: skip


@pytest.mark.parametrize("format_", ["json", "hermes"])
def test_references_inside_a_tools_parameters_point_into_them(format_, tiny_text_model) -> None:
    """The call grammar nests each tool's parameters inside the answer's schema; their
    ``#/$defs/City`` and ``#`` must still mean the parameters' own parts. They resolved
    against the whole answer: llguidance refused ``$defs`` (pydantic-ai's list output
    was a 400) and ``#`` let an answer object stand where the parameters belong."""
    from tests.format_helpers import accepts

    read = plan(HERMES_TEMPLATE if format_ == "hermes" else "", [NESTED], "required")
    grammar = read.format.answer_grammar(read.spec)
    inner = {"cities": [], "next": None}

    def allowed(arguments: object) -> bool:
        text = written([("final_result", arguments)], format_)
        return accepts(tiny_text_model, grammar, text, "</s>")

    assert allowed({"cities": [{"name": "Paris"}], "next": inner})
    assert not allowed({"cities": [{"country": "France"}], "next": None})  # City needs a name
    assert not allowed({"cities": [], "next": {"tool_calls": []}})  # `#` is the parameters
