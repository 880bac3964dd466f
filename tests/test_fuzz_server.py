"""Fuzzing ``ortgen serve`` with requests generated from its own ``/openapi.json``.

schemathesis turns the published JSON schemas into hypothesis strategies: bodies that
fit them (``positive``) and bodies that break them (``negative``), sent to the app
in-process (its lifespan runs the engine on a tiny model, as ``ortgen serve`` does). The
property: every answer is a 2xx whose body fits the document, or a 4xx with OpenAI's
error body; never a 5xx, never a hang (each request has a timeout). A 4xx alone would
let a server that refuses everything pass, so the tests that generate valid requests
have a floor of answers (``tests/fuzz_settings.py``'s ``answering``). Bounded by the
hypothesis profile (``tests/conftest.py``; ``make fuzz`` runs more).
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import schemathesis
from hypothesis import event, given
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.transport import STREAM_CUT_SHORT_ATTRIBUTE as asgi_cut_short
from schemathesis.python import asgi

from ortgen.serve.openapi import openapi_document
from tests.fuzz_settings import ANSWERED, REFUSED, answering, fuzz, outcome
from tests.fuzz_values import JSON_VALUE, SETTING_KEYS, typed_value

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DOCUMENT = openapi_document(api_key=True, models=["tiny"])
SCHEMAS = DOCUMENT["components"]["schemas"]
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
#: how long one request may take before it counts as a hang (the tiny model answers
#: in well under a second; the context is 128 tokens)
TIMEOUT = 30
#: the 200 body of each route, from the document
ANSWERS = {
    "/v1/completions": SCHEMAS["Completion"],
    "/v1/chat/completions": SCHEMAS["ChatCompletion"],
    "/v1/responses": SCHEMAS["Response"],
    "/v1/embeddings": SCHEMAS["EmbeddingList"],
    "/v1/models": SCHEMAS["ModelList"],
    "/v1/models/{model_id}": SCHEMAS["Model"],
}


@pytest.fixture(scope="module")
def server(tiny_text_model, tmp_path_factory):
    """The app of ``ortgen serve`` on the tiny text model, with an API key and a files
    folder (its batch worker does not run: batches stay validating), in-process
    (schemathesis's ASGI client runs its lifespan: the engine starts and stops)."""
    import io

    import ortgen
    from ortgen.serve.app import build_app
    from ortgen.serve.engine import Engine
    from ortgen.serve.model_pool import ModelPool, ServedModel
    from ortgen.serve.state import ServerState

    gen = ortgen.load(tiny_text_model, threads=1)
    engine = Engine(gen, max_batch=4, max_queue=16)
    pool = ModelPool.single(ServedModel("tiny", gen, engine))
    state = ServerState(pool, api_key=KEY, files_dir=tmp_path_factory.mktemp("fuzz-files"))
    assert state.files is not None
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}]}}  # fmt: skip
    upload = io.BytesIO(json.dumps(line).encode() + b"\n")
    BATCH_FILE.append(state.files.add(upload, "input.jsonl", "batch")["id"])
    app = build_app(state)
    state.models.start()  # what the app's lifespan does, once for the module (see below)
    try:
        with asgi.get_client(_without_lifespan(app)) as client:
            client.routes = app.routes  # type: ignore[attr-defined]
            yield client
    finally:
        state.accepting = False
        state.cancel_all()
        engine.shutdown(5.0)


