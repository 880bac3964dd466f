"""Structured output and tool calls through ``ortgen serve``, driven by the official
``openai`` client on loopback against the default model: ``parse()`` with a Pydantic
model, ``json_object`` (OpenAI's and llama.cpp's forms), a bad schema (400 naming
``response_format``), tool calls with each ``tool_choice``, streamed ``delta.tool_calls``
fragments, and a conversation that sends a tool's result back.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pydantic
import pytest

from ortgen.tool_calls import closed
from tests.server_helpers import ServerProcess
from tests.test_tool_calls import TOOLS

pytestmark = pytest.mark.default_model
QUESTION = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]


class Person(pydantic.BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def client(default_model_dir: Path):
    server = ServerProcess("--model", str(default_model_dir), "--threads", "1").ready()
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
    assert "Maria" in choice.message.parsed.name


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
    assert call.function.name == "get_weather" and _valid_call(call)["city"] == "Paris"
    named = client.chat.completions.create(
        model="x", messages=QUESTION, tools=TOOLS, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )  # fmt: skip
    calls = named.choices[0].message.tool_calls
    assert calls and {c.function.name for c in calls} == {"add"}
    assert all(_valid_call(c) is not None for c in calls)
    auto = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Hi! How are you today?"}],
        tools=TOOLS, max_tokens=60,
    )  # fmt: skip
    assert auto.choices[0].finish_reason == "stop" and auto.choices[0].message.content
    assert not auto.choices[0].message.tool_calls
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
