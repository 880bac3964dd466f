"""Several models behind one ``ortgen serve``: ``-m NAME=FOLDER`` (repeated) and
``--models-dir``, picked by the ``model`` field, loaded on first use, the least recently
used unloaded past ``--max-loaded``, each with its own batch and labelled metrics.

Two tiny fp32 models with different weights (a fused Llama and a fused Qwen2), so every
answer must equal, token for token, what that model's own ``generate()``/``chat()``
gives, and an answer from the wrong model would show.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

import ortgen
from tests.server_helpers import KEY, ServerProcess, call, metric, sum_of

MODELS = ("llama", "qwen2")


@pytest.fixture(scope="module")
def gens(two_text_models: dict[str, Path]) -> dict[str, ortgen.TextGenerator]:
    return {name: ortgen.load(path, threads=1) for name, path in two_text_models.items()}


def _request(i: int) -> tuple[str, dict, dict]:
    """Request ``i`` of a mix: endpoint, OpenAI fields, the same as ortgen settings."""
    prompt = "abcdefgh"[: 1 + i % 8] * (1 + i % 2)
    length = 5 + (i * 5) % 19
    fields: dict = {"max_tokens": length}
    settings: dict = {"max_new_tokens": length}
    if i % 3:
        fields.update(temperature=0.8, seed=i, top_p=0.9)
        settings.update(do_sample=True, temperature=0.8, seed=i, top_p=0.9)
    else:
        fields["temperature"], settings["do_sample"] = 0, False
    if i % 2:
        return "chat", {"messages": [{"role": "user", "content": prompt}], **fields}, settings
    return "completion", {"prompt": prompt, **fields}, settings


def _want(gen: ortgen.TextGenerator, i: int) -> str:
    kind, fields, settings = _request(i)
    if kind == "chat":
        return gen.chat(fields["messages"], **settings).text
    return gen.generate(fields["prompt"], **settings).text


async def _ask(client: openai.AsyncOpenAI, model: str, i: int, *, stream: bool) -> str:
    kind, fields, _ = _request(i)
    api = client.chat.completions if kind == "chat" else client.completions
    if not stream:
        answer = await api.create(model=model, **fields)
        assert answer.model == model
        choice = answer.choices[0]
        return (choice.message.content if kind == "chat" else choice.text) or ""
    text = []
    async for chunk in await api.create(model=model, stream=True, **fields):
        assert chunk.model == model
        if chunk.choices:
            choice = chunk.choices[0]
            text.append((choice.delta.content if kind == "chat" else choice.text) or "")
    return "".join(text)


def _ask_all(server: ServerProcess, jobs: list[tuple[str, int]]) -> list[str]:
    """Every (model, request number) at once, half of them streamed."""

    async def run() -> list[str]:
        client = server.async_client()
        asks = (_ask(client, model, i, stream=i % 2 == 0) for model, i in jobs)
        return await asyncio.gather(*asks)

    return asyncio.run(run())


def test_two_models_answer_concurrently_each_as_its_own_generate(two_text_models, gens):
    flags = [f"--model={name}={path}" for name, path in two_text_models.items()]
    server = ServerProcess(*flags, "--threads", "1", "--api-key", KEY).ready()
    try:
        assert server.models == list(MODELS)
        status, listing = call(server, "/v1/models")
        cards = {card["id"]: card for card in listing["data"]}
        assert status == 200 and list(cards) == list(MODELS)
        assert cards["llama"]["status"] == "loaded"  # the first loads at startup
        assert cards["qwen2"]["status"] == "unloaded"  # the others on first use
        assert cards["qwen2"]["max_model_len"] == gens["qwen2"].model.max_context

        jobs = [(model, i) for i in range(10) for model in MODELS]
        got = _ask_all(server, jobs)
        for (model, i), text in zip(jobs, got, strict=True):
            assert text == _want(gens[model], i), f"{model} request {i}"
        assert _want(gens["llama"], 0) != _want(gens["qwen2"], 0)  # the test can tell

        status, health = call(server, "/health", key=None)
        both = dict.fromkeys(MODELS, "loaded")
        assert (status, health) == (200, {"status": "ok", "models": both})
        _, text = call(server, "/metrics")
        for model in MODELS:  # each model's batch counted apart
            rows = sum_of(text, "ortgen_rows_finished_total", model=model)
            assert rows == 10
            assert sum_of(text, "ortgen_model_loaded", model=model) == 1
            assert sum_of(text, "ortgen_model_loads_total", model=model) == 1
        assert metric(server, "ortgen_rows_finished_total") == 20

        prompt = "hello there"
        status, counted = call(server, "/tokenize", {"model": "qwen2", "prompt": prompt})
        assert status == 200
        assert counted["tokens"] == gens["qwen2"].tokenizer.encode(prompt)

        body = {"model": "gpt-4o", "prompt": "hi", "max_tokens": 2}
        for path in ("/v1/completions", "/tokenize"):
            status, error = call(server, path, body)
            assert status == 404, path
            assert error["error"]["code"] == "model_not_found"
            assert error["error"]["param"] == "model"
            assert "it serves 'llama', 'qwen2'" in error["error"]["message"]
        status, error = call(server, "/v1/models/gpt-4o")
        assert status == 404 and error["error"]["code"] == "model_not_found"
        assert call(server, "/v1/models/qwen2")[1]["id"] == "qwen2"
        # omitted: the first model
        status, answer = call(server, "/v1/completions", {"prompt": "ab", "max_tokens": 3})
        assert status == 200 and answer["model"] == "llama"
    finally:
        server.stop()


def test_max_loaded_one_unloads_and_reloads_and_keeps_answering(two_text_models, gens, tmp_path):
    """--models-dir names models by their folders; with --max-loaded 1 every switch
    unloads one model and loads the other, and requests for both at once all finish."""
    folder = tmp_path / "models"
    folder.mkdir()
    for name, path in two_text_models.items():
        (folder / name).symlink_to(path)
    (folder / "notes").mkdir()  # not a model folder: passed over
    server = ServerProcess(
        "--models-dir", str(folder), "--max-loaded", "1", "--threads", "1", "--api-key", KEY
    ).ready()
    try:
        assert server.models == list(MODELS)
        jobs = [(model, i) for i in range(3) for model in MODELS]  # one after another
        for model, i in jobs:
            assert _ask_all(server, [(model, i)]) == [_want(gens[model], i)], (model, i)
        loaded = [model for model in MODELS if metric(server, "ortgen_model_loaded", model=model)]
        assert loaded == ["qwen2"]  # the last one asked for
        assert metric(server, "ortgen_model_unloads_total", model="llama") == 3
        assert metric(server, "ortgen_model_loads_total", model="qwen2") == 3

        burst = [(model, i) for i in range(4, 10) for model in MODELS]  # both at once
        got = _ask_all(server, burst)
        for (model, i), text in zip(burst, got, strict=True):
            assert text == _want(gens[model], i), f"{model} request {i}"
        cards = call(server, "/v1/models")[1]["data"]
        assert sum(card["status"] == "loaded" for card in cards) <= 1
        assert call(server, "/health", key=None)[0] == 200
        assert metric(server, "ortgen_rows_finished_total") == len(jobs) + len(burst)
        assert metric(server, "ortgen_rows_failed_total") == 0
        log = server.log()
        assert "unloading llama to make room (--max-loaded 1)" in log
    finally:
        server.stop()
    assert server.proc.returncode == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-m", "a={two}", "-m", "a={one}"], "two models are called 'a'"),
        (["-m", "{one}", "-m", "{one}"], "two models are called 'llama-fused'"),
        (["-m", "={one}"], "the model's name before '=' is empty"),
        (["-m", "{missing}"], "no such model folder"),
        (["-m", "x={empty}"], "is not a model folder (it has no model.onnx"),
        (["--models-dir", "{empty}"], "no model folder in it"),
        (["--models-dir", "{missing}"], "--models-dir {missing}: no such folder"),
        (["-m", "{one}", "--max-loaded", "-1"], "--max-loaded must be at least 0"),
    ],
)
def test_bad_model_flags_fail_at_startup_naming_them(two_text_models, tmp_path, flags, message):
    names = {
        "one": two_text_models["llama"],
        "two": two_text_models["qwen2"],
        "missing": tmp_path / "missing",
        "empty": tmp_path,
    }
    args = [flag.format(**names) for flag in flags]
    done = subprocess.run(
        [sys.executable, "-m", "ortgen.cli", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert message.format(**names) in done.stderr
    assert "Traceback" not in done.stderr


def test_clients_hanging_up_during_switches_leave_nothing_behind(two_text_models, gens):
    """--max-loaded 1 and 60 requests at once for either model, a quarter of them from
    clients that hang up within 0.3 s (while their model loads, waits or decodes): every
    answer that arrives is its model's own, and afterwards nothing is in flight, queued
    or failed, /health is ok, and both models answer again."""
    flags = [f"--model={name}={path}" for name, path in two_text_models.items()]
    server = ServerProcess(*flags, "--max-loaded", "1", "--threads", "1", "--api-key", KEY)
    server.ready()
    draw = random.Random(7)
    plan = [
        (draw.choice(MODELS), i, draw.random() < 0.25, draw.uniform(0.01, 0.3)) for i in range(60)
    ]

    async def one(client: openai.AsyncOpenAI, model: str, i: int, hang: bool, after: float):
        if hang:
            client = client.with_options(timeout=after)
        try:
            return await _ask(client, model, i, stream=i % 2 == 0)
        except openai.APITimeoutError:
            assert hang, (model, i)
            return None

    async def run() -> list[str | None]:
        client = server.async_client()
        return await asyncio.gather(*(one(client, *job) for job in plan))

    try:
        got = asyncio.run(run())
        for (model, i, _, _), text in zip(plan, got, strict=True):
            if text is not None:
                assert text == _want(gens[model], i), f"{model} request {i}"
        assert sum(text is not None for text in got) >= 40
        deadline = time.monotonic() + 30
        while metric(server, "ortgen_requests_in_flight") or metric(server, "ortgen_batch_size"):
            assert time.monotonic() < deadline, "rows left behind"
            time.sleep(0.1)
        assert metric(server, "ortgen_queue_length") == 0
        assert metric(server, "ortgen_rows_failed_total") == 0
        assert metric(server, "ortgen_model_unloads_total") >= 2
        assert call(server, "/health", key=None)[0] == 200
        for model in MODELS:
            assert _ask_all(server, [(model, 3)]) == [_want(gens[model], 3)]
    finally:
        server.stop()
    assert server.proc.returncode == 0
