"""OpenAI's Files and Batches API on ``ortgen serve --files-dir``, through the official
``openai`` client on a live server.

A batch of OpenAI's documented example shape is uploaded, run and read back: every
output line fits OpenAI's batch output line (``tests.test_openai_batch``'s
``BatchRequestOutput``: the client ships no type for it) and its body the client's
``ChatCompletion``; each custom_id is answered exactly once, and each body equals the
answer of the same request sent to ``/v1/chat/completions`` on the same server (a tiny
fp32 model, greedy: the same tokens whichever way the row went). Chat requests sent
while a batch runs are answered while it still runs; a cancelled batch ends with the
lines of what was done; files and batches are listed, paged, deleted and outlive a
restart; bad input gets OpenAI's error naming what is wrong.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from tests.server_helpers import KEY, ServerProcess, call
from tests.test_openai_batch import BatchRequestOutput
from tests.tiny_models import export_tiny

ENDED = ("completed", "failed", "cancelled", "expired")


def example(custom_id: str, system: str, user: str = "Hello world!", **body: Any) -> dict:
    """A line of OpenAI's Batch API guide's example file ("Preparing your batch file"),
    greedy and short for the tiny model (its context is 128 tokens)."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    body = {"model": "gpt-3.5-turbo-0125", "messages": messages, "max_tokens": 12, **body}
    body.setdefault("temperature", 0)
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fp32 Llama (fused graph: continuous batching) with a tokenizer, exported
    with ``hidden_states`` so embeddings batches run too."""
    return export_tiny("llama", tmp_path_factory.mktemp("batches"), with_tokenizer=True,
                       graph="fused", embeddings=True)  # fmt: skip


def start(model: Path, files: Path) -> ServerProcess:
    return ServerProcess(
        "--model", str(model), "--threads", "1", "--api-key", KEY, "--files-dir", str(files)
    ).ready()  # fmt: skip


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="module")
def server(tiny_dir: Path, files_dir: Path) -> Iterator[ServerProcess]:
    with start(tiny_dir, files_dir) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return server.client()


def upload(client: openai.OpenAI, lines: list[Any], purpose: str = "batch") -> str:
    return client.files.create(file=("input.jsonl", jsonl(lines)), purpose=purpose).id


def wait(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...] = ENDED) -> Any:
    deadline = time.monotonic() + 300
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


def outputs(client: openai.OpenAI, file_id: str | None) -> dict[str, BatchRequestOutput]:
    """custom_id -> its line, each line checked against the types; a custom_id answered
    twice fails."""
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    lines = [BatchRequestOutput.model_validate_json(raw) for raw in text.splitlines()]
    ids = [x.custom_id for x in lines]
    assert len(ids) == len(set(ids)), "a custom_id answered twice"
    return {x.custom_id: x for x in lines}


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs between two answers of one request."""
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def test_the_example_batch_answers_each_line_as_the_server_does(client, server):
    lines = [
        example("request-1", "You are a helpful assistant."),
        example("request-2", "You are an unhelpful assistant."),
        example("request-3", "You are terse.", "What is 2+2?", max_tokens=20),
        example("request-4", "Answer in French.", "Good morning", seed=7, temperature=0.8),
    ]
    file = client.files.create(file=("batchinput.jsonl", jsonl(lines)), purpose="batch")
    assert (file.object, file.purpose, file.bytes, file.filename) == (
        "file", "batch", len(jsonl(lines)), "batchinput.jsonl")  # fmt: skip
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"description": "nightly eval job"},
    )
    assert batch.status == "validating" and batch.id.startswith("batch_")
    batch = wait(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert batch.request_counts.model_dump() == {"total": 4, "completed": 4, "failed": 0}
    assert batch.metadata == {"description": "nightly eval job"}
    assert batch.error_file_id is None and batch.errors is None
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output"
    answers = outputs(client, batch.output_file_id)
    assert sorted(answers) == [line["custom_id"] for line in lines]
    for line in lines:
        out = answers[line["custom_id"]]
        assert out.error is None and out.response is not None
        assert out.response.status_code == 200
        body = ChatCompletion.model_validate(out.response.body).model_dump()
        status, alone = call(server, "/v1/chat/completions", line["body"])
        assert status == 200, alone
        assert without_ids(out.response.body) == without_ids(alone)
        assert body["model"] == server.model
        assert body["choices"][0]["message"]["content"]  # the tiny model says something


def test_a_completions_batch_answers_as_the_completions_route(client, server):
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": prompt, "max_tokens": 10, "temperature": 0}}
        for i, prompt in enumerate(["Once upon a time", "The capital of France"])
    ]  # fmt: skip
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/completions",
                                  completion_window="24h")  # fmt: skip
    batch = wait(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 2
    answers = outputs(client, batch.output_file_id)
    for line in lines:
        body = answers[line["custom_id"]].response.body
        Completion.model_validate(body)
        status, alone = call(server, "/v1/completions", line["body"])
        assert status == 200 and without_ids(body) == without_ids(alone)


def test_an_embeddings_batch_answers_as_the_embeddings_route(client, server):
    """Each line of a ``/v1/embeddings`` batch (text, a list, token ids, ``dimensions``,
    base64, mean pooling) equals ``/v1/embeddings``'s answer to its body; a bad line is
    an error line with the route's own error."""
    bodies = [
        {"model": "m", "input": "a first text"},
        {"model": "m", "input": ["one", "two words"], "dimensions": 8},
        {"model": "m", "input": [5, 6, 7], "encoding_format": "base64"},
        {"model": "m", "input": "mean of this", "pooling": "mean"},
        {"model": "m", "input": ""},
    ]
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
             for i, body in enumerate(bodies)]  # fmt: skip
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/embeddings",
                                  completion_window="24h")  # fmt: skip
    batch = wait(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 4, "failed": 1}
    answers = outputs(client, batch.output_file_id) | outputs(client, batch.error_file_id)
    for line in lines:
        out = answers[line["custom_id"]]
        status, alone = call(server, "/v1/embeddings", line["body"])
        assert out.response is not None and out.response.status_code == status
        if status == 200:
            if line["body"].get("encoding_format") != "base64":  # the client decodes that
                CreateEmbeddingResponse.model_validate(out.response.body)
            assert out.response.body == alone
        else:
            assert alone["error"]["message"] in out.response.body["error"]["message"]
    assert answers["e4"].response.status_code == 400


