"""The serving engine in-process: continuous batching gives each request what it gives
alone, a failing component fails only its request, cancelled rows leave at once, and
rows join a running batch without waiting for it to drain."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

import ortgen
from ortgen import hookimpl
from ortgen.serve.engine import Engine, QueueFull
from tests.server_helpers import running_engine
from tests.tiny_models import export_tiny


class Explodes:
    """A processor that raises at its third step."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("boom")
        return scores


class Poisons:
    """A processor that puts NaN into a few scores at its third step (a plugin bug: an
    argmax would take the first NaN as its pick)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == 3:
            scores = scores.copy()
            scores[:, 3:7] = np.nan
        return scores


class Oracle:
    """A drafter that knows the request's answer (``script``, its generated tokens
    alone) and proposes its next tokens, every other draft with a wrong third token: the
    engine's verification keeps the right ones and rejects the rest, deterministically."""

    def __init__(self, script: list[int], prompt_length: int) -> None:
        self.script, self.prompt_length, self.calls = script, prompt_length, 0

    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        self.calls += 1
        done = len(tokens) - self.prompt_length
        drafts = list(self.script[done : done + min(limit, 4)])
        if self.calls % 2 and len(drafts) > 2:
            drafts[2] = 1 if drafts[2] == 0 else 0
        return drafts


class Plugin:
    @hookimpl
    def register_logits_processors(self, register):
        register("explodes", Explodes)
        register("poisons", Poisons)

    @hookimpl
    def register_drafters(self, register):
        register("oracle", Oracle)


@pytest.fixture(scope="module")
def fused_chat(tiny_root: Path):
    """A tiny fp32 fused Llama with a character tokenizer and a chat template."""
    folder = export_tiny("llama", tiny_root / "serve", with_tokenizer=True, graph="fused")
    return ortgen.load(folder, threads=1, plugins=[Plugin()])


def _requests(gen, count: int) -> list[tuple[list[int], dict]]:
    rng = random.Random(0)
    rows = []
    for i in range(count):
        prompt = gen.tokenizer.encode(f"Request {i}: " + "abc" * rng.randint(0, 12))
        settings: dict = {"max_new_tokens": rng.randint(3, 30), "eos_token_id": None}
        if i % 3 == 1:
            settings.update(do_sample=True, temperature=0.8, top_k=20, seed=100 + i)
        if i % 4 == 2:
            settings.update(stop_strings=["ab"], logprobs=True, top_logprobs=2)
        if i % 5 == 3:
            settings.update(repetition_penalty=1.3, eos_token_id=[5, 6])
        rows.append((prompt, settings))
    return rows


async def _collect(engine: Engine, prompt: list[int], settings: dict):
    handle = engine.submit(prompt, settings)
    pieces = [piece async for piece in handle.pieces()]
    return handle, pieces


def _run(engine: Engine, jobs):
    async def main():
        return await asyncio.gather(*[_collect(engine, p, s) for p, s in jobs])

    return asyncio.run(main())


@pytest.fixture(scope="module")
def optimum_chat(tiny_root: Path):
    """The same tiny Llama exported by optimum: a concat graph (position ids, the past
    concatenated with each step's new position)."""
    folder = export_tiny("llama", tiny_root / "serve-optimum", with_tokenizer=True)
    return ortgen.load(folder, threads=1, plugins=[Plugin()])


@pytest.mark.parametrize("graph", ["fused_chat", "optimum_chat"])
def test_concurrent_requests_equal_each_request_alone(graph, request) -> None:
    gen = request.getfixturevalue(graph)
    jobs = _requests(gen, 16)
    # more requests than rows: some wait, then join
    with running_engine(gen, max_batch=6) as engine:
        results = _run(engine, jobs)
    for (prompt, settings), (_handle, pieces) in zip(jobs, results, strict=True):
        alone = gen.generate([prompt], **settings)
        assert [p.token for p in pieces] == alone.tokens[0], settings
        assert "".join(p.text for p in pieces) == alone.text[0]
        assert pieces[-1].finish_reason == alone.finish_reasons[0]
        if settings.get("logprobs"):
            np.testing.assert_allclose([p.logprob for p in pieces], alone.logprobs[0], atol=1e-5)
            assert [[t for t, _ in p.top_logprobs] for p in pieces] == [
                [t for t, _ in alts] for alts in alone.top_logprobs[0]
            ]
    assert engine.stats.finished == 16 and engine.stats.failed == 0
    assert engine.stats.peak_batch_size > 1  # rows did decode together


