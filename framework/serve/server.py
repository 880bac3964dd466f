"""``ortgen serve``: load the first model (the others load on first use), build the app,
run uvicorn.

Shutdown is ortgen's, not uvicorn's: uvicorn would close the listening socket at once (new
clients get "connection refused" instead of a 503), sse-starlette would cut every stream
at once, and uvicorn re-raises the signal after a graceful exit, so the process would die
of SIGTERM instead of exiting 0. :class:`_Server` takes SIGTERM/SIGINT itself: it drains
(``ServerState.drain``: 503 for new requests, ``--grace`` seconds for those in flight,
then cancels the rest), and only then lets uvicorn shut down, which stops the engine in
the app's lifespan. A second signal cancels everything at once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from ..errors import OrtgenError
from ..model.memory import one_heap
from ..plugin_host.manager import import_plugin
from .app import build_app
from .engine import Engine
from .engine_stats import EngineStats
from .model_pool import ModelPool, ModelSource, ServedModel
from .model_sources import model_sources
from .state import ServerState


def main(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM/SIGINT; 0 after a clean drain."""
    check_flags(args)
    state = build_state(args)
    sock = _bind(args.host, args.port)
    config = uvicorn.Config(
        build_app(state),
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=5,  # after the drain, only idle connections are left
    )
    _Server(config, state, grace=args.grace).run(sockets=[sock])
    print("ortgen serve: stopped", file=sys.stderr, flush=True)
    return 0


def build_state(args: argparse.Namespace) -> ServerState:
    """What the app serves, from the flags: the plugins, the models (the first loaded
    now), the API key and limits. A Ray Serve replica builds its own the same way.
    Unless ``--keep-memory``, every thread allocates from one heap, before any model
    loads (``ortgen.model.memory.one_heap``)."""
    if not args.keep_memory:
        one_heap()
    plugins: list[object] = [import_plugin(spec) for spec in args.plugin]
    sources = model_sources(args.model or [], args.models_dir)
    load = _loader(args, plugins)
    if sources:
        pool = ModelPool(sources, load, max_loaded=args.max_loaded)
        pool.load_now(pool.default_id)  # a model or flag that cannot serve fails now
    else:  # the pipeline's model, or the built-in one (built on first use)
        pool = ModelPool.single(load(None, None))
    return ServerState(
        pool,
        api_key=args.api_key or os.environ.get("ORTGEN_API_KEY") or None,
        max_body_bytes=args.max_body_bytes,
        web=not getattr(args, "no_web", False),
        files_dir=_files_dir(getattr(args, "files_dir", None)),
    )


def _loader(args: argparse.Namespace, plugins: list[object]) -> Callable[..., ServedModel]:
    """How each model loads: the same threads, pipeline, plugins and engine flags for all."""
    from ..api import load

    def load_model(source: ModelSource | None, stats: EngineStats | None) -> ServedModel:
        gen = load(
            source.path if source else None,
            threads=args.threads,
            spin_us=args.spin_us,
            pipeline=args.pipeline,
            plugins=plugins,
            memory_arena=args.keep_memory,  # off: freed tensors go back to the heap
        )
        gen.model.release_memory = not args.keep_memory
        engine = Engine(
            gen,
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            share_prefixes=not args.no_prefix_sharing,
            cache=args.cache,  # (name, params) from --cache, or None: the built-in one
            stats=stats,
            release_memory=not args.keep_memory,
        )
        engine.open_batch()  # a --cache that cannot serve a batch fails now
        return ServedModel(source.id if source else gen.path.name, gen, engine)

    return load_model


def check_flags(args: argparse.Namespace) -> None:
    """The flags' values, checked before anything loads."""
    for flag, value, low in (
        ("--max-batch", args.max_batch, 1),
        ("--max-queue", args.max_queue, 1),  # rows wait in the queue before they join
        ("--max-body-bytes", args.max_body_bytes, 1),
        ("--max-loaded", args.max_loaded, 0),  # 0: no limit
        ("--port", args.port, 0),
    ):
        if value < low:
            raise OrtgenError(f"{flag} must be at least {low}, got {value}")
    if args.port > 65535:
        raise OrtgenError(f"--port must be at most 65535, got {args.port}")
    if args.grace < 0:
        raise OrtgenError(f"--grace must be >= 0 seconds, got {args.grace}")


def _files_dir(given: str | None) -> Path | None:
    """``--files-dir``: the folder, made if missing; an error naming it when it cannot be."""
    if given is None:
        return None
    folder = Path(given)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".ortgen-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OrtgenError(
            f"--files-dir {given}: cannot write there: {exc.strerror or exc}"
        ) from None
    return folder


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a busy port is an ortgen error (status 2)
    and ``--port 0`` can report the port it got."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OrtgenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's Server with ortgen's signal handling (see the module doc)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, *, grace: float) -> None:
        super().__init__(config)
        self.state = state
        self.grace = grace
        self._signals = 0
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Only count here: a signal handler runs between any two bytecodes of the event
        # loop, and on_tick (every 0.1 s) acts. Not recording the signal, as uvicorn's
        # own handler does, keeps uvicorn from re-raising it after a clean exit.
        self._signals += 1

    async def on_tick(self, counter: int) -> bool:
        if self._signals and self._drain is None:
            print("ortgen serve: draining", file=sys.stderr, flush=True)
            self._drain = asyncio.create_task(self.state.drain(self.grace))
        if self._signals > 1:  # asked twice: stop now
            self.state.cancel_all()
            self.should_exit = True
        if self._drain is not None and self._drain.done():
            self.should_exit = True
        return await super().on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets:
            served = ", ".join(self.state.models.sources)
            print(f"ortgen serve: {served} at {_url(sockets[0])}/v1", flush=True)
            if self.state.web:
                print(f"ortgen serve: chat page: open {_url(sockets[0])}/", flush=True)
