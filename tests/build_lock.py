"""One lock for what the suite builds once and caches (not a test module)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """An exclusive flock beside ``path``: pytest-xdist workers that need the same cached
    build (a reference model, a client's venv) wait for the one building it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
