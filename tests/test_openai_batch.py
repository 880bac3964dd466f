"""OpenAI batch files in ``ortgen run``: OpenAI's own example file runs unchanged, every
output line is OpenAI's batch output line (its body what the server would answer), a
line that cannot run is an error line naming why, and a job killed mid-way then run
again answers each ``custom_id`` exactly once.

The output lines are checked against the official client's types: ``ChatCompletion``,
``Completion`` and ``ErrorObject`` for the bodies. The client (3.51) ships no type for
the batch line itself, so ``BatchRequestOutput`` here is OpenAI's API reference for it
("The request output object"): ``id``, ``custom_id``, ``response`` (``status_code``,
``request_id``, ``body``) or null, ``error`` (``code``, ``message``) or null, and
nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pydantic
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject

import ortgen
from ortgen.cli.main import main
from ortgen.jobs import check_input, run_job
from ortgen.jobs.formats import INPUT_FORMATS
from tests.test_chat_formats_apps import (  # noqa: F401 (fixtures)
    CALL,
    CALL_SAYS,
    QUESTION,
    SAYS,
    TOOL_ROW,
    hermes,
    hermes_folder,
    thinking,
    thinking_folder,
)
from tests.test_jobs import CLI
from tests.test_jobs_ray import _env, _pipeline, _ray_args, ray_address  # noqa: F401 (fixture)
from tests.test_tool_calls import read_back

#: OpenAI's Batch API guide, "Preparing your batch file": its example, as it is
EXAMPLE = [
    {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-3.5-turbo-0125",
              "messages": [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": "Hello world!"}],
              "max_tokens": 1000}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-3.5-turbo-0125",
              "messages": [{"role": "system", "content": "You are an unhelpful assistant."},
                           {"role": "user", "content": "Hello world!"}],
              "max_tokens": 1000}},
]  # fmt: skip


class _Response(pydantic.BaseModel, extra="forbid"):
    status_code: int
    request_id: str
    body: dict[str, Any]


class _Error(pydantic.BaseModel, extra="forbid"):
    code: str
    message: str


class BatchRequestOutput(pydantic.BaseModel, extra="forbid"):
    """OpenAI's API reference, "The request output object" (the client has no type)."""

    id: str
    custom_id: str
    response: _Response | None
    error: _Error | None


