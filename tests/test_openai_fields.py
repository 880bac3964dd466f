"""Every field of OpenAI's Chat Completions and Completions requests, through the official
``openai`` client against ``ortgen serve`` on a tiny fp32 model: none is refused as
unknown. Each is answered at a realistic value (supported, or accepted with no effect
here), and the few that would ask for what this server cannot give (audio, web search,
moderation, ...) are refused at such a value with a 400 naming them.

The field lists come from the installed client's own request types, so a field a newer
client adds fails ``test_every_field_of_the_client_is_covered`` until it is handled
here, in the tables the server reads with (``ortgen.request.openai_fields``,
``openai_ignored``), in ``/openapi.json`` and in docs/server.md's table.

``prediction`` (predicted outputs) drafts for speculative decoding: the answer is the one
without it, token for token on the fp32 model, and ``/metrics`` shows drafts proposed
and kept; the drafter's ``reference`` is tested directly too.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

import ortgen
from ortgen.plugins.drafters import PromptLookupDrafter
from ortgen.request.openai_fields import REASONING_EFFORTS, VERBOSITIES
from ortgen.serve.openapi import openapi_document
from ortgen.testing import check_drafter, make_context
from tests.server_helpers import ServerProcess, call, metric
from tests.tiny_models import export_tiny

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "hello there"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

#: a realistic value of every Chat Completions field, each accepted (sent one per request
#: beside messages, model, max_completion_tokens and temperature 0)
CHAT_ACCEPTED: dict[str, Any] = {
    "messages": MESSAGES,
    "model": "gpt-4o",
    "audio": None,
    "frequency_penalty": 0.5,
    "function_call": "none",
    "functions": [],
    "logit_bias": {"5": 2},
    "logprobs": True,
    "max_completion_tokens": 6,
    "max_tokens": 6,
    "metadata": {"session": "abc", "team": "docs"},
    "modalities": ["text"],
    "moderation": None,
    "n": 2,
    "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "hello there"},
    "presence_penalty": 0.5,
    "prompt_cache_key": "conversation-42",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "safety_identifier": "user-7f3a",
    "seed": 7,
    "service_tier": "auto",
    "stop": ["\n\n", "END"],
    "store": True,
    "stream": True,
    "stream_options": {"include_usage": True, "include_obfuscation": False},
    "temperature": 0.7,
    "tool_choice": "none",
    "tools": [TOOL],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "user-7f3a",
    "verbosity": "high",
    "web_search_options": None,
}
#: fields that need another one beside them. The tools go with tool_choice "none" (left
#: out of the prompt): their instructions alone are longer than the tiny model's context
#: of 128 characters; tool calls are tested on the default model (test_structured_server)
CHAT_WITH = {
    "top_logprobs": {"logprobs": True},
    "stream_options": {"stream": True},
    "tools": {"tool_choice": "none"},
    "tool_choice": {"tools": [TOOL]},
    "parallel_tool_calls": {"tools": [TOOL], "tool_choice": "none"},
}
#: values that ask for what this server cannot give: 400 naming the field
CHAT_REFUSED: dict[str, Any] = {
    "audio": {"format": "wav", "voice": "alloy"},
    "modalities": ["text", "audio"],
    "web_search_options": {"search_context_size": "low"},
    "moderation": {"model": "omni-moderation-latest"},
    "functions": [{"name": "get_weather", "parameters": {"type": "object"}}],
    "function_call": {"name": "get_weather"},
}
COMPLETION_ACCEPTED: dict[str, Any] = {
    "model": "gpt-3.5-turbo-instruct",
    "prompt": "hello",
    "best_of": 1,
    "echo": True,
    "frequency_penalty": 0.5,
    "logit_bias": {"5": 2},
    "logprobs": 2,
    "max_tokens": 6,
    "n": 2,
    "presence_penalty": 0.5,
    "seed": 7,
    "stop": "\n\n",
    "stream": True,
    "stream_options": {"include_usage": True, "include_obfuscation": True},
    "suffix": None,
    "temperature": 0.7,
    "top_p": 0.9,
    "user": "user-7f3a",
}
COMPLETION_REFUSED: dict[str, Any] = {"best_of": 3, "suffix": " the end."}


def _fields(params: Any) -> set[str]:
    """The request fields of one of the client's create-params TypedDicts."""
    return set(typing.get_type_hints(params.CompletionCreateParamsBase)) | {"stream"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """``ortgen serve`` on a tiny fp32 fused Llama with a character tokenizer and a chat
    template (the server tests' tiny model), and the model's folder."""
    folder = export_tiny("llama", tmp_path_factory.mktemp("fields"), with_tokenizer=True,
                         graph="fused")  # fmt: skip
    process = ServerProcess("--model", str(folder), "--threads", "1")
    try:
        yield SimpleNamespace(process=process.ready(), folder=folder)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.process.client()


@pytest.fixture(scope="module")
def gen(server):
    return ortgen.load(server.folder, threads=1)


@pytest.fixture(scope="module")
def spelled(gen) -> dict[str, float]:
    """A ``logit_bias`` that leaves only tokens whose text encodes back to them (and EOS):
    most of the tiny model's vocabulary is ``<extra_N>`` placeholders, whose text is
    characters, so a prediction holding an answer's text would never hold its ids."""
    tokenizer = gen.tokenizer
    eos = set(gen.resolve_config({}).config.eos_token_ids)
    size = gen.model.signature.vocab_size

    def spells_itself(i: int) -> bool:
        text = tokenizer.decode([i], skip_special_tokens=False)
        return tokenizer.encode(text, add_special_tokens=False) == [i]

    return {str(i): -100.0 for i in range(size) if i not in eos and not spells_itself(i)}


def _chat(client: openai.OpenAI, **fields: Any) -> Any:
    body: dict[str, Any] = {"model": "x", "messages": MESSAGES, "temperature": 0}
    if "max_tokens" not in fields:
        body["max_completion_tokens"] = 6
    return client.chat.completions.create(**{**body, **fields})


def _text(answer: Any) -> str:
    """The text of the first choice of an answer or of a stream of chunks."""
    if isinstance(answer, openai.Stream):
        return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    return answer.choices[0].message.content or ""


# -- every field is covered --------------------------------------------------------------


def test_every_field_of_the_client_is_covered() -> None:
    """The fields of the installed client's create params, each with a value here; and
    each in /openapi.json's request schema (the published schema takes the value)."""
    chat, completion = _fields(chat_create_params), _fields(completion_create_params)
    assert chat == set(CHAT_ACCEPTED), chat ^ set(CHAT_ACCEPTED)
    assert completion == set(COMPLETION_ACCEPTED), completion ^ set(COMPLETION_ACCEPTED)
    schemas = openapi_document()["components"]["schemas"]
    for name, fields, values in (
        ("ChatCompletionRequest", chat, CHAT_ACCEPTED),
        ("CompletionRequest", completion, COMPLETION_ACCEPTED),
    ):
        properties = schemas[name]["properties"]
        assert fields <= set(properties), fields - set(properties)
        for field in fields:
            jsonschema.validate(values[field], properties[field])


def test_every_chat_field_is_in_the_docs_table() -> None:
    text = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    section = text.split("### Every Chat Completions field", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"^\| `([a-z_]+)`", section, flags=re.M))
    wanted = _fields(chat_create_params) | _fields(completion_create_params)
    assert wanted <= listed, wanted - listed


