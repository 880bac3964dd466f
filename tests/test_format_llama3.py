"""The ``llama3_json`` chat format: which templates it claims, the prompt it gives the
template (rendered as transformers renders it), model outputs read whole and streamed,
and a tiny random Llama-3-shaped model whose calls the grammar alone keeps valid."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
import transformers

import ortgen
from ortgen import ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.plugins import chat_formats
from ortgen.plugins.chat_formats.llama3 import Llama3JsonFormat
from ortgen.protocols.chat_formats import PROBE_ARGUMENTS, PROBE_TOOL
from ortgen.testing import check_chat_format, make_tool_spec
from ortgen.text import Tokenizer
from tests.format_helpers import accepts as accepts_text
from tests.tiny_models import export_chat_family, save_tiny_tokenizer

FORMAT = Llama3JsonFormat()
TEMPLATES = Path(chat_formats.__file__).parent / "templates"
TEMPLATE = (TEMPLATES / "llama3_json.jinja").read_text()
SPECIALS = (
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
)  # fmt: skip
EOS = "<|eot_id|>"
#: small tools for the tiny model: a call is short, so several fit in a few hundred tokens
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
         "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                     "maxItems": 2}},
        "required": ["a", "tags"]}}},
]  # fmt: skip
#: a Hermes-style and a Llama-3-pythonic template: the probe of neither is claimed
HERMES = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}"
    "{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
)
PYTHONIC = (
    "{% for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}"
    "<|end_header_id|>\n\n{% if m.tool_calls %}[{% for c in m.tool_calls %}{{ c.function.name }}("
    "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v | tojson }}{% endfor %})"
    "{% endfor %}]{% else %}{{ m.content }}{% endif %}<|eot_id|>{% endfor %}"
    "{% if tools %}{{ tools | tojson }}<|eot_id|>{% endif %}"
)


def spec_for(choice: str, *, parallel: bool = True) -> ToolSpec:
    """The ToolSpec a request with ``TOOLS`` and this ``tool_choice`` gets, at most 3
    calls when several are allowed (what the grammar tests count to)."""
    spec = make_tool_spec(TOOLS, choice, parallel_tool_calls=parallel)
    return dataclasses.replace(spec, max_calls=min(spec.max_calls, 3))


# -- which templates are this format's ---------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llama3-tokenizers")
    templates = {
        "llama3": TEMPLATE,
        "mistral": (TEMPLATES / "mistral.jinja").read_text(),
        "hermes": HERMES,
        "pythonic": PYTHONIC,
    }
    specials = (*SPECIALS, "<|im_start|>", "<|im_end|>", "[TOOL_CALLS]", "[INST]", "[/INST]")
    return {
        name: save_tiny_tokenizer(root / name, special_tokens=specials, template=template)
        for name, template in templates.items()
    }


def probe(folder: Path, arguments: Any = PROBE_ARGUMENTS) -> TemplateProbe:
    tok = Tokenizer.from_folder(folder)
    tools = [{"type": "function", "function": {"name": PROBE_TOOL, "parameters": {
        "type": "object", "properties": {"probe_argument": {"type": "string"}}}}}]  # fmt: skip
    user = [{"role": "user", "content": "hi"}]
    call = {"id": "abcdefghi", "type": "function",
            "function": {"name": PROBE_TOOL, "arguments": arguments}}  # fmt: skip
    called = [*user, {"role": "assistant", "content": "", "tool_calls": [call]},
              {"role": "tool", "tool_call_id": "abcdefghi", "content": "ok"}]  # fmt: skip
    return TemplateProbe(
        tok.chat_template or "",
        tok.apply_chat_template(user, tools=tools),
        tok.apply_chat_template(called, tools=tools),
    )


def test_recognizes_the_llama3_json_template_only(folders) -> None:
    assert FORMAT.recognizes(probe(folders["llama3"]))
    assert FORMAT.recognizes(probe(folders["llama3"], json.dumps(PROBE_ARGUMENTS)))  # as text
    for other in ("mistral", "hermes", "pythonic"):
        assert not FORMAT.recognizes(probe(folders[other])), other
    # a template that failed on the probe's call: its source shows the "parameters" call
    source_only = TemplateProbe(TEMPLATE, with_tools="<|eot_id|>", with_call=None)
    assert FORMAT.recognizes(source_only)
    assert not FORMAT.recognizes(TemplateProbe(PYTHONIC, "<|eot_id|>", None))
    # a call written after the tag counts too
    tagged = '<|python_tag|>{"name": "ortgen_probe_tool", "parameters": {"probe_argument": 1}}'
    assert FORMAT.recognizes(TemplateProbe("", "", tagged))
    assert not FORMAT.recognizes(TemplateProbe("", "", tagged.replace("parameters", "arguments")))
    assert not FORMAT.recognizes(TemplateProbe(""))


# -- the prompt -----------------------------------------------------------------------------


def test_the_prompt_renders_as_transformers_renders_it(folders) -> None:
    """OpenAI's shape in (arguments as JSON text, two calls in one turn), the template's
    shape out: each call its own turn with its result after it, identical in ortgen's
    rendering and transformers'."""
    calls = [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}},
        {"id": "call_2", "type": "function",
         "function": {"name": "add", "arguments": '{"a": 2, "tags": ["x"]}'}},
    ]  # fmt: skip
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo, and 2 + nothing?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_2", "content": "2"},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny; 2.", "tool_calls": None},
        {"role": "user", "content": "Thanks!"},
    ]
    ours, hf = (
        Tokenizer.from_folder(folders["llama3"]),
        transformers.AutoTokenizer.from_pretrained(folders["llama3"]),
    )
    for spec in (spec_for("auto"), None):  # tool_choice "none": no tools, history kept
        shaped, tools = FORMAT.prompt_messages(messages, spec, template_renders_tools=True)
        assert tools == (TOOLS if spec else None)
        got = ours.apply_chat_template(shaped, tools=tools)
        assert got == hf.apply_chat_template(
            shaped, tools=tools, tokenize=False, add_generation_prompt=True
        )
        first = got.index('{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}')
        second = got.index('{"name": "add", "parameters": {"a": 2, "tags": ["x"]}}')
        assert first < got.index("sunny") < second < got.index("ipython<|end_header_id|>\n\n2")
        assert ("Environment: ipython" in got) == (spec is not None)
    shaped, tools = FORMAT.prompt_messages(messages, spec_for("auto"), template_renders_tools=False)
    assert tools is None and '"parameters": <dictionary of arguments>' in shaped[0]["content"]