def _without_lifespan(app: Any) -> Any:
    """The app, its lifespan answered here: schemathesis's pytest plugin ends every
    lifespan after each test, and an engine's thread starts only once."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while (await receive())["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

    return wrapped


def check_answer(path: str, response: Any) -> bool:
    """2xx with the document's body (or a stream of chunks), or a 4xx error body; whether
    it was an answer (a stream counts when it ends in ``[DONE]``, not in an error)."""
    status = response.status_code
    text = response.content.decode("utf-8", "replace")
    event(f"status {status}")
    assert status < 500, f"{status}: {text[:3000]}"
    if status >= 400:
        jsonschema.validate(json.loads(text), SCHEMAS["Error"])
        return False
    kind = (response.headers.get("content-type") or response.headers.get("Content-Type") or [""])[0]
    if kind.startswith("text/event-stream"):
        return check_stream(text, cut_short=response.stream_cut_short)
    if path in ANSWERS:
        jsonschema.validate(json.loads(text), ANSWERS[path])
    return True


def check_stream(text: str, *, cut_short: bool) -> bool:
    """Server-sent events: JSON chunks, then ``[DONE]``; an error event (a request the
    engine refused) is the request's fault, never the server's. Whether it was an
    answer: chunks ending in ``[DONE]`` (a Responses stream: typed events ending in
    ``response.completed`` or ``response.incomplete``)."""
    datas = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    assert datas or cut_short, text[:2000]
    if datas and '"type":"response.created"' in datas[0]:
        return check_response_events(datas, cut_short=cut_short)
    for data in datas:
        if data == "[DONE]":
            continue
        payload = json.loads(data)
        if "error" in payload:
            jsonschema.validate(payload, SCHEMAS["Error"])
            assert payload["error"]["type"] != "server_error", payload
        else:
            assert payload["object"] in ("text_completion", "chat.completion.chunk"), payload
    if not cut_short:
        assert datas[-1] == "[DONE]" or "error" in json.loads(datas[-1]), datas[-3:]
    return bool(datas) and datas[-1] == "[DONE]"


def check_response_events(datas: list[str], *, cut_short: bool) -> bool:
    """A Responses stream: typed events numbered from 0, ending in the whole response
    (which fits the document) or in an ``error`` event that is the request's fault."""
    events = [json.loads(data) for data in datas]
    assert [e["sequence_number"] for e in events] == list(range(len(events))), events[:3]
    last = events[-1]
    if last["type"] == "error":
        assert last["code"] != "server_error", last
        return False
    if not cut_short:
        assert last["type"] in ("response.completed", "response.incomplete"), last
        jsonschema.validate(last["response"], SCHEMAS["Response"])
    return not cut_short


#: a prompt the model can always answer, for bodies whose own prompt would fail first
PLAIN = {
    "/v1/completions": ("prompt", "hi"),
    "/v1/chat/completions": ("messages", [{"role": "user", "content": "hi"}]),
    "/v1/responses": ("input", "hi"),
}


