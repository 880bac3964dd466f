"""A request's KV cache as the loop calls it: its optional capabilities, found once.

The loop never asks the cache for a member by name. When a step object starts, each
optional capability (``ortgen.protocols``: ``OwnsPresents``, ``FeedsMask``, ``RowSlots``
and the rest) is checked with ``isinstance`` once, and kept here as the same object
typed by that protocol, or None. A step then costs one attribute read per capability it
uses, and a type checker checks every cache call the loop makes against the protocol
that declares it.

A step object keeps one cache for its life (a new turn's chain carries the same cache
over), so the view is built once. ``Generation.fork`` deep-copies it with the rest of
the request, the forked cache standing in for the original: every field then names the
fork.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..protocols.caches import (
    BelongsToGraph,
    CopiesRows,
    FeedsMask,
    ForksCache,
    KVCache,
    LimitsFeed,
    OwnsPresents,
    ReusesPrefixes,
    ReusesRowPrefixes,
    RowSlots,
    SelectsRow,
    ShiftsColumns,
)


@dataclass(frozen=True)
class CacheView:
    """The cache, and the same object once per optional capability it has (else None)."""

    cache: KVCache
    graph: BelongsToGraph | None
    feed_limit: LimitsFeed | None
    forks: ForksCache | None
    selects: SelectsRow | None
    presents: OwnsPresents | None
    masks: FeedsMask | None
    prefixes: ReusesPrefixes | None
    slots: RowSlots | None
    shifts: ShiftsColumns | None
    row_prefixes: ReusesRowPrefixes | None
    copies: CopiesRows | None

    @classmethod
    def of(cls, cache: KVCache | None, name: str) -> CacheView:
        """The view of a request's cache (``name``: what it is registered under)."""
        if cache is None:
            raise InputError(f"kv cache {name!r}: a request needs a KV cache; its chain has none")
        return cls(
            cache=cache,
            graph=cache if isinstance(cache, BelongsToGraph) else None,
            feed_limit=cache if isinstance(cache, LimitsFeed) else None,
            forks=cache if isinstance(cache, ForksCache) else None,
            selects=cache if isinstance(cache, SelectsRow) else None,
            presents=cache if isinstance(cache, OwnsPresents) else None,
            masks=cache if isinstance(cache, FeedsMask) else None,
            prefixes=cache if isinstance(cache, ReusesPrefixes) else None,
            slots=cache if isinstance(cache, RowSlots) else None,
            shifts=cache if isinstance(cache, ShiftsColumns) else None,
            row_prefixes=cache if isinstance(cache, ReusesRowPrefixes) else None,
            copies=cache if isinstance(cache, CopiesRows) else None,
        )

    def max_feed(self) -> int | None:
        """The most positions one forward may feed now (None: no limit)."""
        return self.feed_limit.max_feed if self.feed_limit is not None else None
