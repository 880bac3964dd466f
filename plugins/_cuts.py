"""Shared arithmetic of the sampling warpers (``processors``, ``truncation``): cutting a
row to ``-inf`` fast, row maxima with torch's NaN rules, top-k without partitioning whole
rows, and the argument checks whose messages follow transformers'."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from ortgen import Candidates, ConfigError
from ortgen.checks import is_int

NEG_INF = np.float32(-np.inf)
_NEG_INF_BITS = NEG_INF.view(np.int32)
# Candidate counts tried before falling back to a full sort of the vocabulary.
_CANDIDATE_TIERS = (1024, 8192)
# Columns whose maxima bound top-k's k-th value from below (see top_k_few).
_TOP_K_COLUMNS = 1024


# --- argument checks (messages follow transformers' own) ---------------------


def check_min_tokens_to_keep(value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ConfigError(
            f"`min_tokens_to_keep` has to be a positive integer (>= 1), but is {value!r}"
        )
    return int(value)


# --- numeric helpers -----------------------------------------------------------


def f32(scores: np.ndarray) -> np.ndarray:
    return np.asarray(scores, dtype=np.float32)


def fill(scores: np.ndarray, remove: np.ndarray, *, few_kept: bool = False) -> np.ndarray:
    """A new array: ``scores`` with ``-inf`` where ``remove`` is True.

    Same result as ``np.where(remove, -inf, scores)``. When the caller knows that
    ``few_kept``, the kept scores are copied into a -inf array; otherwise the
    select runs on the bit patterns without branches, as np.where takes ~6x
    longer when the mask is irregular (a flat distribution cut in the middle).
    """
    if few_kept:
        out = np.full_like(scores, NEG_INF)
        kept = np.flatnonzero(~remove)
        out.reshape(-1)[kept] = scores.reshape(-1)[kept]
        return out
    bits = scores.view(np.int32)
    select = -remove.view(np.int8).astype(np.int32)  # 0 keeps, -1 (all bits) replaces
    out = np.bitwise_xor(bits, _NEG_INF_BITS)
    out &= select
    out ^= bits
    return out.view(np.float32)


def few_kept(remove: np.ndarray) -> bool:
    """Whether at most 1/8 of the scores survive ``remove`` (``fill`` then scatters them),
    counted: for a cut whose size is not known in advance."""
    return bool(8 * (remove.size - np.count_nonzero(remove)) < remove.size)


def row_index(batch: int) -> np.ndarray:
    return np.arange(batch)[:, None]


def tiers(vocab: int, minimum: int) -> list[int]:
    """Candidate counts to try, smallest first, ending with the whole vocabulary."""
    return [m for m in _CANDIDATE_TIERS if minimum <= m < vocab] + [vocab]


def row_max_checked(scores: np.ndarray) -> tuple[np.ndarray, bool]:
    """Per-row max (B, 1) and whether every row has a softmax (see ``row_max``).

    The check runs on Python floats: after top-k a warper's numpy calls on the
    few packed scores cost more than their arithmetic, and one row is the
    usual batch.
    """
    top = scores.max(axis=-1, keepdims=True)  # NaN propagates
    return top, all(map(math.isfinite, top.ravel().tolist()))


def errstate_unless(all_valid: bool) -> AbstractContextManager[object]:
    """Silence overflow / invalid warnings unless every row is valid.

    In a valid row ``scores - max`` is <= 0 and the softmax total >= 1, so
    nothing can overflow or be invalid, and numpy's error state (~1 us to set
    and restore) is left alone.
    """
    return nullcontext() if all_valid else np.errstate(over="ignore", invalid="ignore")


def row_max(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row max (B, 1) and whether the row has a softmax at all.

    A row with a NaN, a +inf or only -inf has a NaN softmax in torch, and the
    HF warpers then remove nothing from it.
    """
    top = scores.max(axis=-1, keepdims=True)  # NaN propagates
    return top, np.isfinite(top[:, 0])


def on_present(
    scores: np.ndarray, cut: Callable[[np.ndarray], tuple[np.ndarray, bool]]
) -> np.ndarray:
    """``scores`` with ``-inf`` where ``cut`` removes, decided on the present scores when few.

    ``cut(scores)`` returns the ``remove`` mask and whether few scores are kept
    (see ``fill``). A -inf score stays -inf whatever a cut-off decides (see
    ``Candidates.find``); np.partition is also slow on many equal values, which
    packing avoids. The packed result is scattered straight into the output.
    """
    present = Candidates.find(scores)
    if present is None:
        remove, few_kept = cut(scores)
        return fill(scores, remove, few_kept=few_kept)
    return present.dense_kept(cut(present.packed)[0])


