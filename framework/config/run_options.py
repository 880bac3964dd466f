"""``[run]`` of a pipeline file: how ``ortgen run`` works through an input file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, Problem
from ..plugin_host.registry import did_you_mean

__all__ = ["EMBED_KEYS", "ENGINES", "TASKS", "RunOptions", "read_run"]

_RUN_DEFAULTS: dict[str, Any] = {
    "batch_size": 8,
    "engine": "local",
    "window": 256,
    "address": None,
    "workers": 1,
    "task": "generate",
    "pooling": "last",
    "normalize": True,
    "dimensions": None,
}
ENGINES = ("local", "ray")
#: ``[run] task``
TASKS = ("generate", "embed")
#: the ``[run]`` keys of an embed job (``ortgen.jobs.embedding.EmbedOptions``)
EMBED_KEYS = ("pooling", "normalize", "dimensions")


@dataclass(frozen=True)
class RunOptions:
    """``[run]``: how ``ortgen run`` works through an input file."""

    batch_size: int = 8  # rows per generate call
    engine: str = "local"  # "local" or "ray"
    window: int = 256  # rows read ahead and sorted by length, for less padding
    address: str | None = None  # ray engine: the cluster to join (None: a local Ray)
    workers: int = 1  # ray engine: actors, each with the model loaded once
    task: str = "generate"  # or "embed": each row's text embedded
    pooling: str = "last"  # task "embed": "last" or "mean"
    normalize: bool = True  # task "embed": L2-normalised vectors
    dimensions: int | None = None  # task "embed": the first N components


def read_run(table: Any, problems: list[Problem]) -> RunOptions:
    """``[run]``: every problem added to ``problems`` (the option's default kept)."""
    if not isinstance(table, Mapping):
        problems.append(("run", f"[run] must be a table, got {table!r}"))
        return RunOptions()
    values = dict(_RUN_DEFAULTS)
    for key, value in table.items():
        if key not in _RUN_DEFAULTS:
            hint = did_you_mean(key, list(_RUN_DEFAULTS))
            problems.append((f"run.{key}", f"[run] {key}: unknown option{hint}"))
            continue
        values[key] = value
    address = values["address"]
    if address is not None and not (isinstance(address, str) and address):
        problems.append(
            ("run.address", f"[run] address must be HOST:PORT (a string), got {address!r}")
        )
        values["address"] = None
    for key in ("batch_size", "window", "workers"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append((f"run.{key}", f"[run] {key} must be an integer >= 1, got {value!r}"))
            values[key] = _RUN_DEFAULTS[key]
    if values["engine"] != "ray" and (values["address"] is not None or values["workers"] != 1):
        problems.append(
            ("run.engine", '[run] address and workers are for the ray engine: set engine = "ray"')
        )
    if values["engine"] not in ENGINES:
        message = f"[run] engine must be one of {', '.join(ENGINES)}, got {values['engine']!r}"
        problems.append(("run.engine", message))
        values["engine"] = "local"
    _embed_options(values, problems)
    return RunOptions(**values)


def _embed_options(values: dict[str, Any], problems: list[Problem]) -> None:
    """``[run] task`` and an embed job's pooling options, checked as ``gen.embed`` checks
    them; a bad one is a problem and its default is kept. Whether they go with the task
    is ``ortgen run``'s to say (``--task embed`` may make them the job's)."""
    from ..loop.embedding import check_options

    if values["task"] not in TASKS:
        message = f"[run] task must be one of {', '.join(TASKS)}, got {values['task']!r}"
        problems.append(("run.task", message))
        values["task"] = "generate"
    if not isinstance(values["normalize"], bool):
        got = values["normalize"]
        problems.append(("run.normalize", f"[run] normalize must be true or false, got {got!r}"))
        values["normalize"] = True
    for key in ("pooling", "dimensions"):
        try:
            check_options(values["pooling"], values["dimensions"])
        except InputError as exc:
            if exc.field == key:
                problems.append((f"run.{key}", f"[run] {exc}"))
                values[key] = _RUN_DEFAULTS[key]
