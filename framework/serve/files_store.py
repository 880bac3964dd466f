"""The files of OpenAI's Files API on disk (``ortgen serve --files-dir DIR``).

Each file is two entries of ``DIR/files/``: ``<id>.data`` (the bytes as uploaded, or a
batch's output as written) and ``<id>.json`` (its OpenAI file object). The bytes go in
first and the object last, each through a temporary name and ``os.replace``, so a file
is listed only once it is whole, and a server started again on the same folder lists
what the last one kept. Nothing here knows HTTP: the routes are ``files_api``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import IO, Any

from .errors import RequestError

__all__ = ["OUTPUT_PURPOSE", "PURPOSES", "FileStore", "new_id", "no_file", "write_json"]

#: what an upload's ``purpose`` may be (OpenAI's); the server reads only "batch" files
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
#: the purpose of the files a batch writes
OUTPUT_PURPOSE = "batch_output"
_ID = re.compile(r"file-[0-9a-f]{32}")


def no_file(file_id: str, param: str | None = None) -> RequestError:
    """OpenAI's 404 for a file id this server does not hold."""
    return RequestError(
        f"no file with id {file_id[:80]!r} on this server",
        param=param,
        status=404,
        code="file_not_found",
    )


class FileStore:
    """The files under one folder: uploaded, listed, read and deleted by id."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "files"
        self.folder.mkdir(parents=True, exist_ok=True)

    def add(self, source: IO[bytes], filename: str, purpose: str) -> dict[str, Any]:
        """Store the bytes ``source`` reads as a new file; its file object."""
        file_id = new_id()
        partial = self.folder / f"{file_id}.data.part"
        with partial.open("wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
        return self.adopt(partial, filename, purpose, file_id)

    def adopt(
        self, path: Path, filename: str, purpose: str, file_id: str | None = None
    ) -> dict[str, Any]:
        """Make ``path`` (a file in this folder, written whole) a stored file, moved under
        its id; its file object."""
        file_id = file_id or new_id()
        data = self.folder / f"{file_id}.data"
        os.replace(path, data)
        entry = {
            "id": file_id,
            "object": "file",
            "bytes": data.stat().st_size,
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        write_json(self.folder / f"{file_id}.json", entry)
        return entry

    def scratch(self, name: str) -> Path:
        """A path in this folder to write a file before :meth:`adopt` takes it."""
        return self.folder / f"{name}.part"

    def get(self, file_id: str, param: str | None = None) -> dict[str, Any]:
        """The file object of ``file_id``; 404 when there is none."""
        path = self._meta(file_id)
        try:
            entry = json.loads(path.read_text(encoding="utf-8")) if path is not None else None
        except (OSError, ValueError):
            entry = None
        if not isinstance(entry, dict):
            raise no_file(file_id, param)
        return entry

    def content(self, file_id: str) -> Path:
        """Where the bytes of ``file_id`` are; 404 when there is no such file."""
        self.get(file_id)
        return self.folder / f"{file_id}.data"

    def listing(self) -> list[dict[str, Any]]:
        """Every file object, oldest first (by creation, then id)."""
        entries = []
        for path in self.folder.glob("file-*.json"):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # deleted while listed
            if isinstance(entry, dict):
                entries.append(entry)
        return sorted(entries, key=lambda e: (e.get("created_at", 0), e.get("id", "")))

    def delete(self, file_id: str) -> None:
        """Remove a file (its object first, so it is never listed without its bytes)."""
        self.get(file_id)
        for suffix in (".json", ".data"):
            (self.folder / f"{file_id}{suffix}").unlink(missing_ok=True)

    def _meta(self, file_id: str) -> Path | None:
        """The object's path for an id of the right shape (never a path elsewhere)."""
        return self.folder / f"{file_id}.json" if _ID.fullmatch(file_id) else None


def new_id(prefix: str = "file-") -> str:
    """A new id: the time in nanoseconds, then random digits (32 hex digits in all), so
    ids made one after another sort in that order, within one second too."""
    return f"{prefix}{time.time_ns():016x}{uuid.uuid4().hex[:16]}"


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` whole or not at all (a temporary name, then ``os.replace``)."""
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(value), encoding="utf-8")
    os.replace(partial, path)