def test_a_failing_component_fails_only_its_request(fused_chat) -> None:
    gen = fused_chat
    jobs = _requests(gen, 5)
    jobs[2] = (jobs[2][0], {**jobs[2][1], "logits_processors": [{"name": "explodes"}]})
    jobs[2][1].update(max_new_tokens=20, stop_strings=None)
    with running_engine(gen, max_batch=8) as engine:
        results = _run(engine, jobs)
    failed_handle, failed = results[2]
    assert failed[-1].finish_reason == "error"
    assert "boom" in str(failed_handle.error)
    assert len(failed) == 3  # two tokens, then the error
    for index in (0, 1, 3, 4):
        prompt, settings = jobs[index]
        assert [p.token for p in results[index][1]] == gen.generate([prompt], **settings).tokens[0]
    assert engine.stats.failed == 1 and engine.stats.finished == 4


def test_a_component_returning_nan_fails_only_its_request(fused_chat) -> None:
    """NaN in part of one request's scores: that request fails with an error naming its
    processors, the rows beside it give what they give alone, and the engine goes on."""
    gen = fused_chat
    jobs = _requests(gen, 5)
    for index in (1, 3):
        jobs[index] = (jobs[index][0], {**jobs[index][1], "max_new_tokens": 20})
    jobs[3][1].update(logits_processors=[{"name": "poisons"}], stop_strings=None)
    with running_engine(gen, max_batch=8) as engine:
        results = _run(engine, jobs)
        after = _run(engine, [jobs[0]])
    failed_handle, failed = results[3]
    assert failed[-1].finish_reason == "error" and len(failed) == 3
    assert isinstance(failed_handle.error, ortgen.ComponentError)
    assert "NaN in places at step" in str(failed_handle.error)  # the batch's step
    assert "poisons" in str(failed_handle.error)
    for index in (0, 1, 2, 4):
        prompt, settings = jobs[index]
        assert [p.token for p in results[index][1]] == gen.generate([prompt], **settings).tokens[0]
    assert [p.token for p in after[0][1]] == [p.token for p in results[0][1]]
    assert engine.stats.failed == 1 and engine.stats.finished == 5


@pytest.mark.parametrize("graph", ["fused_chat", "optimum_chat"])
def test_a_request_after_one_that_failed_alone_runs_as_alone(graph, request) -> None:
    """A lone row that fails leaves a step that appended nothing; the next row to join
    still gets a column of its own (it used to be fed nothing: a GQA graph refused)."""
    gen = request.getfixturevalue(graph)
    prompt, settings = _requests(gen, 1)[0]
    settings = {**settings, "max_new_tokens": 8}
    boom = {**settings, "logits_processors": [{"name": "explodes"}]}
    with running_engine(gen, max_batch=4) as engine:
        failed = _run(engine, [(prompt, boom)])
        after = _run(engine, [(prompt, settings)])
    assert failed[0][1][-1].finish_reason == "error"
    assert [p.token for p in after[0][1]] == gen.generate([prompt], **settings).tokens[0]
    assert engine.stats.failed == 1 and engine.stats.finished == 1


def test_a_cancelled_request_leaves_and_the_others_go_on(fused_chat) -> None:
    gen = fused_chat
    prompt = gen.tokenizer.encode("cancel me")
    other = gen.tokenizer.encode("keep going")
    settings = {"max_new_tokens": 60, "eos_token_id": None}

    async def main():
        doomed = engine.submit(prompt, settings)
        kept = asyncio.ensure_future(_collect(engine, other, settings))
        got = 0
        async for _piece in doomed.pieces():
            got += 1
            if got == 5:
                doomed.cancel()
        return got, await kept

    with running_engine(gen, max_batch=4) as engine:
        got, (_handle, pieces) = asyncio.run(main())
    assert got < 60
    assert [p.token for p in pieces] == gen.generate([other], **settings).tokens[0]
    assert engine.stats.cancelled == 1


