"""Tools and ``response_format`` together under ``tool_choice`` ``auto`` (what an agent
with tools and an output type sends every turn): the answer is calls, or JSON of the
schema; never free text and never JSON of another shape.

A tiny random model speaking the ``hermes`` format, so only the grammar makes its
answers well-formed: every sampled answer is checked with ``jsonschema`` against the
request's schema or the called tool's parameters. Forced answers (the ``says``
processor) check how a JSON answer and a call are read back, and the formats that
cannot shape a text answer are refused by name."""

from __future__ import annotations

import json

import jsonschema
import pytest

import ortgen
from ortgen.errors import InputError
from tests import server_plugin
from tests.test_tool_calls import (  # the tiny hermes model and its tools
    HERMES_TEMPLATE,
    TINY_TOOLS,
    _arguments_valid,
    hermes_folder,  # noqa: F401 (a fixture)
    hermes_gen,  # noqa: F401 (a fixture)
    with_template,
)

#: an answer's schema short enough for the tiny model's 128 positions
ANSWER = {
    "type": "object",
    "properties": {
        "k": {"type": "string", "maxLength": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["k", "n"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
ASK = [{"role": "user", "content": "w?"}]


def test_every_answer_is_calls_or_json_of_the_schema(hermes_gen) -> None:  # noqa: F811
    """Sampled answers (16 seeds) under ``auto`` with a schema: each is whole calls with
    valid arguments, or content that is JSON the schema accepts (and ``parsed`` holds it).
    Before, the request was refused; with the text branch left free, answers were text."""
    kinds = []
    tag = hermes_gen.tokenizer.encode("<tool_call>", add_special_tokens=False)[0]  # "<"
    for seed in range(16):  # the tiny model always starts a call: half the rows may not
        bias = {tag: -100.0} if seed % 2 else None
        out = hermes_gen.chat(ASK, tools=TINY_TOOLS, response_format=RESPONSE_FORMAT,
                              parallel_tool_calls=False, max_new_tokens=60, do_sample=True,
                              temperature=1.0, seed=seed, logit_bias=bias)  # fmt: skip
        if out.tool_calls:
            assert out.finish_reasons == ["tool_calls"], out.text
            assert all(_arguments_valid(c, TINY_TOOLS) for c in out.tool_calls)
            kinds.append("calls")
            continue
        assert out.finish_reasons == ["eos"], (seed, out.text)
        value = json.loads(out.text)
        jsonschema.validate(value, ANSWER)
        assert out.parsed == value and out.parse_errors is None
        kinds.append("json")
    assert set(kinds) == {"calls", "json"}, kinds  # both branches were taken


@pytest.fixture(scope="module")
def hermes_says(tiny_root, hermes_folder):  # noqa: F811
    copy = with_template(hermes_folder, tiny_root / "tools-hermes-says", HERMES_TEMPLATE)
    return ortgen.load(copy, threads=1, plugins=[server_plugin])


@pytest.mark.parametrize(
    ("answer", "content", "calls"),
    [
        ('{"k":"ab","n":7}', '{"k":"ab","n":7}', []),
        ('<tool_call>\n{"name":"add","arguments":{"a":3}}\n</tool_call>', "", [("add", '{"a":3}')]),
    ],
)
def test_a_json_answer_and_a_call_are_read_back(hermes_says, answer, content, calls) -> None:
    says = {"name": "says", "text": answer}
    out = hermes_says.chat(ASK, tools=TINY_TOOLS, response_format=RESPONSE_FORMAT,
                           logits_processors=[says], max_new_tokens=100)  # fmt: skip
    assert out.text == content
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in out.tool_calls or []]
    assert got == calls
    assert out.parsed == (json.loads(content) if content else None)


def test_json_object_shapes_the_text_answer_too(hermes_gen) -> None:  # noqa: F811
    settings = {"max_new_tokens": 60, "do_sample": True, "parallel_tool_calls": False}
    for seed in range(6):
        out = hermes_gen.chat(ASK, tools=TINY_TOOLS, json_object=True, seed=seed, **settings)
        assert out.tool_calls or isinstance(json.loads(out.text), dict), out.text


@pytest.mark.parametrize("chat_format", ["llama3_json", "pythonic"])
def test_a_format_that_cannot_shape_its_text_is_named(hermes_gen, chat_format) -> None:  # noqa: F811
    """llama3_json writes calls as bare JSON objects and pythonic as a bare list: a JSON text
    answer could not be told from a call, so they do not set ``shapes_text``."""
    with pytest.raises(InputError, match=f"the '{chat_format}' chat format cannot shape"):
        hermes_gen.chat(ASK, tools=TINY_TOOLS, response_format=RESPONSE_FORMAT,
                        chat_format=chat_format)  # fmt: skip
    forced = hermes_gen.chat(ASK, tools=TINY_TOOLS, response_format=RESPONSE_FORMAT,
                             chat_format=chat_format, tool_choice="required",
                             max_new_tokens=60, do_sample=True, seed=1)  # fmt: skip
    assert forced.tool_calls or forced.finish_reasons == ["length"]


def test_another_constraint_beside_tools_is_still_refused(hermes_gen) -> None:  # noqa: F811
    with pytest.raises(InputError, match="give one of them"):
        hermes_gen.chat(ASK, tools=TINY_TOOLS, regex="[a-z]+")
    with pytest.raises(InputError, match="json_schema must be"):
        hermes_gen.chat(ASK, tools=TINY_TOOLS, json_schema="[1, 2]")
