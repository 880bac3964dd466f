"""The model pool of ``ortgen serve`` (``ortgen.serve.model_pool``): which models are
loaded, the least recently used one unloaded past ``max_loaded``, never under a request,
no starvation, one load for many waiters, load failures reported and retried, and an
unloaded model's generator really freed.

Most tests use stand-in models (the pool only starts, stops and counts them), so the
order of events is exact and fast; the last one loads real tiny models.
"""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path
from typing import Any

import pytest

from ortgen.serve.engine import Engine
from ortgen.serve.engine_stats import EngineStats
from ortgen.serve.errors import RequestError
from ortgen.serve.model_pool import ModelPool, ModelSource, ServedModel


class _StandEngine:
    """What the pool touches of an engine: its stats, and whether it takes rows."""

    def __init__(self, stats: EngineStats) -> None:
        self.stats = stats
        self.accepting = True

    def stop_accepting(self) -> None:
        self.accepting = False


class _Stand:
    """What the pool touches of a served model: an id, an engine, start, stop."""

    def __init__(self, model_id: str, stats: EngineStats) -> None:
        self.id = model_id
        self.engine = _StandEngine(stats)
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self, timeout: float) -> None:
        self.stopped = True


class _Loader:
    """Counts loads; ``fail`` names models whose load raises."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: set[str] = set()
        self.made: list[_Stand] = []

    def __call__(self, source: ModelSource, stats: EngineStats) -> Any:
        self.calls.append(source.id)
        if source.id in self.fail:
            raise OSError(f"cannot read {source.path}")
        model = _Stand(source.id, stats)
        self.made.append(model)
        return model


def _pool(ids: str, max_loaded: int) -> tuple[ModelPool, _Loader]:
    loader = _Loader()
    sources = [ModelSource(i, Path("/models") / i) for i in ids]
    return ModelPool(sources, loader, max_loaded=max_loaded), loader


async def _settle() -> None:
    """Let worker threads (loads, unloads) finish and their results land."""
    for _ in range(50):
        await asyncio.sleep(0.01)


def _states(pool: ModelPool) -> str:
    return " ".join(f"{i}:{pool.state_of(i)}" for i in pool.sources)


def test_least_recently_used_goes_first() -> None:
    async def run() -> None:
        pool, loader = _pool("abc", max_loaded=2)
        for name in "aba":  # a is now more recently used than b
            pool.release(await pool.acquire(name))
        pool.release(await pool.acquire("c"))
        await _settle()
        assert _states(pool) == "a:loaded b:unloaded c:loaded"
        assert loader.calls == ["a", "b", "c"]  # a was loaded once, b never again
        assert pool.stats.loads == {"a": 1, "b": 1, "c": 1}
        assert pool.stats.unloads == {"a": 0, "b": 1, "c": 0}
        assert [m.stopped for m in loader.made] == [False, True, False]

    asyncio.run(run())


def test_a_model_in_use_is_not_unloaded_and_nobody_starves() -> None:
    """--max-loaded 1: b waits for a's request; a second request for a, arriving while
    b waits, waits behind b (a is retiring) instead of keeping a loaded for ever."""

    async def run() -> None:
        pool, loader = _pool("ab", max_loaded=1)
        first_a = await pool.acquire("a")
        order: list[str] = []

        async def use(name: str, hold: float) -> None:
            model = await pool.acquire(name)
            order.append(f"got {name}")
            await asyncio.sleep(hold)
            pool.release(model)

        want_b = asyncio.create_task(use("b", 0.05))
        await _settle()
        want_a = asyncio.create_task(use("a", 0.0))
        await _settle()
        assert not want_b.done() and not want_a.done()
        assert _states(pool) == "a:loaded b:unloaded"  # still answering first_a
        assert not loader.made[0].stopped
        pool.release(first_a)
        await asyncio.wait_for(asyncio.gather(want_b, want_a), 10)
        assert order == ["got b", "got a"]
        assert loader.calls == ["a", "b", "a"]
        assert pool.stats.unloads == {"a": 1, "b": 1}

    asyncio.run(run())


def test_an_idle_model_goes_before_a_busy_one_used_longer_ago() -> None:
    """--max-loaded 2: a is held (and used before b); c must not wait for a's request
    when b, idle, can go at once."""

    async def run() -> None:
        pool, _ = _pool("abc", max_loaded=2)
        held = await pool.acquire("a")
        pool.release(await pool.acquire("b"))
        model = await asyncio.wait_for(pool.acquire("c"), 5)  # a still held
        assert _states(pool) == "a:loaded b:unloaded c:loaded"
        assert pool.stats.unloads == {"a": 0, "b": 1, "c": 0}
        pool.release(model)
        pool.release(held)

    asyncio.run(run())


def test_many_waiters_share_one_load_and_counters_outlive_it() -> None:
    async def run() -> None:
        pool, loader = _pool("ab", max_loaded=1)
        models = await asyncio.gather(*(pool.acquire("b") for _ in range(5)))
        assert loader.calls == ["b"] and len({id(m) for m in models}) == 1
        stats = pool.engine_stats["b"]
        assert models[0].engine.stats is stats  # each load counts into the same object
        for model in models:
            pool.release(model)
        pool.release(await pool.acquire("a"))
        pool.release(await pool.acquire("b"))
        assert loader.made[-1].engine.stats is stats

    asyncio.run(run())


def test_a_failed_load_is_a_500_naming_it_and_the_next_request_tries_again() -> None:
    async def run() -> None:
        pool, loader = _pool("ab", max_loaded=2)
        loader.fail.add("b")
        waiters = await asyncio.gather(
            *(pool.acquire("b") for _ in range(3)), return_exceptions=True
        )
        for error in waiters:
            assert isinstance(error, RequestError)
            assert (error.status, error.code, error.param) == (500, "model_load_failed", "model")
            assert "'b' could not be loaded: OSError: cannot read /models/b" in str(error)
        assert loader.calls == ["b"]  # one load, its failure told to every waiter
        assert pool.state_of("b") == "unloaded"
        loader.fail.clear()
        pool.release(await pool.acquire("b"))
        assert loader.calls == ["b", "b"] and pool.state_of("b") == "loaded"

    asyncio.run(run())


def test_names_unknown_models_and_a_single_model_takes_any_name() -> None:
    pool, _ = _pool("ab", max_loaded=0)
    with pytest.raises(RequestError) as caught:
        pool.resolve("gpt-4o")
    error = caught.value
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert "'gpt-4o' does not exist on this server; it serves 'a', 'b'" in str(error)
    assert pool.resolve(None) == pool.resolve("") == "a"  # the first is the default
    with pytest.raises(RequestError, match="model must be a string"):
        pool.resolve(5)
    single, _ = _pool("a", max_loaded=0)
    assert single.resolve("gpt-4o") == "a"
    with pytest.raises(RequestError) as caught:  # a path names a model exactly
        single.resolve("gpt-4o", optional=False)
    assert caught.value.status == 404


def test_draining_tells_waiters_503() -> None:
    async def run() -> None:
        pool, _ = _pool("ab", max_loaded=1)
        held = await pool.acquire("a")
        waiter = asyncio.create_task(pool.acquire("b"))
        await _settle()
        pool.stop_accepting()
        assert not held.engine.accepting  # the loaded engine takes no new rows
        with pytest.raises(RequestError) as caught:
            await asyncio.wait_for(waiter, 5)
        assert caught.value.status == 503
        pool.release(held)
        await pool.close(1.0)

    asyncio.run(run())


def test_pool_arguments_are_checked() -> None:
    source = ModelSource("a", Path("/a"))
    with pytest.raises(ValueError, match="at least one model"):
        ModelPool([], None)
    with pytest.raises(ValueError, match="unique"):
        ModelPool([source, source], None)
    with pytest.raises(ValueError, match="max_loaded"):
        ModelPool([source], None, max_loaded=-1)


def test_an_unloaded_model_is_freed(two_text_models) -> None:
    """Real tiny models: after its unload, nothing holds the generator (its onnxruntime
    session and cache go with it), and its decode thread has ended. The generator sits
    in reference cycles: the unload must run the cyclic collector, or a server (which
    makes few Python objects) keeps every unloaded model in memory for a long time."""
    import ortgen

    def load(source: ModelSource, stats: EngineStats) -> ServedModel:
        gen = ortgen.load(source.path, threads=1)
        return ServedModel(source.id, gen, Engine(gen, max_batch=2, stats=stats))

    async def run() -> None:
        pool = ModelPool(
            [ModelSource(name, path) for name, path in two_text_models.items()], load, max_loaded=1
        )
        llama = await pool.acquire("llama")
        gen, thread = weakref.ref(llama.gen), llama.engine._thread
        assert thread.is_alive()
        pool.release(llama)
        del llama
        pool.release(await pool.acquire("qwen2"))
        await _settle()
        assert gen() is None  # freed by the unload itself (no gc.collect() here)
        await pool.close(5.0)
        assert not thread.is_alive()

    asyncio.run(run())