# -- model outputs, whole and streamed -----------------------------------------------------

#: (answer, content, [(name, arguments)]) as a Llama 3 model writes them
GOLDEN = [
    ("The weather in Oslo is sunny.", "The weather in Oslo is sunny.", []),
    ('{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}', "",
     [("get_weather", {"city": "Oslo", "unit": "c"})]),
    ('<|python_tag|>{"name": "add", "parameters": {"a": 1, "tags": []}}; '
     '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}', "",
     [("add", {"a": 1, "tags": []}), ("get_weather", {"city": "Rome", "unit": "f"})]),
    ('{"name": "plan", "parameters": {"trip": {"stops": [{"city": "Nice", "days": 2}, '
     '{"city": "Lyon", "days": null}], "note": "a \\"quoted\\" } brace"}}}', "",
     [("plan", {"trip": {"stops": [{"city": "Nice", "days": 2}, {"city": "Lyon", "days": None}],
                         "note": 'a "quoted" } brace'}})]),
    ('{"name": "translate", "parameters": {"text": "Grüße aus Köln 🌧", "to": "日本語"}}', "",
     [("translate", {"text": "Grüße aus Köln 🌧", "to": "日本語"})]),
    ('\n\n{"name": "add", "parameters": {"a": 5, "tags": ["q"]}}\n', "",
     [("add", {"a": 5, "tags": ["q"]})]),
    ("  <b>Bold</b> {not a call} here  ", "<b>Bold</b> {not a call} here", []),
    ('{"answer": 42}', '{"answer": 42}', []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls"), GOLDEN)
def test_golden_outputs_parse_whole(text: str, content: str, calls: list) -> None:
    parsed = FORMAT.parse(text, final=True)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert all(c.complete for c in parsed.calls)


def test_golden_outputs_stream_in_every_split() -> None:
    """Every prefix parsed as not final only grows content, names and arguments, and
    the whole answer parses as its golden (``ortgen.testing.check_chat_format``)."""
    golden = [
        (text, SimpleNamespace(content=content, calls=calls)) for text, content, calls in GOLDEN
    ]
    check_chat_format(FORMAT, golden)


@pytest.mark.parametrize("text", [g[0] for g in GOLDEN if g[2]])
def test_a_call_cut_short_is_not_complete(text: str) -> None:
    last = text.rindex('{"name"')
    for cut in (last + 3, (last + len(text)) // 2, text.rindex('"'), text.rindex("}")):
        parsed = FORMAT.parse(text[:cut], final=True)
        assert parsed.content == "" and parsed.calls and not parsed.calls[-1].complete, cut


# -- the grammar ---------------------------------------------------------------------------


def accepts(folder: Path, grammar: str, text: str) -> bool:
    return accepts_text(folder, grammar, text, EOS)


def test_the_grammar_allows_what_each_tool_choice_allows(folders) -> None:
    """The random model answers text for ``auto`` (a call's first token is one among
    many), so what ``auto`` and the others allow is checked here, text by text."""
    weather = '{"name":"get_weather","parameters":{"city":"Oslo","unit":"c"}}'
    add = '{"name":"add","parameters":{"a":1,"tags":["x"]}}'
    folder = folders["llama3"]
    auto, required = (
        FORMAT.answer_grammar(spec_for("auto")),
        FORMAT.answer_grammar(spec_for("required")),
    )
    for text in ("It is sunny.", " sunny {x}", weather, f"{weather}; {add}; {weather}"):
        assert accepts(folder, auto, text), text
    for text in (
        '{"x": 1}',
        ' {"name"',
        "<|python_tag|>",
        f"{add}; {add}; {add}; {add}",
        add.replace('"a":1', '"a":10'),
        add.replace("}}", ',"b":1}}'),
        f"{add} ok",
    ):
        assert not accepts(folder, auto, text), text  # fmt: skip
    assert accepts(folder, required, add) and not accepts(folder, required, "It is sunny.")
    named = FORMAT.answer_grammar(spec_for("get_weather", parallel=False))
    assert accepts(folder, named, weather)
    for text in (add, f"{weather}; {weather}", "sunny"):
        assert not accepts(folder, named, text), text


# -- a tiny random model: the grammar alone makes its calls valid -------------------------


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("llama3-family")
    folder = export_chat_family(root, "llama3", TEMPLATE, special_tokens=SPECIALS, eos=EOS)
    return ortgen.load(folder, threads=1)


def answer(gen, spec: ToolSpec | None, seed: int) -> tuple[ParsedAnswer, str]:
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    messages, tools = FORMAT.prompt_messages(question, spec, template_renders_tools=True)
    prompt = gen.tokenizer.encode_chat(messages, tools=tools)
    grammar = {"grammar": FORMAT.answer_grammar(spec)} if spec else {}
    out = gen.generate(prompt, max_new_tokens=300, do_sample=True, seed=seed, **grammar)
    return FORMAT.parse(out.text.removesuffix(EOS), final=True), out.finish_reasons[0]


@pytest.mark.parametrize("choice", ["auto", "required", "add", "get_weather"])
def test_the_tiny_model_calls_with_valid_arguments(gen, choice: str) -> None:
    spec = spec_for(choice, parallel=choice != "get_weather")
    kinds = set()
    for seed in range(6):
        parsed, finish = answer(gen, spec, seed)
        kinds.add("calls" if parsed.calls else "text")
        if choice != "auto" or parsed.calls:
            assert finish == "eos" and not parsed.content, (seed, parsed)
            assert 1 <= len(parsed.calls) <= spec.max_calls, (seed, parsed)
        for call in parsed.calls:
            assert call.complete and call.name in spec.functions, (seed, call)
            jsonschema.validate(json.loads(call.arguments), spec.functions[call.name])
    assert choice == "auto" or kinds == {"calls"}


def test_tool_choice_none_has_no_grammar_and_no_tools(gen) -> None:
    parsed, _ = answer(gen, None, 0)
    assert isinstance(parsed.content, str)
    messages, tools = FORMAT.prompt_messages(
        [{"role": "user", "content": "hi"}], None, template_renders_tools=True
    )
    assert tools is None and "Environment: ipython" not in gen.tokenizer.apply_chat_template(
        messages
    )
