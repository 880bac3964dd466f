"""A KV cache composed from a built-in one: ``capped_static``.

``CappedStaticCache`` is the built-in ``static`` cache (``ortgen.plugins.caches``, public
for composing) with a ceiling: a request that may reach more than ``max_positions``
positions per row is refused before its first forward, and a continued one (a chat
turn appended) fails instead of growing past it. Everything else is the built-in's.

It wraps rather than copies. The loop finds a cache's optional capabilities on the object
it is given (``isinstance`` against ``ortgen.SelectsRow``, ``ortgen.OwnsPresents``,
``ortgen.ForksCache``...), so a wrapper forwards each one it keeps; one it leaves out is
one the loop goes without (no ``select``: no prompts of different lengths on fused
graphs; no ``fork``: ``Generation.fork()`` refused).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ortgen import ConfigError, GenerationContext
from ortgen.plugins.caches import StaticCache

__all__ = ["CappedStaticCache"]


class CappedStaticCache:
    """The ``static`` cache, holding at most ``max_positions`` positions per row."""

    def __init__(self, *, ctx: GenerationContext, max_positions: int = 8192) -> None:
        # checked here, not per forward: a value from a TOML file or a server request
        # may be anything, and a bad one fails the request before it starts
        if (
            not isinstance(max_positions, int)
            or isinstance(max_positions, bool)
            or max_positions < 1
        ):
            raise ConfigError(
                f"capped_static: `max_positions` has to be a positive integer, but is "
                f"{max_positions!r}"
            )
        if ctx.max_length > max_positions:
            raise ConfigError(
                f"capped_static: the request may reach {ctx.max_length} positions, more "
                f"than max_positions={max_positions}; ask for fewer new tokens"
            )
        self.max_positions = max_positions
        self._inner = StaticCache(ctx=ctx)
        self.signature = self._inner.signature  # a cache made for another graph is refused

    # -- the KVCache members ------------------------------------------------------------

    def inputs(self) -> dict[str, Any]:
        return self._inner.inputs()

    def update(self, presents: list[Any]) -> None:
        self._inner.update(presents)

    def reorder(self, rows: np.ndarray) -> None:
        self._inner.reorder(rows)

    def crop(self, length: int) -> None:
        self._inner.crop(length)

    @property
    def length(self) -> int:
        return self._inner.length

    @property
    def nbytes(self) -> int:
        return self._inner.nbytes

    # -- the capabilities ``static`` has, forwarded so the loop finds them here -----------

    def outputs(self, total: int) -> list[Any]:
        """The buffers of a forward leaving ``total`` positions: where the cap holds."""
        if total > self.max_positions:
            raise ValueError(
                f"a forward would leave {total} positions, more than max_positions="
                f"{self.max_positions}"
            )
        return self._inner.outputs(total)

    def select(self, row: int | None) -> None:
        self._inner.select(row)

    def fork(self) -> CappedStaticCache:
        twin = copy.copy(self)
        twin._inner = self._inner.fork()  # buffers of its own: the two never share memory
        return twin
