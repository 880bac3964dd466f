"""Parquet in and out, through pyarrow (optional: JSONL needs nothing).

Results are kept as JSONL while the job runs (append-only, so a kill loses nothing)
and become a Parquet file only at the end; see ``results.py``. A job under a JSON
constraint adds a ``parsed`` column, each row's value as JSON text: a Parquet column has
one type, and the values of one schema need not share one (a field that is a number in
one row and a string in the next, an empty object Parquet cannot store as a struct),
where a string column holds any of them. A chat job's rows may add
``reasoning_content`` (text) and ``tool_calls`` (a list of OpenAI's call structs, the
arguments as the JSON text the model wrote); like ``parsed``, each column is there only
when some row has it, so a job without them keeps its schema. ``fingerprint`` (text) is
what each row was done under (``fingerprint.py``). An embed job's table is ``id``,
``embedding`` (a list of float32), ``usage`` (``prompt_tokens``), ``fingerprint`` and
``error``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError, OrtgenError

__all__ = [
    "read_parquet_results",
    "read_parquet_rows",
    "require_pyarrow",
    "write_parquet_results",
]

_BATCH_ROWS = 1024  # rows decoded at a time: a large file streams
#: the columns only some jobs' rows have: a null cell is a row without the key
_OPTIONAL = ("reasoning_content", "tool_calls", "fingerprint")


def require_pyarrow() -> tuple[Any, Any]:
    """pyarrow's modules, or an error that says how to get them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise OrtgenError(
            "Parquet files need pyarrow, which is not installed: pip install pyarrow "
            "(or use JSONL: one JSON object per line)"
        ) from None
    return pa, pq


def read_parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) for each row. A null cell is a column this row does not
    set (Parquet has one schema for every row), so it is left out of the row."""
    _, pq = require_pyarrow()
    try:
        source = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own types for a file that is not Parquet
        raise InputError(f"{path} is not a readable Parquet file: {exc}") from None
    number = 0
    for batch in source.iter_batches(batch_size=_BATCH_ROWS):
        for row in batch.to_pylist():
            number += 1
            yield number, {k: v for k, v in row.items() if v is not None}


def read_parquet_results(path: Path) -> list[dict[str, Any]]:
    """A finished job's Parquet output, as the result lines it was made from."""
    _, pq = require_pyarrow()
    out = []
    for row in pq.read_table(path).to_pylist():
        if row.get("error") is not None:
            error = {"id": row["id"], "error": row["error"]}
            if row.get("usage") is not None:  # a JSON row cut short: its tokens were made
                error["usage"] = row["usage"]
            if row.get("fingerprint") is not None:
                error["fingerprint"] = row["fingerprint"]
            out.append(error)
            continue
        record = {
            k: v
            for k, v in row.items()
            if k not in ("error", "parsed") and not (k in _OPTIONAL and v is None)
        }
        if row.get("parsed") is not None:  # JSON text; a null cell: a row without it
            record["parsed"] = json.loads(row["parsed"])
        out.append(record)
    return out


def write_parquet_results(
    records: list[dict[str, Any]], path: Path, *, embedding: bool = False
) -> None:
    """Write ``records`` (result lines) as one Parquet table, atomically: a kill leaves
    either the old file or the new one. Ids of mixed types are stored as text.
    ``embedding``: an embed job's table (also when its lines say so)."""
    pa, pq = require_pyarrow()
    ids = [r["id"] for r in records]
    if len({type(i) for i in ids}) > 1:
        ids = [str(i) for i in ids]
    id_type = pa.int64() if ids and isinstance(ids[0], int) else pa.string()
    if embedding or any("embedding" in r for r in records):
        columns = _embedding_columns(pa, records)
    else:
        columns = _generation_columns(pa, records)
    columns = {"id": pa.array(ids, type=id_type), **columns}
    if any("fingerprint" in r for r in records):  # the settings each row was done under
        prints = [r.get("fingerprint") for r in records]
        columns["fingerprint"] = pa.array(prints, type=pa.string())
    columns["error"] = pa.array([r.get("error") for r in records], type=pa.string())
    table = pa.table(columns)
    partial = path.with_name(path.name + ".tmp")
    try:
        pq.write_table(table, partial)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)  # a full disk: do not leave half a table behind
        raise


def _embedding_columns(pa: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    """An embed job's columns (``embedding.py``): the vectors as float32, as computed."""
    usage = pa.struct([("prompt_tokens", pa.int64())])
    return {
        "embedding": pa.array([r.get("embedding") for r in records], pa.list_(pa.float32())),
        "usage": pa.array([r.get("usage") for r in records], type=usage),
    }


def _generation_columns(pa: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A generation job's columns, ``parsed`` and the chat columns when some row has them."""
    usage = pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64())])
    columns = {
        "text": pa.array([r.get("text") for r in records], type=pa.string()),
        **_chat_columns(pa, records),
        "tokens": pa.array([r.get("tokens") for r in records], type=pa.list_(pa.int64())),
        "finish_reason": pa.array([r.get("finish_reason") for r in records], pa.string()),
        "usage": pa.array([r.get("usage") for r in records], type=usage),
    }
    if any("parsed" in r for r in records):  # only a JSON job has the column
        parsed = [
            json.dumps(r["parsed"], ensure_ascii=False) if "parsed" in r else None for r in records
        ]
        columns["parsed"] = pa.array(parsed, type=pa.string())
    return columns


def _chat_columns(pa: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    """``reasoning_content`` and ``tool_calls``, each when some row has it."""
    columns = {}
    if any("reasoning_content" in r for r in records):
        thoughts = [r.get("reasoning_content") for r in records]
        columns["reasoning_content"] = pa.array(thoughts, type=pa.string())
    if any("tool_calls" in r for r in records):
        function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
        call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
        calls = [r.get("tool_calls") for r in records]
        columns["tool_calls"] = pa.array(calls, type=pa.list_(call))
    return columns
