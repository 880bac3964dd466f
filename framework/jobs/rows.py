"""Reading a job's input: one request per JSONL line or Parquet row, checked on its own.

A bad row never stops the job: it comes back as an :class:`InputRow` with an ``error``
(and, when it has no usable ``"id"``, its line number as its id), so it becomes one
error line in the output. Rows are read lazily, so a file larger than memory streams.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

from ..chat_formats.tools import tool_spec
from ..errors import InputError, OrtgenError
from ..request.prompts import row_settings
from ..structured.response_format import response_format_settings
from ..structured.settings import CONSTRAINT_FIELDS

__all__ = [
    "CHAT_OPTIONS",
    "InputRow",
    "RowChecker",
    "RowReader",
    "SettingsCheck",
    "chat_options",
    "check_chat_options",
    "chunks",
    "error_line",
    "id_key",
    "is_parquet",
    "read_rows",
    "replaces_constraint",
]

PARQUET_SUFFIXES = (".parquet", ".pq")
#: what a ``messages`` row may carry besides settings, named as in OpenAI's chat
#: completions: the chat request's options, taken out before its settings are resolved
CHAT_OPTIONS = (
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "chat_template_kwargs",
    "reasoning_effort",
)
#: Checks a row's own settings (merged over the job's); raises ConfigError when bad.
SettingsCheck = Callable[[dict[str, Any]], None]
T = TypeVar("T")


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
    #: what a line of another input format (an OpenAI batch line, ``openai_batch``) needs
    #: to be answered in its own shape; result lines carry it to the output, which drops it
    meta: dict[str, Any] | None = None

    @property
    def where(self) -> str:
        return f"{self.unit} {self.number}"


def error_line(
    row: InputRow, message: str, *, server: bool = False, param: str | None = None
) -> dict[str, Any]:
    """A row's error line; ``server``: it failed while it ran, not for what it asked (the
    server would answer 500), which a line of another format (``row.meta``) tells, as it
    tells ``param``, the body's field at fault."""
    record: dict[str, Any] = {"id": row.id, "error": f"{row.where}: {message}"}
    if row.meta is not None:
        meta = {**row.meta, "server_error": True} if server else dict(row.meta)
        if param is not None:
            meta["error"] = {**(meta.get("error") or {}), "param": param}
        record["meta"] = meta
    return record


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


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
        own, options = chat_options(row_settings(request))
        if "prompt" in request:
            _check_prompt(request["prompt"])
            if options:
                raise InputError(
                    f'"{next(iter(options))}" is for a chat: give the row "messages", not "prompt"'
                )
        else:
            _check_messages(request["messages"])
        own.update(check_chat_options(options, own))
        if own and self._check_settings is not None:
            self._check_settings(own)


def chat_options(own: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A row's own keys as (settings, chat options)."""
    options = {k: v for k, v in own.items() if k in CHAT_OPTIONS}
    return {k: v for k, v in own.items() if k not in CHAT_OPTIONS}, options


def replaces_constraint(options: Mapping[str, Any]) -> bool:
    """Whether a row's chat options constrain its answer (``response_format``, or tools
    it may call): that constraint replaces the job's, as a row's own constraint does."""
    if options.get("response_format") not in (None, {"type": "text"}):
        return True
    return bool(options.get("tools")) and options.get("tool_choice") != "none"


def check_chat_options(options: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """Check a row's chat options without the model (the request builder checks them
    again, with it); returns the settings its ``response_format`` stands for."""
    tools, choice = options.get("tools"), options.get("tool_choice")
    if tools is not None or choice is not None:
        tool_spec(tools, choice, options.get("parallel_tool_calls"))
        if tools is None and choice != "none":
            tool_spec([], choice)  # raises: a choice with no tools
    kwargs = options.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InputError('"chat_template_kwargs" must be an object of template variables')
    effort = options.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise InputError(f'"reasoning_effort" must be a string, got {_short(effort)}')
    added = response_format_settings(options.get("response_format"))
    given = [k for k in CONSTRAINT_FIELDS if own.get(k) not in (None, False)]
    if given and replaces_constraint(options):
        what = "response_format" if added else "tools"
        raise InputError(f"give {what} or {given[0]}, not both: a request follows one constraint")
    return added


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


#: Turns one parsed line or row (its number, "line" or "row", the data) into an InputRow.
RowReader = Callable[[int, str, Any], InputRow]


def read_rows(path: str | Path, checker: RowReader) -> Iterator[InputRow]:
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


def _read_jsonl(path: Path, checker: RowReader) -> Iterator[InputRow]:
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