# -- accepted ----------------------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(set(CHAT_ACCEPTED) - {"messages"}))
def test_chat_field_is_accepted(client, field: str) -> None:
    answer = _chat(client, **{**CHAT_WITH.get(field, {}), field: CHAT_ACCEPTED[field]})
    if isinstance(answer, openai.Stream):
        chunks = list(answer)
        assert chunks and chunks[0].choices[0].delta.role == "assistant"
        if field == "stream_options":
            assert chunks[-1].usage is not None  # include_usage's last chunk
    else:
        assert answer.choices and answer.usage.completion_tokens > 0


def test_all_chat_fields_at_once(client) -> None:
    """One request with every accepted field (what a client that fills them all sends)."""
    fields = {k: v for k, v in CHAT_ACCEPTED.items() if k != "max_tokens"}
    chunks = list(_chat(client, **fields))
    assert chunks[-1].usage.prompt_tokens > 0
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}


@pytest.mark.parametrize("field", sorted(set(COMPLETION_ACCEPTED) - {"prompt"}))
def test_completion_field_is_accepted(client, field: str) -> None:
    body = {"model": "x", "prompt": "hello", "max_tokens": 6, "temperature": 0}
    extra = {"stream": True} if field == "stream_options" else {}
    answer = client.completions.create(**{**body, **extra, field: COMPLETION_ACCEPTED[field]})
    if isinstance(answer, openai.Stream):
        assert list(answer)
    else:
        assert answer.choices and answer.usage.completion_tokens > 0


