"""One request builder (``ortgen.request``) for the library, the server and jobs, and
errors that carry their field.

The same request given as a library call, an OpenAI body and a job's input line must
resolve to the same settings, the same prompt and the same chain; the server's ``param``
must come from the error's field, so rewording every message moves no ``param``.
"""

from __future__ import annotations

from typing import Any

import pytest

import ortgen
from ortgen.errors import ConfigError, InputError, OrtgenError
from ortgen.jobs.rows import InputRow
from ortgen.jobs.runner import RowRunner
from ortgen.loop.generate import Generation
from ortgen.request import row_settings
from ortgen.serve.engine import Engine
from ortgen.serve.errors import RequestError
from ortgen.serve.openai_api import check_row, parse_chat, parse_completion
from tests.test_server import BAD

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
MESSAGES = [
    {"role": "developer", "content": "Answer in JSON."},
    {"role": "user", "content": "Count to one."},
]
SETTINGS = {"do_sample": True, "temperature": 0.7, "top_k": 5, "seed": 3, "max_new_tokens": 4}


@pytest.fixture(scope="module")
def gen(tiny_text_model):
    return ortgen.load(tiny_text_model, threads=1)


@pytest.fixture(scope="module")
def engine(gen):
    return Engine(gen, max_batch=2, max_queue=4)  # checks rows; its loop is never started


def _chain_names(chain: Any) -> list[str]:
    return [
        *(name for name, _ in chain.processors),
        chain.sampler[0],
        *(name for name, _ in chain.stopping),
    ]


def _started(gen, monkeypatch) -> list[tuple[list[int], dict[str, Any], list[str]]]:
    """Record what every ``Generation`` the generator starts holds: per row, the
    prompt, the resolved settings and the chain's component names."""
    seen: list[tuple[list[int], dict[str, Any], list[str]]] = []
    original = gen._start

    def recording(rows, configs, seeds=None) -> Generation:
        state = original(rows, configs, seeds)
        for row, config in zip(rows, configs, strict=True):
            seen.append((list(row), config.to_dict(), _chain_names(state.chain)))
        return state

    monkeypatch.setattr(gen, "_start", recording)
    return seen


def test_a_library_call_a_server_request_and_a_job_row_build_the_same(gen, engine, monkeypatch):
    seen = _started(gen, monkeypatch)
    gen.chat(MESSAGES, response_format={"type": "json_schema", "json_schema": {"name": "n",
             "schema": SCHEMA}}, **SETTINGS)  # fmt: skip
    library = seen.pop()

    body = {
        "model": "x",
        "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
        "temperature": 0.7,
        "top_k": 5,
        "seed": 3,
        "max_tokens": 4,
    }
    request = parse_chat(body, gen, max_rows=4)
    (row,) = request.rows
    chain = check_row(engine, gen, row, request)
    server = (row.prompt, engine.check(row.prompt, row.settings).to_dict(), _chain_names(chain))

    job = {"do_sample": True, "temperature": 0.7, "top_k": 5, "max_new_tokens": 4}
    runner = RowRunner(gen, job, batch_size=1)
    line = {"messages": MESSAGES, "json_schema": SCHEMA, "seed": 3}
    (records,) = list(runner.run_window([InputRow(1, "line", "a", request=line)]))
    assert records[0]["usage"]["completion_tokens"] == 4, records  # it ran
    job = seen.pop()

    assert library[0] == server[0] == job[0]  # the developer message rendered as system
    assert "grammar" in library[2]
    assert library[1] == server[1] == job[1]
    assert library[2] == server[2] == job[2]


def test_a_rows_constraint_replaces_the_calls_everywhere(gen):
    call = {"json_schema": SCHEMA, "temperature": 0.5}
    own = {"regex": "[0-9]+"}
    assert row_settings(call, own) == {"temperature": 0.5, "regex": "[0-9]+"}
    assert row_settings(call, {"top_k": 3}) == {**call, "top_k": 3}
    # the library (a per-row prompt), and a job's check of a row, accept it alike
    out = gen.generate([{"prompt": "ab", **own}], **call, max_new_tokens=3, do_sample=False)
    assert out.finish_reasons[0] in ("length", "stop")
    runner = RowRunner(gen, {**call, "max_new_tokens": 3}, batch_size=1)
    runner.check_settings(own)  # a job once merged the two: "set together"


def test_errors_carry_their_field(gen):
    with pytest.raises(ConfigError) as caught:
        gen.resolve_config({"top_p": 2, "tempreature": 1, "max_new_tokens": 0})
    fields = [field for field, _ in caught.value.problems]
    assert fields == ["tempreature", "max_new_tokens", "top_p"], caught.value.problems
    with pytest.raises(ConfigError) as caught:  # from the model's facts, not the layers
        gen.generate("ab", max_new_tokens=2, pad_token_id=10**6)
    assert caught.value.field == "pad_token_id"
    with pytest.raises(ConfigError) as caught:  # a factory's refusal, tied to its setting
        gen.generate("ab", max_new_tokens=2, logit_bias={10**6: 1.0})
    assert caught.value.field == "logit_bias"
    with pytest.raises(InputError) as caught_input:
        gen.chat([{"role": "user", "content": [{"type": "image_url"}]}])
    assert caught_input.value.field == "messages[0].content[0]"
    with pytest.raises(InputError) as caught_input:
        gen.chat(MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}],
                 tool_choice="maybe")  # fmt: skip
    assert caught_input.value.field == "tool_choice"


def _param(gen, engine, path: str, fields: dict[str, Any]) -> str | None:
    """The ``param`` the server would answer ``fields`` with (parse, then check)."""
    body: dict[str, Any] = {"model": "x", "max_tokens": 4}
    chat = path.endswith("chat/completions")
    body.update({"messages": [{"role": "user", "content": "Hi"}]} if chat else {"prompt": "Hi"})
    body.update(fields)
    try:
        request = (parse_chat if chat else parse_completion)(body, gen, max_rows=8)
        for row in request.rows:
            check_row(engine, gen, row, request)
    except RequestError as exc:
        return exc.param
    return "accepted"


def test_rewording_every_message_moves_no_param(gen, engine, monkeypatch):
    """Every 400 of ``tests/test_server.py``'s list, answered twice: as worded, then with
    every ortgen error's message replaced by the same sentence. A server that found the
    field by reading the message would lose or move the ``param``."""
    worded = {i: _param(gen, engine, path, fields) for i, (path, fields, _) in enumerate(BAD)}
    assert sum(worded[i] == param for i, (_, _, param) in enumerate(BAD)) >= len(BAD) - 3
    monkeypatch.setattr(OrtgenError, "__str__", lambda self: "something is wrong")
    reworded = {i: _param(gen, engine, path, fields) for i, (path, fields, _) in enumerate(BAD)}
    assert reworded == worded