def line(custom_id: str, url: str, body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


def chat(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return line(custom_id, "/v1/chat/completions", {"model": "m", "messages": messages, **body})


def write(path: Path, lines: list) -> Path:
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


def read_output(path: Path) -> dict[str, BatchRequestOutput]:
    """custom_id -> its output line, each checked against the types; fails on a torn
    line or a custom_id answered twice."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n"), "torn last line"
    lines = [BatchRequestOutput.model_validate_json(raw) for raw in text.splitlines()]
    ids = [x.custom_id for x in lines]
    assert len(ids) == len(set(ids)), "a custom_id answered twice"
    assert all(x.id.startswith("batch_req_") for x in lines)
    for x in lines:
        assert x.response is not None and x.response.request_id.startswith("req_")
        if x.response.status_code == 200:
            assert x.error is None
        else:  # the server's error body, and the line's error
            ErrorObject.model_validate(x.response.body["error"])
            assert x.error is not None and x.error.message == x.response.body["error"]["message"]
    return {x.custom_id: x for x in lines}


def chat_body(out: BatchRequestOutput) -> ChatCompletion:
    assert out.response is not None and out.response.status_code == 200, out
    return ChatCompletion.model_validate(out.response.body)


def error_of(out: BatchRequestOutput) -> tuple[int, dict[str, Any]]:
    assert out.response is not None and out.error is not None, out
    return out.response.status_code, out.response.body["error"]


@pytest.fixture(scope="module")
def gen(tiny_text_model: Path):
    return ortgen.load(tiny_text_model, threads=1)


def cli_run(capsys, tmp_path: Path, model: Path, source: Path, *args: str) -> tuple[int, str, str]:
    """``ortgen run`` in this process: the exit status, stdout and stderr."""
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{model}"\n')
    out = tmp_path / "out.jsonl"
    code = main(["run", str(pipeline), "--input", str(source), "--output", str(out),
                 "--threads", "1", *args])  # fmt: skip
    said = capsys.readouterr()
    return code, said.out, said.err


# ------------------------------------------------------------------------- answers


def test_openais_example_file_runs_unchanged(gen, tiny_text_model, tmp_path, capsys):
    """Found by its first line (no flag), each request answered with the chat.completion
    the server would give: the answer ``generate`` gives, its usage, finish reason
    "length" (the 1000 tokens asked for are cut at the tiny model's context)."""
    source = write(tmp_path / "batch.jsonl", EXAMPLE)
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source)
    assert code == 0, err
    assert "2 rows ok, 0 errors" in err
    out = read_output(tmp_path / "out.jsonl")
    assert sorted(out) == ["request-1", "request-2"]
    # the two lines ran in one batch: the answers of that batch, to the last float
    conversations = [request["body"]["messages"] for request in EXAMPLE]
    expected = gen.generate([{"messages": m, "max_new_tokens": 1000} for m in conversations])
    for i, request in enumerate(EXAMPLE):
        body = chat_body(out[request["custom_id"]])
        assert body.object == "chat.completion" and body.id.startswith("chatcmpl-")
        assert body.model == tiny_text_model.name  # the model that answered
        [choice] = body.choices
        assert choice.message.role == "assistant" and choice.message.content == expected.text[i]
        assert expected.finish_reasons[i] == "length"  # 1000 tokens, cut at the context
        assert choice.finish_reason == "length"
        assert body.usage is not None
        assert body.usage.prompt_tokens == len(gen.chat_prompt(conversations[i]))
        assert body.usage.completion_tokens == len(expected.tokens[i])
        total = body.usage.prompt_tokens + body.usage.completion_tokens
        assert body.usage.total_tokens == total
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source)  # done already
    assert code == 0 and "0 rows ok, 0 errors, 2 skipped (already done)" in err


def test_completions_lines_and_the_settings_of_a_body(gen, tmp_path):
    """``/v1/completions`` (a text prompt, token ids, a list of one prompt) beside chat
    lines in one batch, each body's fields read as the server reads them: max_tokens,
    temperature 0 (greedy), stop, seed."""
    lines = [
        line("text", "/v1/completions", {"model": "m", "prompt": "Once upon", "max_tokens": 5}),
        line("ids", "/v1/completions", {"prompt": [40, 41, 42], "max_tokens": 4}),
        line("listed", "/v1/completions", {"prompt": ["Once upon"], "max_tokens": 5}),
        chat("greedy", "Hi!", temperature=0, max_completion_tokens=6),
        chat("sampled", "Hi!", temperature=0.8, seed=3, max_tokens=6),
        line("stop", "/v1/completions", {"prompt": "abc", "max_tokens": 30, "stop": ["zz"]}),
    ]
    source = write(tmp_path / "in.jsonl", lines)
    # one line at a time, to compare with single calls to the last float
    summary = run_job(gen, source, tmp_path / "out.jsonl", batch_size=1, progress=None)
    assert (summary.rows_ok, summary.errors) == (6, 0)
    out = read_output(tmp_path / "out.jsonl")
    for name, prompt, n in [("text", "Once upon", 5), ("ids", [40, 41, 42], 4),
                            ("listed", "Once upon", 5)]:  # fmt: skip
        response = out[name].response
        assert response is not None
        body = Completion.model_validate(response.body)
        expected = gen.generate([prompt], max_new_tokens=n)
        assert body.object == "text_completion" and body.id.startswith("cmpl-")
        assert body.choices[0].text == expected.text[0]
        assert body.usage is not None and body.usage.completion_tokens == len(expected.tokens[0])
    messages = [{"role": "user", "content": "Hi!"}]
    greedy = gen.chat(messages, max_new_tokens=6, do_sample=False)
    assert chat_body(out["greedy"]).choices[0].message.content == greedy.text
    sampled = gen.chat(messages, max_new_tokens=6, do_sample=True, temperature=0.8, seed=3)
    assert chat_body(out["sampled"]).choices[0].message.content == sampled.text
    stopped = gen.generate(["abc"], max_new_tokens=30, stop_strings=["zz"])
    response = out["stop"].response
    assert response is not None
    assert Completion.model_validate(response.body).choices[0].text == stopped.text[0]


def test_a_thought_and_tool_calls_are_the_servers_message(thinking, hermes, tmp_path):  # noqa: F811
    """A thinking model's answer: ``reasoning_content`` apart from ``content``; a tool
    call: ``tool_calls``, content null, finish reason "tool_calls" (the answers forced
    with tests/server_plugin.py's ``says``, given as an ortgen setting in the body)."""
    source = write(tmp_path / "think.jsonl", [
        line("t", "/v1/chat/completions",
             {"messages": QUESTION, "max_tokens": 60, "logits_processors": SAYS}),
    ])  # fmt: skip
    run_job(thinking, source, tmp_path / "think-out.jsonl", progress=None)
    message = chat_body(read_output(tmp_path / "think-out.jsonl")["t"]).choices[0].message
    assert (message.content, message.model_extra) == ("hello", {"reasoning_content": "plan"})

    source = write(tmp_path / "call.jsonl", [
        line("call", "/v1/chat/completions",
             {"messages": QUESTION, "max_tokens": 60, "logits_processors": CALL_SAYS,
              **TOOL_ROW}),
    ])  # fmt: skip
    run_job(hermes, source, tmp_path / "call-out.jsonl", progress=None)
    [choice] = chat_body(read_output(tmp_path / "call-out.jsonl")["call"]).choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = [c.model_dump() for c in choice.message.tool_calls or []]
    assert read_back(calls) == CALL


# ------------------------------------------------------------------------ error lines


BAD = [
    line("url", "/v1/foo", {}),
    line("embeddings", "/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"}),
    chat("range", "hi", temperature=5),
    chat("typo", "hi", tempreature=0.5),
    chat("length", "hi", max_tokens=0),
    {**chat("get", "hi"), "method": "GET"},
    chat("n", "hi", n=2),
    chat("stream", "hi", stream=True),
    chat("logprobs", "hi", logprobs=True),
    line("prompts", "/v1/completions", {"prompt": ["a", "b"]}),
    line("no-body", "/v1/chat/completions", [1]),
    line("no-messages", "/v1/chat/completions", {"model": "m"}),
    {**chat("extra", "hi"), "priority": 1},
    chat("wide", "hi", num_beams=2),
]