def test_the_published_batch_request_is_the_one_the_route_reads():
    from ortgen.serve.batches_api import BATCH_FIELDS, ENDPOINTS
    from ortgen.serve.openapi import openapi_document

    request = openapi_document()["components"]["schemas"]["BatchRequest"]
    assert set(request["properties"]) == set(BATCH_FIELDS)
    assert request["properties"]["endpoint"]["enum"] == list(ENDPOINTS)


def test_chat_requests_are_answered_while_a_batch_runs_and_cancel(client):
    """A long batch runs; chat requests sent meanwhile are answered before it ends (a
    batch does not queue live requests behind it). Then it is cancelled: it ends with
    the lines of the rows that ran, each once."""
    lines = [example(f"r{i}", "You ramble.", f"Tell me about {i}", max_tokens=80)
             for i in range(200)]  # fmt: skip
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch = wait(client, batch.id, ("in_progress", *ENDED))
    assert batch.status == "in_progress", batch
    question = example("live", "You are a helpful assistant.")["body"]
    for _ in range(3):
        answer = client.chat.completions.create(**question)
        assert answer.choices[0].message.content
        assert client.batches.retrieve(batch.id).status == "in_progress"  # still running
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    batch = wait(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    counts = batch.request_counts
    assert counts is not None and counts.total == 200
    done = outputs(client, batch.output_file_id)
    assert 0 < len(done) == counts.completed < 200
    assert set(done) <= {line["custom_id"] for line in lines}
    with pytest.raises(openai.ConflictError) as refused:
        client.batches.cancel(batch.id)
    assert "cancelled" in refused.value.message


def test_lines_that_cannot_run_go_to_the_error_file(client):
    """A line whose body is wrong is answered with the error the server would give (its
    status, the field named), in the error file; the others run."""
    lines = [
        example("good", "You are a helpful assistant."),
        example("hot", "You are a helpful assistant.", temperature="hot"),
        example("many", "You are a helpful assistant.", n=2),
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
        completion_window="24h")  # fmt: skip
    batch = wait(client, batch.id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 1, "failed": 2}
    assert set(outputs(client, batch.output_file_id)) == {"good"}
    errors = outputs(client, batch.error_file_id)
    assert set(errors) == {"hot", "many"}
    for custom_id, param in (("hot", "temperature"), ("many", "n")):
        response = errors[custom_id].response
        assert response is not None and response.status_code == 400
        assert response.body["error"]["param"] == param
    hot = errors["hot"].response.body["error"]
    alone = error_alone(client, lines, "hot")  # the server's own error, with the line
    assert hot == {**alone, "message": f"line 2: {alone['message']}"}
    assert "n must be 1 in a batch line" in errors["many"].error.message


def error_alone(client: openai.OpenAI, lines: list[dict], custom_id: str) -> dict[str, Any]:
    """The error the server answers a line's body with, sent alone."""
    body = next(line["body"] for line in lines if line["custom_id"] == custom_id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**body)
    assert isinstance(refused.value.body, dict)
    return refused.value.body


def test_a_malformed_file_fails_the_batch_naming_each_line(client):
    good = example("a", "You are a helpful assistant.")
    other_url = {**example("c", "x"), "url": "/v1/completions"}
    other_model = example("d", "x")
    other_model["body"]["model"] = "another-model"
    lines = [good, "{not json", {**good}, other_url, other_model, {"method": "POST"}]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
        completion_window="24h")  # fmt: skip
    batch = wait(client, batch.id)
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.output_file_id is None and batch.error_file_id is None
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [
        (2, "invalid_line", "custom_id"),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "invalid_url", "url"),
        (5, "mismatched_model", "body.model"),
        (6, "invalid_line", "custom_id"),
    ]
    messages = {e.line: e.message for e in batch.errors.data}
    assert "not valid JSON" in messages[2]
    assert "'a'" in messages[3] and "/v1/completions" in messages[4]
    assert "another-model" in messages[5]
    empty = client.batches.create(
        input_file_id=upload(client, []), endpoint="/v1/chat/completions",
        completion_window="24h")  # fmt: skip
    failed = wait(client, empty.id)
    assert [(e.code, e.line) for e in failed.errors.data] == [("empty_file", None)]


