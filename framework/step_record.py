"""What a request asked to get back besides tokens.

Per generated token: its log-probability under the processed distribution (the
log-softmax of the scores the sampler saw, as transformers'
``compute_transition_scores(..., normalize_logits=True)``) and the ``top_logprobs`` best
alternatives (OpenAI's ``logprobs``/``top_logprobs``). Per step: the raw logits and the
processed scores, one (B, V) array each, as transformers' ``output_logits`` /
``output_scores``.

Log-probabilities are kept in arrays aligned with the token buffer (NaN where a token
was not sampled: prompt, appended turns), so a rewind or a continuation needs no
bookkeeping; only what was asked for is computed.
"""

from __future__ import annotations

import numpy as np


class StepRecord:
    """Per-position log-probabilities and per-step scores of one request."""

    def __init__(
        self,
        batch: int,
        capacity: int,
        *,
        logprobs: bool = False,
        top_logprobs: int = 0,
        scores: bool = False,
        logits: bool = False,
    ) -> None:
        self.want_logprobs = logprobs or top_logprobs > 0
        self.top = top_logprobs
        self.want_scores = scores
        self.want_logits = logits
        self.scores: list[np.ndarray] = []
        self.logits: list[np.ndarray] = []
        self._chosen = np.full((batch, capacity), np.nan, dtype=np.float32)
        self._top_ids = np.zeros((batch, capacity, top_logprobs), dtype=np.int64)
        self._top_values = np.zeros((batch, capacity, top_logprobs), dtype=np.float32)

    @property
    def active(self) -> bool:
        return self.want_logprobs or self.want_scores or self.want_logits

    def reserve(self, capacity: int) -> None:
        """Grow the per-position arrays with the token buffer."""
        grow = capacity - self._chosen.shape[1]
        if grow <= 0:
            return
        self._chosen = np.pad(self._chosen, ((0, 0), (0, grow)), constant_values=np.nan)
        self._top_ids = np.pad(self._top_ids, ((0, 0), (0, grow), (0, 0)))
        self._top_values = np.pad(self._top_values, ((0, 0), (0, grow), (0, 0)))

    def record(
        self, position: int, next_ids: np.ndarray, logits: np.ndarray, scores: np.ndarray
    ) -> None:
        """Keep what was asked for about the tokens written at ``position``."""
        if self.want_logits:
            self.logits.append(np.array(logits, dtype=np.float32, copy=True))
        if self.want_scores:
            self.scores.append(np.array(scores, dtype=np.float32, copy=True))
        if not self.want_logprobs:
            return
        logprobs = log_softmax(scores)
        rows = np.arange(len(next_ids))
        self._chosen[:, position] = logprobs[rows, next_ids]
        if self.top:
            best = np.argpartition(-logprobs, self.top - 1, axis=1)[:, : self.top]
            values = np.take_along_axis(logprobs, best, axis=1)
            order = np.lexsort((best, -values), axis=1)  # best first; ties by token id
            self._top_ids[:, position] = np.take_along_axis(best, order, axis=1)
            self._top_values[:, position] = np.take_along_axis(values, order, axis=1)

    def forget_steps(self, count: int) -> None:
        """Drop the last ``count`` steps' scores/logits (a rewind)."""
        keep = max(0, len(self.scores) - count)
        del self.scores[keep:]
        keep = max(0, len(self.logits) - count)
        del self.logits[keep:]

    def logprobs(self, row: int, start: int, end: int) -> list[float]:
        """Log-probability of each token of ``row`` in [start, end) (NaN: not sampled)."""
        return self._chosen[row, start:end].tolist()

    def top_logprobs(self, row: int, start: int, end: int) -> list[list[tuple[int, float]]]:
        """The best ``top_logprobs`` alternatives at each position of ``row`` in [start, end)."""
        ids = self._top_ids[row, start:end].tolist()
        values = self._top_values[row, start:end].tolist()
        return [list(zip(i, v, strict=True)) for i, v in zip(ids, values, strict=True)]


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32 (``-inf`` stays ``-inf``)."""
    peak = scores.max(axis=1, keepdims=True)
    shifted = scores - peak
    with np.errstate(divide="ignore"):
        return (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(
            np.float32, copy=False
        )