def test_a_line_that_cannot_run_is_an_error_line_and_the_job_goes_on(gen, tmp_path):
    good = chat("good", "Hi!", max_tokens=3)
    source = write(tmp_path / "in.jsonl", [good, *BAD])
    summary = run_job(gen, source, tmp_path / "out.jsonl", progress=None)
    assert (summary.rows_ok, summary.errors) == (1, len(BAD))
    out = read_output(tmp_path / "out.jsonl")
    assert chat_body(out["good"]).choices[0].finish_reason == "length"
    errors = {name: error_of(out[name]) for name in out if name != "good"}
    for number, bad in enumerate(BAD, start=2):  # each names its line
        assert errors[bad["custom_id"]][1]["message"].startswith(f"line {number}: ")
    status, error = errors["url"]
    assert status == 404 and error["code"] == "unknown_url"
    assert "no route POST /v1/foo" in error["message"]
    status, error = errors["embeddings"]  # as the server: this model cannot embed
    assert status == 400 and "--embeddings" in error["message"]
    params = {name: error["param"] for name, (status, error) in errors.items()}
    assert params == {
        "url": None, "embeddings": "model", "range": "temperature", "typo": "tempreature",
        "length": "max_tokens", "get": "method", "n": "n", "stream": "stream",
        "logprobs": "logprobs", "prompts": "prompt", "no-body": "body",
        "no-messages": "messages", "extra": "priority", "wide": "num_beams",
    }  # fmt: skip
    assert all(status == 400 for name, (status, _) in errors.items() if params[name])
    assert "did you mean 'temperature'" in errors["typo"][1]["message"]
    assert all(error["type"] == "invalid_request_error" for _, error in errors.values())


