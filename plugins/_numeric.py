"""Numeric building blocks shared by the samplers and the logits processors.

Two pieces of vectorised numpy that the multinomial sampler and the top-p /
typical-p warpers both need, kept in one place so that a fix or a speed-up
reaches all of them and their results cannot drift apart:

* :class:`PrefixSums` counts, per row, how many prefix sums of non-negative
  weights stay under a limit. That is inverting a CDF (the sampler's draw) and
  finding a cumulative-probability cut-off (top-p, typical-p).
* :func:`pack_present` gathers the scores that are not ``-inf`` to the front
  of a narrow array, so that work after top-k over a large vocabulary only
  touches the few tokens that can still be picked (:func:`pack_flat` packs
  any chosen positions the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_NEG_INF = np.float32(-np.inf)
# Width of the blocks prefix sums are searched in; rows up to 16 blocks long are
# accumulated directly, which is cheaper than the two-level search there.
BLOCK = 256


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


def neg_inf_array(shape: tuple[int, ...]) -> np.ndarray:
    """A new float32 array of ``-inf``.

    ``empty`` + ``fill`` rather than ``np.full``, which goes through ``copyto``
    and costs ~2 us more on a 49152-wide row: an output that is mostly ``-inf``
    (after top-k or top-p) is built on one of these in every step.
    """
    out = np.empty(shape, dtype=np.float32)
    out.fill(_NEG_INF)
    return out


@dataclass
class PresentScores:
    """Chosen scores of each row (those not ``-inf``, say), packed to the front of ``packed``.

    ``packed`` is (B, W) float32, W the most chosen scores in any row (at least
    1), and ``-inf`` after each row's own entries. When the scores left out are
    ``-inf``, it has the same softmax, order and cut-offs as the full rows.
    ``flat`` holds each chosen score's flat index in the (B, vocab) scores and
    ``slots`` its flat index in ``packed`` (rows in order; a slice when that is
    every slot from 0, as for one row); ``cols`` is its column (token id) and
    ``starts`` each row's first entry in these arrays.
    """

    packed: np.ndarray
    flat: np.ndarray
    slots: np.ndarray | slice
    cols: np.ndarray
    starts: np.ndarray
    vocab: int

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """Scatter a (B, W) float32 result on ``packed`` back to (B, vocab), ``-inf`` elsewhere."""
        out = neg_inf_array((packed.shape[0], self.vocab))
        out.reshape(-1)[self.flat] = packed.reshape(-1)[self.slots]
        return out

    def unpack_kept(self, remove: np.ndarray) -> np.ndarray:
        """The original scores, ``-inf`` outside the packing and where ``remove`` (B, W) is True.

        Same result as ``unpack(np.where(remove, -inf, packed))``, without the
        intermediate (B, W) array.
        """
        kept = ~remove.reshape(-1)[self.slots]
        values = self.packed.reshape(-1)[self.slots]
        out = neg_inf_array((self.packed.shape[0], self.vocab))
        out.reshape(-1)[self.flat[kept]] = values[kept]
        return out

    def token_ids(self, picked: np.ndarray) -> np.ndarray:
        """The vocabulary ids of one packed column per row (``picked`` (B,) < each row's count)."""
        return self.cols[self.starts + picked]


def pack_flat(scores: np.ndarray, flat: np.ndarray) -> PresentScores:
    """Pack the scores at ``flat``, ascending flat indices into the (B, vocab) ``scores``.

    One row (the usual batch) needs no row bookkeeping: its packed row is the
    gathered scores themselves.
    """
    batch, vocab = scores.shape
    values = scores.reshape(-1)[flat]
    n = flat.size
    if batch == 1:
        packed = values.reshape(1, n) if n else neg_inf_array((1, 1))
        return PresentScores(packed, flat, slice(0, n), flat, np.zeros(1, np.intp), vocab)
    rows = flat // vocab
    counts = np.bincount(rows, minlength=batch)
    starts = np.cumsum(counts) - counts
    width = max(int(counts.max()), 1)
    slots = rows * width + (np.arange(n) - starts[rows])  # row, then position in the row
    packed = neg_inf_array((batch, width))
    packed.reshape(-1)[slots] = values
    return PresentScores(packed, flat, slots, flat - rows * vocab, starts, vocab)


def pack_present(scores: np.ndarray) -> PresentScores | None:
    """Pack the scores that are not ``-inf``, or None when more than 1/16 of them are.

    A ``-inf`` score has probability 0 and stays ``-inf`` whatever a cut-off
    decides, so top-p after top-k(50) over a 49152-token vocabulary is a top-p
    over 50 scores, and a draw among them picks the same token. Above 1/16 the
    packing costs more than it saves. NaN counts as present (it invalidates its
    row, which the caller must still see).

    The row is scanned once for the mask (``np.isfinite``, or comparing the
    int32 bit patterns, are no faster than ``!= -inf``, and NaN / +inf must
    count as present anyway). A dense row must not reach ``nonzero``, which
    would fill a full-width index array for nothing, so a row is counted first
    unless every 61st entry says it is sparse: the count is then the length of
    the indices, and the exact count pass (~3 us at 49152) is saved where
    packing pays, after top-k. The sample only picks the order of the work;
    the decision is the exact count either way.
    """
    present = scores != _NEG_INF
    mask = present.reshape(-1)
    sample = mask[::61]
    if np.count_nonzero(sample) * 16 > sample.size and np.count_nonzero(mask) * 16 > mask.size:
        return None
    flat = mask.nonzero()[0]
    if flat.size * 16 > mask.size:
        return None
    return pack_flat(scores, flat)
