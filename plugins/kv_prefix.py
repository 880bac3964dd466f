"""The ``prefix`` KV cache: keys/values of earlier requests reused for a shared start.

System prompts, few-shot headers and the earlier turns of a conversation repeat from
one call to the next. A transformer's keys/values for a token depend only on the tokens
before it, so a request whose prompt starts with tokens an earlier request already ran
can take their keys/values instead of computing them again: the result is the same
(up to the float rounding of a different chunking), and prefill feeds only the rest.

The store lives as long as the loaded model (``ctx.model_state``), holds each
finished row's tokens with their keys/values, and forgets the least recently used
entries beyond ``max_bytes``. Within a request the cache is a ``static`` cache; each row
of a batch looks up its own prefix (on fused graphs each row starts where its own
prefix ends; on optimum graphs the rows share one sequence axis, so they start where
the shortest reuse ends).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortgen import GenerationContext, KVCacheFactory, Register, hookimpl
from ortgen.checks import is_int

from .caches import StaticCache

#: default bound of one model's store
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def common_prefix_length(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """How many leading tokens two token sequences (arrays, lists or tuples) share."""
    n = min(len(a), len(b))
    same = np.asarray(a[:n]) == np.asarray(b[:n])
    return n if same.all() else int(np.argmin(same))


@dataclass
class _Entry:
    tokens: np.ndarray  # (n,) int64
    arrays: list[np.ndarray]  # per past tensor, (kv_heads, n, head_dim)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


class PrefixStore:
    """Token sequences with their keys/values, least recently used first out.

    One store serves every request of a loaded model, from any thread: a lock keeps
    its entries whole. An entry's arrays are never written after it is stored, so a
    request copies them in without holding the lock.
    """

    def __init__(self, signature: Any, max_bytes: int) -> None:
        self.signature = signature
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self.hits = 0
        self.reused_tokens = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._nbytes()

    def _nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, tokens: np.ndarray, limit: int) -> tuple[_Entry | None, int]:
        """The entry sharing the longest start with ``tokens`` (at most ``limit``)."""
        with self._lock:
            return self._longest(tokens, limit)

    def _longest(self, tokens: np.ndarray, limit: int) -> tuple[_Entry | None, int]:
        best, best_length, best_key = None, 0, None
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), len(tokens), limit)
            length = common_prefix_length(entry.tokens[:n], tokens[:n])
            if length > best_length:
                best, best_length, best_key = entry, length, key
        if best_key is not None:
            self._entries.move_to_end(best_key)
            self.hits += 1
            self.reused_tokens += best_length
        return best, best_length

    def add(self, tokens: np.ndarray, arrays: list[np.ndarray]) -> None:
        """Keep ``tokens`` and their keys/values; entries that are a start of them go."""
        with self._lock:
            self._add(tokens, arrays)

    def _add(self, tokens: np.ndarray, arrays: list[np.ndarray]) -> None:
        for key, entry in list(self._entries.items()):
            n = len(entry.tokens)
            if n <= len(tokens) and (entry.tokens == tokens[:n]).all():
                del self._entries[key]
            elif n > len(tokens) and (entry.tokens[: len(tokens)] == tokens).all():
                self._entries.move_to_end(key)  # already held by a longer entry
                return
        entry = _Entry(tokens, arrays)
        if entry.nbytes > self.max_bytes:
            return
        self._entries[self._next_key] = entry
        self._next_key += 1
        while self._nbytes() > self.max_bytes:
            self._entries.popitem(last=False)


class PrefixCache(StaticCache):
    """A ``static`` cache that starts from the longest stored prefix of each prompt and
    stores what each row ran when the request ends (see module doc).

    Args:
        max_bytes: bound of the model's store (bytes of keys/values; default 256 MiB).
        capacity: as for ``static``.
    """

    def __init__(
        self,
        *,
        ctx: GenerationContext,
        max_bytes: int = DEFAULT_MAX_BYTES,
        capacity: int | None = None,
    ) -> None:
        if not is_int(max_bytes) or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
        super().__init__(ctx=ctx, capacity=capacity)
        signature = self.signature  # the static cache's (graph_signature: not None)
        # setdefault: two threads starting the model's first requests get one store
        store = ctx.model_state.setdefault("prefix", PrefixStore(signature, max_bytes))
        if store.signature != signature:  # a context shared by another graph's requests
            store = ctx.model_state["prefix"] = PrefixStore(signature, max_bytes)
        store.max_bytes = max_bytes
        self.store: PrefixStore = store
        self._prompt_length = ctx.prompt_length
        self._pads = np.zeros(ctx.batch_size, dtype=np.int64)

    def reuse(self, prompts: list[list[int]]) -> list[int]:
        """Copy each row's longest stored prefix in; returns how many tokens each got."""
        self._pads = np.asarray([self._prompt_length - len(p) for p in prompts], dtype=np.int64)
        found = []
        for prompt in prompts:
            tokens = np.asarray(prompt, dtype=np.int64)
            found.append(self.store.longest(tokens, max(len(tokens) - 1, 0)))
        counts = [n for _, n in found]
        if not any(counts):
            return counts
        starts = [0 if self._shared else int(pad) for pad in self._pads]
        self._length = max(s + n for s, n in zip(starts, counts, strict=True))
        for row, ((entry, n), start) in enumerate(zip(found, starts, strict=True)):
            if entry is None or not n:
                continue
            for index, held in enumerate(entry.arrays):
                self._array(index)[row, :, start : start + n] = held[:, :n]
        return counts

    def remember(self, rows: list[list[int]]) -> None:
        """Store each row's tokens with the keys/values the cache holds for them."""
        for row, tokens in enumerate(rows):
            if not tokens:
                continue
            start = 0 if self._shared else int(self._pads[row])
            end = start + len(tokens)
            arrays = [
                np.array(self._array(i)[row, :, start:end], copy=True)
                for i in range(len(self._names))
            ]
            self.store.add(np.asarray(tokens, dtype=np.int64), arrays)

    def reorder(self, rows: np.ndarray) -> None:
        super().reorder(rows)
        self._pads = self._pads[np.asarray(rows)]

    def fork(self) -> PrefixCache:
        """An independent copy of this request's keys/values; the store stays shared."""
        twin = super().fork()
        twin._pads = self._pads.copy()
        return twin


@hookimpl
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    register("prefix", PrefixCache)