@pytest.mark.parametrize("value", ["in_memory", "24h", None])
def test_prompt_cache_retention_changes_nothing(client, value) -> None:
    plain = _text(_chat(client))
    assert _text(_chat(client, prompt_cache_retention=value, prompt_cache_key="k")) == plain


@pytest.mark.parametrize("effort", [*REASONING_EFFORTS, None])
def test_every_reasoning_effort_is_accepted(client, effort) -> None:
    assert _chat(client, reasoning_effort=effort).choices


@pytest.mark.parametrize("verbosity", [*VERBOSITIES, None])
def test_every_verbosity_is_accepted(client, verbosity) -> None:
    assert _chat(client, verbosity=verbosity).choices


# -- refused, with the field named -----------------------------------------------------------


def _refused(make: Any, param: str) -> str:
    with pytest.raises(openai.BadRequestError) as caught:
        make()
    error = caught.value
    assert error.status_code == 400 and error.param == param, error.body
    return error.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reasoning_effort", "extreme"),
        ("reasoning_effort", "HIGH"),
        ("reasoning_effort", 3),
        ("verbosity", "verbose"),
        ("verbosity", ["low"]),
    ],
)
def test_a_bad_reasoning_effort_or_verbosity_is_a_400_naming_it(client, field, value) -> None:
    message = _refused(lambda: _chat(client, **{field: value}), field)
    assert field in message and repr(value) in message


@pytest.mark.parametrize("field", sorted(CHAT_REFUSED))
def test_chat_field_refused_at_a_value_it_cannot_honour(client, field) -> None:
    message = _refused(lambda: _chat(client, **{field: CHAT_REFUSED[field]}), field)
    assert "not supported" in message


@pytest.mark.parametrize("field", sorted(COMPLETION_REFUSED))
def test_completion_field_refused_at_a_value_it_cannot_honour(client, field) -> None:
    body = {"model": "x", "prompt": "hello", "max_tokens": 4, field: COMPLETION_REFUSED[field]}
    _refused(lambda: client.completions.create(**body), field)


def test_a_bad_stream_option_is_a_400(client) -> None:
    options = {"include_usage": True, "include_obfuscation": "yes"}
    _refused(lambda: list(_chat(client, stream=True, stream_options=options)),
             "include_obfuscation")  # fmt: skip


# -- prediction: drafts, same answer -----------------------------------------------------


def test_prediction_gives_the_same_answer_and_drafts(server, client, spelled) -> None:
    """Greedy on the fp32 model: with the answer itself as the prediction, a wrong
    prediction, parts or nothing, the text is the one without a prediction; the right
    one has drafts proposed and kept (/metrics), streamed too."""
    ask = {"max_completion_tokens": 40, "logit_bias": spelled}
    plain = _text(_chat(client, **ask))
    assert len(plain) >= 8, plain
    drafted = metric(server.process, "ortgen_drafted_tokens_total")
    kept = metric(server.process, "ortgen_accepted_drafts_total")
    right = {"type": "content", "content": plain}
    assert _text(_chat(client, **ask, prediction=right)) == plain
    assert metric(server.process, "ortgen_drafted_tokens_total") > drafted
    assert metric(server.process, "ortgen_accepted_drafts_total") >= kept + len(plain) // 2
    wrong = {"type": "content", "content": plain[::-1] + " something else entirely"}
    assert _text(_chat(client, **ask, prediction=wrong)) == plain
    half = len(plain) // 2
    parts = {"type": "content", "content": [{"type": "text", "text": plain[:half]},
                                            {"type": "text", "text": plain[half:]}]}  # fmt: skip
    kept = metric(server.process, "ortgen_accepted_drafts_total")
    assert _text(_chat(client, **ask, prediction=parts, stream=True)) == plain
    assert metric(server.process, "ortgen_accepted_drafts_total") > kept
    empty = {"type": "content", "content": ""}
    assert _text(_chat(client, **ask, prediction=empty)) == plain


