"""The format of a job's input, and with it the shape of its output lines.

- ``ortgen`` (:class:`JobFormat`): rows in the shape ``generate()`` takes (``rows.py``),
  one result line per row (``results.py``), JSONL or Parquet;
- ``openai``: OpenAI's batch input lines, answered with OpenAI's batch output lines
  (``openai_batch.py``), JSONL.

An embed job (``task = "embed"``) reads ortgen's rows as :class:`EmbedFormat`: a text each
(``embedding.py``); an OpenAI line's url says its task itself.

Both run through the same engines (``runner.RowRunner``, the ray engine): a format only
reads its lines into :class:`InputRow` s, says which problems stop a job before it
starts, and opens the output that writes and resumes its lines. ``auto`` (the default)
takes ``openai`` when the input's first line is a JSON object with a ``"custom_id"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError, InputError
from .check import InputReport, scan_rows
from .embedding import EmbedRowChecker
from .results import ResultLog, open_results
from .rows import InputRow, RowChecker, SettingsCheck, is_parquet, read_rows

__all__ = ["INPUT_FORMATS", "EmbedFormat", "JobFormat", "job_format", "model_name"]

#: what ``--input-format`` takes
INPUT_FORMATS = ("auto", "ortgen", "openai")


class JobFormat:
    """ortgen's own format: rows as ``generate()`` takes them, one result line each."""

    name = "ortgen"
    #: what a row's id is called in messages
    id_name = "id"
    #: what stops a job whose input has rows no id can tell apart
    stop_message = "has rows with the same id"

    def rows(
        self, path: str | Path, check_settings: SettingsCheck | None = None
    ) -> Iterator[InputRow]:
        """Every row of ``path``, checked (``check_settings``: a row's own settings)."""
        return read_rows(path, RowChecker(check_settings))

    def checker(self, check_settings: SettingsCheck | None = None) -> RowChecker:
        """What checks a row of this format with the job's settings (``recheck``)."""
        return RowChecker(check_settings)

    def recheck(self, row: InputRow, checker: RowChecker) -> InputRow:
        """A row read without settings checks (so its fingerprint is what it says),
        checked again by ``checker`` (its own settings over the job's); a row already bad
        stays as it is."""
        if row.error is not None or row.request is None:
            return row
        return checker(row.number, row.unit, {"id": row.id, **row.request})

    def scan(self, path: str | Path, check_settings: SettingsCheck | None = None) -> InputReport:
        """The input's report (rows, bad rows, ids): what a dry run lists."""
        return scan_rows(self.rows(path, check_settings), self.id_name)

    def scan_unique(self, path: str | Path) -> InputReport:
        """The input's report; raises when rows cannot each be found again by their id
        (two rows share one, or a row has none), since resume finds rows by id."""
        report = self.scan(path)
        stops = sorted(report.unnamed + report.duplicates, key=lambda p: int(p[0].split()[-1]))
        if stops:
            listed = "\n".join(f"  - {where}: {why}" for where, why in stops[:10])
            raise InputError(f"{path} {self.stop_message}:\n{listed}")
        return report

    def results(self, path: str | Path) -> ResultLog:
        """The output: JSONL, or Parquet by its suffix."""
        return open_results(path)


class EmbedFormat(JobFormat):
    """ortgen's rows in an embed job: a text each (``embedding.EmbedRowChecker``), one
    embedding line each."""

    def rows(
        self, path: str | Path, check_settings: SettingsCheck | None = None
    ) -> Iterator[InputRow]:
        return read_rows(path, EmbedRowChecker())

    def checker(self, check_settings: SettingsCheck | None = None) -> RowChecker:
        return EmbedRowChecker()

    def recheck(self, row: InputRow, checker: RowChecker) -> InputRow:
        """As read: an embedding row's options do not depend on the job's settings."""
        return row

    def results(self, path: str | Path) -> ResultLog:
        return open_results(path, embedding=True)


def job_format(
    input_path: str | Path,
    given: str | None = None,
    *,
    model: str = "ortgen",
    task: str = "generate",
) -> JobFormat:
    """The format of ``input_path``: ``given`` (one of :data:`INPUT_FORMATS`; None is
    ``auto``), or what its first line looks like. ``model`` names the model in an OpenAI
    answer body; ``task`` (``"embed"``) makes ortgen's rows texts to embed."""
    name = given or "auto"
    if name not in INPUT_FORMATS:
        raise ConfigError(f"input format must be one of {', '.join(INPUT_FORMATS)}, got {name!r}")
    if name == "auto":
        name = "openai" if _looks_like_openai(Path(input_path)) else "ortgen"
    if name == "ortgen":
        return EmbedFormat() if task == "embed" else JobFormat()
    if task == "embed":
        raise ConfigError(
            f"{input_path} holds OpenAI batch lines, whose url says their task: leave out "
            'task = "embed" (a /v1/embeddings line is embedded as the server embeds it)'
        )
    if is_parquet(input_path):
        raise ConfigError(
            f"{input_path}: OpenAI batch input is JSONL (one request object per line), not Parquet"
        )
    from .openai_batch import OpenAIBatch  # it builds on JobFormat

    return OpenAIBatch(model)


def model_name(path: str | Path | None) -> str:
    """What an answer body calls the model, as ``ortgen serve`` names it: a model
    folder's name, a GGUF file's stem."""
    if path is None:
        from ..model.paths import default_model_dir

        path = default_model_dir()
    path = Path(path)
    return path.stem if path.is_file() else path.name


def _looks_like_openai(path: Path) -> bool:
    """Whether the first non-blank line of a JSONL file is a JSON object with a
    ``"custom_id"`` (OpenAI's batch line; ortgen's rows have no such key)."""
    if is_parquet(path) or not path.is_file():
        return False
    with path.open("rb") as lines:
        for raw in lines:
            if raw.strip():
                try:
                    first = json.loads(raw.decode("utf-8"))
                except (ValueError, RecursionError):
                    return False
                return isinstance(first, dict) and "custom_id" in first
    return False
