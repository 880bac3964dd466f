"""``run_job``: a file of requests through one loaded model, batch by batch.

Rows are read ``window`` at a time, sorted by prompt length within the window (rows of
one batch then need little padding) and generated ``batch_size`` at a time with the
API's own per-row shape. A bad row or a failing request becomes an error line and the
job goes on; when a whole batch fails, its rows are retried one by one, so only the
row that fails is reported. Finished rows are appended as they complete (see
``results.py``), so a killed job picks up where it stopped.

:class:`RowRunner` (a window of rows to result lines) and the checks and writing around
it are shared with the ray engine (``ray_engine.py``), so both give the same lines.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..chat_formats.reply import ReplyPlan, read_reply
from ..errors import ConfigError, InputError, OrtgenError
from ..loop.embedding import check_embedder
from ..request import build_chat, row_settings
from ..request.prompts import row_settings as own_settings
from ..request.sessions import changed_settings
from ..structured.response_format import parse_json_output
from ..structured.settings import CONSTRAINT_FIELDS, constraint
from .check import InputReport
from .embedding import TASKS, EmbedOptions, RowEmbedder, is_embedding
from .fingerprint import job_print, reconcile, stamp
from .formats import JobFormat, job_format, model_name
from .progress import JobSummary, Progress
from .results import ResultLog
from .rows import (
    InputRow,
    RowChecker,
    chat_options,
    chunks,
    error_line,
    id_key,
    replaces_constraint,
)

if TYPE_CHECKING:
    from ..api import TextGenerator
    from ..request.outputs import GenerationOutput

__all__ = [
    "RAY_NEEDS_ITS_RUNNER",
    "RowRunner",
    "check_one_result_per_row",
    "check_sizes",
    "chunks",
    "recheck",
    "run_job",
    "scan_unique",
    "write_records",
]

RAY_NEEDS_ITS_RUNNER = (
    "run_job runs rows in this process (the local engine); for the ray engine use "
    "ortgen.jobs.ray_engine.run_ray_job (or `ortgen run --engine ray`)"
)
ONE_RESULT_PER_ROW = "ortgen run writes one result per row; num_return_sequences must be 1"


@dataclass(frozen=True)
class _Ready:
    """A row whose prompt is encoded: it can join a batch."""

    row: InputRow
    ids: list[int]
    own: dict[str, Any]  # the row's own settings
    plan: ReplyPlan | None = None  # a chat row's answer is read back (thought, calls)


def run_job(
    gen: TextGenerator,
    input_path: str | Path,
    output_path: str | Path,
    *,
    batch_size: int = 8,
    window: int = 256,
    engine: str = "local",
    settings: Mapping[str, Any] | None = None,
    progress: TextIO | None = sys.stderr,
    input_format: str | None = None,
    rerun_changed: bool = False,
    task: str = "generate",
    embedding: EmbedOptions | None = None,
) -> JobSummary:
    """Generate for every row of ``input_path`` not already in ``output_path``.

    ``settings`` are the job's call layer (a row's own settings win over them; the
    generator's pipeline is the layer below). ``progress``: where the live line (only on
    a terminal) and the summary go; None for silence. ``input_format``: ``"ortgen"``
    (rows), ``"openai"`` (OpenAI batch lines, answered with its output lines) or None /
    ``"auto"`` (by the first line; ``formats.job_format``). Raises before any row runs
    when the job as a whole cannot work (bad settings, duplicate ids, unusable output,
    rows done under other settings: ``rerun_changed`` does those again, see
    ``fingerprint.py``; both formats). ``task``: ``"generate"``, or ``"embed"``: each
    ortgen row's ``text`` (or ``input``) embedded as ``gen.embed`` embeds it alone, pooled
    by ``embedding`` (``embedding.EmbedOptions``; a row's own options win); a model that
    cannot embed stops the job first. An OpenAI batch file's lines say their task by
    their url.
    """
    if engine != "local":
        raise ConfigError(RAY_NEEDS_ITS_RUNNER if engine == "ray" else f"unknown engine {engine!r}")
    check_sizes(batch_size, window)
    settings = dict(settings or {})
    options = embed_options(task, embedding)
    check_one_result_per_row(gen.resolve_config(settings).config.num_return_sequences)
    fmt = job_format(input_path, input_format, model=model_name(gen.path), task=task)
    if options is not None:
        check_embedder(gen.model, gen.path, options.pooling, options.dimensions)
    report = fmt.scan_unique(input_path)
    pipeline = gen.pipeline.settings if gen.pipeline is not None else {}
    fingerprint = job_print(gen.path, pipeline, settings, embedding=options)
    results = fmt.results(output_path)
    results.open()
    try:
        reconcile(
            fingerprint, results, fmt.rows(input_path), output_path, rerun_changed=rerun_changed
        )
        done = results.done
        tracker = Progress(report.rows, len(report.ids & done), progress)
        job = RowRunner(gen, settings, batch_size, embedding=options)
        checker = fmt.checker(job.check_settings)
        # read as the ray driver reads them (each row's fingerprint from what it says),
        # then checked with the job's settings, as a ray worker checks them
        for rows in chunks(fmt.rows(input_path), window):
            todo = [row for row in rows if id_key(row.id) not in done]
            prints = {id_key(row.id): fingerprint.row(row) for row in todo}
            for records in job.run_window([fmt.recheck(row, checker) for row in todo]):
                write_records(results, tracker, stamp(records, prints))
        results.finish()
    finally:
        results.close()
    return tracker.finish()


def recheck(row: InputRow, checker: RowChecker) -> InputRow:
    """A row read without settings checks, checked again by ``checker`` (its own settings
    over the job's); a row already bad stays as it is (``JobFormat.recheck``)."""
    return JobFormat().recheck(row, checker)


def check_sizes(batch_size: int, window: int) -> None:
    """Both engines refuse the same bad sizes, before anything runs."""
    for name, value in (("batch_size", batch_size), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def check_one_result_per_row(num_return_sequences: int) -> None:
    """A result line is one row's one answer: resume finds it by the row's id."""
    if num_return_sequences != 1:
        raise ConfigError(ONE_RESULT_PER_ROW)


def scan_unique(input_path: str | Path) -> InputReport:
    """The input's report (rows, ids) in ortgen's row format; raises when two rows share
    an id, since resume finds rows by id and would take them for one row (a format's
    own: ``JobFormat.scan_unique``)."""
    return JobFormat().scan_unique(input_path)


def write_records(results: ResultLog, progress: Progress, records: list[dict[str, Any]]) -> None:
    """Append finished rows (one write, then fsync) and count them: the one place both
    engines make rows durable."""
    results.append(records)
    errors = sum("error" in r for r in records)
    # tokens made; an embedding row's: the tokens it read
    tokens = sum(_tokens(r["usage"]) for r in records if "usage" in r)
    progress.add(len(records) - errors, errors, tokens)


def _tokens(usage: Mapping[str, int]) -> int:
    return usage.get("completion_tokens", usage.get("prompt_tokens", 0))


def embed_options(task: str, embedding: EmbedOptions | None) -> EmbedOptions | None:
    """The job's pooling options when it embeds (the defaults unless given), None when it
    generates; a bad task (or options for a job that generates) raises before anything
    runs."""
    if task not in TASKS:
        raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "generate":
        if embedding is not None:
            raise ConfigError('embedding options are for task "embed"')
        return None
    return embedding or EmbedOptions()


class RowRunner:
    """Rows to result lines with one loaded model: the per-window work of both engines
    (the local job in this process, each ray actor in its own), so a row gives the same
    line, or the same error line, whichever engine runs it.

    ``generate``: what runs a batch's requests (each ``{"prompt": ids, **own settings}``)
    into one output, ``gen.generate(requests, **settings)`` unless given: the server's
    Batches API passes its serving engine's (``ortgen.serve.batch_worker``)."""

    def __init__(
        self,
        gen: TextGenerator,
        settings: dict[str, Any],
        batch_size: int,
        generate: Callable[[list[dict[str, Any]]], GenerationOutput] | None = None,
        embedding: EmbedOptions | None = None,
    ) -> None:
        self.gen = gen
        self.settings = settings
        self.batch_size = batch_size
        self._generate = generate or (lambda requests: gen.generate(requests, **settings))
        self._job_wants_json: bool | None = None  # rows without settings of their own
        # embedding rows (an embed job's, an OpenAI line's): pooled as ``embedding`` says
        self.embedder = RowEmbedder(gen, embedding or EmbedOptions(), batch_size)

    def check_settings(self, own: dict[str, Any]) -> None:
        """A row's settings, resolved over the job's as its request will resolve them
        (``ortgen.request.row_settings``: a row's own constraint replaces the job's)."""
        self.gen.resolve_config(row_settings(self.settings, own))

    def run_window(self, rows: list[InputRow]) -> Iterator[list[dict[str, Any]]]:
        """Result lines for ``rows``, a group at a time (bad rows, then each batch), so
        the caller makes each group durable as soon as it exists."""
        ready: list[_Ready] = []
        failed: list[dict[str, Any]] = []
        embeds: list[InputRow] = []
        for row in rows:
            if row.error is not None:
                failed.append(error_line(row, row.error))
                continue
            if is_embedding(row.request):
                embeds.append(row)
                continue
            try:
                ready.append(self._ready(row))
            except OrtgenError as exc:
                failed.append(error_line(row, _about_the_prompt(str(exc), row.number)))
        if failed:
            yield failed
        if embeds:
            yield from self.embedder.run(embeds)
        ready.sort(key=lambda r: len(r.ids))  # stable: equal lengths keep file order
        for batch in chunks(ready, self.batch_size):
            yield self._run_batch(batch)

    def _ready(self, row: InputRow) -> _Ready:
        """A row's prompt and own settings. A ``messages`` row goes through the request
        builder (``ortgen.request.build_chat``, as ``gen.chat()``) with the job's settings
        and its own, its chat options (``tools``, ``response_format``, ...) apart: its own
        settings are then what its request changed (the constraint its tools or thought
        make), so it still joins a batch."""
        request = row.request or {}
        if "messages" not in request:
            ids, own = self.gen.prompts.encode_row(request, row.number)
            return _Ready(row, ids, own)
        own, options = chat_options(own_settings(request))
        call = self.settings
        if replaces_constraint(options):  # a row's own constraint replaces the job's
            call = {k: v for k, v in call.items() if k not in CONSTRAINT_FIELDS}
        wanted = row_settings(call, own)
        config = self.gen.resolve_config(wanted).config
        given = [k for k in CONSTRAINT_FIELDS if wanted.get(k) not in (None, False)]
        found = constraint(config)
        if found is not None and not given and not replaces_constraint(options):
            wanted[found[0]] = found[1]  # the pipeline's ([output]): after a thought, too
        chat = build_chat(
            self.gen,
            request["messages"],
            wanted,
            tools=options.get("tools"),
            tool_choice=options.get("tool_choice"),
            parallel_tool_calls=options.get("parallel_tool_calls"),
            response_format=options.get("response_format"),
            template_kwargs=options.get("chat_template_kwargs"),
            reasoning_effort=options.get("reasoning_effort"),
            chat_format=config.chat_format,
        )
        ids = self.gen.prompts.check_ids(chat.prompt, row.number)
        return _Ready(row, ids, changed_settings(chat.settings, self.settings), chat.plan)

    def _run_batch(self, batch: list[_Ready]) -> list[dict[str, Any]]:
        requests = [{"prompt": r.ids, **r.own} for r in batch]
        try:
            out = self._generate(requests)
        except Exception as exc:  # the job outlives any one request, whatever it raised
            if len(batch) > 1:  # find the row that fails: the others still complete
                return [record for ready in batch for record in self._run_batch([ready])]
            message = str(exc) if isinstance(exc, OrtgenError) else f"{type(exc).__name__}: {exc}"
            server = not isinstance(exc, ConfigError | InputError)  # not what the row asked
            return [error_line(batch[0].row, message, server=server)]
        texts = out.text if isinstance(out.text, list) else [out.text] * len(batch)
        return [self._record(ready, out, i, texts[i]) for i, ready in enumerate(batch)]

    def _record(self, ready: _Ready, out: GenerationOutput, i: int, text: Any) -> dict[str, Any]:
        """Row ``i``'s result line. A chat row read back by its plan has the answer's
        content as ``text``, its thought as ``reasoning_content`` and its calls as
        ``tool_calls`` (finish reason "tool_calls" when whole calls ended it). Under a
        JSON constraint (``[output]``, or a ``json_schema``/``json_object`` setting) it
        carries ``parsed``, the JSON value (of the content, after a thought); a row that
        did not end as whole JSON is an error row saying why, since a result line's
        ``parsed`` is a promise a downstream reader relies on. That error row keeps its
        ``usage``: its tokens were generated, and the job's tokens/s counts them."""
        record: dict[str, Any] = {"id": ready.row.id, "text": text}
        reason = out.finish_reasons[i]
        plan = ready.plan
        if plan is not None:
            reply = read_reply(text or "", plan, reason)
            record["text"], reason = reply.content or "", reply.finish_reason
            if reply.reasoning_content is not None:
                record["reasoning_content"] = reply.reasoning_content
            if reply.tool_calls:
                record["tool_calls"] = reply.tool_calls
        record.update(
            tokens=out.tokens[i],
            finish_reason=reason,
            usage={"prompt_tokens": len(ready.ids), "completion_tokens": len(out.tokens[i])},
        )
        if ready.row.meta is not None:  # another format's line, answered as the server
            return {**record, "meta": ready.row.meta}  # answers: no ``parsed`` promise
        if plan is not None and plan.json_answer:  # after a thought: the content's JSON
            value, why = parse_json_output(record["text"], reason)
        elif (plan is None or not plan.calls_allowed) and self._wants_json(ready.own):
            value = out.parsed[i] if out.parse_errors is not None else None
            why = out.parse_errors[i] if out.parse_errors else "the model gave no text to parse"
        else:
            return record
        if why is not None:
            return {**error_line(ready.row, why), "usage": record["usage"]}
        return {**record, "parsed": value}

    def _wants_json(self, own: dict[str, Any]) -> bool:
        """Whether a row's request (its own settings over the job's) asks for JSON; a row
        may ask for another schema, or for none (``"json_schema": null``). Rows without
        settings of their own share the job's answer, resolved once."""
        if own:
            return self._asks_for_json(row_settings(self.settings, own))
        if self._job_wants_json is None:
            self._job_wants_json = self._asks_for_json(self.settings)
        return self._job_wants_json

    def _asks_for_json(self, settings: dict[str, Any]) -> bool:
        config = self.gen.resolve_config(settings).config
        return config.json_schema is not None or config.json_object


def _about_the_prompt(message: str, number: int) -> str:
    """The encoder names a prompt by its index in a call; in a job that is the row's
    line, which the error line already gives."""
    for tail in (" ", ":"):
        message = message.replace(f"prompt {number}{tail}", f"the prompt{tail}", 1)
    return message
