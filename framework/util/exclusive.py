"""A guard for objects one thread drives at a time: a second thread gets an error, not a race.

A request (a step object, a chat session) holds buffers onnxruntime writes into and
per-row state its components advance; two threads stepping it at once would interleave
both without a crash to tell. Waiting for the other thread would hide the bug instead of
naming it, so the guard refuses at once: the loaded model is what threads share, and
each thread starts its own request (or ``fork()``s one).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import InputError


class Exclusive:
    """Refuses a second thread while one is inside ``hold()`` (see module doc)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> Exclusive:
        return Exclusive(self.what)  # a copy of the object is a new object to drive

    @contextmanager
    def hold(self, action: str) -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            raise InputError(
                f"{self.what} is already running {action}() or another call in another thread: "
                "one thread drives a request at a time. The loaded model is safe to share: "
                "start one request (or chat session) per thread, or fork() this one"
            )
        try:
            yield
        finally:
            self._lock.release()