@pytest.mark.parametrize(
    ("change", "status", "param", "says"),
    [
        ({"input_file_id": "file-00000000000000000000000000000000"}, 404, "input_file_id",
         "no file"),
        ({"input_file_id": "../../etc/passwd"}, 404, "input_file_id", "no file"),
        ({"endpoint": "/v1/moderations"}, 400, "endpoint", "/v1/chat/completions"),
        ({"completion_window": "1h"}, 400, "completion_window", "'24h'"),
        ({"metadata": {"k": 1}}, 400, "metadata", "strings"),
        ({"priority": "high"}, 400, "priority", "unknown field"),
        ({"endpoint": None}, 400, "endpoint", "non-empty string"),
    ],
)  # fmt: skip
def test_a_bad_batch_request_names_the_problem(client, change, status, param, says):
    body = {"input_file_id": upload(client, [example("a", "x")]),
            "endpoint": "/v1/chat/completions", "completion_window": "24h", **change}  # fmt: skip
    with pytest.raises(openai.APIStatusError) as refused:
        client.post("/batches", body=body, cast_to=object)
    assert refused.value.status_code == status
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert says in error["message"]


def test_a_file_of_another_purpose_is_refused_as_a_batch(client):
    file_id = upload(client, [example("a", "x")], purpose="user_data")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                              completion_window="24h")  # fmt: skip
    assert refused.value.param == "input_file_id"
    assert "'user_data'" in refused.value.message and '"batch"' in refused.value.message


def test_bad_uploads_and_unknown_ids(client, server):
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("a.jsonl", b"{}\n"), purpose="nonsense")
    assert refused.value.param == "purpose" and "batch" in refused.value.message
    auth = {"Authorization": f"Bearer {KEY}"}
    formed = httpx.post(f"{server.url}/v1/files", data={"purpose": "batch"}, headers=auth)
    assert formed.status_code == 400 and formed.json()["error"]["param"] == "file", formed.text
    status, error = call(server, "/v1/files", {"purpose": "batch"})  # JSON: no form at all
    assert status == 400 and error["error"]["param"] == "purpose", error
    for path in ("/v1/files/file-nope", "/v1/files/file-nope/content", "/v1/batches/batch_x"):
        status, error = call(server, path)
        assert status == 404 and "no " in error["error"]["message"], (path, error)
    with pytest.raises(openai.NotFoundError):
        client.batches.cancel("batch_00000000000000000000000000000000")
    status, error = call(server, "/v1/batches?limit=0")
    assert status == 400 and error["error"]["param"] == "limit"
    status, error = call(server, "/v1/files?after=file-nope")
    assert status == 400 and error["error"]["param"] == "after"
    assert call(server, "/v1/files", key=None)[0] == 401
    assert call(server, "/v1/batches", key="wrong")[0] == 401


