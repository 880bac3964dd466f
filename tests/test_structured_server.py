"""Structured output and tool calls through ``ortgen serve``, driven by the official
``openai`` client on loopback against the default model: ``parse()`` with a Pydantic
model, ``json_object`` (OpenAI's and llama.cpp's forms), a bad schema (400 naming
``response_format``), tool calls with each ``tool_choice``, streamed ``delta.tool_calls``
fragments, a conversation that sends a tool's result back, and answers forced
(tests/server_plugin.py's ``says``) to several distinct calls, every one of which must
come back.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pydantic
import pytest

from ortgen.chat_formats import MAX_PARALLEL_CALLS, closed
from tests.server_helpers import ServerProcess
from tests.test_tool_calls import THREE_CALLS, TOOLS, written

pytestmark = pytest.mark.default_model
QUESTION = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]


class Person(pydantic.BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def client(default_model_dir: Path):
    server = ServerProcess(
        "--model", str(default_model_dir), "--threads", "1", "--plugin", "tests.server_plugin"
    ).ready()
    try:
        yield server.client()
    finally:
        server.stop()


def _valid_call(call) -> dict:
    schema = next(
        t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name
    )
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, closed(schema))
    assert call.id.startswith("call_") and call.type == "function"
    return arguments


def test_parse_with_a_pydantic_model(client) -> None:
    answer = client.chat.completions.parse(
        model="x",
        messages=[{"role": "user", "content": "Extract the person: 'Maria, 34, lives in Lisbon.'"}],
        response_format=Person,
        max_tokens=60,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)  # the client validated it
    # (which name the int8 default model copies is not asserted: at a near-tie it depends
    # on the CPU; tests/test_tool_calls.py asserts content on the float32 graph)


def test_json_object_both_forms(client) -> None:
    plain = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": 'A cat as JSON with the keys "name" and "age".'}],
        response_format={"type": "json_object"},
        max_tokens=120,
    )
    assert plain.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(plain.choices[0].message.content), dict)
    schema = {"type": "object", "properties": {"colour": {"enum": ["black", "white"]}},
              "required": ["colour"], "additionalProperties": False}  # fmt: skip
    llama = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "What colour is a swan?"}],
        response_format={"type": "json_object", "schema": schema},  # llama.cpp's form
        max_tokens=30,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in llama if chunk.choices)
    jsonschema.validate(json.loads(text), schema)


def test_a_schema_llguidance_cannot_compile_is_a_400(client) -> None:
    schema = {"type": "object", "if": {}, "then": {}}
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="x", messages=QUESTION, response_format=bad)
    body = error.value.body
    assert body["param"] == "response_format"
    assert "if" in body["message"] and "llguidance cannot compile" in body["message"]


def test_tool_calls_with_each_tool_choice(client) -> None:
    required = client.chat.completions.create(
        model="x", messages=QUESTION, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=80,
    )  # fmt: skip
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and _valid_call(call)["city"]
    named = client.chat.completions.create(
        model="x", messages=QUESTION, tools=TOOLS, max_tokens=80, logprobs=True,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )  # fmt: skip
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    # what the request allows: 1 to MAX_PARALLEL_CALLS calls, each of add, valid for it
    assert 1 <= len(calls) <= MAX_PARALLEL_CALLS and {c.function.name for c in calls} == {"add"}
    arguments = [_valid_call(c) for c in calls]
    # and exactly the calls the model wrote (its tokens, read with plain json; a repeat
    # kept once): which those are differs between CPUs, that they all come back does not
    written_text = b"".join(bytes(t.bytes) for t in choice.logprobs.content).decode()
    answer, _ = json.JSONDecoder().raw_decode(written_text)  # the EOS's text follows it
    expected: list = []
    for call in answer["tool_calls"]:
        if call not in expected:
            expected.append(call)
    assert [{"name": "add", "arguments": a} for a in arguments] == expected, written_text
    assert len({c.id for c in calls}) == len(calls)
    auto = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Hi! How are you today?"}],
        tools=TOOLS, max_tokens=60,
    )  # fmt: skip
    reason, message = auto.choices[0].finish_reason, auto.choices[0].message
    assert (reason == "tool_calls") == bool(message.tool_calls)  # auto: the model's choice
    assert reason == "tool_calls" or message.content
    none = client.chat.completions.create(
        model="x", messages=QUESTION, tools=TOOLS, tool_choice="none", max_tokens=20
    )
    assert not none.choices[0].message.tool_calls and none.choices[0].message.content


def test_streamed_tool_calls_assemble_into_the_same_calls(client) -> None:
    settings = dict(model="x", messages=QUESTION, tools=TOOLS, tool_choice="required",
                    parallel_tool_calls=False, max_tokens=80, temperature=0)  # fmt: skip
    whole = client.chat.completions.create(**settings).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(**settings, stream=True))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for fragment in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(fragment.index, {"name": "", "arguments": ""})
            if fragment.id:
                call["id"] = fragment.id
            call["name"] += fragment.function.name or ""
            call["arguments"] += fragment.function.arguments or ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_a_tool_result_round_trip(client) -> None:
    first = client.chat.completions.create(
        model="x", messages=QUESTION, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=80,
    )  # fmt: skip
    call = first.choices[0].message.tool_calls[0]
    conversation = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    second = client.chat.completions.create(
        model="x", messages=conversation, tools=TOOLS, max_tokens=80
    )
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls")
    if choice.finish_reason == "stop":
        assert choice.message.content and not choice.message.tool_calls
    else:
        assert all(_valid_call(c) is not None for c in choice.message.tool_calls)


@pytest.mark.parametrize("count", [2, 3])
def test_every_call_of_an_answer_comes_back(client, count) -> None:
    """The answer forced to ``count`` distinct calls (two functions, one twice with other
    arguments): the response holds exactly those, in order, whole and streamed."""
    calls = THREE_CALLS[:count]
    says = {"name": "says", "text": written(calls, "json")}
    settings = dict(model="x", messages=QUESTION, tools=TOOLS, tool_choice="required",
                    max_tokens=200, extra_body={"logits_processors": [says]})  # fmt: skip
    choice = client.chat.completions.create(**settings).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    got = choice.message.tool_calls
    assert [(c.function.name, _valid_call(c)) for c in got] == calls
    assert len({c.id for c in got}) == count
    streamed: dict[int, dict] = {}
    for chunk in client.chat.completions.create(**settings, stream=True):
        for fragment in chunk.choices[0].delta.tool_calls or ():
            call = streamed.setdefault(fragment.index, {"name": "", "arguments": ""})
            call["name"] += fragment.function.name or ""
            call["arguments"] += fragment.function.arguments or ""
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed.values()] == calls


def test_a_forced_call_within_64_tokens_comes_back_as_a_call(client) -> None:
    """The issue's report: a call forced by name with ``max_tokens`` 64 and no
    ``parallel_tool_calls`` came back as ``finish_reason: length`` with the internal
    ``{"tool_calls":[...`` wrapper as the message's content (the grammar allowed 8 calls
    and the model repeated its call). A named tool now allows one call, and a cut call is
    never text."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    for settings in ({}, {"temperature": 1.0, "seed": 3}):
        choice = client.chat.completions.create(
            model="x", messages=QUESTION, tools=TOOLS, tool_choice=named, max_tokens=64,
            **settings,
        ).choices[0]  # fmt: skip
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and _valid_call(call)
    cut = client.chat.completions.create(
        model="x", messages=QUESTION, tools=TOOLS, tool_choice=named, max_tokens=10
    ).choices[0]
    assert cut.finish_reason == "length"
    assert not cut.message.content and not cut.message.tool_calls
