"""What a job says while it runs and when it ends.

A live progress line (rows, tokens, tok/s, ETA), redrawn in place, only when stderr is a
terminal: in a log file it would be noise. The one-line summary is always written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TextIO

__all__ = ["JobSummary", "Progress"]

_clock = time.perf_counter  # one name to replace in tests that check the live line


@dataclass
class JobSummary:
    """The counts of one ``run_job`` call (this run only, not earlier runs it resumed)."""

    rows_ok: int = 0
    errors: int = 0
    skipped: int = 0  # already in the output from an earlier run
    tokens: int = 0  # completion tokens generated (an embed job: the tokens embedded)
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (
            f"ortgen run: {self.rows_ok} rows ok, {self.errors} errors, "
            f"{self.skipped} skipped (already done), {self.tokens} tokens in "
            f"{self.seconds:.1f} s ({self.tokens_per_s:.1f} tok/s)"
        )


class Progress:
    """Counts rows and tokens as batches finish, and draws the live line when it may."""

    def __init__(self, total: int, skipped: int, stream: TextIO | None) -> None:
        self.summary = JobSummary(skipped=skipped)
        self.total = total
        self.stream = stream
        self.live = stream is not None and _is_terminal(stream)
        self.started = _clock()
        self._drawn = 0.0

    def add(self, ok: int, errors: int, tokens: int) -> None:
        summary = self.summary
        summary.rows_ok += ok
        summary.errors += errors
        summary.tokens += tokens
        summary.seconds = _clock() - self.started
        if self.live and summary.seconds - self._drawn >= 0.2:  # no faster than people read
            self._drawn = summary.seconds
            self._draw(self._line())

    def _line(self) -> str:
        s = self.summary
        done = s.rows_ok + s.errors + s.skipped
        ran = s.rows_ok + s.errors
        left = self.total - done
        eta = f"{left * s.seconds / ran:.0f} s" if ran else "?"
        return (
            f"{done}/{self.total} rows ({s.errors} errors), {s.tokens} tokens, "
            f"{s.tokens_per_s:.1f} tok/s, ETA {eta}"
        )

    def _draw(self, text: str) -> None:
        assert self.stream is not None
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()

    def finish(self) -> JobSummary:
        """Stop the clock, clear the live line, and write the summary."""
        self.summary.seconds = _clock() - self.started
        if self.stream is not None:
            if self.live:
                self.stream.write("\r\x1b[K")
            self.stream.write(self.summary.line() + "\n")
            self.stream.flush()
        return self.summary


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False
