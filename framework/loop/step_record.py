"""What a request asked to get back besides tokens.

Per generated token: its log-probability under the processed distribution (the
log-softmax of the scores the sampler saw, as transformers'
``compute_transition_scores(..., normalize_logits=True)``) and the ``top_logprobs`` best
alternatives (OpenAI's ``logprobs``/``top_logprobs``). Per step: the raw logits and the
processed scores, one (B, V) array each, as transformers' ``output_logits`` /
``output_scores``. Per prompt token (``prompt_logprobs``): its log-probability under
the raw model given the tokens before it, its rank and the best alternatives
(``prompt_scoring``), written during the prefill.

Log-probabilities are kept in arrays aligned with the token buffer (NaN where a token
was not sampled or scored: the prompt unless ``prompt_logprobs`` asked, appended turns),
so a rewind or a continuation needs no bookkeeping; only what was asked for is computed.
"""

from __future__ import annotations

import numpy as np

from ..protocols.candidates import best_first
from .prompt_scoring import PositionScores, TokenLogprob


class StepRecord:
    """Per-position log-probabilities and per-step scores of one request.

    Log-probabilities are kept per row (``wanted``, ``tops``, ``prompt_tops``): rows of a
    batch that joined with their own settings (a server request) may ask for them or
    not, and for different numbers of alternatives; only the rows that asked are computed.
    """

    def __init__(
        self,
        batch: int,
        capacity: int,
        *,
        logprobs: bool = False,
        top_logprobs: int = 0,
        scores: bool = False,
        logits: bool = False,
        prompt_logprobs: int | None = None,
    ) -> None:
        self.wanted = np.full(batch, logprobs or top_logprobs > 0, dtype=bool)
        self.tops = np.full(batch, top_logprobs, dtype=np.int64)
        #: per row, the alternatives asked per prompt token; -1: no prompt logprobs
        self.prompt_tops = np.full(
            batch, -1 if prompt_logprobs is None else prompt_logprobs, dtype=np.int64
        )
        self.want_scores = scores
        self.want_logits = logits
        self.scores: list[np.ndarray] = []
        self.logits: list[np.ndarray] = []
        self._chosen = np.full((batch, capacity), np.nan, dtype=np.float32)
        self._ranks = np.zeros((batch, capacity), dtype=np.int32)  # prompt tokens' ranks
        width = max(top_logprobs, prompt_logprobs or 0, 0)
        self._top_ids = np.zeros((batch, capacity, width), dtype=np.int64)
        self._top_values = np.zeros((batch, capacity, width), dtype=np.float32)

    @property
    def want_logprobs(self) -> bool:
        return bool(self.wanted.any())

    @property
    def top(self) -> int:
        """The most alternatives any row asked for."""
        return int(self.tops.max()) if self.tops.size else 0

    @property
    def want_prompt(self) -> bool:
        """Whether a row asked for its prompt tokens' logprobs."""
        return bool((self.prompt_tops >= 0).any())

    @property
    def active(self) -> bool:
        return self.want_logprobs or self.want_scores or self.want_logits

    def reserve(self, capacity: int) -> None:
        """Grow the per-position arrays with the token buffer."""
        grow = capacity - self._chosen.shape[1]
        if grow <= 0:
            return
        self._chosen = np.pad(self._chosen, ((0, 0), (0, grow)), constant_values=np.nan)
        self._ranks = np.pad(self._ranks, ((0, 0), (0, grow)))
        self._top_ids = np.pad(self._top_ids, ((0, 0), (0, grow), (0, 0)))
        self._top_values = np.pad(self._top_values, ((0, 0), (0, grow), (0, 0)))

    def record(
        self, position: int, next_ids: np.ndarray, logits: np.ndarray | None, scores: np.ndarray
    ) -> None:
        """Keep what was asked for about the tokens written at ``position``."""
        if self.want_logits:
            self.logits.append(np.array(logits, dtype=np.float32, copy=True))
        if self.want_scores:
            self.scores.append(np.array(scores, dtype=np.float32, copy=True))
        if not self.want_logprobs:
            return
        if self.wanted.all():
            self._keep(position, np.arange(len(next_ids)), next_ids, scores)
        else:
            rows = np.flatnonzero(self.wanted)
            self._keep(position, rows, next_ids[rows], scores[rows])

    def record_row(self, position: int, row: int, token: int, scores: np.ndarray) -> None:
        """What ``row`` asked for about ``token`` at ``position`` (a row's first token,
        picked alone when it joined a batch); ``scores`` (1, V)."""
        if self.wanted[row]:
            self._keep(position, np.asarray([row]), np.asarray([token]), scores)

    def _keep(self, position: int, rows: np.ndarray, ids: np.ndarray, scores: np.ndarray) -> None:
        logprobs = log_softmax(scores)
        self._chosen[rows, position] = logprobs[np.arange(len(rows)), ids]
        top = int(self.tops[rows].max())
        if top:
            ids, values = best_first(logprobs, top)
            self._top_ids[rows, position, :top] = ids
            self._top_values[rows, position, :top] = values

    def keep_prompt(self, rows: np.ndarray, columns: np.ndarray, scores: PositionScores) -> None:
        """Prompt tokens' scores (``prompt_scoring``): ``scores`` item ``i`` is row
        ``rows[i]``'s token at ``columns[i]``."""
        self._chosen[rows, columns] = scores.logprobs
        self._ranks[rows, columns] = scores.ranks
        top = scores.top_ids.shape[1]
        if top:
            self._top_ids[rows, columns, :top] = scores.top_ids
            self._top_values[rows, columns, :top] = scores.top_values

    def prompt_logprobs(self, row: int, start: int, tokens: list[int]) -> list[TokenLogprob | None]:
        """``row``'s prompt ``tokens``, in columns from ``start`` on, with their scores;
        None where a token has none (the first: nothing comes before it)."""
        end = start + len(tokens)
        top = int(self.prompt_tops[row])
        values = self._chosen[row, start:end].tolist()
        ranks = self._ranks[row, start:end].tolist()
        ids = self._top_ids[row, start:end, :top].tolist()
        tops = self._top_values[row, start:end, :top].tolist()
        out: list[TokenLogprob | None] = []
        for token, value, rank, best, best_values in zip(
            tokens, values, ranks, ids, tops, strict=True
        ):
            scored = value == value  # NaN: not scored
            alternatives = list(zip(best, best_values, strict=True))
            out.append(TokenLogprob(token, value, rank, alternatives) if scored else None)
        return out

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
        """The best alternatives ``row`` asked for at each position in [start, end)."""
        top = int(self.tops[row])
        ids = self._top_ids[row, start:end, :top].tolist()
        values = self._top_values[row, start:end, :top].tolist()
        return [list(zip(i, v, strict=True)) for i, v in zip(ids, values, strict=True)]

    # -- rows that move, join and leave ------------------------------------------------

    def take(self, index: np.ndarray) -> None:
        """Row ``i`` becomes old row ``index[i]`` (as ``RowState.take``)."""
        self._check_per_row("move rows")
        self.wanted, self.tops = self.wanted[index], self.tops[index]
        self.prompt_tops = self.prompt_tops[index]
        self._chosen, self._ranks = self._chosen[index], self._ranks[index]
        self._top_ids, self._top_values = self._top_ids[index], self._top_values[index]

    def extend(self, other: StepRecord) -> None:
        """``other``'s rows after these (the same columns)."""
        self._check_per_row("add rows")
        capacity = max(self._chosen.shape[1], other._chosen.shape[1])
        self.reserve(capacity)
        other.reserve(capacity)
        width = max(self._top_ids.shape[2], other._top_ids.shape[2])
        self.wanted = np.concatenate([self.wanted, other.wanted])
        self.tops = np.concatenate([self.tops, other.tops])
        self.prompt_tops = np.concatenate([self.prompt_tops, other.prompt_tops])
        self._chosen = np.concatenate([self._chosen, other._chosen])
        self._ranks = np.concatenate([self._ranks, other._ranks])
        self._top_ids = np.concatenate(
            [_width(self._top_ids, width), _width(other._top_ids, width)]
        )
        self._top_values = np.concatenate(
            [_width(self._top_values, width), _width(other._top_values, width)]
        )

    def shift(self, columns: int) -> None:
        """Columns added on the left (negative: dropped), as ``RowState.shift``."""
        if columns > 0:
            self._chosen = np.pad(self._chosen, ((0, 0), (columns, 0)), constant_values=np.nan)
            self._ranks = np.pad(self._ranks, ((0, 0), (columns, 0)))
            pad = ((0, 0), (columns, 0), (0, 0))
            self._top_ids, self._top_values = (
                np.pad(self._top_ids, pad),
                np.pad(self._top_values, pad),
            )
        else:
            self._chosen = self._chosen[:, -columns:]
            self._ranks = self._ranks[:, -columns:]
            self._top_ids, self._top_values = (
                self._top_ids[:, -columns:],
                self._top_values[:, -columns:],
            )

    def _check_per_row(self, what: str) -> None:
        if self.want_scores or self.want_logits:
            raise ValueError(
                f"output_scores/output_logits keep one (B, V) array per step: rows cannot "
                f"{what} under them"
            )


def _width(array: np.ndarray, width: int) -> np.ndarray:
    """``array`` (B, T, w) padded with zeros to ``width`` alternatives."""
    extra = width - array.shape[2]
    return np.pad(array, ((0, 0), (0, 0), (0, extra))) if extra > 0 else array


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32 (``-inf`` stays ``-inf``)."""
    peak = scores.max(axis=1, keepdims=True)
    shifted = scores - peak
    with np.errstate(divide="ignore"):
        return (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(
            np.float32, copy=False
        )