def test_prediction_with_prompt_lookup_settings(server, client, spelled) -> None:
    """``prompt_lookup_num_tokens`` and ``max_matching_ngram_size`` become the drafter's
    parameters; the answer stays, and drafts are kept."""
    ask = {"max_completion_tokens": 30, "logit_bias": spelled}
    plain = _text(_chat(client, **ask))
    extra = {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 2}
    prediction = {"type": "content", "content": plain}
    kept = metric(server.process, "ortgen_accepted_drafts_total")
    assert _text(_chat(client, **ask, prediction=prediction, extra_body=extra)) == plain
    assert metric(server.process, "ortgen_accepted_drafts_total") > kept


@pytest.mark.parametrize(
    ("prediction", "extra", "in_message"),
    [
        ({"type": "text", "content": "x"}, {}, "prediction must be"),
        ({"type": "content"}, {}, "prediction must be"),
        ({"type": "content", "content": [{"type": "image_url"}]}, {}, "prediction must be"),
        ("just text", {}, "prediction must be"),
        ({"type": "content", "content": "x"}, {"drafter": "prompt_lookup"}, "not both"),
    ],
)
def test_a_bad_prediction_is_a_400_naming_it(client, prediction, extra, in_message) -> None:
    message = _refused(lambda: _chat(client, prediction=prediction, extra_body=extra),
                       "prediction")  # fmt: skip
    assert in_message in message


def test_prediction_tokens_are_the_drafter_reference(gen) -> None:
    """What the server makes of a prediction, in-process: the prompt_lookup drafter with
    the predicted text's token ids as its reference."""
    from ortgen.serve.openai_api import parse_chat

    body = {"messages": MESSAGES, "prediction": {"type": "content", "content": "hello world"}}
    request = parse_chat(body, gen, max_rows=8)
    drafter = request.rows[0].settings["drafter"]
    assert drafter == {
        "name": "prompt_lookup",
        "reference": gen.tokenizer.encode("hello world", add_special_tokens=False),
    }
    assert request.names["drafter"] == "prediction"
    body = {**body, "reasoning_effort": "high", "verbosity": "low"}
    request = parse_chat(body, gen, max_rows=8)
    assert (request.reasoning_effort, request.verbosity) == ("high", "low")
    assert parse_chat({"messages": MESSAGES}, gen, max_rows=8).reasoning_effort is None


@pytest.mark.parametrize(
    ("pipeline", "request_settings", "want"),
    [
        ({"prompt_lookup_num_tokens": 5}, {}, {"num_tokens": 5}),
        ({}, {"prompt_lookup_num_tokens": 6, "max_matching_ngram_size": 2},
         {"num_tokens": 6, "max_ngram": 2}),
        ({"drafter": {"name": "prompt_lookup", "min_ngram": 3, "max_ngram": 4}}, {},
         {"min_ngram": 3, "max_ngram": 4}),
        ({"drafter": {"name": "draft_model", "model": "elsewhere"}}, {}, None),
    ],
    ids=["pipeline-lookup", "request-lookup", "pipeline-prompt-lookup", "pipeline-draft-model"],
)  # fmt: skip
def test_prediction_joins_the_drafting_already_asked_for(
    server, pipeline, request_settings, want
) -> None:
    """Prompt lookup asked for by the pipeline or the request: its parameters carry over
    to the drafter with the reference. Another drafter of the pipeline's stays (the
    prediction then has no effect). Either way the settings resolve."""
    from ortgen.config.pipeline import Pipeline
    from ortgen.serve.openai_api import parse_chat

    gen = ortgen.load(server.folder, threads=1, pipeline=Pipeline(settings=pipeline))
    prediction = {"type": "content", "content": "hello world"}
    body = {"messages": MESSAGES, "prediction": prediction, **request_settings}
    settings = parse_chat(body, gen, max_rows=8).rows[0].settings
    if want is None:
        assert "drafter" not in settings
        assert gen.resolve_config(settings).config.drafter == pipeline["drafter"]
        return
    ids = gen.tokenizer.encode("hello world", add_special_tokens=False)
    assert settings["drafter"] == {"name": "prompt_lookup", **want, "reference": ids}
    assert gen.resolve_config(settings).config.prompt_lookup_num_tokens is None