def cut_candidates(
    scores: np.ndarray | Candidates, remove: Callable[[np.ndarray], np.ndarray]
) -> Candidates | None:
    """A ``sparse`` method for a cut decided per row on the scores that are not ``-inf``:
    ``remove(packed)`` on Candidates; None (be called dense) on dense scores."""
    if not isinstance(scores, Candidates):
        return None
    return scores.keep(remove(scores.packed))


def top_k_few(scores: np.ndarray, k: int) -> tuple[Candidates, np.ndarray] | None:
    """Top-k for ``8 * k < vocab`` without partitioning whole rows; None if the rows do not suit.

    Same result as partitioning the whole row for its k-th value (~50 us at
    49152, most of top-k's cost), for about half as much. Each row is viewed as
    a (w, m) matrix, ``m >= 4k`` columns (``_TOP_K_COLUMNS``, 1024): the column
    maxima are scores at distinct positions, so the k-th highest of them,
    ``floor``, has at least k scores >= it and is at most the row's k-th value.
    Only scores not below ``floor`` can be kept; on logits with k = 50 they are ~50 (a maximum of 48
    scores is far out in the tail), so the k-th value is partitioned out of
    them. Column maxima are a strided reduction over whole rows of the view,
    ~4x cheaper than maxima of contiguous blocks, which numpy reduces one short
    block at a time. (Comparing only the columns whose maximum reaches
    ``floor`` reads less memory but takes more numpy calls, which cost more
    here than a pass over the row.)

    Returns the candidates and which of them to remove, or None when the
    candidates are over 1/8 of the scores (many equal scores, a
    sorted row: the full partition is then cheaper) or there is a NaN (np.partition
    ranks it highest, as torch.topk does; a NaN k-th value keeps the whole row).
    """
    batch, vocab = scores.shape
    columns = min(max(_TOP_K_COLUMNS, 4 * k), vocab // 2)  # >= 4k, as 8k < vocab
    rows = vocab // columns  # the tail past rows * columns is in no column, which is fine
    # (ufuncs and ndarray methods called directly: numpy's wrappers cost ~1 us a call,
    # and this runs once per token)
    maxima = np.maximum.reduce(scores[:, : rows * columns].reshape(batch, rows, columns), axis=1)
    # a NaN (ranked highest, as by torch.topk) must be a candidate, which >= below
    # would miss: a batch with one takes the full partition (max propagates NaN)
    tail = scores[:, rows * columns :]
    if math.isnan(np.maximum.reduce(maxima, axis=None)) or (tail.size and math.isnan(tail.max())):
        return None
    maxima.partition(columns - k, axis=-1)  # its own array
    floor = maxima[:, columns - k, None]
    flat = (scores >= floor).reshape(-1).nonzero()[0]
    if flat.size * 8 > scores.size:
        return None
    present = Candidates.at(scores, flat)  # each row has >= k; the -inf padding ranks lowest
    packed = present.packed
    ranked = packed.copy()
    ranked.partition(packed.shape[1] - k, axis=-1)
    kth = ranked[:, packed.shape[1] - k, None]
    if any(map(math.isnan, kth.ravel().tolist())):
        return None
    return present, packed < kth  # the scores outside are < floor <= kth


def closest(distance: np.ndarray, size: int) -> np.ndarray:
    """Indices (B, n >= size) of each row's ``size`` smallest distances, or of all the
    distances up to some bound that holds at least that many.

    Either is a prefix of the row in distance order (ties at the bound included), which
    is all typical-p's cut needs. One row with ``8 * size`` below its width goes through
    ``top_k_few`` on the negated distances (~0.3 ms less than np.argpartition over
    49,152); otherwise, or if that declines, np.argpartition.
    """
    batch, vocab = distance.shape
    if batch == 1 and 8 * size < vocab:
        few = top_k_few(-distance, size)
        if few is not None:
            return few[0].cols[None, :]  # every candidate: those >= the floor
    return np.argpartition(distance, size - 1, axis=-1)[:, :size]
