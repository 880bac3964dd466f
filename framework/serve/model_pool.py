"""Several models behind one server: which are served, which are loaded, and which is
unloaded to make room for another.

Each served model has its own :class:`ServedModel`: its generator, its engine (so its own
batch and decode thread) and its counters. A request names a model by the OpenAI
``model`` field and holds it from :meth:`ModelPool.acquire` to :meth:`ModelPool.release`
(a stream holds it until its last event), so a model is never unloaded under a request.

Models load on first use (in a worker thread: the event loop keeps answering) and, past
``max_loaded``, one is unloaded: the least recently used that no request holds, or, when
every loaded model is busy, the least recently used. A model that must go but still
answers requests is *retiring*: it takes no new requests, and goes when its last request
ends; requests for it wait and load it again afterwards. Evictions are taken one at a
time and waiters are woken in arrival order, so with ``--max-loaded 1`` and two models
the server alternates between them instead of starving one.

Everything here runs on the event loop's thread (only loading and unloading run in
worker threads, and their results are installed back on the loop), so the bookkeeping
needs no lock.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api import TextGenerator
from ..errors import InputError
from .engine import Engine
from .engine_stats import EngineStats
from .errors import RequestError, shutting_down
from .responses import TokenText

log = logging.getLogger("ortgen.serve")

#: seconds an unloaded model's engine gets to stop its decode thread
UNLOAD_TIMEOUT = 10.0


@dataclass(frozen=True)
class ModelSource:
    """A model the server can serve: the id requests name it by, and its folder."""

    id: str
    path: Path


class ServedModel:
    """One loaded model: the generator, the engine that decodes its batch, and what the
    HTTP layer needs of it (its token text, how many rows a request may queue)."""

    def __init__(self, model_id: str, gen: TextGenerator, engine: Engine) -> None:
        if gen.tokenizer is None:
            raise InputError(f"ortgen serve needs a model with a tokenizer; {gen.path} has none")
        self.id = model_id
        self.gen = gen
        self.engine = engine
        self.words = TokenText(gen.tokenizer)
        self.max_rows = max(1, engine.max_queue)  # what one request can surely queue
        self._started = False

    def start(self) -> None:
        """Start the decode thread (once)."""
        if not self._started:
            self._started = True
            self.engine.start()

    def stop(self, timeout: float) -> None:
        """Cancel what the engine holds and stop its decode thread (if it ran)."""
        if self._started:
            self.engine.shutdown(timeout)


#: builds a loaded model from its source; the engine must count into the given stats,
#: which outlive one load (Prometheus counters only grow)
Loader = Callable[[ModelSource, EngineStats], ServedModel]


@dataclass(eq=False)
class _Entry:
    """A model in the pool: loading (``model`` None), loaded, retiring or unloading."""

    model: ServedModel | None = None
    users: int = 0  # requests holding it
    retiring: bool = False  # must go once its users are done: takes no new requests
    unloading: bool = False
    error: BaseException | None = None  # the load failed (waiters raise it)


@dataclass
class PoolStats:
    """Loads and unloads per model, for ``/metrics``."""

    loads: dict[str, int] = field(default_factory=dict)
    unloads: dict[str, int] = field(default_factory=dict)


class ModelPool:
    """The models a server serves, and the (at most ``max_loaded``) loaded ones."""

    def __init__(
        self, sources: list[ModelSource], load: Loader | None, *, max_loaded: int = 0
    ) -> None:
        if not sources:
            raise ValueError("a model pool needs at least one model")
        if max_loaded < 0:
            raise ValueError("max_loaded must be 0 (no limit) or more")
        self.sources = {source.id: source for source in sources}
        if len(self.sources) != len(sources):
            raise ValueError("model ids must be unique")
        self.default_id = sources[0].id
        self.max_loaded = max_loaded
        self.engine_stats = {source.id: EngineStats() for source in sources}
        self.stats = PoolStats(
            loads=dict.fromkeys(self.sources, 0), unloads=dict.fromkeys(self.sources, 0)
        )
        self._load = load
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._tick = asyncio.Event()  # set (and replaced) whenever an entry changes
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = True

    @classmethod
    def single(cls, model: ServedModel) -> ModelPool:
        """A pool of one model, loaded already (it is never unloaded)."""
        pool = cls([ModelSource(model.id, model.gen.path)], None)
        pool.adopt(model)
        return pool

    # -- what is served ---------------------------------------------------------------

    def resolve(self, name: object, *, optional: bool = True) -> str:
        """The id a request's ``model`` field names; an unknown one is OpenAI's 404.

        With ``optional`` (a request body's field): omitted or empty is the first model,
        and a server of one model takes any name, as llama.cpp's server does (clients
        send names like "gpt-4o" they cannot change); the 404 is for servers of several."""
        if optional and (name is None or name == ""):
            return self.default_id
        if not isinstance(name, str):
            raise RequestError("model must be a string", param="model")
        if optional and len(self.sources) == 1:
            return self.default_id
        if name not in self.sources:
            served = ", ".join(repr(model_id) for model_id in self.sources)
            raise RequestError(
                f"the model {name!r} does not exist on this server; it serves {served}",
                param="model",
                status=404,
                kind="invalid_request_error",
                code="model_not_found",
            )
        return name

    def state_of(self, model_id: str) -> str:
        """``"loaded"``, ``"loading"``, ``"unloading"`` or ``"unloaded"``."""
        entry = self._entries.get(model_id)
        if entry is None:
            return "unloaded"
        if entry.model is None:
            return "loading"
        return "unloading" if entry.unloading else "loaded"

    def loaded(self) -> Iterator[ServedModel]:
        """The loaded models (retiring ones too: they still answer their requests)."""
        for entry in list(self._entries.values()):
            if entry.model is not None:
                yield entry.model

    # -- loading before the server starts ---------------------------------------------

    def adopt(self, model: ServedModel) -> None:
        """Take a model loaded before the event loop runs (the first one, so a model that
        cannot load fails the server at startup, not its first request)."""
        if model.id not in self.sources:
            raise ValueError(f"{model.id!r} is not one of this pool's models")
        self.engine_stats[model.id] = model.engine.stats
        self.stats.loads[model.id] += 1
        self._entries[model.id] = _Entry(model=model)

    def load_now(self, model_id: str) -> ServedModel:
        """Load a model in this thread (before the server starts) and keep it."""
        if self._load is None:
            raise ValueError("this pool cannot load models")
        model = self._load(self.sources[model_id], self.engine_stats[model_id])
        self.adopt(model)
        return model

    def start(self) -> None:
        """Start the engines of the models adopted before the event loop ran."""
        for model in self.loaded():
            model.start()

    # -- requests ---------------------------------------------------------------------

    async def acquire(self, name: object) -> ServedModel:
        """The model a request names, loaded (waiting for room if the pool is full);
        the request holds it until :meth:`release`."""
        model_id = self.resolve(name)
        watched: _Entry | None = None
        while True:
            if not self._accepting:
                raise shutting_down()
            if watched is not None and watched.error is not None:
                raise _load_failed(model_id, watched.error)
            entry = self._entries.get(model_id)
            if entry is None and self._has_room():
                entry = self._start_load(model_id)
            if entry is None:
                self._make_room()
            elif entry.model is not None and not entry.retiring:
                entry.users += 1
                self._entries.move_to_end(model_id)  # the most recently used
                return entry.model
            else:
                watched = entry  # loading, retiring or unloading: wait for it
            await self._changed()

    def release(self, model: ServedModel) -> None:
        """A request is done with ``model``; a retiring model goes with its last user."""
        entry = self._entries.get(model.id)
        if entry is None or entry.model is not model:
            return
        entry.users -= 1
        if entry.retiring and entry.users == 0:
            self._start_unload(model.id, entry)

    def stop_accepting(self) -> None:
        """Draining: requests waiting for a model get 503, no model loads, and the loaded
        ones' engines take no new rows (those queued or running go on)."""
        self._accepting = False
        for model in self.loaded():
            model.engine.stop_accepting()
        self._wake()

    async def close(self, timeout: float = 5.0) -> None:
        """Stop every engine (the server is shutting down)."""
        self.stop_accepting()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout + UNLOAD_TIMEOUT)
        models = list(self.loaded())
        self._entries.clear()
        for model in models:
            await asyncio.to_thread(model.stop, timeout)

    # -- loading and unloading --------------------------------------------------------

    def _has_room(self) -> bool:
        return not self.max_loaded or len(self._entries) < self.max_loaded

    def _make_room(self) -> None:
        """Send a loaded model away, unless one is going already: the least recently used
        of those no request holds (it goes at once), else the least recently used."""
        if any(entry.retiring for entry in self._entries.values()):
            return
        loaded = [(i, entry) for i, entry in self._entries.items() if entry.model is not None]
        idle = [(i, entry) for i, entry in loaded if entry.users == 0]
        if not loaded:  # every slot is loading: wait for one
            return
        model_id, entry = (idle or loaded)[0]  # oldest use first
        entry.retiring = True
        _say(f"unloading {model_id} to make room (--max-loaded {self.max_loaded})")
        if entry.users == 0:
            self._start_unload(model_id, entry)

    def _start_load(self, model_id: str) -> _Entry:
        entry = _Entry()
        self._entries[model_id] = entry
        source, stats = self.sources[model_id], self.engine_stats[model_id]
        _say(f"loading {model_id} from {source.path}")

        def load() -> ServedModel:
            if self._load is None:
                raise RuntimeError("this pool cannot load models")
            started = time.perf_counter()
            model = self._load(source, stats)
            model.start()
            _say(f"loaded {model_id} in {time.perf_counter() - started:.1f} s")
            return model

        async def run() -> None:
            try:
                entry.model = await asyncio.to_thread(load)
                self.stats.loads[model_id] += 1
            except Exception as exc:  # the waiters report it; the next request tries again
                log.error("ortgen serve: cannot load %s", model_id, exc_info=exc)
                entry.error = exc
                self._entries.pop(model_id, None)
            self._wake()

        self._spawn(run())
        return entry

    def _start_unload(self, model_id: str, entry: _Entry) -> None:
        entry.unloading = True

        async def run() -> None:
            assert entry.model is not None
            await asyncio.to_thread(entry.model.stop, UNLOAD_TIMEOUT)
            entry.model = None  # the last reference to the model
            if self._entries.get(model_id) is entry:
                del self._entries[model_id]
            # The generator's objects form reference cycles, which only the cyclic
            # collector frees; a server allocates few Python objects, so without this
            # it may not run for many switches, and each unloaded model's sessions and
            # cache would stay in memory until it did (+85 MiB a switch, measured).
            await asyncio.to_thread(gc.collect)
            self.stats.unloads[model_id] += 1
            _say(f"unloaded {model_id}")
            self._wake()

        self._spawn(run())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _changed(self) -> None:
        await self._tick.wait()

    def _wake(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()


def _load_failed(model_id: str, error: BaseException) -> RequestError:
    return RequestError(
        f"the model {model_id!r} could not be loaded: {type(error).__name__}: {error}",
        param="model",
        status=500,
        kind="server_error",
        code="model_load_failed",
    )


def _say(message: str) -> None:
    print(f"ortgen serve: {message}", file=sys.stderr, flush=True)
