"""The serving engine: one decode loop per model, fed by requests from many clients.

The HTTP layer (``ortgen.serve.app``) turns an OpenAI request into rows (one per
choice) and submits each with :meth:`Engine.submit`; it gets a :class:`RowHandle`
whose :meth:`RowHandle.pieces` yields :class:`~ortgen.api.StreamPiece` objects as the
decode loop produces them, and which a client that hangs up cancels.

The loop runs in its own thread (onnxruntime releases the GIL while it computes, so the
event loop stays responsive) and hands pieces to the event loop with
``call_soon_threadsafe``. Settings are validated in :meth:`Engine.submit`, in the
caller's thread, so a bad request fails before it is queued.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..api import StreamPiece, TextGenerator
from ..errors import InputError

#: what ends a row's piece stream when the engine itself fails the row
_ERROR = "error"


class QueueFull(InputError):
    """Too many requests are waiting; the HTTP layer answers 429."""


class ShuttingDown(InputError):
    """The server stopped accepting requests; the HTTP layer answers 503."""


@dataclass
class EngineStats:
    """Counters for ``/metrics``."""

    requests: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    batch_size: int = 0
    queue_length: int = 0
    first_token_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=512))
    decode_tokens_per_s: float = 0.0


class RowHandle:
    """One submitted row: its pieces as they come, and a way to cancel it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, prompt: list[int], settings: dict) -> None:
        self.prompt = prompt
        self.settings = settings
        self.submitted = time.perf_counter()
        self.first_token_s: float | None = None
        self.error: Exception | None = None  # why the row ended with finish_reason "error"
        self.cancelled = threading.Event()
        self._loop = loop
        self._queue: asyncio.Queue[StreamPiece | None] = asyncio.Queue()
        self.tokens = 0

    def cancel(self) -> None:
        """Stop generating this row (the client went away); its slot frees at the next step."""
        self.cancelled.set()

    async def pieces(self) -> AsyncIterator[StreamPiece]:
        """The row's pieces; the last has a ``finish_reason``."""
        while True:
            piece = await self._queue.get()
            if piece is None:
                return
            yield piece
            if piece.finish_reason is not None:
                return

    # -- called from the engine thread ---------------------------------------------

    def push(self, piece: StreamPiece) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.submitted
        self.tokens += 1
        self._loop.call_soon_threadsafe(self._queue.put_nowait, piece)

    def fail(self, error: Exception) -> None:
        self.error = error
        self._loop.call_soon_threadsafe(
            self._queue.put_nowait, StreamPiece(text="", token=-1, finish_reason=_ERROR)
        )


class Engine:
    """Runs submitted rows on one model (see module doc)."""

    def __init__(self, gen: TextGenerator, *, max_batch: int = 8, max_queue: int = 64) -> None:
        if max_batch < 1 or max_queue < 0:
            raise ValueError("max_batch must be at least 1 and max_queue at least 0")
        self.gen = gen
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.stats = EngineStats()
        self._waiting: collections.deque[RowHandle] = collections.deque()
        self._wake = threading.Condition()
        self._accepting = True
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="ortgen-engine", daemon=True)

    # -- the HTTP side -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def check(self, prompt: list[int], settings: dict[str, Any]) -> None:
        """Raise ``ConfigError``/``InputError`` naming what is wrong with one row."""
        config = self.gen.resolve_config(settings).config
        self.gen.prompts.check_ids(prompt, 0)
        if config.num_beams != 1 or config.num_return_sequences != 1:
            raise InputError(
                "the server runs one sequence per row: num_beams and "
                "num_return_sequences must be 1 (ask for n choices instead)"
            )
        context = self.gen.model.max_context
        wanted = len(prompt) + (config.max_new_tokens or 0)
        if context is not None and wanted > context:
            raise InputError(
                f"the prompt ({len(prompt)} tokens) plus max_tokens ({config.max_new_tokens}) "
                f"exceeds the model's context of {context} tokens"
            )

    def submit(self, prompt: list[int], settings: dict[str, Any]) -> RowHandle:
        """Queue one row (call from the event loop's thread; settings checked first)."""
        if not self._accepting:
            raise ShuttingDown("the server is shutting down")
        self.check(prompt, settings)
        handle = RowHandle(asyncio.get_running_loop(), prompt, settings)
        with self._wake:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"{len(self._waiting)} requests are already waiting (--max-queue); retry later"
                )
            self._waiting.append(handle)
            self.stats.requests += 1
            self.stats.queue_length = len(self._waiting)
            self._wake.notify()
        return handle

    def stop_accepting(self) -> None:
        self._accepting = False

    @property
    def busy(self) -> bool:
        with self._wake:
            return bool(self._waiting) or self.stats.batch_size > 0

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel what is left and stop the loop thread."""
        self._accepting = False
        with self._wake:
            for handle in self._waiting:
                handle.cancel()
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout)

    # -- the engine thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._stopped:
                    self._wake.wait()
                if self._stopped and not self._waiting:
                    return
                handle = self._waiting.popleft()
                self.stats.queue_length = len(self._waiting)
            self._serve_one(handle)

    def _serve_one(self, handle: RowHandle) -> None:
        """One row alone (the first engine; continuous batching replaces this)."""
        if handle.cancelled.is_set():
            self._finish(handle, "cancelled")
            return
        self.stats.batch_size = 1
        try:
            state = self.gen.start([handle.prompt], **handle.settings)
            record = state.record
            while not state.is_done:
                if handle.cancelled.is_set():
                    self._finish(handle, "cancelled")
                    return
                token = int(state.step()[0])
                done = state.is_done
                handle.push(
                    StreamPiece(
                        text=state.new_text(0),
                        token=token,
                        logprob=state.logprobs(0)[-1] if record.want_logprobs else None,
                        top_logprobs=state.top_logprobs(0)[-1] if record.top else None,
                        finish_reason=state.finish_reasons[0] if done else None,
                    )
                )
                self.stats.generated_tokens += 1
            self._finish(handle, "finished")
        except Exception as exc:  # a plugin or the model failed: only this row ends
            handle.fail(exc)
            self._finish(handle, "failed")
        finally:
            self.stats.batch_size = 0

    def _finish(self, handle: RowHandle, outcome: str) -> None:
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
        self.stats.prompt_tokens += len(handle.prompt)
        if handle.first_token_s is not None:
            self.stats.first_token_s.append(handle.first_token_s)
        if outcome == "cancelled":
            handle._loop.call_soon_threadsafe(handle._queue.put_nowait, None)