def test_files_and_batches_are_listed_paged_deleted_and_outlive_a_restart(
    client, server, tiny_dir, files_dir
):
    first = upload(client, [example("a", "x")])
    second = upload(client, [example("b", "x")], purpose="user_data")
    listed = [f.id for f in client.files.list()]
    assert listed.index(second) < listed.index(first)  # newest first
    assert [f.id for f in client.files.list(order="asc")] == listed[::-1]
    assert second not in [f.id for f in client.files.list(purpose="batch")]
    page = client.files.list(limit=1)
    assert [f.id for f in page.data] == listed[:1] and page.has_more
    assert [f.id for f in client.files.list(limit=1)] == listed  # auto-paging: every file
    assert client.files.content(first).content == jsonl([example("a", "x")])
    batch = client.batches.create(input_file_id=first, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
    wait(client, batch.id)
    batches = [b.id for b in client.batches.list()]
    assert batches[0] == batch.id
    assert [b.id for b in client.batches.list(limit=1)] == batches  # auto-paging
    deleted = client.files.delete(second)
    assert deleted.deleted and deleted.id == second
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(second)
    long = [example(f"r{i}", "You ramble.", f"Tell me about {i}", max_tokens=80)
            for i in range(60)]  # fmt: skip
    unfinished = client.batches.create(input_file_id=upload(client, long),
        endpoint="/v1/chat/completions", completion_window="24h")  # fmt: skip
    wait(client, unfinished.id, ("in_progress", *ENDED))
    kept_files = {f.id: f.model_dump() for f in client.files.list()}
    kept_batches = {b.id: b.model_dump() for b in client.batches.list()}
    server.stop()  # mid-batch: it is left active on disk
    left = json.loads((files_dir / "batches" / f"{unfinished.id}.json").read_text())
    assert left["status"] == "in_progress" and left["request_counts"]["completed"] < 60
    again = start(tiny_dir, files_dir)
    try:
        other = again.client()
        assert {f.id: f.model_dump() for f in other.files.list()}.items() >= kept_files.items()
        batches = {b.id: b.model_dump() for b in other.batches.list()}
        del batches[unfinished.id], kept_batches[unfinished.id]
        assert batches == kept_batches
        assert other.files.content(first).content == jsonl([example("a", "x")])
        done = wait(other, unfinished.id)  # run again from its first line
        assert done.status == "completed" and done.request_counts.completed == 60
        assert sorted(outputs(other, done.output_file_id)) == sorted(x["custom_id"] for x in long)
    finally:
        again.stop()


def test_without_files_dir_the_routes_say_how_to_turn_them_on(tiny_dir):
    """In process: a server without ``--files-dir`` answers every route with a 404
    naming the flag."""
    from starlette.testclient import TestClient

    import ortgen
    from ortgen.serve.app import build_app
    from ortgen.serve.engine import Engine
    from ortgen.serve.model_pool import ModelPool, ServedModel
    from ortgen.serve.state import ServerState

    gen = ortgen.load(tiny_dir, threads=1)
    state = ServerState(ModelPool.single(ServedModel("tiny", gen, Engine(gen))))
    http = TestClient(build_app(state))  # no lifespan: no engine needed
    routes = [("GET", "/v1/files"), ("POST", "/v1/batches"), ("GET", "/v1/batches/batch_x"),
              ("DELETE", "/v1/files/file-x")]  # fmt: skip
    for method, path in routes:
        response = http.request(method, path, json={} if method == "POST" else None)
        assert response.status_code == 404, (path, response.text)
        assert "--files-dir" in response.json()["error"]["message"]
    response = http.post("/v1/files", files={"file": ("a", io.BytesIO(b"x"))})
    assert response.status_code == 404 and "--files-dir" in response.text


def test_files_dir_is_refused_with_ray(tmp_path, capsys):
    """Every Ray Serve replica would run the folder's batches: the pair is one clear
    error before anything starts (no Ray is reached)."""
    from ortgen.cli import main

    assert main(["serve", "--ray", "--files-dir", str(tmp_path / "files")]) == 2
    err = capsys.readouterr().err
    assert "--files-dir" in err and "--ray" in err
    assert not (tmp_path / "files").exists()
