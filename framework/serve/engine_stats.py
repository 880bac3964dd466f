"""The serving engine's counters for ``/metrics`` (``ortgen.serve.metrics`` writes them):
what an :class:`~ortgen.serve.engine.Engine` counts as rows come and go, kept by the
model pool across a model's unload and reload."""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass, field

#: upper bounds (seconds) of the time-to-first-token histogram's buckets (/metrics): from
#: a short prompt's prefill on a small model (tens of ms on a CPU) to a long prompt that
#: waited behind a full batch (a minute); the last catches the rest
FIRST_TOKEN_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0)
FIRST_TOKEN_BUCKETS += (7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, float("inf"))


@dataclass
class EngineStats:
    """Counters for ``/metrics``."""

    requests: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    generated_tokens: int = 0
    shared_prefills: int = 0  # rows that copied a held row's prefill of the same prompt
    reused_prompt_tokens: int = 0  # prompt tokens taken from a prefix a slot held
    prompt_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding: tokens drafters proposed
    accepted_drafts: int = 0  # ... and drafts the model kept
    batch_size: int = 0
    peak_batch_size: int = 0  # the most rows one decode step has run
    queue_length: int = 0
    first_token_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=512))
    first_token_sum: float = 0.0  # seconds, over every row that produced a token
    first_token_count: int = 0
    #: rows per FIRST_TOKEN_BUCKETS bucket (each counted once, not cumulative)
    first_token_buckets: list[int] = field(default_factory=lambda: [0] * len(FIRST_TOKEN_BUCKETS))
    decode_tokens_per_s: float = 0.0

    def count_first_token(self, seconds: float) -> None:
        """One more row whose first token came ``seconds`` after it was queued: kept in
        the recent window (the summary's quantiles) and counted in the cumulative sum,
        count and histogram bucket, which a window would lose between two scrapes."""
        self.first_token_s.append(seconds)
        self.first_token_sum += seconds
        self.first_token_count += 1
        self.first_token_buckets[bisect.bisect_left(FIRST_TOKEN_BUCKETS, seconds)] += 1

    def count_outcome(self, outcome: str) -> None:
        """One more row that ended ``outcome`` ("finished", "failed" or "cancelled")."""
        if outcome == "finished":
            self.finished += 1
        elif outcome == "failed":
            self.failed += 1
        elif outcome == "cancelled":
            self.cancelled += 1
        else:
            raise ValueError(f"unknown row outcome {outcome!r}")
