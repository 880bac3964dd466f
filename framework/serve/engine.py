"""The serving engine: one decode loop per model, fed by requests from many clients.

The HTTP layer (``ortgen.serve.app``) turns an OpenAI request into rows (one per
choice) and submits each with :meth:`Engine.submit`; it gets a :class:`RowHandle`
whose :meth:`RowHandle.pieces` yields :class:`~ortgen.request.outputs.StreamPiece`
objects as the decode loop produces them, and which a client that hangs up cancels.

The loop runs in its own thread (onnxruntime releases the GIL while it computes, so the
event loop stays responsive) and hands pieces to the event loop with
``call_soon_threadsafe``. Settings are validated in :meth:`Engine.submit`, in the
caller's thread, so a bad request fails before it is queued.

``background=True`` rows (the Batches API's, ``ortgen.serve.batch_worker``) wait in an
unbounded queue of their own, taken from only when no live row waits (their submitter
keeps few rows in it): a live request joins the open batch at the next step."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from ..api import TextGenerator
from ..config import GenerationConfig
from ..errors import InputError
from ..loop.chain import Chain
from ..loop.generate import Generation
from ..loop.step_report import StepReport
from ..model.memory import trim_heap
from ..plugin_host.chains import build_chain
from ..request import start_row
from ..request.outputs import StreamPiece
from .engine_stats import EngineStats

#: positions per row the shared cache starts with (it doubles when a row needs more)
SLOT_POSITIONS = 256
#: the most keys/values an idle batch keeps of the prompt it holds for the next request
#: (``slots``' ``keep_bytes``; 32 MiB: 728 tokens of the default model, 46 KiB each)
IDLE_KEEP_BYTES = 32 << 20
#: what ends a row's piece stream when the engine itself fails the row
_ERROR = "error"


class QueueFull(InputError):
    """Too many requests are waiting; the HTTP layer answers 429."""


class ShuttingDown(InputError):
    """The server stopped accepting requests; the HTTP layer answers 503."""


class RowHandle:
    """One submitted row: its pieces as they come, and a way to cancel it."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, prompt: list[int], settings: dict, chain: Chain
    ) -> None:
        self.prompt = prompt
        self.settings = settings
        self.chain = chain  # its components, built when it was checked (no cache yet)
        self.submitted = time.perf_counter()
        self.first_token_s: float | None = None
        self.error: Exception | None = None  # why the row ended with finish_reason "error"
        self.outcome: str | None = None  # "finished", "failed" or "cancelled" once it ended
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
        self.note_first_token()
        self.tokens += 1
        self._loop.call_soon_threadsafe(self._queue.put_nowait, piece)

    def note_first_token(self) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.submitted

    def fail(self, error: Exception) -> None:
        self.error = error
        self._loop.call_soon_threadsafe(
            self._queue.put_nowait, StreamPiece(text="", token=-1, finish_reason=_ERROR)
        )


