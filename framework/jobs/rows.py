"""Reading a job's input: one request per JSONL line or Parquet row, checked on its own.

A bad row never stops the job: it comes back as an :class:`InputRow` with an ``error``
(and, when it has no usable ``"id"``, its line number as its id), so it becomes one
error line in the output. Rows are read lazily, so a file larger than memory streams.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, OrtgenError
from ..request.prompts import row_settings

__all__ = ["InputRow", "RowChecker", "SettingsCheck", "id_key", "is_parquet", "read_rows"]

PARQUET_SUFFIXES = (".parquet", ".pq")
#: Checks a row's own settings (merged over the job's); raises ConfigError when bad.
SettingsCheck = Callable[[dict[str, Any]], None]


def is_parquet(path: str | Path) -> bool:
    """Parquet by its suffix; anything else is read and written as JSONL."""
    return Path(path).suffix.lower() in PARQUET_SUFFIXES


def id_key(value: Any) -> str:
    """Ids compare as text, so the same row is found again whether its id came back
    from JSON (``3``) or from a Parquet string column (``"3"``)."""
    return str(value)


@dataclass(frozen=True)
class InputRow:
    """One input row: its request (the API's row shape) or why it cannot be one."""

    number: int  # 1-based line (JSONL) or row (Parquet) number
    unit: str  # "line" or "row", for messages
    id: Any  # the row's "id", else its number
    request: dict[str, Any] | None = None  # {"prompt"|"messages": ..., settings...}
    error: str | None = None

    @property
    def where(self) -> str:
        return f"{self.unit} {self.number}"


class RowChecker:
    """Turns one parsed row into an :class:`InputRow`: its id, its shape, its settings."""

    def __init__(self, check_settings: SettingsCheck | None = None) -> None:
        self._check_settings = check_settings

    def __call__(self, number: int, unit: str, data: Any) -> InputRow:
        if not isinstance(data, Mapping):
            kind = "null" if data is None else type(data).__name__
            return InputRow(number, unit, number, error=f"a row must be a JSON object, got {kind}")
        row_id = data.get("id", number)
        if isinstance(row_id, bool) or not isinstance(row_id, str | int):
            return InputRow(
                number, unit, number, error=f'"id" must be a string or an integer, got {row_id!r}'
            )
        request = {k: v for k, v in data.items() if k != "id"}
        try:
            self._check(request)
        except OrtgenError as exc:
            return InputRow(number, unit, row_id, error=str(exc))
        return InputRow(number, unit, row_id, request=request)

    def _check(self, request: dict[str, Any]) -> None:
        own = row_settings(request)
        if "prompt" in request:
            _check_prompt(request["prompt"])
        else:
            _check_messages(request["messages"])
        if own and self._check_settings is not None:
            self._check_settings(own)


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise InputError('"prompt" is empty')
        return
    if isinstance(prompt, list):
        if not prompt:
            raise InputError('"prompt" is an empty list of token ids')
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return
    raise InputError(f'"prompt" must be text or a list of token ids, got {_short(prompt)}')


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InputError(f'"messages" must be a non-empty list of messages, got {_short(messages)}')
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InputError(
                f'messages[{i}] must be an object with a "role", got {_short(message)}'
            )


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_rows(path: str | Path, checker: RowChecker) -> Iterator[InputRow]:
    """Every row of ``path`` (JSONL, or Parquet by its suffix), in file order."""
    path = Path(path)
    try:
        found = path.is_file()
    except OSError as exc:  # a name the system refuses (too long, say)
        raise InputError(f"input file {_short(str(path))}: {exc.strerror}") from None
    if not found:
        raise InputError(f"input file {path} does not exist")
    if is_parquet(path):
        from .parquet import read_parquet_rows

        for number, data in read_parquet_rows(path):
            yield checker(number, "row", data)
        return
    yield from _read_jsonl(path, checker)


def _read_jsonl(path: Path, checker: RowChecker) -> Iterator[InputRow]:
    """Blank lines are not rows, but they count, so numbers are the file's line numbers."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                yield InputRow(number, "line", number, error=f"not UTF-8 text: {exc}")
                continue
            except json.JSONDecodeError as exc:
                yield InputRow(number, "line", number, error=f"not valid JSON: {exc}")
                continue
            except RecursionError:
                yield InputRow(number, "line", number, error="JSON nested too deep to read")
                continue
            yield checker(number, "line", data)