def test_bad_requests_fail_at_submit(fused_chat) -> None:
    engine = Engine(fused_chat, max_batch=2, max_queue=0)

    async def main():
        with pytest.raises(ortgen.ConfigError, match="temprature"):
            engine.submit([1, 2, 3], {"temprature": 0.5})
        with pytest.raises(ortgen.InputError, match="one sequence per row"):
            engine.submit([1, 2, 3], {"num_beams": 2})
        with pytest.raises(ortgen.InputError, match="manages the KV cache"):
            engine.submit([1, 2, 3], {"cache": "prefix"})
        with pytest.raises(ortgen.InputError, match="leaves no room"):
            engine.submit([1, 2, 3], {"max_length": 2, "max_new_tokens": None})
        with pytest.raises(QueueFull):
            engine.submit([1, 2, 3], {"max_new_tokens": 2})

    asyncio.run(main())


def test_a_new_request_joins_without_waiting_for_the_batch(fused_chat) -> None:
    gen = fused_chat
    settings = {"eos_token_id": None}
    order: list[str] = []

    async def drain(name: str, handle) -> None:
        async for _piece in handle.pieces():
            pass
        order.append(name)

    async def main():
        long = engine.submit(gen.tokenizer.encode("long"), {**settings, "max_new_tokens": 100})
        seen = 0
        async for _piece in long.pieces():  # the long request is decoding: send another
            seen += 1
            if seen == 5:
                break
        short = engine.submit(gen.tokenizer.encode("short"), {**settings, "max_new_tokens": 3})
        await asyncio.gather(drain("long", long), drain("short", short))

    with running_engine(gen, max_batch=4) as engine:
        asyncio.run(main())
    assert order == ["short", "long"]  # it joined the running batch and left it first


def test_rows_with_the_same_prompt_share_one_prefill(fused_chat) -> None:
    """The n choices of one request (or identical prompts) copy the held row's keys and
    values and its prefill logits: one prefill, and each row still equals it alone."""
    gen = fused_chat
    prompt = gen.tokenizer.encode("The same question, asked four times")
    jobs = [
        (prompt, {"max_new_tokens": 20, "do_sample": True, "seed": seed, "eos_token_id": None})
        for seed in (1, 2, 3, 4)
    ]
    jobs.append((prompt, {"max_new_tokens": 12, "eos_token_id": None}))  # greedy, same prompt
    with running_engine(gen, max_batch=8) as engine:
        results = _run(engine, jobs)
    for (row_prompt, settings), (_handle, pieces) in zip(jobs, results, strict=True):
        alone = gen.generate([row_prompt], **settings)
        assert [p.token for p in pieces] == alone.tokens[0], settings
    assert len({tuple(p.token for p in pieces) for _h, pieces in results[:4]}) > 1  # own seeds
    assert engine.stats.shared_prefills == 4


def test_a_held_prefill_follows_its_row_when_rows_move(fused_chat) -> None:
    """A held prefill is found by its row, and rows move when others leave: the batch's
    index of held prefills must follow them. Driven step by step on the server's own open
    batch, in an order where a stale index is read: A, B, C join; A ends, so C moves
    into A's row; E joins in C's old slot and overwrites it; then C's prompt again (it must
    copy C, now row 0, not E's slot 2), B's again (B never moved), and A's again (A left:
    nothing of it is held, it is prefilled afresh). Each request must equal itself alone;
    a stale or off-by-one index copies another prompt's keys and values, whose first token
    still comes from the right logits, and the answers part after it."""
    gen = fused_chat
    engine = Engine(gen, max_batch=6)  # never started: its open batch, driven by hand
    batch = engine.open_batch()
    encode = gen.tokenizer.encode
    prompts = {
        "A": encode("A leaves soon"),
        "B": encode("B stays where it is"),
        "C": encode("C is moved"),
        "E": encode("E writes over the slot C left"),
    }
    assert len(prompts["E"]) >= len(prompts["C"])  # E's prefill covers all C left there
    lengths = {"A": 3, "B": 25, "C": 25, "E": 25}
    live: list[tuple[str, list[int], dict]] = []
    served: list[tuple[str, list[int], dict, list[int]]] = []
    admitted: list[str] = []

    def admit(name: str) -> None:
        prompt = prompts[name]
        settings = {"max_new_tokens": lengths[name], "eos_token_id": None}
        chain = engine.check_components(prompt, engine.check(prompt, settings))
        chain = dataclasses.replace(
            chain, cache=batch.chain.cache, cache_name=batch.chain.cache_name
        )
        assert batch.admit(prompt, chain).row == len(live) and batch.errors[-1] is None
        live.append((f"{name} again" if name in admitted else name, prompt, settings))
        admitted.append(name)

    def leave() -> list[int]:
        """The engine's release: only when a row ended (an empty release moves nothing)."""
        gone = [row for row in range(len(live)) if not batch.unfinished[row]]
        if not gone:
            return list(range(len(live)))
        served.extend((*live[row], batch.generated(row)) for row in gone)
        order = batch.release(gone)
        live[:] = [live[old] for old in order]
        return order

    for name in "ABC":
        admit(name)
    while live[0][0] == "A":
        batch.step()
        order = leave()
    assert order == [2, 1] and [name for name, *_ in live] == ["C", "B"]  # C moved
    for name in "ECBA":
        admit(name)
    while live:
        batch.step()
        leave()
    names = ["A", "A again", "B", "B again", "C", "C again", "E"]
    assert sorted(name for name, *_ in served) == names
    for name, prompt, settings, tokens in served:
        assert tokens == gen.generate([prompt], **settings).tokens[0], name
    assert batch.shared_prefills == 2  # C's and B's prompts copied their held rows


