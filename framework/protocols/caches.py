"""What a KV cache must look like, and the optional capabilities the loop uses when it has them.

Split out of ``protocols.py`` (which re-exports every name here: ``ortgen.protocols`` stays
the one module plugin authors read). Each optional capability is its own
``runtime_checkable`` protocol, found once with ``isinstance`` when a request starts
(``ortgen.loop.cache_view.CacheView``), so the loop never asks a cache for a member by
name and a type checker checks both sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from ..model.session import GraphSignature


@runtime_checkable
class KVCache(Protocol):
    """Past keys/values kept between forwards of one request.

    ``inputs()`` gives the past feeds by graph input name; ``update(presents)``
    takes the graph's present outputs (same order as ``GraphSignature.past_inputs``)
    after a forward; ``reorder(rows)`` keeps/duplicates batch rows (beam search);
    ``crop(length)`` forgets positions past ``length`` (rewind). The optional
    capabilities the loop uses when a cache has them are the protocols below.
    """

    def inputs(self) -> dict[str, Any]: ...

    def update(self, presents: list[Any]) -> None: ...

    def reorder(self, rows: np.ndarray) -> None: ...

    def crop(self, length: int) -> None: ...

    @property
    def length(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


@runtime_checkable
class BelongsToGraph(Protocol):
    """``signature``: the ``GraphSignature`` the keys/values belong to (None: unsaid). A
    cache made for another graph is refused when a request starts: another model's
    keys/values are never valid input."""

    @property
    def signature(self) -> GraphSignature | None: ...


@runtime_checkable
class LimitsFeed(Protocol):
    """``max_feed``: the most positions one forward may feed (None: no limit). Prefill and
    scoring feed in chunks of at most this (a window cannot hold a longer forward). Read
    before each forward, so it may change as the cache fills."""

    @property
    def max_feed(self) -> int | None: ...


@runtime_checkable
class ForksCache(Protocol):
    """``fork()``: an independent copy holding the same positions (``Generation.fork``)."""

    def fork(self) -> KVCache: ...


@runtime_checkable
class SelectsRow(Protocol):
    """``select(row)``: until ``select(None)``, ``inputs()``/``update()`` (and ``outputs()``)
    cover ``row`` alone, from its own first position: rows of different lengths are
    prefilled one by one on a shared-buffer graph, and a row joining an open batch alone."""

    def select(self, row: int | None) -> None: ...


@runtime_checkable
class OwnsPresents(Protocol):
    """``outputs(total)``: the buffers the graph writes its presents into, for a forward
    whose keys/values span ``total`` positions (a preallocated cache binds them, so
    nothing is copied); ``update()`` then receives those same buffers."""

    def outputs(self, total: int) -> list[Any]: ...


@runtime_checkable
class FeedsMask(Protocol):
    """``feed_mask(mask, new)``: the attention mask the graph is fed, from the loop's
    (B, positions) mask and the ``new`` positions of this forward (a window or attention
    sinks keep fewer positions than the loop has seen)."""

    def feed_mask(self, mask: np.ndarray, new: int) -> np.ndarray: ...


@runtime_checkable
class ReusesPrefixes(Protocol):
    """Keys/values kept across requests of one model: ``reuse(prompts)`` loads the
    longest prefix of each prompt it holds and returns those lengths (the loop feeds the
    rest); ``remember(rows)`` is told each row's tokens when a request ends."""

    def reuse(self, prompts: list[list[int]]) -> Sequence[int]: ...

    def remember(self, rows: list[list[int]]) -> None: ...


@runtime_checkable
class RowSlots(Protocol):
    """Optional capability of a KV cache whose rows come and go: a continuous batch
    (``Generation.open()``, the server) admits requests as rows and releases them.

    - ``add_rows(count)``: ``count`` new rows after the last, holding nothing yet; a
      joining row is then prefilled alone through ``select(row)`` (``inputs()`` and
      ``outputs()``/``update()`` cover that row only, from its first position).
    - ``keep_rows(order)``: row ``i`` becomes old row ``order[i]``; the others are
      dropped (``order`` only moves rows down, into freed places).

    Used beside it when present: :class:`ShiftsColumns`, :class:`ReusesRowPrefixes`,
    :class:`CopiesRows`.
    """

    def add_rows(self, count: int) -> None: ...

    def keep_rows(self, order: np.ndarray) -> None: ...


@runtime_checkable
class ShiftsColumns(Protocol):
    """``shift(columns)``: keys/values that follow the token buffer's columns (a concat
    graph's in an open batch) get that many positions on the left; negative drops them.
    A cache whose rows start at position 0 (shared-buffer graphs) does not need it."""

    def shift(self, columns: int) -> None: ...


@runtime_checkable
class ReusesRowPrefixes(Protocol):
    """Prompt prefixes shared between the rows of an open batch.

    ``reuse_row(row, prompt, chunk) -> int``: copy into the joining ``row`` the longest
    prefix of ``prompt`` the cache holds from any row, and return its length; only
    positions the loop would feed in several-token forwards of ``chunk`` anyway.
    ``note_row(row, prompt, taken, chunk)``: what ``row``'s prefill computed (``taken``
    positions were reused), to offer later rows.
    """

    def reuse_row(self, row: int, prompt: Sequence[int], chunk: int) -> int: ...

    def note_row(self, row: int, prompt: Sequence[int], taken: int, chunk: int) -> None: ...


@runtime_checkable
class CopiesRows(Protocol):
    """``copy_row(source, target, positions)``: a row joining with another held row's very
    prompt takes that row's first ``positions`` keys/values instead of a prefill."""

    def copy_row(self, source: int, target: int, positions: int) -> None: ...


@runtime_checkable
class LiftsContext(Protocol):
    """Optional capability of a KV-cache *factory* (what ``register`` is given, not the
    cache it makes): a cache that keeps positions within a window lets a request run
    past the model's trained context, and ``lifts_context(signature)`` says on which
    graphs (e.g. only those whose positions stay within the window). Without it, a
    request's length is clipped at the model's context (``TextGenerator.max_length``).
    """

    def lifts_context(self, signature: Any) -> bool: ...
