"""``POST /v1/responses`` (OpenAI's Responses API, stateless) through ``ortgen serve`` and
the official ``openai`` client, on the tiny hermes-family model that thinks and calls
tools (tests/test_chat_formats_server.py's): plain text, ``text.format`` parsed into a
Pydantic model, a function call and its output sent back, the thought as a reasoning
item, the typed stream events in their order (the client's own stream helper
accumulates them), ``max_output_tokens`` cutting the answer, and 400s naming the field
(``previous_response_id``, ``input[1].call_id``, ...).

Answers are forced with tests/server_plugin.py's ``says``; the random model writes
nothing sensible on its own. Where the translation into a chat matters, the prompt is
compared with the chat route's: the same conversation must cost the same input tokens.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import openai
import pydantic
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseIncompleteEvent,
    ResponseOutputItemAddedEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    response_create_params,
)

from ortgen.serve.openapi import openapi_document
from ortgen.serve.responses_api import RESPONSES_FIELDS, accepted_fields
from tests.format_helpers import CALL, THOUGHT_THEN_ANSWER, export_hermes_family, says
from tests.server_helpers import ROOT, ServerProcess, call

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
CHAT_ADD = {
    "type": "function",
    "function": {k: ADD[k] for k in ("name", "description", "parameters")},
}
QUESTION = "1+2?"


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_hermes_family(tmp_path_factory.mktemp("hermes-family"))


@pytest.fixture(scope="module")
def server(family: Path):
    with ServerProcess(
        "--model", str(family), "--threads", "1", "--plugin", "tests.server_plugin"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return server.client()


def chat_prompt_tokens(client: openai.OpenAI, messages: list, **fields) -> int:
    """What the chat route counts for the same conversation."""
    answer = client.chat.completions.create(
        model="x", messages=messages, max_tokens=1, **fields
    )  # fmt: skip
    return answer.usage.prompt_tokens


def test_plain_text_and_instructions(client) -> None:
    response = client.responses.create(
        model="x", instructions="Be brief.", input=QUESTION, max_output_tokens=40,
        **says("Three."),
    )  # fmt: skip
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == "Three."
    (message,) = response.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert message.content[0].annotations == []
    assert response.instructions == "Be brief." and response.tool_choice == "auto"
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens == len("Three.") + 1  # the character vocabulary, and EOS
    assert usage.output_tokens_details.reasoning_tokens == 0
    system_first = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": QUESTION}]  # fmt: skip
    assert usage.input_tokens == chat_prompt_tokens(client, system_first)


def test_text_format_parsed_into_a_pydantic_model(client) -> None:
    class Sum(pydantic.BaseModel):
        total: int

    response = client.responses.parse(
        model="x", input=QUESTION, text_format=Sum, max_output_tokens=60,
        **says('{"total":3}'),
    )  # fmt: skip
    assert response.status == "completed"
    assert response.output_parsed == Sum(total=3)
    assert response.text.format.type == "json_schema" and response.text.format.name == "Sum"


def test_tools_and_text_format_give_a_call_or_the_parsed_output(client) -> None:
    """An agent's turn: tools under ``auto`` and an output type (``text.format``). The
    answer that makes no call is the output's JSON, parsed by the client, whole and
    streamed; one that calls is a ``function_call`` item. It was a 400 (both constrained
    one answer)."""

    class Sum(pydantic.BaseModel):
        total: int

    settings = dict(model="x", input=QUESTION, tools=[ADD], text_format=Sum, max_output_tokens=120)
    answered = client.responses.parse(**settings, **says('{"total":3}'))
    assert answered.status == "completed" and answered.output_parsed == Sum(total=3)
    with client.responses.stream(**settings, **says('{"total":3}')) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        streamed = stream.get_final_response()
    assert streamed.output_parsed == Sum(total=3) and "".join(deltas) == '{"total":3}'
    called = client.responses.parse(**settings, **says(CALL))
    assert [item.type for item in called.output] == ["function_call"]
    assert called.output_parsed is None and json.loads(called.output[0].arguments) == {
        "a": 1,
        "b": 2,
    }


def test_a_function_call_round_trip(client) -> None:
    question = [{"role": "user", "content": QUESTION}]
    first = client.responses.create(
        model="x", input=question, tools=[ADD], max_output_tokens=120, **says(CALL)
    )
    (call_item,) = first.output
    assert call_item.type == "function_call" and call_item.status == "completed"
    assert (call_item.name, json.loads(call_item.arguments)) == ("add", {"a": 1, "b": 2})
    assert call_item.call_id.startswith("call_") and first.output_text == ""
    assert first.tools[0].name == "add"  # echoed, and sent back below as the tools
    result = {"type": "function_call_output", "call_id": call_item.call_id, "output": "3"}
    second = client.responses.create(
        model="x", input=[*question, *first.output, result], tools=first.tools,
        max_output_tokens=40, **says("Three."),
    )  # fmt: skip
    assert second.output_text == "Three."
    chat = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_item.call_id, "type": "function",
             "function": {"name": "add", "arguments": call_item.arguments}}]},
        {"role": "tool", "tool_call_id": call_item.call_id, "content": "3"},
    ]  # fmt: skip
    assert second.usage.input_tokens == chat_prompt_tokens(client, chat, tools=[CHAT_ADD])


def test_the_thought_is_a_reasoning_item_and_may_be_sent_back(client) -> None:
    response = client.responses.create(
        model="x", input=QUESTION, max_output_tokens=80, reasoning={"effort": "medium"},
        **says(THOUGHT_THEN_ANSWER),
    )  # fmt: skip
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [c.text for c in reasoning.content] == ["I add them."]
    assert message.content[0].text == "Three." and response.output_text == "Three."
    assert response.reasoning.effort == "medium"
    thought = response.usage.output_tokens_details.reasoning_tokens
    assert thought == 1 + len("\nI add them.\n") + 1  # the tags are one token each
    follow_up = [{"role": "user", "content": QUESTION}, *response.output,
                 {"role": "user", "content": "And 2+2?"}]  # fmt: skip
    again = client.responses.create(model="x", input=follow_up, max_output_tokens=20,
                                    **says("Four."))  # fmt: skip
    assert again.output_text == "Four."
    # the thought reaches the template as the turn's reasoning_content (hermes renders
    # it on the last assistant turn only): the same prompt as the chat route's
    last = client.responses.create(model="x", input=follow_up[:-1], max_output_tokens=1)
    chat = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Three.", "reasoning_content": "I add them."},
    ]
    assert last.usage.input_tokens == chat_prompt_tokens(client, chat)
    no_thought = [chat[0], {"role": "assistant", "content": "Three."}]
    assert chat_prompt_tokens(client, no_thought) < last.usage.input_tokens


# -- streams ---------------------------------------------------------------------------

#: what may follow each event type in one response's stream (None: the start)
FOLLOWS = {
    None: {"response.created"},
    "response.created": {"response.in_progress"},
    "response.in_progress": {"response.output_item.added"},
    "response.output_item.added": {"response.content_part.added",
                                   "response.function_call_arguments.delta"},
    "response.content_part.added": {"response.reasoning_text.delta",
                                    "response.output_text.delta",
                                    "response.reasoning_text.done",
                                    "response.output_text.done"},
    "response.reasoning_text.delta": {"response.reasoning_text.delta",
                                      "response.reasoning_text.done"},
    "response.output_text.delta": {"response.output_text.delta", "response.output_text.done"},
    "response.function_call_arguments.delta": {"response.function_call_arguments.delta",
                                               "response.function_call_arguments.done"},
    "response.reasoning_text.done": {"response.content_part.done"},
    "response.output_text.done": {"response.content_part.done"},
    "response.function_call_arguments.done": {"response.output_item.done"},
    "response.content_part.done": {"response.output_item.done"},
    "response.output_item.done": {"response.output_item.added", "response.completed",
                                  "response.incomplete"},
}  # fmt: skip


def check_order(events: list[ResponseStreamEvent]) -> None:
    """Each event may follow the one before it, sequence numbers count up from 0, and
    the text events of an item name it and its output index."""
    last, item, index = None, None, -1
    for number, event in enumerate(events):
        assert event.type in FOLLOWS[last], f"{event.type} after {last}"
        assert event.sequence_number == number
        if event.type == "response.output_item.added":
            item, index = event.item.id, index + 1
            assert event.output_index == index
        elif hasattr(event, "item_id"):
            assert (event.item_id, event.output_index) == (item, index)
        last = event.type
    assert last in ("response.completed", "response.incomplete")


def joined(events: list, kind: str) -> str:
    return "".join(e.delta for e in events if e.type == f"response.{kind}.delta")


def test_a_stream_of_typed_events_joins_to_the_whole_response(client) -> None:
    settings = dict(model="x", input=QUESTION, max_output_tokens=80, **says(THOUGHT_THEN_ANSWER))
    whole = client.responses.create(**settings)
    events = list(client.responses.create(**settings, stream=True))
    check_order(events)
    assert all(type(e).__module__.startswith("openai.types.responses") for e in events)
    assert [e.item.type for e in events if isinstance(e, ResponseOutputItemAddedEvent)] == [
        "reasoning", "message"
    ]  # fmt: skip
    assert joined(events, "reasoning_text") == whole.output[0].content[0].text
    assert joined(events, "output_text") == whole.output_text
    assert sum(isinstance(e, ResponseTextDeltaEvent) for e in events) > 1
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent) and final.response.output_text == "Three."
    assert final.response.usage.output_tokens == whole.usage.output_tokens
    with client.responses.stream(**settings) as stream:  # the client's own accumulator
        helper = list(stream)
        response = stream.get_final_response()
    assert response.output_text == "Three." and len(helper) == len(events)


def test_call_arguments_stream_as_they_are_written(client) -> None:
    settings = dict(model="x", input=QUESTION, tools=[ADD], max_output_tokens=120,
                    **says(f"<think>\nadd\n</think>\n\n{CALL}"))  # fmt: skip
    whole = client.responses.create(**settings)
    assert [item.type for item in whole.output] == ["reasoning", "function_call"]
    events = list(client.responses.create(**settings, stream=True))
    check_order(events)
    arguments = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(arguments) > 3, "the arguments came in one piece, not as they were written"
    assert joined(events, "function_call_arguments") == whole.output[1].arguments
    call_item = events[-1].response.output[1]
    assert (call_item.name, call_item.status) == ("add", "completed")


def test_max_output_tokens_cuts_the_answer(client) -> None:
    settings = dict(model="x", input=QUESTION, max_output_tokens=4, **says("Three and more."))
    response = client.responses.create(**settings)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Thre" and response.output[0].status == "incomplete"
    events = list(client.responses.create(**settings, stream=True))
    check_order(events)
    assert isinstance(events[-1], ResponseIncompleteEvent)
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert joined(events, "output_text") == "Thre"


def test_a_row_that_fails_mid_stream_ends_with_an_error_event(client) -> None:
    events = list(client.responses.create(
        model="x", input=QUESTION, max_output_tokens=20, stream=True,
        extra_body={"logits_processors": [{"name": "explode", "at_step": 2}]},
    ))  # fmt: skip
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert isinstance(events[-1], ResponseErrorEvent) and "exploded" in events[-1].message
    assert [e.sequence_number for e in events] == list(range(len(events)))


# -- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_tokens": 5}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"temprature": 0.5}, "temprature"),  # not a field nor a setting: did you mean
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [ADD]}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format.schema"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(client, fields, param) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="x", input=QUESTION, extra_body=fields)
    assert caught.value.param == param, caught.value.message


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([{"role": "user", "content": "hi"},
          {"type": "function_call_output", "call_id": "call_x", "output": "1"}],
         "input[1].call_id"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
         "input[0].content[0].type"),
        ([{"role": "user", "content": "hi"},
          {"type": "function_call", "call_id": "c", "name": "add", "arguments": {"a": 1}}],
         "input[1].arguments"),
        ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ([{"role": "robot", "content": "hi"}], "input[0].role"),
        ([], "input"),
    ],
)  # fmt: skip
def test_a_bad_input_item_is_a_400_naming_it(server, items, param) -> None:
    status, answer = call(server, "/v1/responses", {"model": "x", "input": items})
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer


def test_every_field_of_the_client_is_read_or_named() -> None:
    """Every field of the installed client's Responses request is one the server reads,
    or accepts at the values that ask for nothing (never an unknown setting), is
    published in /openapi.json and is in docs/server.md's section."""
    fields = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase))
    fields |= {"stream"}
    known = set(RESPONSES_FIELDS) | set(accepted_fields())
    assert fields <= known, fields - known
    published = openapi_document()["components"]["schemas"]["ResponseRequest"]["properties"]
    assert fields <= set(published), fields - set(published)
    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    section = text.split("## The Responses API", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z_]+)[`.:]", section))
    assert fields <= named, fields - named
