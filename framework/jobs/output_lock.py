"""One job per output: an advisory lock file beside the output while a job writes it.

Two ``ortgen run`` jobs on one output each read the ids already written, then append the
rows they think are missing: the file ends with rows twice and interleaved (measured: 72
lines for 40 ids). So a job takes ``OUT.lock`` (an exclusive ``flock``) before it reads
or repairs the output and holds it until it stops; a second job finds it taken and stops
with an error naming the first job's pid.

``flock`` belongs to the open file, so the OS releases it when the process dies however
it dies (a SIGKILL, an out-of-memory kill): a stale lock *file* may stay, but never a
held lock, and the next job takes it. The pid written inside is only for the message.
The file is removed on release; a job that opened the old file just before that checks,
once it holds the lock, that the path still names the file it locked, and otherwise
tries again, so two jobs can never both believe they hold it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ..errors import OutputError

__all__ = ["OutputLock", "lock_path"]


def lock_path(output: Path) -> Path:
    """The lock file of ``output``: ``OUT.lock`` in the same folder."""
    return output.with_name(output.name + ".lock")


class OutputLock:
    """The exclusive right to write one job output, for as long as it is held."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.path = lock_path(output)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`OutputError` naming the job that holds it."""
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise OutputError(
                    f"the output {self.output} is being written by another ortgen job "
                    f"({holder}); wait for it to finish, or give another --output"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            if _names(self.path, fd):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._fd = fd
            else:  # the holder removed this file as we opened it: take the new one
                os.close(fd)

    def release(self) -> None:
        """Remove the lock file and let the lock go (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still held: no other job holds this inode yet
        os.close(self._fd)  # closing releases the flock
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` is still the file open as ``fd`` (it may have been removed)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)


def _read_pid(fd: int) -> str:
    """'pid N' from the holder's lock file, as far as it can be read."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "its pid is not recorded yet"
