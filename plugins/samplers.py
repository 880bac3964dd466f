"""Built-in samplers: ``greedy`` (argmax) and ``multinomial`` (one draw per row).

A sampler only picks: temperature, top-k, top-p and the like are processors
that ran before it. A row with nothing to pick from (every score ``-inf``, or
any NaN / ``+inf``) raises :class:`ortgen.ComponentError` naming the sampler and
the row, instead of silently returning token 0.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

from ortgen import Candidates, GenerationContext, Register, SamplerFactory, hookimpl
from ortgen.checks import check_pickable

from ._numeric import PrefixSums

# A row this short is drawn from with Python floats (see MultinomialSampler._draw_few).
_FEW = 128


@hookimpl
def register_samplers(register: Register[SamplerFactory]) -> None:
    register("greedy", GreedySampler)
    register("multinomial", MultinomialSampler)


class GreedySampler:
    """The highest score of each row; ties go to the lowest token id (like ``torch.argmax``).

    A ``+inf`` score is a valid pick; a row with a NaN or only ``-inf`` raises.
    """

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        picked = scores.argmax(axis=-1)  # a NaN wins argmax, so it is caught below
        # Each row's best as a Python float (NaN and -inf fail ``> -inf``): a batch is a
        # few rows, and right after a forward has swept the caches a fancy-index gather and
        # a vectorised check cost ~140 us of cold code, this a few.
        best = [float(scores[row, pick]) for row, pick in enumerate(picked.tolist())]
        if not all(value > -math.inf for value in best):
            check_pickable("greedy", np.asarray(best, dtype=np.float32), allow_inf=True)
        return picked.astype(np.int64, copy=False)

    def sparse(self, input_ids: np.ndarray, scores: Candidates) -> np.ndarray:
        """The same pick among candidates: they are in token order, so a tie still goes
        to the lowest id."""
        return scores.token_ids(self(input_ids, scores.packed))


class MultinomialSampler:
    """Draw one token per row from ``softmax(scores)``.

    The sampler owns one ``np.random.Generator`` seeded with ``ctx.seed`` (None:
    fresh entropy), so a seeded request is reproducible. Per row it draws a
    single uniform number and inverts the cumulative distribution, as llama2.c
    does: with weights ``w = exp(score - max)`` and ``t = u * sum(w)``, it picks
    the token ``i`` with ``cdf[i - 1] <= t < cdf[i]``. A ``-inf`` score has weight
    0 and is never drawn. The weights are computed in float32 (numpy's float64
    exp is ~10x slower on -inf; the relative error is 1e-7 and only weights below
    ``exp(-103)`` of the top one round to 0), and every sum is float64. The CDF is
    searched block-wise by :class:`PrefixSums` (the search top-p and typical-p
    use too), compared in float64. When at most 1/16 of the scores are finite
    (after top-k, say), only those are looked at (:class:`ortgen.Candidates`); the
    CDF, and so the pick, is the same: the weights left out are 0, and adding 0.0
    changes no prefix sum.
    """

    def __init__(self, *, ctx: GenerationContext) -> None:
        self.seed = ctx.seed
        self._rng = np.random.default_rng(ctx.seed)
        # per-row settings: one stream per row, so a seeded row draws what it draws alone
        self._row_rngs = row_generators(ctx) if ctx.row_seeds else None

    def reseed(self, seed: int) -> None:
        """Start new random streams from ``seed`` (a forked request, ``Generation.fork``):
        one for the batch, or per row ``[seed, row]``."""
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        if self._row_rngs is not None:
            self._row_rngs = [
                np.random.default_rng([seed, row]) for row in range(len(self._row_rngs))
            ]

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores, dtype=np.float32)
        present = Candidates.find(scores)
        if present is None:
            return self.draw_columns(scores)
        # Few possible tokens (after top-k, say): draw among those alone.
        return present.token_ids(self.draw_columns(present.packed))

    def sparse(self, input_ids: np.ndarray, scores: Candidates) -> np.ndarray:
        """The same draw among candidates (see the class docstring)."""
        return scores.token_ids(self.draw_columns(scores.packed))

    def draw_columns(self, scores: np.ndarray) -> np.ndarray:
        """One column per row of ``scores`` (B, W), drawn from its softmax: the draw
        itself, for a sampler that truncates first (mirostat) and maps columns itself."""
        if scores.shape[0] == 1 and scores.shape[1] <= _FEW:
            picked = self._draw_few(scores[0])
            if picked is not None:
                return picked
        return self._draw_rows(scores)

    def _draw_few(self, row: np.ndarray) -> np.ndarray | None:
        """``_draw_rows`` for one row of at most ``_FEW`` scores (a draw after top-k), in
        Python floats: on so few scores each numpy call costs more than its arithmetic.

        The same draw, bit for bit: the same float32 weights, the same sequential
        float64 prefix sums (``np.add.accumulate`` adds in order too), the same uniform
        number from the same stream. None for a row that cannot be drawn from, which
        the general path reports.
        """
        top = np.maximum.reduce(row)  # NaN propagates
        if not math.isfinite(top):
            return None
        weights = np.exp(row - top).tolist()
        sums = list(itertools.accumulate(weights))
        rng = self._row_rngs[0] if self._row_rngs is not None else self._rng
        pick = bisect.bisect_right(sums, rng.random() * sums[-1])  # sums <= target
        if pick >= len(weights) or weights[pick] == 0:  # rounding at the very top
            pick = max(i for i in range(min(pick, len(weights) - 1) + 1) if weights[i] > 0)
        return np.array([pick], dtype=np.int64)

    def _draw_rows(self, scores: np.ndarray) -> np.ndarray:
        batch, vocab = scores.shape
        # Checked here, on the packed rows when there are: packing drops only -inf
        # scores, so a row's max (NaN propagates) is the same, and the full row is
        # not scanned once more for it.
        top = scores.max(axis=-1)
        if not all(map(math.isfinite, top.tolist())):  # Python floats: cheaper than 3 numpy calls
            check_pickable("multinomial", top)
        weights = np.exp(scores - top[:, None])
        cdf = PrefixSums(weights)
        if self._row_rngs is not None:
            uniform = np.array([rng.random() for rng in self._row_rngs])
        else:
            uniform = np.asarray(self._rng.random(batch))
        target = uniform * cdf.total
        picked = cdf.count(target[:, None], in_float32=False)

        # Rounding can leave the target at the very top of the distribution (or of a
        # block); the token meant is then the last one with a weight above 0. Checked
        # with Python scalars: batches are small, and on a row packed after top-k the
        # half-dozen numpy calls of a vectorised check cost more than the draw.
        for row, pick in enumerate(picked.tolist()):
            if pick >= vocab or weights[row, pick] == 0:
                picked[row] = np.flatnonzero(weights[row, : min(pick, vocab - 1) + 1])[-1]
        return picked.astype(np.int64, copy=False)


def row_generators(ctx: GenerationContext) -> list[np.random.Generator]:
    """One generator per row: a row's own seed, or for an unseeded row a stream derived
    from the request's seed and the row (fresh entropy without one)."""
    streams = []
    for row, own in enumerate(ctx.row_seeds):
        seed: int | list[int] | None = own
        if own is None:
            seed = None if ctx.seed is None else [ctx.seed, row]
        streams.append(np.random.default_rng(seed))
    return streams
