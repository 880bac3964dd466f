"""The batch objects of OpenAI's Batches API, kept in ``DIR/batches/<id>.json``.

A batch object is OpenAI's shape as it is (``id``, ``status``, ``request_counts``, the
files, one timestamp per status reached, ``errors``, ``metadata``), written whole at
every change, so a server started again on the same folder lists every batch it had and
runs again those it had not finished (``batch_worker``). The server is the folder's
only writer; the objects are kept in memory too.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from .errors import RequestError
from .files_store import new_id, write_json

__all__ = ["ACTIVE", "BatchStore", "mark"]

#: statuses of a batch that has not ended
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
#: statuses of a batch that has ended
ENDED = ("completed", "failed", "expired", "cancelled")
#: the one completion window OpenAI takes, in seconds
WINDOW = {"24h": 24 * 3600}
_ID = re.compile(r"batch_[0-9a-f]{32}")


def mark(batch: dict[str, Any], status: str) -> None:
    """Move ``batch`` to ``status``, stamping the status's time (``in_progress_at``...;
    ``validating`` has none: it is the status a batch starts in)."""
    if status not in (*ACTIVE, *ENDED):
        raise ValueError(f"unknown batch status {status!r}")
    batch["status"] = status
    if status != "validating":
        batch[f"{status}_at"] = int(time.time())


class BatchStore:
    """Every batch of one folder, by id."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "batches"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.batches: dict[str, dict[str, Any]] = {}
        for path in sorted(self.folder.glob("batch_*.json")):
            try:
                batch = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # a torn write never happens (os.replace); a hand-edited one may
            if isinstance(batch, dict) and _ID.fullmatch(str(batch.get("id"))):
                self.batches[batch["id"]] = batch

    def create(
        self,
        input_file_id: str,
        endpoint: str,
        window: str,
        metadata: dict[str, str] | None,
        model: str,
    ) -> dict[str, Any]:
        """A new batch, validating: the worker takes it from there."""
        now = int(time.time())
        batch: dict[str, Any] = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": endpoint,
            "model": model,
            "errors": None,
            "input_file_id": input_file_id,
            "completion_window": window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + WINDOW[window],
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
        }
        self.save(batch)
        return batch

    def get(self, batch_id: str) -> dict[str, Any]:
        batch = self.batches.get(batch_id)
        if batch is None:
            raise RequestError(
                f"no batch with id {batch_id[:80]!r} on this server",
                status=404,
                code="batch_not_found",
            )
        return batch

    def newest_first(self) -> list[dict[str, Any]]:
        return sorted(self.batches.values(), key=lambda b: (b["created_at"], b["id"]), reverse=True)

    def save(self, batch: dict[str, Any]) -> None:
        """Keep ``batch`` as it is now (in memory and on disk)."""
        self.batches[batch["id"]] = batch
        write_json(self.folder / f"{batch['id']}.json", batch)
