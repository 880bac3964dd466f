"""``ortgen run --engine ray``: the same job, its rows spread over a pool of Ray actors.

The driver (this process) does what must happen in one place: it reads and checks the
input with the local engine's reader (the same line numbers and the same error rows),
refuses duplicate ids, opens the output with the local engine's resume (torn last line
cut, ids already done skipped), and appends each group of result lines as it comes back,
with the same one-write-then-fsync discipline. A kill at any moment followed by the same
command therefore gives every row once, whichever engine wrote the lines.

The rows that are left go to Ray Data as a dataset of JSON strings (one string column:
rows mix text and token-id prompts and their own settings, which Arrow could not put in
one schema; Ray's own JSON reader would also stop at the first malformed line, where the
job must turn it into an error row). ``map_batches`` runs a pool of actors; each loads
the model once and turns a window of rows into result lines with the local engine's
:class:`RowRunner`, yielding each batch's lines as soon as they exist.

Ray is imported only here, and only when a job runs, so the local engine never needs it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from .. import config as config_mod
from ..errors import ConfigError, OrtgenError
from ..loop.embedding import check_embedder
from ..util import ray_cluster
from ..util.ray_cluster import ray_available
from .embedding import EmbedOptions, is_embedding
from .fingerprint import job_print, reconcile, stamp
from .formats import job_format, model_name
from .openai_batch import LineChecker
from .progress import JobSummary, Progress
from .results import result_line
from .rows import InputRow, RowChecker, id_key
from .runner import (
    RowRunner,
    check_one_result_per_row,
    check_sizes,
    embed_options,
    write_records,
)

if TYPE_CHECKING:
    from ..config.pipeline import Pipeline

__all__ = ["RAY_MISSING", "ray_available", "require_ray", "run_ray_job"]

RAY_MISSING = "the ray engine needs Ray, which is not installed: pip install 'ortgen[ray]'"


def require_ray() -> Any:
    """The ``ray`` module with Ray Data, or an error that says how to get it."""
    return ray_cluster.require("data", "the ray engine")


def run_ray_job(
    pipeline: Pipeline,
    input_path: str | Path,
    output_path: str | Path,
    *,
    model: str | Path | None = None,
    address: str | None = None,
    workers: int = 1,
    threads: int | None = None,
    spin_us: int | None = None,
    batch_size: int = 8,
    window: int = 256,
    settings: Mapping[str, Any] | None = None,
    progress: TextIO | None = sys.stderr,
    input_format: str | None = None,
    rerun_changed: bool = False,
    task: str = "generate",
    embedding: EmbedOptions | None = None,
) -> JobSummary:
    """Generate for every row of ``input_path`` not already in ``output_path``, on Ray.

    ``address``: a running cluster (``HOST:PORT``); None starts a local Ray instance for
    this job. ``workers``: actors, each with the model loaded once, each reserving
    ``threads`` CPUs (1 when None); ``spin_us`` is their sessions' spin (see ``load``).
    The other arguments mean what they mean for :func:`run_job` (``rerun_changed``,
    ``task`` and ``embedding`` too); the output is the same, fingerprints included.
    Raises before any row runs when the job as a whole cannot work."""
    from ..model.session import spin_duration

    check_sizes(batch_size, window)
    spin_duration(spin_us)  # a bad value fails here, not in every worker
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    settings = dict(settings or {})
    options = embed_options(task, embedding)
    # the model's own config files are not read here (the model is loaded only on the
    # workers); each actor checks again with them before its first row
    resolved = config_mod.resolve([("pipeline", pipeline.settings), ("call", settings)])
    check_one_result_per_row(resolved.config.num_return_sequences)
    ray = require_ray()
    model = model or pipeline.model_path()
    # a worker's current directory is not ours: give it a path that means the same there
    model = str(Path(model).expanduser().resolve()) if model is not None else None
    fmt = job_format(input_path, input_format, model=model_name(model), task=task)
    report = fmt.scan_unique(input_path)
    fingerprint = job_print(model, pipeline.settings, settings, embedding=options)
    results = fmt.results(output_path)
    results.open()
    try:
        reconcile(
            fingerprint, results, fmt.rows(input_path), output_path, rerun_changed=rerun_changed
        )
        done = results.done
        pending: list[str] = []
        prints: dict[str, str] = {}  # the driver stamps each line: the same as run_job's
        for row in fmt.rows(input_path):
            key = id_key(row.id)
            if key not in done:
                pending.append(_encode(row))
                prints[key] = fingerprint.row(row)
        tracker = Progress(report.rows, len(report.ids & done), progress)
        if pending:
            started = _connect_keeping_sigterm(ray, address, workers, threads)
            try:
                cpus = float(threads or 1)
                ray_cluster.check_room(ray, workers, cpus, "workers", "--workers or --threads")
                data = ray.data.from_items([{"row": row} for row in pending])
                lines = data.map_batches(
                    _Worker,
                    fn_constructor_kwargs={
                        "model": model,
                        "pipeline": pipeline,
                        "threads": threads,
                        "spin_us": spin_us,
                        "settings": settings,
                        "batch_size": batch_size,
                        "embedding": options,
                    },
                    batch_size=window,
                    batch_format="numpy",
                    compute=ray.data.ActorPoolStrategy(size=workers),
                    num_cpus=cpus,
                )
                for batch in _results(lines):
                    records = [json.loads(line) for line in batch]
                    write_records(results, tracker, stamp(records, prints))
            finally:
                if started:
                    ray.shutdown()
        results.finish()
    finally:
        results.close()
    return tracker.finish()


def _encode(row: InputRow) -> str:
    """A checked row as the text Ray carries: its number, id, request or error, and the
    meta of a line of another format (an OpenAI batch line's url)."""
    if row.error is not None:
        fields: dict[str, Any] = {"error": row.error}
    else:
        fields = {"request": row.request}
    if row.meta is not None:
        fields["meta"] = row.meta
    return json.dumps({"number": row.number, "unit": row.unit, "id": row.id, **fields})


def _decode(text: str, checker: RowChecker, lines: LineChecker) -> InputRow:
    """The row back, its own settings now checked over the model's config as well
    (the driver has no model); the checker is the local engine's, so the error is too.
    An OpenAI batch line (its ``meta``) is checked as its line's row, as locally."""
    data = json.loads(text)
    number, unit, row_id, meta = data["number"], data["unit"], data["id"], data.get("meta")
    if "error" in data:
        return InputRow(number, unit, row_id, error=data["error"], meta=meta)
    if meta is not None:
        return lines.row(number, unit, row_id, data["request"], meta)
    if is_embedding(data["request"]):  # an embed job's row, read whole by the driver
        return InputRow(number, unit, row_id, request=data["request"])
    return checker(number, unit, {"id": row_id, **data["request"]})


class _Worker:
    """One actor of the pool: the model loaded once, then window after window of rows."""

    def __init__(
        self,
        model: str | None,
        pipeline: Pipeline,
        threads: int | None,
        spin_us: int | None,
        settings: dict[str, Any],
        batch_size: int,
        embedding: EmbedOptions | None = None,
    ) -> None:
        from ..api import load

        gen = load(model, pipeline=pipeline, threads=threads, spin_us=spin_us)
        check_one_result_per_row(gen.resolve_config(settings).config.num_return_sequences)
        if embedding is not None:  # the driver has no model: a worker says it cannot embed
            check_embedder(gen.model, gen.path, embedding.pooling, embedding.dimensions)
        self.runner = RowRunner(gen, settings, batch_size, embedding=embedding)
        self.checker = RowChecker(self.runner.check_settings)
        self.lines = LineChecker(self.runner.check_settings)

    def __call__(self, batch: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        rows = [_decode(str(text), self.checker, self.lines) for text in batch["row"]]
        for records in self.runner.run_window(rows):  # each batch back as soon as it is done
            lines = [result_line(r) for r in records]
            yield {"line": np.array(lines, dtype=object)}


def _connect(ray: Any, address: str | None, workers: int, threads: int | None) -> bool:
    """Join the cluster at ``address``, or start a local instance (``ray_cluster``); True
    when this call started Ray (so the job shuts it down), False when the caller had
    already."""
    # enough CPUs for the pool even on a small machine: Ray waits forever otherwise
    cpus = max(os.cpu_count() or 1, workers * (threads or 1))
    if not ray_cluster.connect(ray, address, cpus):
        return False
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the job draws its own progress line
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # e.g. "progress bars disabled"
    return True


def _connect_keeping_sigterm(
    ray: Any, address: str | None, workers: int, threads: int | None
) -> bool:
    """:func:`_connect`, then the caller's SIGTERM handler back: ``ray.init`` installs
    its own (``sys.exit``), which would end the job without the caller's say. The CLI's
    handler stops the job cleanly, and the ``finally`` here shuts down a cluster it
    started."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        return _connect(ray, address, workers, threads)
    finally:
        if in_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _results(lines: Any) -> Iterator[list[str]]:
    """Each group of result lines as the pool hands it back; an ortgen error raised on
    a worker (a model that cannot load there, a bad pipeline) comes back as itself."""
    try:
        for batch in lines.iter_batches(batch_size=None, batch_format="numpy"):
            yield [str(line) for line in batch["line"]]
    except OrtgenError:
        raise
    except Exception as exc:  # Ray wraps what failed on a worker in its own types
        cause = ray_cluster.ortgen_error_in(exc)
        if cause is not None:
            raise cause from None
        raise OrtgenError(f"the Ray job failed: {type(exc).__name__}: {exc}") from exc
