"""The job's output: append-only result lines that survive a kill at any moment.

Each finished batch is appended with one ``write`` then ``fsync``, so after a SIGKILL
the file holds whole lines plus, at worst, one torn last line. Opening the log again
cuts that torn line off and collects the ids already written, so a rerun with the same
arguments does each remaining row once: none lost, none twice.

A Parquet output is written at the end from a JSONL progress file beside it
(``OUT.parquet.partial.jsonl``), which is what resume reads while the job is unfinished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import InputError
from .rows import id_key, is_parquet

__all__ = ["ResultLog", "open_results"]


class ResultLog:
    """An append-only JSONL file of result lines, repaired and indexed on open."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: set[str] = set()  # id keys already written
        self._fd: int | None = None

    def open(self) -> set[str]:
        """Cut a torn last line, read the ids already done, and open for appending."""
        if self.path.is_dir():
            raise InputError(
                f"the output {self.path} is a folder; give a file path (.jsonl or .parquet)"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self._repair_and_index()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InputError(f"cannot write the output {self.path}: {exc.strerror or exc}") from exc
        return self.done

    def _repair_and_index(self) -> None:
        end = 0  # offset just past the last complete line
        with self.path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                if not raw.endswith(b"\n"):
                    break  # torn by a kill mid-write: its row was not done
                end += len(raw)
                if raw.strip():
                    self.done.add(id_key(self._result_id(raw, number)))
        if end != self.path.stat().st_size:
            with self.path.open("r+b") as torn:
                torn.truncate(end)
                os.fsync(torn.fileno())

    def _result_id(self, raw: bytes, number: int) -> Any:
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict) or "id" not in record:
            raise InputError(
                f"{self.path} line {number} is not a result line of `ortgen run`, so the job "
                "cannot resume from this file; give another output path"
            )
        return record["id"]

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Write ``records`` as whole lines in one write, then make them durable."""
        assert self._fd is not None, "open() first"
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
        view = memoryview(data)
        while view:  # a regular file takes it in one go; loop in case it does not
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def close(self) -> None:
        """Stop appending (also after an error: every line written so far stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def finish(self) -> None:
        """The job is complete: the output is final."""
        self.close()

    def records(self) -> list[dict[str, Any]]:
        with self.path.open(encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]


class ParquetResults(ResultLog):
    """A JSONL progress file while the job runs; the Parquet file when it is done."""

    def __init__(self, path: Path) -> None:
        super().__init__(path.with_name(path.name + ".partial.jsonl"))
        self.final = path

    def open(self) -> set[str]:
        from .parquet import require_pyarrow

        require_pyarrow()  # before any row runs, not at the end
        if not self.path.exists() and self.final.exists():
            self._seed_from_final()  # a finished job run again: its rows are done
        return super().open()

    def _seed_from_final(self) -> None:
        from .parquet import read_parquet_results

        seed = self.path.with_name(self.path.name + ".tmp")
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in read_parquet_results(self.final))
        seed.write_text("".join(lines), encoding="utf-8")
        os.replace(seed, self.path)

    def finish(self) -> None:
        """Write the Parquet file from every line, then drop the progress file."""
        from .parquet import write_parquet_results

        self.close()
        write_parquet_results(self.records(), self.final)
        self.path.unlink()


def open_results(path: str | Path) -> ResultLog:
    """The result store for ``path``: JSONL, or Parquet by its suffix."""
    path = Path(path)
    return ParquetResults(path) if is_parquet(path) else ResultLog(path)
