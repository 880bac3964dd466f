"""The ``mistral`` chat format: which templates it claims, the prompt it gives the
template (rendered as transformers renders it), model outputs read whole and streamed,
and a tiny random Mistral-shaped model whose calls the grammar alone keeps valid."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import transformers

import ortgen
from ortgen import ParsedAnswer, TemplateProbe, ToolSpec
from ortgen.plugins import chat_formats
from ortgen.plugins.chat_formats.mistral import MistralFormat, mistral_id
from ortgen.protocols.chat_formats import PROBE_ARGUMENTS, PROBE_TOOL
from ortgen.testing import check_chat_format, make_tool_spec
from ortgen.text import Tokenizer
from tests.format_helpers import accepts as accepts_text
from tests.tiny_models import export_chat_family, save_tiny_tokenizer

FORMAT = MistralFormat()
TEMPLATES = Path(chat_formats.__file__).parent / "templates"
TEMPLATE = (TEMPLATES / "mistral.jinja").read_text()
SPECIALS = (
    "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
)  # fmt: skip
EOS = "</s>"
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
#: a Hermes-style template and a Llama 3 JSON one: the probe of neither is claimed
HERMES = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}"
    "{% for c in m.tool_calls %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
)


def spec_for(choice: str, *, parallel: bool = True) -> ToolSpec:
    """The ToolSpec a request with ``TOOLS`` and this ``tool_choice`` gets, at most 3
    calls when several are allowed (what the grammar tests count to)."""
    spec = make_tool_spec(TOOLS, choice, parallel_tool_calls=parallel)
    return dataclasses.replace(spec, max_calls=min(spec.max_calls, 3))


# -- which templates are this format's ---------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mistral-tokenizers")
    templates = {
        "mistral": TEMPLATE,
        "llama3": (TEMPLATES / "llama3_json.jinja").read_text(),
        "hermes": HERMES,
    }
    specials = (*SPECIALS, "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|eot_id|>")
    return {
        name: save_tiny_tokenizer(root / name, special_tokens=specials, template=template)
        for name, template in templates.items()
    }


def probe(folder: Path, call_id: str = "abcdefghi") -> TemplateProbe:
    tok = Tokenizer.from_folder(folder)
    tools = [{"type": "function", "function": {"name": PROBE_TOOL, "parameters": {
        "type": "object", "properties": {"probe_argument": {"type": "string"}}}}}]  # fmt: skip
    user = [{"role": "user", "content": "hi"}]
    call = {"id": call_id, "type": "function",
            "function": {"name": PROBE_TOOL, "arguments": PROBE_ARGUMENTS}}  # fmt: skip
    called = [*user, {"role": "assistant", "content": "", "tool_calls": [call]},
              {"role": "tool", "tool_call_id": call_id, "content": "ok"}]  # fmt: skip
    try:
        with_call = tok.apply_chat_template(called, tools=tools)
    except ortgen.errors.InputError:
        with_call = None  # the template refused the call
    return TemplateProbe(tok.chat_template or "", tok.apply_chat_template(user, tools=tools),
                         with_call)  # fmt: skip


def test_recognizes_the_mistral_template_only(folders) -> None:
    assert FORMAT.recognizes(probe(folders["mistral"]))
    refused = probe(folders["mistral"], call_id="call_1")  # not 9 characters: the source
    assert refused.with_call is None and FORMAT.recognizes(refused)
    for other in ("llama3", "hermes"):
        assert not FORMAT.recognizes(probe(folders[other])), other
    assert not FORMAT.recognizes(TemplateProbe(""))


# -- the prompt -----------------------------------------------------------------------------


def test_the_prompt_renders_as_transformers_renders_it(folders) -> None:
    """OpenAI's shape in (arguments as JSON text, OpenAI's ids), the template's shape out
    (arguments as values, ids of 9 characters, the same for a call and its result),
    identical in ortgen's rendering and transformers'."""
    first, second = "call_0123456789abcdef01234567", "call_2"
    calls = [
        {"id": first, "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}},
        {"id": second, "type": "function",
         "function": {"name": "add", "arguments": '{"a": 2, "tags": ["x"]}'}},
    ]  # fmt: skip
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo, and 2 + nothing?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": first, "content": "sunny"},
        {"role": "tool", "tool_call_id": second, "content": "2"},
        {"role": "assistant", "content": "Sunny; 2.", "tool_calls": []},
        {"role": "user", "content": "Thanks!"},
    ]
    ours = Tokenizer.from_folder(folders["mistral"])
    hf = transformers.AutoTokenizer.from_pretrained(folders["mistral"])
    for spec in (spec_for("auto"), None):  # tool_choice "none": no tools, history kept
        shaped, tools = FORMAT.prompt_messages(messages, spec, template_renders_tools=True)
        assert tools == (TOOLS if spec else None)
        got = ours.apply_chat_template(shaped, tools=tools)
        assert got == hf.apply_chat_template(shaped, tools=tools, tokenize=False)
        ids = [mistral_id(first), mistral_id(second)]
        assert ids[0] == "f01234567" and re.fullmatch("[0-9a-f]{9}", ids[1])
        assert (
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}, '
            f'"id": "{ids[0]}"}}, {{"name": "add", "arguments": {{"a": 2, "tags": ["x"]}}, '
            f'"id": "{ids[1]}"}}]</s>'
        ) in got
        assert f'[TOOL_RESULTS]{{"content": "2", "call_id": "{ids[1]}"}}[/TOOL_RESULTS]' in got
        assert ("[AVAILABLE_TOOLS]" in got) == (spec is not None)
    shaped, tools = FORMAT.prompt_messages(messages, spec_for("auto"), template_renders_tools=False)
    assert tools is None and shaped[0]["content"].startswith("Be brief.\n\nYou can call")


# -- model outputs, whole and streamed -----------------------------------------------------

#: (answer, content, [(name, arguments)]) as Mistral models write them
GOLDEN = [
    ("The weather in Oslo is sunny.", "The weather in Oslo is sunny.", []),
    ("Arrays look like [1, 2] and [TOOL] is no marker.",
     "Arrays look like [1, 2] and [TOOL] is no marker.", []),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}]', "",
     [("get_weather", {"city": "Oslo", "unit": "c"})]),
    ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "tags": []}, "id": "a1b2c3d4e"}, '
     '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}, "id": "Z9y8X7w6v"}]',
     "", [("add", {"a": 1, "tags": []}), ("get_weather", {"city": "Rome", "unit": "f"})]),
    ('I will look it up. [TOOL_CALLS][{"name": "plan", "arguments": {"trip": {"stops": '
     '[{"city": "Nice", "days": 2}, {"city": "Lyon", "days": null}], '
     '"note": "a \\"quoted\\" ] bracket"}}}]', "I will look it up.",
     [("plan", {"trip": {"stops": [{"city": "Nice", "days": 2}, {"city": "Lyon", "days": None}],
                         "note": 'a "quoted" ] bracket'}})]),
    ('[TOOL_CALLS][{"name": "translate", "arguments": {"text": "Grüße aus Köln 🌧", '
     '"to": "日本語"}}]', "", [("translate", {"text": "Grüße aus Köln 🌧", "to": "日本語"})]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "unit": "c"}[TOOL_CALLS]add[ARGS]'
     '{"a": 3, "tags": ["ä"]}', "",
     [("get_weather", {"city": "Oslo", "unit": "c"}), ("add", {"a": 3, "tags": ["ä"]})]),
    ('[TOOL_CALLS]get_weather{"city": "Oslo", "unit": "f"}', "",
     [("get_weather", {"city": "Oslo", "unit": "f"})]),
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
    report = check_chat_format(
        FORMAT, golden, shaped_answers=[('{"city":"[TOOL","temperature":21}', SHAPED)]
    )
    assert report["text_schema"].startswith("shaped: free text refused, 1 JSON")


#: the kit's TEXT_SCHEMA answered (a value like the start of the marker)
SHAPED = {"city": "[TOOL", "temperature": 21}


@pytest.mark.parametrize("text", [g[0] for g in GOLDEN if g[2]])
def test_a_call_cut_short_is_not_complete(text: str) -> None:
    last = text.rindex("[TOOL_CALLS]") + len("[TOOL_CALLS]")
    for cut in (last, last + 4, (last + len(text)) // 2, text.rindex('"'), text.rindex("}")):
        parsed = FORMAT.parse(text[:cut], final=True)
        assert parsed.calls and not parsed.calls[-1].complete, cut


# -- the grammar ---------------------------------------------------------------------------


def accepts(folder: Path, grammar: str, text: str) -> bool:
    return accepts_text(folder, grammar, text, EOS)


def test_the_grammar_allows_what_each_tool_choice_allows(folders) -> None:
    """The random model answers text for ``auto`` (a call's first token is one among
    many), so what ``auto`` and the others allow is checked here, text by text."""
    weather = '{"name":"get_weather","arguments":{"city":"Oslo","unit":"c"}}'
    add = '{"name":"add","arguments":{"a":1,"tags":["x"]}}'
    folder = folders["mistral"]
    auto, required = (
        FORMAT.answer_grammar(spec_for("auto")),
        FORMAT.answer_grammar(spec_for("required")),
    )
    for text in (
        "It is sunny [1].",
        f"[TOOL_CALLS][{weather}]",
        f"Let me look.[TOOL_CALLS][{weather},{add},{weather}]",
    ):
        assert accepts(folder, auto, text), text  # fmt: skip
    too_big, other_key = add.replace(":1,", ":10,"), add.replace("arguments", "parameters")
    for text in (
        "[TOOL_CALLS]",
        "a [TOOL_CALLS] b",
        f"[TOOL_CALLS][{add},{add},{add},{add}]",
        f"[TOOL_CALLS][{too_big}]",
        f"[TOOL_CALLS][{add}] ok",
        f"[TOOL_CALLS][{other_key}]",
    ):
        assert not accepts(folder, auto, text), text  # fmt: skip
    assert accepts(folder, required, f"[TOOL_CALLS][{add}]")
    for text in ("It is sunny.", f"Look.[TOOL_CALLS][{add}]"):
        assert not accepts(folder, required, text), text
    named = FORMAT.answer_grammar(spec_for("get_weather", parallel=False))
    assert accepts(folder, named, f"[TOOL_CALLS][{weather}]")
    for text in (f"[TOOL_CALLS][{add}]", f"[TOOL_CALLS][{weather},{weather}]", "sunny"):
        assert not accepts(folder, named, text), text


# -- a tiny random model: the grammar alone makes its calls valid -------------------------


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("mistral-family")
    folder = export_chat_family(root, "mistral", TEMPLATE, special_tokens=SPECIALS, eos=EOS)
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
        if choice != "auto":
            assert finish == "eos" and not parsed.content, (seed, parsed)
        if parsed.calls:
            assert finish == "eos" and 1 <= len(parsed.calls) <= spec.max_calls, (seed, parsed)
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
    assert tools is None and "[AVAILABLE_TOOLS]" not in gen.tokenizer.apply_chat_template(messages)