# -- the drafter's reference -------------------------------------------------------------


def test_the_reference_drafts_the_opening_then_follows_in_order() -> None:
    reference = [7, 8, 9, 4, 5, 7, 8, 6, 2]
    drafter = PromptLookupDrafter(num_tokens=3, reference=reference)
    prompt = [1, 2, 3]
    # the first token is the reference's first: the rest of its opening is drafted
    assert drafter.draft(np.array([*prompt, 7]), 10) == [8, 9, 4]
    drafter.accepted(3, 3)  # all kept, and the model's own next token (5) after them
    assert drafter.draft(np.array([*prompt, 7, 8, 9, 4, 5]), 10) == [7, 8, 6]
    drafter.accepted(3, 1)  # kept 7, then the model wrote 3 instead of 8
    # [.., 7, 3] is nowhere in the reference, nor in the row: nothing to draft
    assert drafter.draft(np.array([*prompt, 7, 8, 9, 4, 5, 7, 3]), 10) == []
    # a 2-gram of the reference resyncs: [7, 8] is at 0 and at 5; the one ahead (5) wins
    assert drafter.draft(np.array([*prompt, 7, 8, 9, 4, 5, 7, 8]), 10) == [6, 2]


def test_without_a_match_in_the_reference_the_row_own_tokens_draft() -> None:
    drafter = PromptLookupDrafter(num_tokens=3, reference=[40, 41, 42])
    tokens = np.array([1, 2, 3, 4, 9, 1, 2, 3])
    assert drafter.draft(tokens, 10) == [4, 9, 1]  # as without a reference
    assert PromptLookupDrafter(reference=[]).reference is None


@pytest.mark.parametrize(
    "reference", [[1, -2], [1.5, 2], ["a"], [[1, 2], [3]], "12", {"a": 1}, [10**30]]
)
def test_a_bad_reference_is_a_config_error(reference) -> None:
    with pytest.raises(ortgen.ConfigError, match="reference must be a list of token ids"):
        PromptLookupDrafter(reference=reference)


def test_a_reference_outside_the_vocabulary_is_a_config_error() -> None:
    ctx = make_context(vocab_size=50)
    assert PromptLookupDrafter(reference=[1, 49], ctx=ctx).reference is not None
    with pytest.raises(ortgen.ConfigError, match="outside the vocabulary"):
        PromptLookupDrafter(reference=[1, 50], ctx=ctx)


def test_a_reference_keeps_the_loop_promises() -> None:
    """ortgen.testing.check_drafter: every scenario gives plain decoding's tokens with the
    drafter drafting from a reference (its ids chosen among the fake model's)."""
    report = check_drafter(PromptLookupDrafter, {"reference": [3, 17, 5, 9, 30, 11, 2, 41]})
    assert set(report) == {"greedy", "sampled", "copying", "short", "eos"}


def test_the_server_answers_a_request_through_plain_http(server) -> None:
    """What the client would not send in that form: the fields as raw JSON, with the
    prediction's content parts and include_obfuscation alone."""
    body = {
        "model": "x",
        "messages": MESSAGES,
        "max_completion_tokens": 4,
        "prediction": {"type": "content", "content": [{"type": "text", "text": "hi"}]},
        "prompt_cache_options": {"mode": "explicit"},
        "service_tier": "flex",
        "stream": True,
        "stream_options": {"include_obfuscation": True},
    }
    status, answer = call(server.process, "/v1/chat/completions", body)
    assert status == 200 and "[DONE]" in answer