def test_a_row_asking_past_the_context_ends_there_as_generate_does(tiny_llama_gen) -> None:
    """One context-length rule for the library and the server: clipped, reason "length"."""
    gen = tiny_llama_gen
    context = gen.model.max_context
    prompt = [1] * (context - 3)
    settings = {"max_new_tokens": 50, "eos_token_id": None}
    alone = gen.generate([prompt], **settings)
    assert len(alone.tokens[0]) == 3 and alone.finish_reasons == ["length"]
    with running_engine(gen, max_batch=2) as engine:

        async def main():
            handle = engine.submit(prompt, settings)
            return [piece async for piece in handle.pieces()]

        pieces = asyncio.run(main())
    assert [p.token for p in pieces] == alone.tokens[0]
    assert pieces[-1].finish_reason == "length"


@pytest.mark.parametrize("graph", ["fused_chat", "optimum_chat"])
def test_speculative_and_plain_requests_each_equal_themselves_alone(graph, request) -> None:
    """Drafting requests through the engine: alone it speculates (drafts kept and
    rejected, several tokens per step, one piece per token); mixed with plain requests
    in one batch, every request gives what it gives alone, token for token."""
    gen = request.getfixturevalue(graph)
    jobs = _requests(gen, 8)
    for index in (0, 3, 4, 7):  # greedy and seeded sampling, with logprobs
        prompt, settings = jobs[index]
        settings = {**settings, "max_new_tokens": 30, "logprobs": True}
        script = gen.generate([prompt], **settings).tokens[0]
        oracle = {"name": "oracle", "script": script, "prompt_length": len(prompt)}
        jobs[index] = (prompt, {**settings, "drafter": oracle})
    jobs[5][1]["prompt_lookup_num_tokens"] = 4  # the built-in, by its Hugging Face name
    with running_engine(gen, max_batch=4) as engine:
        alone = _run(engine, [jobs[0]])  # by itself: it speculates
        drafted, kept = engine.stats.drafted_tokens, engine.stats.accepted_drafts
        mixed = _run(engine, jobs)
    assert drafted > kept > 0  # drafts were kept and rejected
    for (prompt, settings), (_handle, pieces) in zip([jobs[0], *jobs], alone + mixed, strict=True):
        want = gen.generate([prompt], **{k: v for k, v in settings.items() if k != "drafter"})
        assert [p.token for p in pieces] == want.tokens[0], settings
        assert "".join(p.text for p in pieces) == want.text[0]
        assert pieces[-1].finish_reason == want.finish_reasons[0]
        if settings.get("logprobs"):
            np.testing.assert_allclose([p.logprob for p in pieces], want.logprobs[0], atol=1e-4)
    assert engine.stats.finished == 9 and engine.stats.failed == 0


