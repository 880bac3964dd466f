"""Scores in which all but a few entries of each row are ``-inf``, held as those few.

After top-k(50) over a 49,152-token vocabulary, the later warpers and the sampler
only ever look at 50 scores per row: a ``-inf`` score has probability 0 and stays
``-inf`` whatever a cut-off decides. Handing them a dense (B, V) row costs a pass
to fill it with ``-inf``, and each of them a pass to find the 50 again. A component
that leaves few candidates may return :class:`Candidates` from its ``sparse``
method; the loop passes them on to every later component that has a ``sparse``
method too and makes them dense only for one that has not (see
``framework/scoring.py`` and the plugin guide). ``Candidates(...).dense()`` is
exactly the dense scores they stand for.
"""

from __future__ import annotations

import numpy as np

_NEG_INF = np.float32(-np.inf)


def best_first(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest of each row of (R, V) ``values``, best first, ties by lower index
    (as torch.topk gives on CPU in practice, and as OpenAI's top_logprobs list them):
    (indices (R, k), values (R, k)). The one ordering every "top k" list of ortgen uses
    (recorded top logprobs, beam search's candidates and alternatives)."""
    k = min(k, values.shape[1])
    part = np.argpartition(-values, k - 1, axis=1)[:, :k]
    picked = np.take_along_axis(values, part, axis=1)
    order = np.lexsort((part, -picked), axis=1)
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(picked, order, axis=1)


def neg_inf_array(shape: tuple[int, ...]) -> np.ndarray:
    """A new float32 array of ``-inf``.

    ``empty`` + ``fill`` rather than ``np.full``, which goes through ``copyto``
    and costs ~2 us more on a 49152-wide row.
    """
    out = np.empty(shape, dtype=np.float32)
    out.fill(_NEG_INF)
    return out


class Candidates:
    """The scores of a (B, ``vocab``) batch that may not be ``-inf``, packed per row.

    ``packed`` is (B, W) float32, W at least 1: each row's candidate scores in
    ascending token order, then ``-inf`` padding. A candidate may itself be
    ``-inf`` (a cut-off removed it; it is not worth moving the others). Every
    score outside the candidates is ``-inf``, so ``packed`` has the same softmax,
    order and cut-offs as the dense rows. ``flat`` holds each candidate's flat
    index in the dense (B, vocab) scores and ``slots`` its flat index in
    ``packed`` (a slice from 0 when that is every slot in order, as for one row);
    ``cols`` is its token id and ``starts`` each row's first entry in these
    arrays.

    Treat an instance as immutable: every method returns a new one. (A plain class
    with ``__slots__``: a frozen dataclass costs ~1.4 us more to build, and a step
    builds several.)
    """

    __slots__ = ("cols", "flat", "packed", "slots", "starts", "vocab")

    def __init__(
        self,
        packed: np.ndarray,
        flat: np.ndarray,
        slots: np.ndarray | slice,
        cols: np.ndarray,
        starts: np.ndarray,
        vocab: int,
    ) -> None:
        self.packed = packed
        self.flat = flat
        self.slots = slots
        self.cols = cols
        self.starts = starts
        self.vocab = vocab

    def __repr__(self) -> str:
        return f"Candidates(shape={self.shape}, packed={self.packed!r}, cols={self.cols!r})"

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of the dense scores these stand for."""
        return self.packed.shape[0], self.vocab

    @classmethod
    def at(cls, scores: np.ndarray, flat: np.ndarray) -> Candidates:
        """The scores at ``flat``, ascending flat indices into the (B, vocab) ``scores``.

        One row (the usual batch) needs no row bookkeeping: its packed row is the
        gathered scores themselves.
        """
        batch, vocab = scores.shape
        values = scores.reshape(-1)[flat]
        n = flat.size
        if batch == 1:
            packed = values.reshape(1, n) if n else neg_inf_array((1, 1))
            return cls(packed, flat, slice(0, n), flat, np.zeros(1, np.intp), vocab)
        rows = flat // vocab
        counts = np.bincount(rows, minlength=batch)
        starts = np.cumsum(counts) - counts
        width = max(int(counts.max()), 1)
        slots = rows * width + (np.arange(n) - starts[rows])  # row, then position in the row
        packed = neg_inf_array((batch, width))
        packed.reshape(-1)[slots] = values
        return cls(packed, flat, slots, flat - rows * vocab, starts, vocab)

    @classmethod
    def point(cls, tokens: np.ndarray, vocab: int) -> Candidates:
        """One certain token per row (score 0, log-probability 0): ``tokens`` (B,)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        batch = tokens.shape[0]
        rows = np.arange(batch)
        flat = rows * vocab + tokens
        packed = np.zeros((batch, 1), dtype=np.float32)
        slots: np.ndarray | slice = slice(0, 1) if batch == 1 else rows
        return cls(packed, flat, slots, tokens.copy(), rows, vocab)

    @classmethod
    def find(cls, scores: np.ndarray) -> Candidates | None:
        """The scores that are not ``-inf``, or None when more than 1/16 of them are.

        Above 1/16 packing costs more than it saves. NaN counts as present (it
        invalidates its row, which the caller must still see). The row is scanned
        once for the mask; a dense row must not reach ``nonzero``, which would fill
        a full-width index array for nothing, so a row is counted first unless every
        61st entry says it is sparse. The sample only picks the order of the work;
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
        return cls.at(scores, flat)

    def dense(self) -> np.ndarray:
        """The (B, vocab) float32 scores: the candidates in place, ``-inf`` elsewhere."""
        out = neg_inf_array(self.shape)
        out.reshape(-1)[self.flat] = self.packed.reshape(-1)[self.slots]
        return out

    def with_scores(self, packed: np.ndarray) -> Candidates:
        """The same candidates with new scores: ``packed`` (B, W), e.g. ``self.packed / t``.

        The padding must stay ``-inf`` (any operation that keeps ``-inf`` does).
        """
        if packed.shape != self.packed.shape:
            raise ValueError(f"packed scores of shape {packed.shape}; expected {self.packed.shape}")
        return Candidates(packed, self.flat, self.slots, self.cols, self.starts, self.vocab)

    def keep(self, remove: np.ndarray) -> Candidates:
        """These candidates with ``-inf`` where ``remove`` (B, W) is True."""
        packed = self.packed.copy()
        packed[remove] = _NEG_INF
        return self.with_scores(packed)

    def dense_kept(self, remove: np.ndarray) -> np.ndarray:
        """``keep(remove).dense()`` without the intermediate packed array."""
        kept = ~remove.reshape(-1)[self.slots]
        values = self.packed.reshape(-1)[self.slots]
        out = neg_inf_array(self.shape)
        out.reshape(-1)[self.flat[kept]] = values[kept]
        return out

    def token_ids(self, picked: np.ndarray) -> np.ndarray:
        """The token ids of one packed column per row (``picked`` (B,) < each row's count)."""
        return self.cols[self.starts + picked]