#: the Files and Batches API's operations, fuzzed as one family
BATCH_OPERATIONS = [
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("DELETE", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
]
#: the id of a batch input file the module's server holds (its fixture uploads it)
BATCH_FILE: list[str] = []


#: schemathesis's strategies, per route and mode: bodies that fit the schema
#: ("positive") and bodies that break it ("negative")
CASES = {
    (method, path, mode): SCHEMA[path][method].as_strategy(generation_mode=GenerationMode(mode))
    for method, path in [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/models/{model_id}"),
        *BATCH_OPERATIONS,
    ]
    for mode in ("positive", "negative")
}


def send(server: Any, case: Any, plain: bool) -> bool:
    """Send a generated case and check its answer; whether it was answered."""
    # half the time the body's own prompt is one that works, so the other fields reach
    # the engine (a random conversation mostly fails the chat template first)
    path = case.operation.path
    if plain and path in PLAIN and isinstance(case.body, dict):
        key, value = PLAIN[path]
        case.body = {**case.body, key: value}
    response = case.call(session=server, base_url="http://testserver", headers=AUTH,
                         timeout=TIMEOUT)  # fmt: skip
    return check_answer(path, response)


ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/responses"]


#: Bodies that fit the schema are not all valid: the schema gives ortgen's settings their
#: types, not their ranges and combinations, and a random conversation mostly fails the
#: chat template. A working server answered 22-55% of them (8 runs of 40 over both
#: routes; 32% of 800 under `make fuzz`), so at least 5% must be, and at least one: a
#: server that refuses every request fails here. The routes share the 40 examples
#: (each had 12 of its own before, too few for a floor).
@answering(0.05)
@fuzz(40, long=800)
@given(data=st.data(), path=st.sampled_from(ROUTES), plain=st.booleans())
def test_requests_that_fit_the_published_schemas(server, data, path, plain):
    """Requests generated from ``/openapi.json``: 2xx or 4xx with OpenAI's error body,
    and enough of them answered."""
    case = data.draw(CASES["POST", path, "positive"], label="case")
    outcome(ANSWERED if send(server, case, plain) else REFUSED)


@pytest.mark.parametrize("path", ROUTES)
@fuzz(12, long=400)
@given(data=st.data(), plain=st.booleans())
def test_requests_that_break_the_published_schemas(server, path, data, plain):
    """Bodies that break ``/openapi.json``: 4xx with OpenAI's error body (or an answer,
    where the server reads a value more loosely than the schema says)."""
    case = data.draw(CASES["POST", path, "negative"], label="case")
    event("answered" if send(server, case, plain) else "refused")


@pytest.mark.parametrize("mode", ["positive", "negative"])
@fuzz(8, long=200)
@given(data=st.data())
def test_embeddings_route_from_the_published_schema(server, mode, data):
    """``/v1/embeddings``: the tiny model has no hidden-state output, so every body is a
    4xx with OpenAI's error body (the model's, or the field's that is wrong), never a 5xx."""
    send(server, data.draw(CASES["POST", "/v1/embeddings", mode], label="case"), False)


@pytest.mark.parametrize("mode", ["positive", "negative"])
@fuzz(5, long=100)
@given(data=st.data())
def test_model_route_from_the_published_schema(server, mode, data):
    send(server, data.draw(CASES["GET", "/v1/models/{model_id}", mode], label="case"), False)


@pytest.mark.parametrize(("method", "path"), BATCH_OPERATIONS)
@pytest.mark.parametrize("mode", ["positive", "negative"])
@fuzz(6, long=150)
@given(data=st.data(), real_file=st.booleans())
def test_files_and_batches_routes_from_the_published_schema(
    server, method, path, mode, data, real_file
):
    """``/v1/files`` and ``/v1/batches``: a 2xx whose body fits the document, or a 4xx
    with OpenAI's error body; half the batch bodies name a file the server holds, so
    they get past the file check."""
    case = data.draw(CASES[method, path, mode], label="case")
    if real_file and path == "/v1/batches" and isinstance(case.body, dict):
        case.body = {**case.body, "input_file_id": BATCH_FILE[0]}
    response = case.call(session=server, base_url="http://testserver", headers=AUTH,
                         timeout=TIMEOUT)  # fmt: skip
    if check_answer(path, response) and "json" in response.headers.get("content-type", ""):
        answer = DOCUMENT["paths"][path][method.lower()]["responses"]["200"]
        schema = answer["content"]["application/json"]["schema"]
        jsonschema.validate(response.json(), {**schema, "components": DOCUMENT["components"]})


@st.composite
def ortgen_settings(draw: st.DrawFn) -> dict[str, Any]:
    """A few ortgen settings (every generation setting can be drawn), each with a value
    of its type (NaN, ±inf and huge numbers included: Python's JSON sends them) or not."""
    keys = draw(st.lists(st.sampled_from(SETTING_KEYS), min_size=1, max_size=3, unique=True))
    return {key: draw(typed_value(key)) for key in keys}


#: A working server answered 12-31% of these (8 runs of 65; 21% of 400 under `make fuzz`):
#: most refusals name a value out of its setting's range. So at least 4% must be, and at
#: least one, out of 90 examples (they are quick: a prompt of two tokens, 4 new tokens).
@answering(0.04)
@fuzz(90, long=400)
@given(settings=ortgen_settings(), chat=st.booleans(), stream=st.booleans())
def test_ortgen_settings_in_a_request(server, settings, chat, stream):
    """Any ortgen setting with any value beside a prompt that works (as the OpenAI
    client's ``extra_body`` sends them): a 4xx naming it, or an answer; a value the
    checks let through must not fail the row later (a 500)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    key, value = PLAIN[path]
    body = {key: value, "max_tokens": 4, **settings, "stream": stream}
    response = server.post(
        path, data=json.dumps(body), headers={**AUTH, "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )  # fmt: skip
    outcome(ANSWERED if check_answer(path, _Answer(response)) else REFUSED)


class _Answer:
    """A ``requests`` response as ``check_answer`` reads schemathesis's."""

    def __init__(self, response: Any) -> None:
        self.status_code = response.status_code
        self.content = response.content
        self.headers = {k.lower(): [v] for k, v in response.headers.items()}
        self.stream_cut_short = bool(getattr(response, asgi_cut_short, False))


@pytest.mark.parametrize("choice", ["é", "\x1f", "aé"])
def test_a_constraint_the_vocabulary_cannot_spell_is_a_400(server, choice):
    """Found by fuzzing: a constraint needing text the vocabulary cannot spell (the tiny
    models' character vocabulary has no 'é' nor control characters, and no byte
    fallback). llguidance let the unknown token stand for it, then refused it: a 500.
    Now the grammar drops what its matcher would refuse, and a row left with nothing is
    NoTokenLeft (the request's constraint): a 400 naming it."""
    body = {"prompt": "hi", "max_tokens": 4, "choice": [choice]}
    response = server.post(
        "/v1/completions",
        data=json.dumps(body),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text[:500]
    assert "vocabulary cannot spell" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "settings",
    [
        {"suppress_tokens": list(range(256))},
        {"choice": ["a"], "suppress_tokens": [ord("a") - 28]},  # the tiny vocabulary's 'a'
    ],
    ids=["all-suppressed", "constraint-suppressed"],
)
def test_settings_that_leave_no_token_are_a_400(server, settings):
    """Found by fuzzing: the row failed with a ComponentError, which the server answered
    as its own fault (500); the request asked for the contradiction (NoTokenLeft). A
    grammar left with nothing names the processor before it that removed its tokens."""
    body = {"prompt": "hi", "max_tokens": 2, **settings}
    response = server.post(
        "/v1/completions",
        data=json.dumps(body),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    if "choice" in settings:
        assert "suppress_tokens (before the grammar) removed every token" in error["message"]
    else:
        assert re.search("no token can be picked|nothing can be sampled", error["message"])


@fuzz(10, long=200)
@given(
    body=st.one_of(JSON_VALUE, st.dictionaries(st.sampled_from(SETTING_KEYS), JSON_VALUE)),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
)
def test_any_json_body(server, body, path):
    """Bodies no schema describes (any JSON value, NaN included): a 4xx or an answer."""
    response = server.post(
        path, data=json.dumps(body), headers={**AUTH, "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )  # fmt: skip
    assert response.status_code < 500, response.text[:2000]
    if response.status_code >= 400:
        jsonschema.validate(response.json(), SCHEMAS["Error"])


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


#: a chat request whose tool's parameters nest ``depth`` levels (as JSON text)
TOOL_BODY = (
    b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
    b'"function": {"name": "f", "parameters": {"type": "object", "properties": {"a": %s}}}}]}'
)


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/completions", b"[" * 100_000),
        ("/v1/completions", b'{"prompt": ' + nested(50_000) + b"}"),
        ("/v1/chat/completions", TOOL_BODY % (b'{"not": ' * 800 + b"{}" + b"}" * 800)),
        ("/v1/chat/completions", TOOL_BODY % nested(101)),
    ],
    ids=["array", "prompt", "tool-parameters", "just-too-deep"],
)
def test_a_body_nested_too_deep_is_a_400(server, path, raw):
    """Found writing the fuzz tests: JSON nested deeper than Python's recursion limit raised
    RecursionError in the body's reader, and a tool's parameters nested 800 levels deep did in the
    tool-call grammar: a 500 each. The server reads at most MAX_DEPTH levels."""
    response = server.post(path, data=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400, response.text[:500]
    assert "nested" in response.json()["error"]["message"]


def test_a_body_nested_as_deep_as_allowed_is_read(server):
    from ortgen.serve.app import MAX_DEPTH

    depth = MAX_DEPTH - 8  # the body's own levels above the parameters' value
    response = server.post(
        "/v1/chat/completions",
        data=TOOL_BODY % (b'{"not": ' * depth + b"{}" + b"}" * depth),
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status_code in (200, 400), response.text[:500]
    assert "nested" not in response.text


def test_openapi_json_is_public_and_describes_the_routes(server):
    """``/openapi.json`` answers without the key (like ``/health``); the other routes
    say which need it; the schemas are valid JSON Schema (2020-12, OpenAPI 3.1's)."""
    response = server.get("/openapi.json")
    assert response.status_code == 200
    assert response.json() == json.loads(json.dumps(DOCUMENT))
    paths = DOCUMENT["paths"]
    served = {
        (route.path.replace(":path}", "}"), method.lower())
        for route in server.routes
        for method in route.methods - {"HEAD"}
    }
    documented = {(path, method) for path, item in paths.items() for method in item}
    assert documented == served  # every route the app serves, and only those
    assert "security" not in paths["/health"]["get"]
    assert paths["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    for schema in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    refused = server.get("/v1/models")
    assert refused.status_code == 401
    jsonschema.validate(refused.json(), SCHEMAS["Error"])
    assert "security" not in openapi_document(api_key=False)["paths"]["/metrics"]["get"]


def test_the_schemas_follow_the_parsing_tables():
    """The request schemas are built from the tables the server parses with: every
    OpenAI field it reads, with its range, and every ortgen setting."""
    from ortgen.config import FIELDS
    from ortgen.request.openai_fields import (
        CHAT_FIELDS,
        COMPLETION_FIELDS,
        IGNORED,
        INTEGERS,
        NUMBERS,
        UNSUPPORTED,
    )

    chat = SCHEMAS["ChatCompletionRequest"]["properties"]
    completion = SCHEMAS["CompletionRequest"]["properties"]
    assert set(CHAT_FIELDS) <= set(chat) and set(COMPLETION_FIELDS) <= set(completion)
    assert set(FIELDS) | IGNORED | set(UNSUPPORTED) <= set(chat) & set(completion)
    assert chat["temperature"]["maximum"] == NUMBERS["temperature"][1]
    assert chat["n"]["maximum"] == INTEGERS["n"][1]
    assert SCHEMAS["CompletionRequest"]["required"] == ["prompt"]
    assert SCHEMAS["ChatCompletionRequest"]["required"] == ["messages"]
    assert completion["prompt"] == COMPLETION_FIELDS["prompt"]
    assert "ignored" in completion["messages"]["description"]  # as settings_of skips it
