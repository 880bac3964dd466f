"""Numeric building blocks shared by the samplers and the logits processors.

:class:`PrefixSums` counts, per row, how many prefix sums of non-negative weights
stay under a limit. That is inverting a CDF (the sampler's draw) and finding a
cumulative-probability cut-off (top-p, typical-p), kept in one place so that a fix or
a speed-up reaches all of them and their results cannot drift apart.
:func:`present_scores` gives one row's scores that are not ``-inf`` (packing them for
the whole batch is :class:`ortgen.Candidates`).
"""

from __future__ import annotations

import numpy as np

# Width of the blocks prefix sums are searched in; rows up to 16 blocks long are
# accumulated directly, which is cheaper than the two-level search there.
BLOCK = 256


def present_scores(row: np.ndarray) -> tuple[np.ndarray, np.ndarray | slice]:
    """One row's scores that are not ``-inf``, in token order, and their columns.

    Components whose result depends on a sum over the row (top-nσ, XTC, mirostat,
    epsilon and eta cut-offs) sum these alone, so that a row gives the same bits dense
    and packed after top-k (zeros in place of the others would change how numpy's
    pairwise sum groups the rest). A full row is returned as is with ``slice(None)`` for
    its columns (a 49,152-wide copy and index for nothing cost more than the count).
    """
    present = row != -np.inf
    if np.count_nonzero(present) == row.size:
        return row, slice(None)
    columns = np.flatnonzero(present)
    return row[columns], columns


class PrefixSums:
    """Searchable prefix sums of ``weights`` (B, N), which must be >= 0.

    Sums are float64. Because the weights are non-negative the prefix sums never
    decrease, so a count can be found block-wise: the cumulative block sums (a
    fast vectorised reduction) locate the block where the count ends, and only
    that block is accumulated. numpy's cumsum over a whole long row is several
    times slower. Short rows are accumulated directly.
    """

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights
        n = weights.shape[-1]
        if n <= 16 * BLOCK:
            # cumsum(weights.astype(float64)) without the temporary and np.cumsum's
            # wrapper (~2 us on a short row): each weight is widened, then added in order.
            self._sums = np.add.accumulate(weights, axis=-1, dtype=np.float64)
            self._starts: np.ndarray | None = None
        else:  # cumulative block sums; the last one is the row total
            self._starts = np.arange(0, n, BLOCK)
            self._sums = np.cumsum(
                np.add.reduceat(weights, self._starts, axis=-1, dtype=np.float64), axis=-1
            )
        # The row totals (B,), the same float64 values the counts are searched against.
        self.total: np.ndarray = self._sums[:, -1]

    def count(
        self,
        limit: np.ndarray | np.floating,
        *,
        offset: np.ndarray | float | None = None,
        total: np.ndarray | float | None = None,
        strict: bool = False,
        in_float32: bool = True,
    ) -> np.ndarray:
        """Per row, how many of ``offset + prefix_sum / total`` are <= ``limit`` (< if ``strict``).

        ``limit``, ``offset`` and ``total`` broadcast against (B, 1); None leaves
        the sums unshifted / unscaled. With ``in_float32`` the (float64) values are
        rounded to float32 before the comparison, as torch's CPU cumsum and
        comparison do for the Hugging Face warpers; otherwise they are compared in
        float64. The count is at most N.
        """
        compare = np.less if strict else np.less_equal

        def below(sums: np.ndarray) -> np.ndarray:
            if total is not None:
                sums = sums / total
            if offset is not None:
                sums = offset + sums
            if in_float32:
                sums = sums.astype(np.float32)
            return compare(sums, limit)

        if self._starts is None:
            return below(self._sums).sum(axis=-1)
        starts, weights = self._starts, self.weights
        batch, n = weights.shape
        rows = np.arange(batch)[:, None]
        block = np.minimum(below(self._sums).sum(axis=-1), starts.size - 1)  # where it ends
        cols = starts[block][:, None] + np.arange(BLOCK)
        inside = np.where(cols < n, weights[rows, np.minimum(cols, n - 1)], 0)
        base = np.where(block > 0, self._sums[rows[:, 0], block - 1], 0.0)[:, None]
        sums = base + np.cumsum(inside.astype(np.float64), axis=-1)
        return np.minimum(starts[block] + below(sums).sum(axis=-1), n)


def count_prefix(
    weights: np.ndarray,
    limit: np.ndarray | np.floating,
    *,
    offset: np.ndarray | float | None = None,
    total: np.ndarray | float | None = None,
    strict: bool = False,
) -> np.ndarray:
    """``PrefixSums(weights).count(...)`` compared in float32, for a one-off search."""
    return PrefixSums(weights).count(limit, offset=offset, total=total, strict=strict)
