"""Embedding rows in ``ortgen run``: ``task = "embed"`` rows and OpenAI's ``/v1/embeddings``
batch lines, through ``gen.embed``.

An embedding row's request is ``{"input": [text or token ids, ...], options...}`` (the
key :data:`EMBED_INPUT` tells it from a generation row): an ortgen row of an embed job
(``{"id", "text"}`` or ``{"id", "input"}``, one text or token-id list, and optionally
its own ``pooling``/``normalize``/``dimensions``) makes one of one text, read by
:class:`EmbedRowChecker`; an OpenAI batch line makes one of its body's texts
(``openai_batch``). :class:`RowEmbedder` runs them for ``runner.RowRunner``: rows sorted
by length, ``batch_size`` rows of the same options in one forward (right-padded: each
text gets its vector as alone, to float rounding), a failing batch retried row by row.

An ortgen row's result line is ``{"id", "embedding": [float, ...], "usage":
{"prompt_tokens"}}`` (a Parquet output: ``embedding`` a list of float32); an OpenAI
line's carries its vectors to ``openai_batch.output_line``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.run_options import TASKS
from ..errors import ConfigError, InputError, OrtgenError
from ..loop.embedding import check_options
from ..request.openai_embeddings import embedding_error
from .rows import InputRow, RowChecker, chunks, error_line

if TYPE_CHECKING:
    from ..api import TextGenerator

__all__ = [
    "EMBED_INPUT",
    "TASKS",
    "EmbedOptions",
    "EmbedRowChecker",
    "RowEmbedder",
    "is_embedding",
]

#: the key of an embedding row's request: its texts
EMBED_INPUT = "input"
#: what an ortgen row of an embed job may call its text
_TEXT_KEYS = ("text", "input")


@dataclass(frozen=True)
class EmbedOptions:
    """How an embed job pools (the server's ``pooling`` and ``dimensions``, and
    ``gen.embed``'s ``normalize``); a row may give its own."""

    pooling: str = "last"
    normalize: bool = True
    dimensions: int | None = None

    def __post_init__(self) -> None:
        check(asdict(self))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(options: Mapping[str, Any]) -> None:
    """Options as ``gen.embed`` takes them, or an InputError naming the bad one."""
    unknown = sorted(set(options) - set(EmbedOptions.__dataclass_fields__))
    if unknown:
        raise InputError(
            f"unknown key {unknown[0]!r}: an embedding row takes text (or input) and "
            "pooling, normalize, dimensions",
            field=unknown[0],
        )
    check_options(options.get("pooling", "last"), options.get("dimensions"))
    normalize = options.get("normalize", True)
    if not isinstance(normalize, bool):
        raise InputError(f"normalize must be true or false, got {normalize!r}", field="normalize")


def is_embedding(request: Mapping[str, Any] | None) -> bool:
    """Whether a row's request asks for embeddings (a generation row has no ``input``)."""
    return request is not None and EMBED_INPUT in request


class EmbedRowChecker(RowChecker):
    """One row of an embed job to an :class:`InputRow` whose request is an embedding
    request of one text; a row without a usable text, or with a key it does not take, is
    an error row."""

    def __call__(self, number: int, unit: str, data: Any) -> InputRow:
        row = super().__call__(number, unit, data)
        return row if row.request is None else self.row(row)

    def _check(self, request: dict[str, Any]) -> None:  # the text is checked in row()
        """Nothing here: ``row`` reads the request (RowChecker's is a generation row's)."""

    def row(self, row: InputRow) -> InputRow:
        request = dict(row.request or {})
        given = [key for key in _TEXT_KEYS if key in request]
        try:
            if len(given) != 1:
                what = "both text and input" if given else "no text"
                raise InputError(f"{what}: an embedding row gives its text as text (or input)")
            text = request.pop(given[0])
            _check_text(text, given[0])
            check(request)
        except InputError as exc:
            return InputRow(row.number, row.unit, row.id, error=str(exc))
        return InputRow(row.number, row.unit, row.id, request={EMBED_INPUT: [text], **request})


def _check_text(text: Any, key: str) -> None:
    if isinstance(text, str) and text:
        return
    if (
        isinstance(text, list)
        and text
        and all(isinstance(t, int) and not isinstance(t, bool) for t in text)
    ):
        return
    got = repr(text)[:60]
    raise InputError(f'"{key}" must be a non-empty text or a list of token ids, got {got}')


@dataclass(frozen=True)
class _Ready:
    row: InputRow
    ids: list[list[int]]  # the request's texts, encoded
    options: tuple[str, bool, int | None]  # (pooling, normalize, dimensions)


class RowEmbedder:
    """Embedding rows to result lines with one loaded model (``options``: the job's, under
    a row's own; an OpenAI line's are its body's)."""

    def __init__(self, gen: TextGenerator, options: EmbedOptions, batch_size: int) -> None:
        self.gen, self.options, self.batch_size = gen, options, batch_size

    def run(self, rows: list[InputRow]) -> Iterator[list[dict[str, Any]]]:
        """Result lines for ``rows`` (all embedding requests), a group at a time."""
        ready: list[_Ready] = []
        failed: list[dict[str, Any]] = []
        for row in rows:
            try:
                ready.append(self._ready(row))
            except InputError as exc:
                failed.append(error_line(row, str(exc), param=embedding_error(exc).param))
        if failed:
            yield failed
        ready.sort(key=lambda r: (repr(r.options), max(map(len, r.ids))))
        groups: dict[tuple[str, bool, int | None], list[_Ready]] = {}
        for item in ready:
            groups.setdefault(item.options, []).append(item)
        for group in groups.values():
            for batch in chunks(group, self.batch_size):
                yield self._run_batch(batch)

    def _ready(self, row: InputRow) -> _Ready:
        request = row.request or {}
        own = {k: v for k, v in request.items() if k != EMBED_INPUT}
        if row.meta is not None:  # an OpenAI line: its body's, as the server takes them
            options = (own.get("pooling", "last"), True, own.get("dimensions"))
        else:
            merged = {**self.options.to_dict(), **own}
            options = (merged["pooling"], merged["normalize"], merged["dimensions"])
        ids, _, _ = self.gen.prompts.encode(request[EMBED_INPUT])
        return _Ready(row, ids, options)

    def _run_batch(self, batch: list[_Ready]) -> list[dict[str, Any]]:
        pooling, normalize, dimensions = batch[0].options
        rows = [ids for ready in batch for ids in ready.ids]
        try:
            vectors = self.gen.embed(
                rows, pooling=pooling, normalize=normalize, dimensions=dimensions
            )
        except Exception as exc:  # the job outlives any one request
            if len(batch) > 1:
                return [line for ready in batch for line in self._run_batch([ready])]
            if isinstance(exc, InputError):
                return [error_line(batch[0].row, str(exc), param=embedding_error(exc).param)]
            message = str(exc) if isinstance(exc, OrtgenError) else f"{type(exc).__name__}: {exc}"
            return [error_line(batch[0].row, message, server=not isinstance(exc, ConfigError))]
        records, start = [], 0
        for ready in batch:
            end = start + len(ready.ids)
            records.append(_record(ready, vectors[start:end]))
            start = end
        return records


def _record(ready: _Ready, vectors: np.ndarray) -> dict[str, Any]:
    tokens = sum(map(len, ready.ids))
    row = ready.row
    if row.meta is None:
        embedding = [float(x) for x in vectors[0]]
        return {"id": row.id, "embedding": embedding, "usage": {"prompt_tokens": tokens}}
    encoding = (row.request or {}).get("encoding_format", "float")
    return {
        "id": row.id,
        "embeddings": [[float(x) for x in v] for v in vectors],
        "encoding_format": encoding,
        "usage": {"prompt_tokens": tokens},
        "meta": row.meta,
    }
