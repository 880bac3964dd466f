"""Everything a step object keeps per row, in one place.

Rows move (a search strategy keeps its best beams), join (a request enters a running
batch) and leave (a finished request frees its row). Each of those is one operation
here, over every per-row field at once, so a new per-row field is declared once (in
``RowState``'s fields) and cannot be forgotten by one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..text import RowText
from .chain import Chain


@dataclass
class RowState:
    """Per-row fields of a ``Generation``: arrays with one row per batch row on axis 0, or
    lists with one item per row.

    Columns of ``ids``/``mask`` are buffer positions; a row's real tokens start after its
    left padding (``pads``), its generated tokens of this turn at ``prompt_end``.
    ``finished_at`` is the buffer length when the row finished (-1 while it runs).
    """

    ids: np.ndarray  # (B, capacity) int64: left-padded prompts and generated tokens
    mask: np.ndarray  # (B, capacity) int64: 1 on real tokens
    pads: np.ndarray  # (B,) left padding columns: a token's position is column - pads
    prompt_end: np.ndarray  # (B,) this turn's generated tokens start here
    reused: np.ndarray  # (B,) prompt tokens whose keys/values the cache held already
    unfinished: np.ndarray  # (B,) bool
    finished_at: np.ndarray  # (B,) buffer length when the row finished; -1: running
    finish_reasons: list[str | None]
    texts: list[RowText | None]  # None without a tokenizer, or under a search strategy
    forced: list[list[int]]  # tokens a component forces next (``ForcesTokens``)
    errors: list[Exception | None]  # why the row failed, if a component of its own did
    chains: list[Chain]  # the components the row runs with

    @classmethod
    def empty(cls, capacity: int, pad_token_id: int) -> RowState:
        """No rows yet, ``capacity`` columns."""
        return cls(
            ids=np.full((0, capacity), pad_token_id, dtype=np.int64),
            mask=np.zeros((0, capacity), dtype=np.int64),
            pads=np.zeros(0, dtype=np.int64),
            prompt_end=np.zeros(0, dtype=np.int64),
            reused=np.zeros(0, dtype=np.int64),
            unfinished=np.zeros(0, dtype=bool),
            finished_at=np.zeros(0, dtype=np.int64),
            finish_reasons=[],
            texts=[],
            forced=[],
            errors=[],
            chains=[],
        )

    def __len__(self) -> int:
        return self.ids.shape[0]

    def take(self, index: np.ndarray | list[int]) -> None:
        """Row ``i`` becomes old row ``index[i]`` (rows may repeat or be dropped)."""
        order = np.asarray(index, dtype=np.int64)
        rows = order.tolist()
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, np.ndarray):
                setattr(self, item.name, value[order])
            else:
                setattr(self, item.name, [value[i] for i in rows])

    def extend(self, other: RowState) -> None:
        """``other``'s rows after these (both with the same columns)."""
        for item in fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            if isinstance(mine, np.ndarray):
                setattr(self, item.name, np.concatenate([mine, theirs]))
            else:
                mine.extend(theirs)

    def reserve(self, capacity: int, pad_token_id: int) -> None:
        """At least ``capacity`` columns (grown by doubling)."""
        have = self.ids.shape[1]
        if capacity <= have:
            return
        grow = max(capacity, 2 * have) - have
        self.ids = np.pad(self.ids, ((0, 0), (0, grow)), constant_values=pad_token_id)
        self.mask = np.pad(self.mask, ((0, 0), (0, grow)))

    def shift(self, columns: int, pad_token_id: int) -> None:
        """Add ``columns`` padding columns on the left (negative: drop that many, which
        must be padding in every row). Every column index moves with them."""
        if columns > 0:
            self.ids = np.pad(self.ids, ((0, 0), (columns, 0)), constant_values=pad_token_id)
            self.mask = np.pad(self.mask, ((0, 0), (columns, 0)))
        else:
            self.ids, self.mask = self.ids[:, -columns:], self.mask[:, -columns:]
        self.pads += columns
        self.prompt_end += columns
        self.finished_at[self.finished_at >= 0] += columns


def one_row(
    ids: np.ndarray,
    mask: np.ndarray,
    pad: int,
    prompt_end: int,
    chain: Chain,
    text: RowText | None,
) -> RowState:
    """A single running row (a request joining a batch)."""
    return RowState(
        ids=ids[None],
        mask=mask[None],
        pads=np.asarray([pad], dtype=np.int64),
        prompt_end=np.asarray([prompt_end], dtype=np.int64),
        reused=np.zeros(1, dtype=np.int64),
        unfinished=np.ones(1, dtype=bool),
        finished_at=np.full(1, -1, dtype=np.int64),
        finish_reasons=[None],
        texts=[text],
        forced=[[]],
        errors=[None],
        chains=[chain],
    )