def test_a_line_that_fails_while_it_runs_is_a_500(thinking, tmp_path):  # noqa: F811
    """Not the request's fault (a component that raises): the server would answer 500."""
    explode = [{"name": "explode"}]
    source = write(tmp_path / "in.jsonl", [
        line("boom", "/v1/chat/completions", {"messages": QUESTION, "logits_processors": explode}),
        line("fine", "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2}),
    ])  # fmt: skip
    run_job(thinking, source, tmp_path / "out.jsonl", batch_size=2, progress=None)
    out = read_output(tmp_path / "out.jsonl")
    status, error = error_of(out["boom"])
    assert status == 500 and error["type"] == "server_error" and "exploded" in error["message"]
    assert chat_body(out["fine"]).choices


def test_lines_no_custom_id_names_stop_the_job_before_it_starts(gen, tmp_path):
    """As OpenAI refuses such a file: a line without a custom_id, one that is not JSON,
    a custom_id used twice. A rerun could not tell their answers apart."""
    lines = [chat("a", "hi"), "{oops", {**chat("x", "hi"), "custom_id": 7}, chat("a", "yo")]
    source = write(tmp_path / "in.jsonl", lines)
    with pytest.raises(ortgen.InputError) as raised:
        run_job(gen, source, tmp_path / "out.jsonl", progress=None)
    said = str(raised.value)
    assert "cannot run as an OpenAI batch file: every line needs a custom_id" in said
    assert "line 2: not valid JSON" in said
    assert 'line 3: "custom_id" must be a non-empty string, got 7' in said
    assert "line 4: custom_id 'a' is also the custom_id of line 1" in said
    assert not (tmp_path / "out.jsonl").exists()
    report = check_input(source)  # the dry run's report lists them too
    assert [where for where, _ in report.problems] == ["line 2", "line 3", "line 4"]


def test_the_format_flag_and_outputs_it_cannot_write(gen, tmp_path, capsys, tiny_text_model):
    from ortgen.cli import run as cli_module

    assert cli_module.INPUT_FORMATS == INPUT_FORMATS == ("auto", "ortgen", "openai")
    source = write(tmp_path / "in.jsonl", EXAMPLE[:1])
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source, "--input-format", "ortgen")
    assert code == 0 and "0 rows ok, 1 errors" in err  # read as a row: it has no prompt
    code, out, err = cli_run(capsys, tmp_path, tiny_text_model, source, "--dry-run")
    assert code == 0, out + err
    assert out.splitlines()[1] == f"input {source} (OpenAI batch lines): 1 rows, none bad"
    with pytest.raises(ortgen.ConfigError, match="OpenAI batch output is JSONL"):
        run_job(gen, source, tmp_path / "out.parquet", progress=None)
    rows = write(tmp_path / "rows.jsonl", [{"prompt": "hi", "max_new_tokens": 2}])
    run_job(gen, rows, tmp_path / "rows-out.jsonl", progress=None)  # ortgen's result lines
    with pytest.raises(ortgen.InputError, match="line 1 is not an OpenAI batch output line"):
        run_job(gen, source, tmp_path / "rows-out.jsonl", progress=None)


# ------------------------------------------------------------------------- resume


#: a job long enough to be caught running: one line at a time, 16 tokens each
LONG = [chat(f"q-{i}", f"Question {i}?", max_tokens=16, temperature=0) for i in range(400)]


def test_killed_mid_run_then_rerun_answers_each_custom_id_once(gen, tiny_text_model, tmp_path):
    """A real ``ortgen run`` SIGKILLed while it writes, then the same command: every
    custom_id exactly once, whole lines, the rerun skipping what the first wrote, and
    the answers ``gen.chat`` gives."""
    source = write(tmp_path / "batch.jsonl", LONG)
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{tiny_text_model}"\n')
    out = tmp_path / "out.jsonl"
    args = [*CLI, "run", str(pipeline), "--input", str(source), "--output", str(out)]
    args += ["--batch-size", "1", "--threads", "1"]
    job = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 10:
            break
        time.sleep(0.02)
    assert job.poll() is None, "the job ended before it could be killed; make it longer"
    os.kill(job.pid, signal.SIGKILL)
    job.communicate()
    killed = out.read_bytes().count(b"\n")
    assert 10 <= killed < len(LONG)
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{killed} skipped (already done)" in rerun.stderr
    results = read_output(out)  # fails on a custom_id answered twice or a torn line
    assert sorted(results) == sorted(x["custom_id"] for x in LONG)
    for request in LONG[:20]:
        messages = request["body"]["messages"]
        expected = gen.chat(messages, max_new_tokens=16, do_sample=False).text
        assert chat_body(results[request["custom_id"]]).choices[0].message.content == expected


# ---------------------------------------------------------------------------- Ray


def _same_answers(path: Path) -> dict[str, Any]:
    """The lines without what is new in every answer (ids, request ids, times)."""
    lines = {}
    for custom_id, out in read_output(path).items():
        data = out.model_dump()
        data.pop("id")
        response = data["response"]
        response.pop("request_id")
        for key in ("id", "created"):
            response["body"].pop(key, None)
        lines[custom_id] = data
    return lines


