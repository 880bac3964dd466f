"""The client libraries people point at an OpenAI-compatible server, on their default
settings, against a live ``ortgen serve`` of the default model: the ``openai`` client,
langchain-openai, pydantic-ai and openai-agents (instructor runs in its own environment:
tests/test_client_instructor.py; lm-evaluation-harness: tests/test_lm_eval.py).

What is asserted holds on any CPU: the grammar makes it so (a structured answer
validates against its schema, a forced call has arguments of its tool's schema, a turn
without tools is text). The schemas bound every string and list, so an answer always ends
within the default ``max_tokens`` (the default model, left free, can write a list for
ever). Which words the model picks is not asserted: the int8 default model may pick
another at a near-tie on another CPU. A request the client sends on its own defaults is
checked to be the route the client is known to use (``/metrics`` counts them).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.server_helpers import KEY, ServerProcess, metric

pytestmark = pytest.mark.default_model


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)


class Answer(BaseModel):
    """A bounded answer: it ends within the token limit (free words after a tool result
    ran past it in 2 of 8 openai-agents runs on the default model)."""

    text: str = Field(min_length=1, max_length=80)


class Cities(BaseModel):
    """A nested model: its JSON Schema refers to ``City`` through ``$defs``."""

    cities: list[City] = Field(min_length=1, max_length=3)


@pytest.fixture(scope="module")
def server(default_model_dir: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model", str(default_model_dir), "--threads", "1") as server:
        yield server


def served(server: ServerProcess, route: str) -> float:
    """Successful requests of ``route`` so far."""
    try:
        return metric(server, "ortgen_http_requests_total", route=route, code="200")
    except KeyError:
        return 0.0


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def valid_add_arguments(arguments: Any) -> bool:
    """Whether a call's arguments (text or parsed) fit ``add``'s parameters."""
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    integer = {"type": "integer"}
    schema = {
        "type": "object",
        "properties": {"a": integer, "b": integer},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    jsonschema.validate(value, schema)
    return True


# -- openai --------------------------------------------------------------------------


def test_openai_responses_create_and_chat_parse(server: ServerProcess) -> None:
    client = server.client()
    before = served(server, "/v1/responses")
    response = client.responses.create(model="x", input="Hi")
    assert response.status == "completed" and response.output_text.strip()
    assert served(server, "/v1/responses") == before + 1
    parsed = client.chat.completions.parse(
        model="x",
        messages=[{"role": "user", "content": "Name a city in France."}],
        response_format=City,
    )
    assert isinstance(parsed.choices[0].message.parsed, City)
    nested = client.responses.parse(model="x", input="Name French cities.", text_format=Cities)
    assert isinstance(nested.output_parsed, Cities)


# -- langchain-openai ----------------------------------------------------------------


def test_langchain_chat_openai(server: ServerProcess) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{server.url}/v1", api_key=KEY, model="x")
    before = served(server, "/v1/chat/completions")
    answer = llm.invoke("Hi")
    assert isinstance(answer.content, str) and answer.content.strip()
    assert answer.response_metadata["finish_reason"] == "stop"
    # with_structured_output's default method is json_schema: response_format
    method = inspect.signature(ChatOpenAI.with_structured_output).parameters["method"]
    assert method.default == "json_schema"
    assert isinstance(llm.with_structured_output(City).invoke("Name a city in France."), City)
    assert isinstance(llm.with_structured_output(Cities).invoke("Name French cities."), Cities)
    add_tool = tool(add)
    question = HumanMessage("What is 2 + 3?")
    called = llm.bind_tools([add_tool], tool_choice="add").invoke([question])
    (call,) = called.tool_calls
    assert call["name"] == "add" and valid_add_arguments(call["args"])
    # the result goes back; without tools the model answers in words
    result = ToolMessage(str(add(**call["args"])), tool_call_id=call["id"])
    final = llm.invoke([question, called, result])
    assert isinstance(final.content, str) and final.content.strip() and not final.tool_calls
    assert served(server, "/v1/chat/completions") == before + 5


def test_langchain_responses_api(server: ServerProcess) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{server.url}/v1", api_key=KEY, model="x", use_responses_api=True)
    before = served(server, "/v1/responses")
    answer = llm.invoke("Hi")
    assert answer.text.strip()
    assert isinstance(llm.with_structured_output(City).invoke("Name a city in France."), City)
    called = llm.bind_tools([tool(add)], tool_choice="add").invoke("What is 2 + 3?")
    (call,) = called.tool_calls
    assert call["name"] == "add" and valid_add_arguments(call["args"])
    assert served(server, "/v1/responses") == before + 3


# -- pydantic-ai ---------------------------------------------------------------------


def pydantic_ai_model(server: ServerProcess) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{server.url}/v1", api_key=KEY)
    return OpenAIChatModel("x", provider=provider)


def test_pydantic_ai_text_and_structured_output(server: ServerProcess) -> None:
    from pydantic_ai import Agent

    model = pydantic_ai_model(server)
    assert Agent(model).run_sync("Hi").output.strip()
    # output_type's default is a tool (final_result) whose arguments are the model's
    assert isinstance(Agent(model, output_type=City).run_sync("A city in France?").output, City)
    # its schema nests City under $defs: the call grammar was a 400 before
    cities = Agent(model, output_type=Cities).run_sync("Name French cities.").output
    assert isinstance(cities, Cities) and cities.cities


def test_pydantic_ai_tool_round_trip(server: ServerProcess) -> None:
    """The first step must call the tool; the next one may not (``tool_choice`` per step,
    as pydantic-ai's docs say to force a tool once): the default model, free to call
    again, calls ``add`` until the request limit."""
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.messages import TextPart, ToolCallPart, ToolReturnPart

    def settings(ctx: RunContext[None]) -> dict[str, Any]:
        return {"tool_choice": "required" if ctx.run_step <= 1 else "none"}

    calls: list[tuple[int, int]] = []
    agent = Agent(pydantic_ai_model(server), model_settings=settings)  # type: ignore[arg-type]

    @agent.tool_plain
    def add_tool(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    result = agent.run_sync("What is 2 + 3?")
    parts = [part for message in result.all_messages() for part in message.parts]
    (call,) = [p for p in parts if isinstance(p, ToolCallPart)]
    assert call.tool_name == "add_tool" and valid_add_arguments(call.args)
    assert len(calls) == 1 and [p.content for p in parts if isinstance(p, ToolReturnPart)] == [
        sum(calls[0])
    ]
    assert isinstance(parts[-1], TextPart) and result.output.strip()


# -- openai-agents -------------------------------------------------------------------


@pytest.fixture
def agents_client(server: ServerProcess) -> Iterator[None]:
    """openai-agents' default client pointed at the server (its default model speaks
    the Responses API); tracing off: it would upload traces to OpenAI."""
    from agents import set_default_openai_client, set_tracing_disabled

    set_default_openai_client(server.async_client(), use_for_tracing=False)
    set_tracing_disabled(True)
    yield


def test_openai_agents_runner(server: ServerProcess, agents_client: None) -> None:
    from agents import Agent, Runner

    async def both() -> tuple[Any, Any]:  # one event loop: the client's connections live in it
        text = await Runner.run(Agent(name="a"), "Hi")
        return text, await Runner.run(Agent(name="a", output_type=City), "A city in France?")

    before = served(server, "/v1/responses")
    text, structured = asyncio.run(both())
    assert isinstance(text.final_output, str) and text.final_output.strip()
    assert isinstance(structured.final_output, City)
    assert served(server, "/v1/responses") == before + 2


def test_openai_agents_function_tool_round_trip(server: ServerProcess, agents_client: None) -> None:
    """The call is forced, then the tool is disabled once used (``is_enabled``), so the
    next turn answers (the default model, free to call again, calls ``add`` until
    ``max_turns``). The agent's ``output_type`` goes with both turns: the forced call
    leaves it for the answer. The call and its output reach the server as Responses
    items (``function_call``, ``function_call_output``)."""
    from agents import Agent, ModelSettings, Runner, function_tool
    from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem

    calls: list[tuple[int, int]] = []

    @function_tool(is_enabled=lambda ctx, agent: not calls)
    def add_tool(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    agent = Agent(
        name="calc",
        tools=[add_tool],
        model_settings=ModelSettings(tool_choice="required"),
        output_type=Answer,
    )
    before = served(server, "/v1/responses")
    result = asyncio.run(Runner.run(agent, "What is 2 + 3?", max_turns=3))
    kinds = [type(item) for item in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem]
    call = result.new_items[0].raw_item
    assert getattr(call, "name", None) == "add_tool" and valid_add_arguments(call.arguments)
    assert result.new_items[1].output == sum(calls[0])
    assert isinstance(result.final_output, Answer) and result.final_output.text.strip()
    assert served(server, "/v1/responses") == before + 2


def test_openai_agents_tools_and_output_type_on_their_defaults(
    server: ServerProcess, agents_client: None
) -> None:
    """``Agent(tools=..., output_type=...)`` as written in openai-agents' docs: each turn
    sends the tools (``tool_choice`` ``auto``) and the output schema together, which
    was a 400. The first turn's answer is a call or the output; the tool is disabled once
    used, so a turn after its result answers. The run ends with the output type."""
    from agents import Agent, Runner, function_tool
    from agents.items import ToolCallItem

    calls: list[tuple[int, int]] = []

    @function_tool(is_enabled=lambda ctx, agent: not calls)
    def add_tool(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    agent = Agent(name="calc", tools=[add_tool], output_type=Answer)
    before = served(server, "/v1/responses")
    result = asyncio.run(Runner.run(agent, "What is 2 + 3?", max_turns=3))
    assert isinstance(result.final_output, Answer) and result.final_output.text.strip()
    made = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    assert len(made) == len(calls) <= 1
    assert all(valid_add_arguments(call.arguments) for call in made)
    assert served(server, "/v1/responses") == before + 1 + len(calls)


def test_openai_chat_parse_with_tools_gives_a_call_or_the_schema(server: ServerProcess) -> None:
    """The ``openai`` client's ``chat.completions.parse`` with strict function tools and a
    ``response_format`` model (``tool_choice`` left to ``auto``): the message is a
    parsed call or the parsed model, whichever the model picked."""
    import openai

    class AddArguments(BaseModel):
        a: int
        b: int

    client = server.client()
    for question in ("What is 2 + 3? Use the tool.", "Name a city in France."):
        reply = client.chat.completions.parse(
            model="x",
            messages=[{"role": "user", "content": question}],
            tools=[openai.pydantic_function_tool(AddArguments, name="add")],
            response_format=City,
        )
        message = reply.choices[0].message
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            assert isinstance(message.tool_calls[0].function.parsed_arguments, AddArguments)
        else:
            assert isinstance(message.parsed, City), message.content
