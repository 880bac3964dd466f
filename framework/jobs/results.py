"""The job's output: append-only result lines that survive a kill at any moment.

Each finished batch is appended with one ``write`` then ``fsync``, so after a SIGKILL
the file holds whole lines plus, at worst, one torn last line. Opening the log again
cuts that torn line off and collects the ids already written, so a rerun with the same
arguments does each remaining row once: none lost, none twice.

A write that fails part way (a full disk, a file-size limit, a signal) is cut back to
where the batch began, so the file never holds a torn line while the job lives: the
error says so, and a rerun resumes. While a job writes its output it holds the output's
lock (``output_lock.py``): a second job on the same output stops instead of appending
the same rows again.

A Parquet output is written at the end from a JSONL progress file beside it
(``OUT.parquet.partial.jsonl``), which is what resume reads while the job is unfinished.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import InputError, OutputError
from .output_lock import OutputLock
from .rows import id_key, is_parquet

__all__ = ["FINGERPRINT", "ResultLog", "open_results", "result_line"]

#: the key of a result line that says under which settings its row was done
#: (``fingerprint.py``)
FINGERPRINT = "fingerprint"

#: the end of every write-fault message: what to do, and that nothing was lost
_RERUN = "run the same command again to continue"


#: Characters some readers take for a line end although JSON keeps them raw in a string:
#: Python's str.splitlines() splits on U+0085, U+2028 and U+2029 (JSON escapes the other
#: ones it knows, all below U+0020), and so do JavaScript's line readers for the last two.
_LINE_BREAKS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_LINE_BREAK_TABLE = str.maketrans(_LINE_BREAKS)


def result_line(record: dict[str, Any]) -> str:
    """One result as one JSON line, without a character any line reader splits on
    (fuzzing found an error message holding a U+2028 that split a row in two)."""
    return json.dumps(record, ensure_ascii=False).translate(_LINE_BREAK_TABLE)


class ResultLog:
    """An append-only JSONL file of result lines, repaired and indexed on open."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: set[str] = set()  # id keys already written
        #: id key -> the fingerprint its line carries (lines written before ortgen kept
        #: one have none)
        self.prints: dict[str, str] = {}
        self.written = 0  # lines this job appended
        self.lock = OutputLock(path)
        self._fd: int | None = None

    def open(self) -> set[str]:
        """Take the output's lock, cut a torn last line, read the ids already done, and
        open for appending. Raises before any row runs when the output cannot be used."""
        if self.path.is_dir():
            raise InputError(
                f"the output {self.path} is a folder; give a file path (.jsonl or .parquet)"
            )
        for path in {self.lock.output, self.path}:  # before a lock file is made beside it
            self._check_regular(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()
        except OSError as exc:
            raise OutputError(f"cannot write the output {self.path}: {_why(exc)}") from exc
        try:
            self._prepare()
            if self.path.exists():
                self._repair_and_index()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            self.lock.release()
            raise OutputError(f"cannot write the output {self.path}: {_why(exc)}") from exc
        except BaseException:
            self.lock.release()
            raise
        return self.done

    def _prepare(self) -> None:
        """What a kind of output does first, under the lock (nothing for JSONL)."""

    @staticmethod
    def _check_regular(path: Path) -> None:
        """A device or pipe is no result file (reading /dev/zero to resume never ends)."""
        if path.exists() and not stat.S_ISREG(path.stat().st_mode):
            raise InputError(f"the output {path} is not a regular file; give a file path")

    def _repair_and_index(self) -> None:
        end = 0  # offset just past the last complete line
        with self.path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                if not raw.endswith(b"\n"):
                    break  # torn by a kill mid-write: its row was not done
                end += len(raw)
                if raw.strip():
                    record = self._result(raw, number)
                    key = id_key(record["id"])
                    self.done.add(key)
                    stamp = record.get(FINGERPRINT)
                    if isinstance(stamp, str):  # most lines share one: keep one copy
                        self.prints[key] = sys.intern(stamp)
        if end != self.path.stat().st_size:
            with self.path.open("r+b") as torn:
                torn.truncate(end)
                os.fsync(torn.fileno())

    def _result_id(self, raw: bytes, number: int) -> Any:
        """The id of a result line (``_result``: the whole line)."""
        return self._result(raw, number)["id"]

    def _result(self, raw: bytes, number: int) -> dict[str, Any]:
        """A result line as the log keeps track of it: its ``"id"`` (the row's) and,
        when it has one, its ``"fingerprint"``."""
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict) or "id" not in record:
            raise InputError(
                f"{self.path} line {number} is not a result line of `ortgen run`, so the job "
                "cannot resume from this file; give another output path"
            )
        return record

    def forget(self, keys: set[str]) -> None:
        """Drop the lines of the rows ``keys`` (done under other settings, to be done
        again) before any row is appended: the file is rewritten without them and put in
        the old one's place (``os.replace``), so a kill leaves the one or the other."""
        assert self._fd is not None, "open() first"
        kept = self.path.with_name(self.path.name + ".tmp")
        try:
            with self.path.open("rb") as lines, kept.open("wb") as out:
                for raw in lines:
                    if not raw.strip() or id_key(self._result_id(raw, 0)) not in keys:
                        out.write(raw)
                out.flush()
                os.fsync(out.fileno())
            os.replace(kept, self.path)
            fd, self._fd = self._fd, None
            os.close(fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            kept.unlink(missing_ok=True)
            raise OutputError(f"cannot write the output {self.path}: {_why(exc)}") from exc
        self.done -= keys
        for key in keys:
            self.prints.pop(key, None)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Write ``records`` as whole lines in one write, then make them durable.

        A write or fsync that fails (``ENOSPC``, ``EFBIG`` past ``ulimit -f``, ``EIO``)
        cuts the file back to where this batch began: its rows were not done, every line
        before them stays. A signal (SIGINT, the CLI's SIGTERM) raised here keeps the
        batch if all of it was written, and otherwise cuts it back the same way."""
        assert self._fd is not None, "open() first"
        batch = list(records)
        data = "".join(result_line(r) + "\n" for r in batch).encode()
        start = os.fstat(self._fd).st_size  # the only writer: the lock says so
        try:
            view = memoryview(data)
            while view:  # a short write (a limit reached) continues, then fails
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            self._cut_back(start)
            raise OutputError(
                f"cannot write the output {self.path}: {_why(exc)}; the {self._kept()} "
                f"rows written before are kept; {_RERUN} once the cause is fixed"
            ) from exc
        except BaseException:  # a signal: keep the batch if it is all there
            if os.fstat(self._fd).st_size == start + len(data):
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
                self.written += len(batch)
            else:
                self._cut_back(start)
            raise
        self.written += len(batch)

    def _kept(self) -> int:
        return len(self.done) + self.written

    def _cut_back(self, size: int) -> None:
        """Drop a partly written batch; the lines before it are already durable."""
        assert self._fd is not None
        with contextlib.suppress(OSError):  # shrinking needs no space; if it fails,
            os.ftruncate(self._fd, size)  # the next open cuts the torn line instead
            os.fsync(self._fd)

    def close(self) -> None:
        """Stop appending and let the output's lock go (also after an error: every line
        written so far stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.lock.release()

    def finish(self) -> None:
        """The job is complete: the output is final."""
        self.close()

    def records(self) -> list[dict[str, Any]]:
        with self.path.open(encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]


class ParquetResults(ResultLog):
    """A JSONL progress file while the job runs; the Parquet file when it is done."""

    def __init__(self, path: Path, *, embedding: bool = False) -> None:
        super().__init__(path.with_name(path.name + ".partial.jsonl"))
        self.final = path
        self.embedding = embedding  # an embed job's columns, even when every row failed
        self.lock = OutputLock(path)  # the output the user named, not the progress file
        self._copy_of_final = False  # the progress file is the finished file's rows

    def open(self) -> set[str]:
        from .parquet import require_pyarrow

        require_pyarrow()  # before any row runs, not at the end
        return super().open()

    def _prepare(self) -> None:
        if not self.path.exists() and self.final.exists():
            self._seed_from_final()  # a finished job run again: its rows are done
            self._copy_of_final = True

    def forget(self, keys: set[str]) -> None:
        super().forget(keys)
        self._copy_of_final = False

    def close(self) -> None:
        """As a JSONL log's; a progress file that is still a copy of the finished Parquet
        file (a job that stopped before its first row) is dropped."""
        if self._copy_of_final and self.written == 0 and self.lock.held:
            self.path.unlink(missing_ok=True)
            self._copy_of_final = False
        super().close()

    def _seed_from_final(self) -> None:
        from .parquet import read_parquet_results

        seed = self.path.with_name(self.path.name + ".tmp")
        lines = (result_line(r) + "\n" for r in read_parquet_results(self.final))
        seed.write_text("".join(lines), encoding="utf-8")
        os.replace(seed, self.path)

    def finish(self) -> None:
        """Write the Parquet file from every line, then drop the progress file. If the
        Parquet file cannot be written, the progress file stays: a rerun writes it."""
        from .parquet import write_parquet_results

        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            write_parquet_results(self.records(), self.final, embedding=self.embedding)
            self.path.unlink()  # under the lock: no other job sees a half-finished pair
        except OSError as exc:
            raise OutputError(
                f"cannot write the output {self.final}: {_why(exc)}; every row is kept in "
                f"{self.path}; {_RERUN} once the cause is fixed"
            ) from exc
        finally:
            self.close()


def open_results(path: str | Path, *, embedding: bool = False) -> ResultLog:
    """The result store for ``path``: JSONL, or Parquet by its suffix (``embedding``: an
    embed job's table)."""
    path = Path(path)
    return ParquetResults(path, embedding=embedding) if is_parquet(path) else ResultLog(path)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