@pytest.mark.ray
def test_ray_gives_the_local_engines_lines(gen, tiny_text_model, ray_address, tmp_path):  # noqa: F811
    """The same lines, errors too, whichever engine runs the file (a setting only the
    worker checks, with the model, keeps the field it names), then resume on Ray."""
    lines = [*EXAMPLE, *(chat(f"q-{i}", f"Q{i}?", max_tokens=5, temperature=0) for i in range(6)),
             chat("typo", "hi", tempreature=0.5), line("url", "/v1/foo", {}),
             line("embeddings", "/v1/embeddings", {"input": "hi"}),
             line("text", "/v1/completions", {"prompt": "Once", "max_tokens": 4})]  # fmt: skip
    source = write(tmp_path / "batch.jsonl", lines)
    run_job(gen, source, tmp_path / "local.jsonl", batch_size=2, window=4, progress=None)
    pipeline = _pipeline(tmp_path, tiny_text_model, batch_size=2, window=4)
    out = tmp_path / "ray.jsonl"
    args = _ray_args(pipeline, source, out, ray_address)
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert result.returncode == 0, result.stderr
    assert "9 rows ok, 3 errors, 0 skipped" in result.stderr
    assert _same_answers(out) == _same_answers(tmp_path / "local.jsonl")
    assert error_of(read_output(out)["typo"])[1]["param"] == "tempreature"
    again = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 0, again.stderr
    assert "0 rows ok, 0 errors, 12 skipped" in again.stderr


# ---------------------------------------------------------------------- fingerprints


def test_a_rerun_under_other_settings_is_refused_and_rerun_changed_redoes_it(
    tiny_text_model, tmp_path, capsys
):
    """Fingerprints on an OpenAI batch output: the lines stay OpenAI's shape (the strict
    model of ``read_output``), each row's fingerprint is kept beside them
    (``OUT.prints.jsonl``) and the job's in ``OUT.run.json``. Another flag is refused
    naming it, before any line is written; ``--rerun-changed`` redoes those lines; a line
    whose own body changed is named by its custom_id, and only it is redone."""
    from ortgen.jobs.fingerprint import prints_path, record_path

    lines = [chat("a", "Hi!", temperature=0), chat("b", "Hello?", temperature=0)]
    source = write(tmp_path / "batch.jsonl", lines)
    out = tmp_path / "out.jsonl"
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source, "--max-new-tokens", "4")
    assert code == 0, err
    first = out.read_bytes()
    assert sorted(read_output(out)) == ["a", "b"]
    assert b"fingerprint" not in first  # kept beside the lines, not in them
    kept = [json.loads(x) for x in prints_path(out).read_text().splitlines()]
    assert sorted(x["custom_id"] for x in kept) == ["a", "b"]
    assert record_path(out).is_file()

    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source, "--max-new-tokens", "2")
    assert code == 2
    assert "max_new_tokens changed from 4 to 2 since this output was written" in err
    assert "--rerun-changed to redo the 2 rows" in err
    assert out.read_bytes() == first  # nothing run or written

    args = ("--max-new-tokens", "2", "--rerun-changed")
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source, *args)
    assert code == 0, err
    assert "2 rows ok, 0 errors" in err
    redone = read_output(out)
    assert sorted(redone) == ["a", "b"]
    for custom_id in ("a", "b"):
        usage = chat_body(redone[custom_id]).usage
        assert usage is not None and usage.completion_tokens <= 2
    second = out.read_bytes()

    lines[1] = chat("b", "Hello?", temperature=0, max_tokens=1)  # one line's own settings
    write(source, lines)
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source, "--max-new-tokens", "2")
    assert code == 2 and "the row's own settings changed" in err and "'b'" in err
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source, *args)
    assert code == 0, err
    assert "1 rows ok, 0 errors, 1 skipped (already done)" in err
    final = read_output(out)
    assert final["a"].model_dump() == redone["a"].model_dump()  # kept as it was
    [kept_a] = [x for x in second.splitlines() if b'"custom_id": "a"' in x]
    assert kept_a in out.read_bytes().splitlines()
    usage = chat_body(final["b"]).usage
    assert usage is not None and usage.completion_tokens == 1
    code, _, err = cli_run(capsys, tmp_path, tiny_text_model, source, *args)
    assert code == 0 and "0 rows ok, 0 errors, 2 skipped (already done)" in err
