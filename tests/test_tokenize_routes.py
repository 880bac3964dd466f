"""``/tokenize`` and ``/detokenize`` (vLLM's request shapes) and the context length in
``/v1/models``, in-process on a tiny model with a tokenizer and a chat template: counts
equal the model's own tokenizer and chat template, round trips return the text, bad
bodies are 400s naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import ortgen
from ortgen.serve.app import build_app
from ortgen.serve.engine import Engine
from ortgen.serve.model_pool import ModelPool, ServedModel
from ortgen.serve.state import ServerState
from tests.tiny_models import export_tiny

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
]


@pytest.fixture(scope="module")
def gen(tiny_root: Path):
    return ortgen.load(export_tiny("llama", tiny_root / "text-tok", with_tokenizer=True), threads=1)


@pytest.fixture(scope="module")
def client(gen) -> Iterator[TestClient]:
    state = ServerState(ModelPool.single(ServedModel("tiny", gen, Engine(gen, max_batch=2))))
    with TestClient(build_app(state)) as test_client:
        yield test_client


def test_text_counts_what_the_tokenizer_counts_and_round_trips(client, gen):
    text = "Hello there, tokens!"
    answer = client.post("/tokenize", json={"model": "tiny", "prompt": text}).json()
    ids = gen.tokenizer.encode(text)
    assert answer == {"count": len(ids), "max_model_len": gen.model.max_context, "tokens": ids}
    bare = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == gen.tokenizer.encode(text, add_special_tokens=False)
    back = client.post("/detokenize", json={"tokens": bare["tokens"]}).json()
    assert back == {"prompt": text}
    pieces = client.post("/tokenize", json={"prompt": "ab", "return_token_strs": True}).json()
    assert pieces["token_strs"] == [gen.tokenizer.id_to_token(i) for i in pieces["tokens"]]


def test_messages_count_the_chat_template_tokens(client, gen):
    answer = client.post("/tokenize", json={"messages": CHAT}).json()
    assert answer["tokens"] == gen.chat_prompt(CHAT)  # what a chat request is prefilled with
    assert answer["count"] == len(answer["tokens"]) > 10
    open_ended = client.post(
        "/tokenize", json={"messages": CHAT, "add_generation_prompt": False}
    ).json()
    assert open_ended["tokens"] == gen.chat_prompt(CHAT, add_generation_prompt=False)
    assert open_ended["count"] < answer["count"]


def test_models_give_the_context_length(client, gen):
    assert gen.model.max_context
    listed = client.get("/v1/models").json()["data"][0]
    assert listed["max_model_len"] == gen.model.max_context
    assert client.get("/v1/models/tiny").json()["max_model_len"] == gen.model.max_context


@pytest.mark.parametrize(
    ("route", "body", "named"),
    [
        ("/tokenize", {}, "either prompt"),
        ("/tokenize", {"prompt": "a", "messages": CHAT}, "either prompt"),
        ("/tokenize", {"prompt": 5}, "prompt must be a string"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": 1}, "add_special_tokens must be"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "goes with messages"),
        ("/tokenize", {"messages": []}, "messages is empty"),
        ("/tokenize", {"messages": [{"role": "user"}]}, "has no 'content'"),
        ("/tokenize", {"prompt": "a", "tokens": [1]}, "unknown field 'tokens'"),
        ("/detokenize", {"tokens": "abc"}, "list of token ids"),
        ("/detokenize", {"tokens": [1, True]}, "list of token ids"),
        ("/detokenize", {"tokens": [1, 1.5]}, "list of token ids"),
        ("/detokenize", {"tokens": [1, 10**9]}, "outside the vocabulary"),
        ("/detokenize", {"prompt": "x"}, "unknown field 'prompt'"),
    ],
)
def test_bad_bodies_are_400_naming_the_problem(client, route, body, named):
    answer = client.post(route, json=body)
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]["message"]


@pytest.mark.default_model
def test_messages_with_tools_count_what_a_chat_request_is_prefilled_with(default_gen):
    """The default model's template knows no tools: a chat request gets the chat format's
    tool prompt and the earlier call as JSON. /tokenize rendered the template alone: it
    left the tools out (a smaller count) and failed on the call (no content)."""
    add = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}  # fmt: skip
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
    conversations = [
        [{"role": "user", "content": "Add 1."}],
        [{"role": "user", "content": "Add 1."},
         {"role": "assistant", "content": None, "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "c1", "content": "1"}],
    ]  # fmt: skip
    engine = Engine(default_gen, max_batch=1)
    state = ServerState(ModelPool.single(ServedModel("default", default_gen, engine)))
    with TestClient(build_app(state)) as client:
        for messages in conversations:
            counted = client.post("/tokenize", json={"messages": messages, "tools": [add]})
            assert counted.status_code == 200, counted.json()
            chat = client.post("/v1/chat/completions", json={
                "messages": messages, "tools": [add], "max_tokens": 1}).json()  # fmt: skip
            assert counted.json()["count"] == chat["usage"]["prompt_tokens"]
