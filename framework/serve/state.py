"""What the routes of ``ortgen serve`` share: the models (``model_pool``), limits,
counters and the rows in flight, and the drain that SIGTERM starts.

A request owns its rows from :meth:`ServerState.admit` to :meth:`ServerState.release`;
whatever is unfinished at release (the client left, the server drains) is cancelled, so
the engine never works for nobody.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from ..errors import ConfigError, InputError
from .batch_store import BatchStore
from .batch_worker import BatchWorker
from .engine import QueueFull, RowHandle, ShuttingDown
from .errors import RequestError, shutting_down
from .files_store import FileStore
from .metrics import HttpStats
from .model_pool import ModelPool, ServedModel
from .openai_api import ParsedRequest, check_row
from .responses import Choice

log = logging.getLogger("ortgen.serve")


class ServerState:
    """What the routes share: the models, limits, counters, live rows."""

    def __init__(
        self,
        models: ModelPool,
        *,
        api_key: str | None = None,
        max_body_bytes: int = 1 << 20,
        web: bool = True,
        files_dir: Path | None = None,
    ) -> None:
        self.models = models
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.web = web  # the chat page at / (``--no-web``: off)
        self.http = HttpStats()
        self.accepting = True
        self.handles: set[RowHandle] = set()
        self.created = int(time.time())
        #: the Files and Batches API (``--files-dir``): None when it is off
        self.files = FileStore(files_dir) if files_dir is not None else None
        self.batch_worker = (
            BatchWorker(self.files, BatchStore(files_dir), models)
            if self.files is not None and files_dir is not None
            else None
        )

    def admit(self, model: ServedModel, request: ParsedRequest) -> list[RowHandle]:
        """Check every row, then queue them all on ``model``'s engine (or none: a full
        queue cancels the rows this request queued already)."""
        if not self.accepting:
            raise shutting_down()
        engine = model.engine
        chains = [check_row(engine, model.gen, row, request) for row in request.rows]
        handles: list[RowHandle] = []
        try:
            for row, chain in zip(request.rows, chains, strict=True):
                handles.append(engine.submit(row.prompt, row.settings, chain=chain))
        except Exception as exc:
            for handle in handles:
                handle.cancel()
            if isinstance(exc, QueueFull):
                raise RequestError(
                    str(exc), status=429, kind="rate_limit_error", code="queue_full"
                ) from None
            if isinstance(exc, ShuttingDown):
                raise shutting_down() from None
            if isinstance(exc, ConfigError | InputError):
                raise RequestError(str(exc)) from None
            raise
        self.handles.update(handles)
        self.http.in_flight += 1
        return handles

    def release(self, model: ServedModel, handles: list[RowHandle], choices: list[Choice]) -> None:
        """The request is answered (or abandoned): cancel its unfinished rows, and let go
        of its model."""
        for handle, choice in zip(handles, choices, strict=True):
            if not choice.ended:
                handle.cancel()
            self.handles.discard(handle)
        self.http.in_flight -= 1
        self.models.release(model)

    def cancel_all(self) -> None:
        for handle in list(self.handles):
            handle.cancel()

    async def drain(self, grace: float) -> None:
        """SIGTERM: refuse new requests (503), give those in flight ``grace`` seconds,
        then cancel what is left and wait (briefly) for those answers to go out."""
        self.accepting = False
        self.models.stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.http.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.http.in_flight:
            log.warning("grace period over; cancelling %d request(s)", self.http.in_flight)
            self.cancel_all()
            deadline = loop.time() + 5.0
            while self.http.in_flight and loop.time() < deadline:
                await asyncio.sleep(0.05)
