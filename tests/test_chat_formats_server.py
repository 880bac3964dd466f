"""A model that thinks and calls tools in the hermes format (ortgen's hermes template on a
tiny random model), through ``ortgen serve`` and the official ``openai`` client: the
thought kept apart (``reasoning_content``, whole and streamed), thinking turned off,
tool-call arguments streamed as they are written, one call for a named tool, a call cut
by ``max_tokens`` never returned as text, a constraint applied after the thought, and
the same split from the library.

The random model writes nothing sensible on its own: answers are forced with
tests/server_plugin.py's ``says`` where the test is about reading them, and left to
the grammar where it is about what the grammar allows.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import ortgen
from tests import server_plugin
from tests.format_helpers import CALL, THOUGHT_THEN_ANSWER, export_hermes_family, says
from tests.server_helpers import ServerProcess

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
NOTE = {
    "type": "function",
    "function": {
        "name": "note",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 12}},
            "required": ["text"],
        },
    },
}
QUESTION = [{"role": "user", "content": "1+2?"}]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_hermes_family(tmp_path_factory.mktemp("hermes-family"))


@pytest.fixture(scope="module")
def client(family: Path):
    with ServerProcess(
        "--model", str(family), "--threads", "1", "--plugin", "tests.server_plugin"
    ) as server:
        yield server.client()


def streamed(chunks) -> tuple[str, str, dict[int, dict], str | None, int]:
    """(content, reasoning, calls by index, finish reason, argument chunks) of a stream."""
    content, reasoning, calls, reason, pieces = "", "", {}, None, 0
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for fragment in delta.tool_calls or ():
            call = calls.setdefault(fragment.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or fragment.id
            call["name"] += (fragment.function.name or "") if fragment.function else ""
            if fragment.function and fragment.function.arguments:
                call["arguments"] += fragment.function.arguments
                pieces += 1
        reason = choice.finish_reason or reason
    return content, reasoning, calls, reason, pieces


def test_the_thought_is_kept_apart_whole_and_streamed(client) -> None:
    settings = dict(model="x", messages=QUESTION, max_tokens=80, **says(THOUGHT_THEN_ANSWER))
    message = client.chat.completions.create(**settings).choices[0].message
    assert message.content == "Three."
    assert message.model_extra["reasoning_content"] == "I add them."
    content, reasoning, _, reason, _ = streamed(
        client.chat.completions.create(**settings, stream=True)
    )
    assert (content, reasoning, reason) == ("Three.", "I add them.", "stop")


def test_thinking_turned_off_gives_no_thought(client) -> None:
    for extra in ({"chat_template_kwargs": {"enable_thinking": False}},
                  {"reasoning_effort": "none"}):  # fmt: skip
        body = {**extra, "logits_processors": [{"name": "says", "text": "Three."}]}
        message = (
            client.chat.completions.create(
                model="x", messages=QUESTION, max_tokens=40, extra_body=body
            )
            .choices[0]
            .message
        )
        assert message.content == "Three.", extra
        assert not (message.model_extra or {}).get("reasoning_content"), extra


def test_a_thought_sent_back_in_the_history_is_accepted(client) -> None:
    history = [
        *QUESTION,
        {"role": "assistant", "content": "Three.", "reasoning_content": "I add them."},
        {"role": "user", "content": "And 2+2?"},
    ]
    answer = client.chat.completions.create(
        model="x", messages=history, max_tokens=40, **says("Four.")
    )
    assert answer.choices[0].message.content == "Four."


def test_call_arguments_stream_as_they_are_written(client) -> None:
    settings = dict(model="x", messages=QUESTION, tools=[ADD, NOTE], max_tokens=120,
                    **says(f"<think>\nadd\n</think>\n\n{CALL}"))  # fmt: skip
    whole = client.chat.completions.create(**settings).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    assert whole.message.model_extra["reasoning_content"] == "add"
    (call,) = whole.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 1, "b": 2})
    content, reasoning, calls, reason, pieces = streamed(
        client.chat.completions.create(**settings, stream=True)
    )
    assert (content, reasoning, reason) == ("", "add", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        ("add", call.function.arguments)
    ]
    assert calls[0]["id"].startswith("call_")
    assert pieces > 3, "the arguments came in one piece, not as they were written"


def test_a_named_tool_gives_one_call_and_a_cut_call_is_never_text(client) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for seed in range(3):
        choice = client.chat.completions.create(
            model="x",
            messages=QUESTION,
            tools=[ADD, NOTE],
            tool_choice=named,
            max_tokens=200,
            seed=seed,
            temperature=1.0,
        ).choices[0]  # fmt: skip
        assert choice.finish_reason == "tool_calls", choice
        assert [c.function.name for c in choice.message.tool_calls] == ["add"]
        jsonschema.validate(
            json.loads(choice.message.tool_calls[0].function.arguments),
            ADD["function"]["parameters"],
        )
    cut = client.chat.completions.create(
        model="x", messages=QUESTION, tools=[ADD], tool_choice=named, max_tokens=12,
    ).choices[0]  # fmt: skip
    assert cut.finish_reason == "length"
    assert not cut.message.content and not cut.message.tool_calls


def test_a_schema_applies_to_the_answer_after_the_thought(client) -> None:
    schema = {
        "type": "object",
        "properties": {"sum": {"type": "integer"}},
        "required": ["sum"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model="x", messages=QUESTION, max_tokens=200, n=8, seed=1, temperature=1.0,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        extra_body={"thinking_budget": 12},
    )  # fmt: skip
    thought = 0
    for choice in answer.choices:
        if choice.finish_reason != "stop":
            continue  # the random model may still be inside its answer at max_tokens
        jsonschema.validate(json.loads(choice.message.content), schema)
        thought += bool(choice.message.model_extra.get("reasoning_content"))
    assert sum(c.finish_reason == "stop" for c in answer.choices) >= 4
    assert thought, "no choice thought first: the test shows nothing about the thought"


def test_the_library_splits_the_same_answer_the_same_way(family: Path) -> None:
    gen = ortgen.load(family, threads=1, plugins=[server_plugin])
    says_text = f"<think>\nadd\n</think>\n\n{CALL}"
    out = gen.chat(QUESTION, tools=[ADD, NOTE], max_new_tokens=120,
                   logits_processors=[{"name": "says", "text": says_text}])  # fmt: skip
    assert out.finish_reasons == ["tool_calls"] and out.text == ""
    assert out.reasoning_content == "add"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in out.tool_calls] == [
        ("add", '{"a":1,"b":2}')
    ]