def test_stream_pieces_of_a_speculative_request_carry_every_token(fused_chat) -> None:
    gen = fused_chat
    prompt = gen.tokenizer.encode("abcabcabcabcabc")
    settings = {"max_new_tokens": 40, "eos_token_id": None, "logprobs": True}
    want = gen.generate(prompt, **settings)
    oracle = {"name": "oracle", "script": want.tokens[0], "prompt_length": len(prompt)}
    fast = gen.generate(prompt, **settings, drafter=oracle)
    assert fast.stats["accepted"] > 0 and fast.stats["verify_forwards"] < 40
    pieces = list(gen.stream_pieces(prompt, **settings, drafter=oracle))
    assert [p.token for p in pieces] == want.tokens[0]
    assert "".join(p.text for p in pieces) == want.text
    np.testing.assert_allclose([p.logprob for p in pieces], want.logprobs[0], atol=1e-4)
    assert [p.finish_reason for p in pieces] == [None] * (len(pieces) - 1) + ["length"]


def test_a_speculative_row_near_the_context_ends_there_as_generate_does(fused_chat) -> None:
    """Drafts never take positions past the model's context: the row ends at it, as
    without drafts."""
    gen = fused_chat
    context = gen.model.max_context
    prompt = gen.tokenizer.encode("ab" * ((context - 6) // 2))
    settings = {"max_new_tokens": 50, "eos_token_id": None}
    alone = gen.generate([prompt], **settings)
    script = alone.tokens[0] + [7] * 20  # it would draft past the context
    oracle = {"name": "oracle", "script": script, "prompt_length": len(prompt)}
    with running_engine(gen, max_batch=2) as engine:
        pieces = _run(engine, [(prompt, {**settings, "drafter": oracle})])[0][1]
        assert engine.stats.accepted_drafts > 0
    assert [p.token for p in pieces] == alone.tokens[0]
    assert pieces[-1].finish_reason == "length"


def test_health_reports_a_dead_decode_loop(fused_chat) -> None:
    """/health answered 200 while the engine thread was gone: nothing queued would run."""
    from starlette.testclient import TestClient

    from ortgen.serve.app import build_app
    from ortgen.serve.model_pool import ModelPool, ServedModel
    from ortgen.serve.state import ServerState

    engine = Engine(fused_chat, max_batch=2)
    state = ServerState(ModelPool.single(ServedModel("tiny", fused_chat, engine)))
    with TestClient(build_app(state)) as client:
        assert client.get("/health").json() == {"status": "ok", "models": {"tiny": "loaded"}}
        engine.shutdown()  # the loop thread ends, as if it had died
        answer = client.get("/health")
        stopped = {"status": "engine_stopped", "stopped": ["tiny"], "models": {"tiny": "loaded"}}
        assert (answer.status_code, answer.json()) == (503, stopped)


def test_a_shut_down_engine_ends_its_waiting_rows_and_takes_no_more(tiny_llama_gen) -> None:
    """An engine shut down (the server stops, or the model pool unloads it) with rows still
    waiting: each waiting row ends (its reader is not left waiting forever), the queue
    gauge reads 0 (a model's stats outlive its unloads), and a row submitted after is
    refused, not queued on an engine that will never take it."""
    from ortgen.serve.engine import ShuttingDown

    async def go() -> None:
        engine = Engine(tiny_llama_gen, max_batch=1)  # not started: rows wait
        handle = engine.submit([5, 6, 7], {"max_new_tokens": 2})
        assert engine.stats.queue_length == 1
        engine.shutdown()
        assert engine.stats.queue_length == 0
        assert [p async for p in handle.pieces()] == []
        assert handle.outcome == "cancelled"
        with pytest.raises(ShuttingDown):
            engine.submit([5, 6, 7], {"max_new_tokens": 2})

    asyncio.run(asyncio.wait_for(go(), 10))


def test_a_live_row_is_admitted_before_background_rows_queued_earlier(fused_chat) -> None:
    """The Batches API's rows are background rows: one engine slot, a background row
    running, another background row queued, then a live row: the live row runs next."""
    gen = fused_chat
    settings = {"eos_token_id": None, "max_new_tokens": 30}
    order: list[str] = []

    async def drain(name: str, handle) -> None:
        async for _piece in handle.pieces():
            pass
        order.append(name)

    async def main():
        first = engine.submit(gen.tokenizer.encode("one"), settings, background=True)
        queued = engine.submit(gen.tokenizer.encode("two"), settings, background=True)
        live = engine.submit(gen.tokenizer.encode("live"), settings)
        await asyncio.gather(drain("first", first), drain("queued", queued), drain("live", live))

    with running_engine(gen, max_batch=1) as engine:
        asyncio.run(main())
    assert order.index("live") < order.index("queued"), order
