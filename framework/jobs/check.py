"""A pass over a job's input without generating: row count, bad rows, duplicate ids.

``run_job`` uses it for the total (progress, ETA) and to refuse duplicate ids before
anything runs (resume finds rows by id, so two rows with one id would be one row);
``ortgen run --dry-run`` prints it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .rows import InputRow, id_key

__all__ = ["InputReport", "scan_rows"]


@dataclass
class InputReport:
    """What is in an input file: how many rows, which are bad and why."""

    rows: int = 0
    ids: set[str] = field(default_factory=set)  # id keys (see ``id_key``)
    bad: list[tuple[str, str]] = field(default_factory=list)  # (where, why)
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (where, why)
    #: bad rows without an id, which no output line could name (an OpenAI batch line
    #: without a readable custom_id); also in ``bad``
    unnamed: list[tuple[str, str]] = field(default_factory=list)  # (where, why)

    @property
    def problems(self) -> list[tuple[str, str]]:
        return sorted(self.bad + self.duplicates, key=lambda p: int(p[0].split()[-1]))


def scan_rows(rows: Iterable[InputRow], id_name: str = "id") -> InputReport:
    """Count ``rows``, keep each bad row's reason, and find ids used twice (``id_name``:
    what the input format calls a row's id, for the messages)."""
    report = InputReport()
    first: dict[str, str] = {}  # id key -> where it was first seen
    for row in rows:
        report.rows += 1
        if row.error is not None:
            report.bad.append((row.where, row.error))
        if row.id is None:
            report.unnamed.append((row.where, row.error or f"no {id_name}"))
            continue
        key = id_key(row.id)
        if key in first:
            report.duplicates.append(
                (
                    row.where,
                    f"{id_name} {row.id!r} is also the {id_name} of {first[key]}; {id_name}s "
                    "must be unique (a resumed job finds rows by id)",
                )
            )
            continue
        first[key] = row.where
        report.ids.add(key)
    return report