class Engine:
    """Runs submitted rows on one model (see module doc)."""

    def __init__(
        self,
        gen: TextGenerator,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        share_prefixes: bool = True,
        cache: tuple[str, dict[str, Any]] | None = None,
        stats: EngineStats | None = None,
        release_memory: bool = True,
    ) -> None:
        if max_batch < 1 or max_queue < 0:
            raise ValueError("max_batch must be at least 1 and max_queue at least 0")
        self.gen = gen
        #: (name, params) of the KV cache plugin every row shares; None: the built-in
        #: one for the graph. It must have the RowSlots capability (checked at start).
        self.cache = cache
        self.max_batch = max_batch
        self.max_queue = max_queue
        #: whether a row starts from a prompt prefix a slot holds (``ortgen.plugins.kv_slots``)
        self.share_prefixes = share_prefixes
        #: give memory back when the batch empties (``slots`` keeps one prefix, the heap
        #: is trimmed: ``ortgen.model.memory``); False: ``ortgen serve --keep-memory``
        self.release_memory = release_memory
        #: the counters; a server passes the same object to each engine a model gets
        #: (it may be unloaded and loaded again), so its counters only grow
        self.stats = stats if stats is not None else EngineStats()
        self._waiting: collections.deque[RowHandle] = collections.deque()
        self._background: collections.deque[RowHandle] = collections.deque()
        self._wake = threading.Condition()
        self._accepting = True
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="ortgen-engine", daemon=True)
        self._batch: Generation | None = None  # the open batch, made with the first row
        self._pad = gen.resolve_config({}).config.padding_id

    # -- the HTTP side -------------------------------------------------------------

    def start(self) -> None:
        self.open_batch()  # a cache that cannot serve fails here, before any request
        self._thread.start()

    def check(self, prompt: list[int], settings: dict[str, Any]) -> GenerationConfig:
        """The row's resolved config; ``ConfigError``/``InputError`` naming what is wrong."""
        config = self.gen.resolve_config(settings).config
        self.gen.prompts.check_ids(prompt, 0)
        if config.cache is not None:
            raise InputError(
                "the server manages the KV cache itself; remove `cache`", field="cache"
            )
        if config.num_beams != 1 or config.num_return_sequences != 1:
            raise InputError(
                "the server runs one sequence per row: num_beams and "
                "num_return_sequences must be 1 (ask for n choices instead)",
                field="num_beams",
            )
        self.gen.max_length(config, len(prompt))  # the library's rule: clipped at the context
        return config

    def check_components(self, prompt: list[int], config: GenerationConfig) -> Chain:
        """Build the row's components (no cache yet) from :meth:`check`'s config, so a
        factory that refuses a value fails the request before anything is sent; the row
        runs with these very components."""
        ctx = self.gen.context([prompt], config)
        return build_chain(self.gen.registry, ctx, cache=("none", None))

    def submit(
        self,
        prompt: list[int],
        settings: dict[str, Any],
        *,
        chain: Chain | None = None,
        background: bool = False,
    ) -> RowHandle:
        """Queue one row (call from the event loop's thread). ``chain``: its components
        from :meth:`check_components`, when the caller checked the row already.
        ``background``: a low-priority row (see the module doc), never refused as
        ``QueueFull``."""
        if not self._accepting:
            raise ShuttingDown("the server is shutting down")
        if chain is None:
            chain = self.check_components(prompt, self.check(prompt, settings))
        handle = RowHandle(asyncio.get_running_loop(), prompt, settings, chain)
        with self._wake:
            if self._stopped:  # shut down between the check above and here (an unload)
                raise ShuttingDown("the model was unloaded; retry")
            if background:
                self._background.append(handle)
            elif len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"{len(self._waiting)} requests are already waiting (--max-queue); retry later"
                )
            else:
                self._waiting.append(handle)
            self.stats.requests += 1
            self.stats.queue_length = len(self._waiting)
            self._wake.notify()
        return handle

    def stop_accepting(self) -> None:
        self._accepting = False

    @property
    def alive(self) -> bool:
        """Whether the decode loop thread runs (``/health`` reports a dead one)."""
        return self._thread.is_alive()

    @property
    def busy(self) -> bool:
        with self._wake:
            return bool(self._waiting or self._background) or self.stats.batch_size > 0

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel what is left and stop the loop thread."""
        self._accepting = False
        with self._wake:
            for handle in (*self._waiting, *self._background):  # ended: their waiters hear it
                handle.cancel()
                self._finish(handle, "cancelled")
            self._waiting.clear()
            self._background.clear()  # a stopped engine holds nothing: its gauges say so too
            self.stats.queue_length = 0
            self._stopped = True
            self._wake.notify()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.stats.batch_size = 0

    # -- the engine thread ------------------------------------------------------------

    def _run(self) -> None:
        signature = self.gen.model.signature
        if signature.shared_kv or (signature.has_attention_mask and signature.has_position_ids):
            self._run_batched()
        else:  # a concat graph without a mask or positions cannot hold padded rows
            self._run_one_by_one()

    def _next_waiting(self, room: int, block: bool) -> list[RowHandle] | None:
        """Up to ``room`` waiting rows, live ones first (background rows only when no
        live row waits); with ``block``, wait for one first. None: stop."""
        with self._wake:
            while block and not (self._waiting or self._background) and not self._stopped:
                self._wake.wait()
            if self._stopped:
                return None
            taken: list[RowHandle] = []
            while self._waiting and len(taken) < room:
                taken.append(self._waiting.popleft())
            while self._background and not self._waiting and len(taken) < room:
                taken.append(self._background.popleft())
            self.stats.queue_length = len(self._waiting)
            return taken

    def _run_batched(self) -> None:
        """Continuous batching on an open ``Generation`` (``ortgen.loop.admission``): between
        two steps, waiting rows join and cancelled ones leave; after a step, finished ones
        leave."""
        rows: list[RowHandle] = []
        while True:
            joining = self._next_waiting(self.max_batch - len(rows), block=not rows)
            if joining is None:
                for handle in rows:
                    self._finish(handle, "cancelled")
                return
            for handle in joining:
                self._admit(rows, handle)
            batch = self._batch
            if batch is None or not rows:
                continue
            # a row may end with its first token (EOS, a limit of 1), or be cancelled
            self._leave(rows, [r for r in range(len(rows)) if not batch.unfinished[r]], None)
            cancelled = [r for r, handle in enumerate(rows) if handle.cancelled.is_set()]
            self._leave(rows, cancelled, "cancelled")
            if not rows:
                self.stats.batch_size = 0  # /metrics: idle, not the last batch's size
                continue
            self.stats.batch_size = len(rows)
            self.stats.peak_batch_size = max(self.stats.peak_batch_size, len(rows))
            started = time.perf_counter()
            try:
                report = batch.step()
            except Exception as exc:  # the model itself failed: every row ends
                for handle in rows:
                    self._fail(handle, exc)
                self._leave(rows, list(range(len(rows))), None)
                self.stats.batch_size = 0
                continue
            seconds = time.perf_counter() - started
            made: list[tuple[RowHandle, list[StreamPiece]]] = []
            for row, handle in enumerate(rows):
                error = batch.errors[row]
                if error is not None:  # its own component raised: only this row ends
                    self._fail(handle, error)
                    continue
                made.append((handle, StreamPiece.since(batch, row, int(report.starts[row]))))
            # counted before any client hears of them: /metrics never lags an answer
            self._rate(sum(len(pieces) for _, pieces in made), seconds)
            self._count_drafts(report)
            for handle, pieces in made:
                for piece in pieces:
                    self._deliver(handle, piece)
            self._leave(rows, [r for r in range(len(rows)) if not batch.unfinished[r]], None)
            self.stats.batch_size = len(rows)

    def _admit(self, rows: list[RowHandle], handle: RowHandle) -> None:
        """Prefill ``handle``'s row into the open batch (made with the first row)."""
        if handle.cancelled.is_set():
            self._finish(handle, "cancelled")
            return
        try:
            batch = self.open_batch()
            chain = dataclasses.replace(
                handle.chain, cache=batch.chain.cache, cache_name=batch.chain.cache_name
            )
            admitted = batch.admit(handle.prompt, chain)
            self.stats.shared_prefills += admitted.shared_prefill
            self.stats.reused_prompt_tokens += admitted.reused_tokens
            row = admitted.row
        except Exception as exc:  # its settings, the cache or the model failed
            self._fail(handle, exc)
            return
        rows.append(handle)
        self.stats.generated_tokens += 1
        error = batch.errors[row]
        if error is not None:
            self._fail(handle, error)
        else:
            for piece in StreamPiece.since(batch, row, batch.row_end(row) - 1):
                self._deliver(handle, piece)

    def _leave(self, rows: list[RowHandle], gone: list[int], outcome: str | None) -> None:
        """Release ``gone`` rows from the batch; ``rows`` follows the batch's new order."""
        if not gone or self._batch is None:
            return
        for row in gone:
            handle = rows[row]
            if handle.outcome is None:  # a failure was counted when it was reported
                self._finish(handle, outcome or "finished")
        order = self._batch.release(gone)
        rows[:] = [rows[i] for i in order]
        if not rows and self.release_memory:
            trim_heap()

    def open_batch(self) -> Generation:
        """The open batch every row joins, over one KV cache for every row (made once; a
        cache that cannot serve is refused here, before any request). Fused graphs:
        ``slots`` for ``max_batch`` rows, positions grown by doubling as the longest row
        needs (only the rows in use are copied). Optimum graphs: ``concat_slots``, the
        batch's rows and columns as they are."""
        if self._batch is None:
            gen = self.gen
            ctx = gen.context([[0]], gen.resolve_config({}).config)
            ctx = dataclasses.replace(ctx, batch_size=self.max_batch, max_length=SLOT_POSITIONS)
            params: dict[str, Any]
            if self.cache is not None:
                name, params = self.cache
            elif gen.model.signature.shared_kv:
                name = "slots"
                params = {"capacity": SLOT_POSITIONS, "share": self.share_prefixes}
                params["compact"] = self.release_memory
                if self.release_memory:
                    params["keep_bytes"] = IDLE_KEEP_BYTES
            else:
                name, params = "concat_slots", {}
            cache = gen.registry.create("kv_cache", name, params, ctx)
            chain = build_chain(gen.registry, ctx, cache=(name, cache))
            self._batch = Generation.open(
                gen.model, chain, pad_token_id=self._pad, tokenizer=gen.tokenizer
            )
        return self._batch

    def _count_drafts(self, report: StepReport) -> None:
        """Speculative decoding's totals for ``/metrics``: drafts proposed and kept."""
        self.stats.drafted_tokens += report.drafted
        self.stats.accepted_drafts += report.kept

    def _rate(self, tokens: int, seconds: float) -> None:
        """Decode tokens/s, smoothed over recent steps (a step may keep several tokens
        per row when it speculates)."""
        self.stats.generated_tokens += tokens
        if seconds > 0:
            rate = tokens / seconds
            previous = self.stats.decode_tokens_per_s
            self.stats.decode_tokens_per_s = rate if not previous else 0.9 * previous + 0.1 * rate

    def _run_one_by_one(self) -> None:
        """Graphs whose rows share one sequence axis (optimum exports) cannot take a row
        joining mid-way: their requests run one after another."""
        while True:
            taken = self._next_waiting(1, block=True)
            if taken is None:
                return
            for handle in taken:
                self._serve_one(handle)

    def _serve_one(self, handle: RowHandle) -> None:
        """One row alone."""
        if handle.cancelled.is_set():
            self._finish(handle, "cancelled")
            return
        self.stats.batch_size = 1
        try:
            config = self.gen.resolve_config(handle.settings).config
            state = start_row(self.gen, handle.prompt, config, handle.chain)  # built once
            while not state.is_done:
                if handle.cancelled.is_set():
                    self._finish(handle, "cancelled")
                    return
                started = time.perf_counter()
                report = state.step()
                pieces = StreamPiece.since(state, 0, int(report.starts[0]))
                self._rate(len(pieces), time.perf_counter() - started)
                self._count_drafts(report)
                for piece in pieces:
                    self._deliver(handle, piece)
            if handle.outcome is None:  # its last piece counted it already
                self._finish(handle, "finished")
        except Exception as exc:  # a plugin or the model failed: only this row ends
            self._fail(handle, exc)
        finally:
            self.stats.batch_size = 0

    def _fail(self, handle: RowHandle, error: Exception) -> None:
        """Count the row as failed (once), then hand its client the error: counted before
        the client hears of it, so /metrics never lags what a client saw."""
        if handle.outcome is None:
            self._finish(handle, "failed")
        handle.fail(error)

    def _deliver(self, handle: RowHandle, piece: StreamPiece) -> None:
        """Hand ``piece`` to the row's client; a row's last piece is counted as finished
        first, so a scrape of /metrics right after an answer already counts its row."""
        if piece.finish_reason is not None and handle.outcome is None:
            handle.note_first_token()
            self._finish(handle, "finished")
        handle.push(piece)

    def _finish(self, handle: RowHandle, outcome: str) -> None:
        handle.outcome = outcome
        self.stats.count_outcome(outcome)
        self.stats.prompt_tokens += len(handle.prompt)
        if handle.first_token_s is not None:
            self.stats.count_first_token(handle.first_token_s)
        if outcome == "cancelled":
            handle._loop.call_soon_threadsafe(handle._queue.put_nowait, None)
