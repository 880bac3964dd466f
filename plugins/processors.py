"""Built-in sampling warpers: temperature, top-k, top-p, min-p and typical-p.

Each one reproduces the Hugging Face ``*LogitsWarper`` of the same name
(transformers 4.57, ``generation/logits_process.py``): the same parameters, the
same range checks in ``__init__`` (raising :class:`ortgen.ConfigError`) and the
same output for the same scores, up to float32 rounding at a cut-off. Deliberate
differences: the value Hugging Face's ``generate()`` treats as "off" (``top_k=0``,
``top_p=1.0``, ``typical_p=1.0``) is accepted and gives an unchanged copy, so a
config can always be passed through; an int is accepted where HF insists on a
float (``temperature = 1`` in a TOML file); inf and NaN are refused.

They are pure numpy: no Python loop over rows or tokens, and no full sort of the
vocabulary where a partition finds the same tokens. Every ``__call__`` returns a
new float32 array and leaves its inputs alone.

Ties: Hugging Face cuts top-p in the order of ``torch.sort``, which is stable on
short rows only, so when equal scores straddle the cut it is unspecified which of
them survive. Here the choice is that of a stable ascending sort (the lower ids
among equal scores are removed first), which is what HF does on short rows.
Typical-p's cut depends on ties only through ``min_tokens_to_keep``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ortgen import Candidates, ConfigError, LogitsProcessorFactory, Register, hookimpl
from ortgen.checks import as_float, is_int

from ._cuts import (
    NEG_INF,
    check_min_tokens_to_keep,
    closest,
    cut_candidates,
    errstate_unless,
    f32,
    few_kept,
    fill,
    on_present,
    row_index,
    row_max,
    row_max_checked,
    tiers,
    top_k_few,
)
from ._numeric import count_prefix

# A row this short is cut with Python floats (see TopPProcessor._cut_few).
_FEW = 128


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("temperature", TemperatureProcessor)
    register("top_k", TopKProcessor)
    register("top_p", TopPProcessor)
    register("min_p", MinPProcessor)
    register("typical_p", TypicalPProcessor)


# --- processors -----------------------------------------------------------------


class TemperatureProcessor:
    """``scores / temperature`` (TemperatureLogitsWarper)."""

    def __init__(self, temperature: float) -> None:
        expected = "a strictly positive float (> 0)"
        value = as_float("temperature", temperature, expected)
        if not value > 0:
            hint = " For greedy decoding, set `do_sample=False` instead." if value == 0 else ""
            raise ConfigError(f"`temperature` has to be {expected}, but is {temperature!r}.{hint}")
        self.temperature = value

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = f32(scores)
        if self.temperature == 1.0:
            return scores.copy()
        return scores / self.temperature  # float32, divided by float32(temperature) as torch does

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The same division on candidates (``-inf`` stays ``-inf``)."""
        if not isinstance(scores, Candidates):
            return None
        if self.temperature == 1.0:
            return scores
        return scores.with_scores(scores.packed / self.temperature)


class TopKProcessor:
    """Keep the ``top_k`` highest scores and every score tied with the k-th (TopKLogitsWarper).

    ``k = max(top_k, min_tokens_to_keep)``; ``top_k=0`` disables it. The k-th
    value comes from ``np.partition`` (NaN ranks highest, as in ``torch.topk``).
    """

    def __init__(self, top_k: int, min_tokens_to_keep: int = 1) -> None:
        if not is_int(top_k) or top_k < 0:
            raise ConfigError(
                f"`top_k` has to be a strictly positive integer (or 0 to disable), but is {top_k!r}"
            )
        self.top_k = int(top_k)
        self.min_tokens_to_keep = check_min_tokens_to_keep(min_tokens_to_keep)
        self._k = max(self.top_k, self.min_tokens_to_keep) if self.top_k else 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = f32(scores)
        vocab = scores.shape[-1]
        k = min(self._k, vocab)
        if k == 0 or k == vocab:
            return scores.copy()
        if 8 * k < vocab:
            few = top_k_few(scores, k)
            if few is not None:
                present, remove = few
                return present.dense_kept(remove)
        kth = np.partition(scores, vocab - k, axis=-1)[:, vocab - k, None]
        return fill(scores, scores < kth, few_kept=8 * k < vocab)

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """Top-k as Candidates: from dense scores when k is small against the vocabulary
        (None otherwise, or when a k-th value is NaN), and on candidates always."""
        if isinstance(scores, Candidates):
            packed = scores.packed
            width = packed.shape[1]
            k = min(self._k, scores.vocab)
            # the scores outside are -inf: the k-th of the row is the k-th candidate, or
            # -inf (nothing removed) when there are fewer
            if k == 0 or k >= width:
                return scores
            kth = np.partition(packed, width - k, axis=-1)[:, width - k, None]
            return scores.keep(packed < kth)
        scores = f32(scores)
        k = min(self._k, scores.shape[-1])
        if k == 0 or 8 * k >= scores.shape[-1]:
            return None
        few = top_k_few(scores, k)
        if few is None:
            return None
        present, remove = few
        present.packed[remove] = NEG_INF  # its own new array, not yet seen by anyone
        return present


class TopPProcessor:
    """Keep the smallest set of most probable tokens whose probability reaches ``top_p``.

    TopPLogitsWarper: softmax, sort ascending, cumulative sum, remove tokens
    whose cumulative probability is ``<= 1 - top_p``, never the last
    ``min_tokens_to_keep``. Only the highest 1024 (then 8192) scores are sorted
    when everything below them is removed anyway; otherwise the whole row is
    sorted. Among equal scores at the cut, the lower ids are removed first.
    """

    def __init__(self, top_p: float, min_tokens_to_keep: int = 1) -> None:
        expected = "a float in the [0, 1] interval"
        value = as_float("top_p", top_p, expected)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"`top_p` has to be {expected}, but is {top_p!r}")
        self.top_p = value
        self.min_tokens_to_keep = check_min_tokens_to_keep(min_tokens_to_keep)
        self._removes = _at_most_in_float32(1.0 - value)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = f32(scores)
        if self.top_p == 1.0:
            return scores.copy()
        return on_present(scores, self._cut)

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The same cut on candidates."""
        if self.top_p == 1.0 and isinstance(scores, Candidates):
            return scores
        return cut_candidates(scores, lambda packed: self._cut(packed)[0])

    def _cut(self, scores: np.ndarray) -> tuple[np.ndarray, bool]:
        batch, vocab = scores.shape
        if batch == 1 and vocab <= _FEW:
            few = self._cut_few(scores[0])
            if few is not None:
                return few
        keep = min(self.min_tokens_to_keep, vocab)
        limit = np.float32(1.0 - self.top_p)  # torch compares in float32 too
        top, all_valid = row_max_checked(scores)
        valid = np.isfinite(top[:, 0]) if not all_valid else np.ones(0, dtype=bool)  # unused then
        with errstate_unless(all_valid):
            total = np.exp(scores - top).astype(np.float64).sum(axis=-1, keepdims=True)
            for size in tiers(vocab, keep + 1):
                if size < vocab:
                    part = np.partition(scores, vocab - size, axis=-1)[:, vocab - size :]
                    probs = np.exp(part - top).astype(np.float64) / total
                    below = 1.0 - probs.sum(axis=-1, keepdims=True)  # mass under the candidates
                    # part[:, 0] is the lowest candidate; once even it is removed, so is
                    # everything under it, and the candidates decide the cut.
                    lowest = (below[:, 0] + probs[:, 0]).astype(np.float32)
                    reached = lowest <= limit
                    if not all_valid:
                        reached |= ~valid
                    if not reached.all():
                        continue
                    cand = np.sort(part, axis=-1)
                else:  # no offset: adding 0.0 to the non-negative sums would change no bit
                    cand, below = np.sort(scores, axis=-1), None
                weights = np.exp(cand - top)
                n_removed = count_prefix(weights, limit, offset=below, total=total)
                n_removed = np.minimum(n_removed, size - keep)
                break

        if not all_valid:
            n_removed[~valid] = 0
        rows = np.arange(batch)
        cut = cand[rows, n_removed]  # the lowest kept score
        if not all_valid:
            cut[~valid] = -np.inf
        few_kept = 8 * (size - int(n_removed.min())) < vocab
        remove = scores < cut[:, None]
        # Equal scores straddling the cut: keep as many as the sorted order did, the
        # highest ids (a stable ascending sort puts the lower ids first, under the cut).
        # Found with Python scalars: batches are small, and on a row packed after
        # top-k each numpy call here costs as much as the cut's real work.
        straddle = [
            row
            for row, n in enumerate(n_removed.tolist())
            if n > 0 and cand[row, n - 1] == cut[row]
        ]
        for row in straddle:
            n_kept = np.searchsorted(cand[row], cut[row], side="right") - n_removed[row]
            tied = np.flatnonzero(scores[row] == cut[row])
            remove[row, tied[: tied.size - n_kept]] = True
        return remove, few_kept

    def _cut_few(self, row: np.ndarray) -> tuple[np.ndarray, bool] | None:
        """``_cut`` for one row of at most ``_FEW`` scores (top-p after top-k), summed in
        Python floats: on so few scores each numpy call costs more than its arithmetic.

        The same weights (float32 ``exp``) and float64 prefix sums as the general
        path, compared as float32; the total is summed exactly (``math.fsum``)
        rather than pairwise, which can only matter when a cumulative probability
        rounds to the limit itself. None for what the general path handles: a row
        without a softmax (NaN, +inf, all -inf) and equal scores straddling the cut.
        """
        top = float(row.max())  # NaN propagates
        if not math.isfinite(top):
            return None
        ordered = np.sort(row)
        weights = np.exp(ordered - np.float32(top)).tolist()
        total = math.fsum(weights)
        size = len(weights)
        removed, running = 0, 0.0
        for weight in weights[: size - min(self.min_tokens_to_keep, size)]:
            running += weight
            if not self._removes(running / total):
                break
            removed += 1
        cut = ordered[removed]  # the lowest kept score
        if removed and ordered[removed - 1] == cut:
            return None
        return (row < cut)[None, :], 8 * (size - removed) < size


def _at_most_in_float32(limit: float) -> Callable[[float], bool]:
    """``x -> float32(x) <= float32(limit)`` for a float64 ``x``, without rounding each x.

    ``x`` rounds to at most ``L = float32(limit)`` below the midpoint between ``L``
    and the next float32 up, and at the midpoint itself when ``L``'s last mantissa
    bit is 0 (round half to even).
    """
    bound = np.float32(limit)
    middle = (float(bound) + float(np.nextafter(bound, np.float32(np.inf)))) / 2
    if int(bound.view(np.int32)) & 1:
        return lambda x: x < middle
    return lambda x: x <= middle


class MinPProcessor:
    """Remove tokens whose probability is below ``min_p`` times the top probability.

    MinPLogitsWarper. ``p < min_p * p_max`` is ``score - max < log(min_p)``,
    which needs no softmax; the ``min_tokens_to_keep`` highest are always kept.
    """

    def __init__(self, min_p: float, min_tokens_to_keep: int = 1) -> None:
        expected = "a float in the [0, 1] interval"
        value = as_float("min_p", min_p, expected)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"`min_p` has to be {expected}, but is {min_p!r}")
        self.min_p = value
        self.min_tokens_to_keep = check_min_tokens_to_keep(min_tokens_to_keep)
        self._log_min_p = math.log(value) if value > 0 else -math.inf

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = f32(scores)
        if self.min_p == 0.0:
            return scores.copy()
        return fill(scores, self._remove(scores))

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The same cut on candidates."""
        if self.min_p == 0.0 and isinstance(scores, Candidates):
            return scores
        return cut_candidates(scores, self._remove)

    def _remove(self, scores: np.ndarray) -> np.ndarray:
        top = scores.max(axis=-1, keepdims=True)
        # NaN, +inf or all -inf in a row: HF's softmax is NaN there and removes nothing.
        threshold = np.where(np.isfinite(top), top + np.float32(self._log_min_p), NEG_INF)
        remove = scores < threshold
        keep = min(self.min_tokens_to_keep, scores.shape[-1])
        if keep > 1:  # the top token always survives, so only keep > 1 needs a fix-up
            short = np.flatnonzero(scores.shape[-1] - remove.sum(axis=-1) < keep)
            if short.size:
                best = np.argpartition(-scores[short], keep - 1, axis=-1)[:, :keep]
                remove[short[:, None], best] = False
        return remove


class TypicalPProcessor:
    """Locally typical sampling (TypicalLogitsWarper), parameter ``typical_p`` (HF's ``mass``).

    Tokens are ranked by how far their surprisal is from the entropy; the
    closest ones are kept until their probability reaches ``typical_p``, plus
    every token as close as the last one kept. Only the closest 1024 (then
    8192) are sorted when they already reach the mass.
    """

    def __init__(self, typical_p: float = 0.9, min_tokens_to_keep: int = 1) -> None:
        expected = "a float in the (0, 1] interval"
        value = as_float("typical_p", typical_p, expected)
        if not 0.0 < value <= 1.0:
            raise ConfigError(f"`typical_p` has to be {expected}, but is {typical_p!r}")
        self.typical_p = value
        self.min_tokens_to_keep = check_min_tokens_to_keep(min_tokens_to_keep)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = f32(scores)
        if self.typical_p == 1.0:
            return scores.copy()
        return on_present(scores, self._cut)

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The same cut on candidates."""
        if self.typical_p == 1.0 and isinstance(scores, Candidates):
            return scores
        return cut_candidates(scores, lambda packed: self._cut(packed)[0])

    def _cut(self, scores: np.ndarray) -> tuple[np.ndarray, bool]:
        batch, vocab = scores.shape
        mass = np.float32(self.typical_p)
        top, valid = row_max(scores)
        # -inf * 0 for removed tokens (skipped by nansum); NaN and overflow only in invalid rows
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            shifted = scores - top
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            probs = np.exp(log_probs)
            terms = log_probs * probs
            entropy = terms.sum(axis=-1, keepdims=True)
            if not all(map(math.isfinite, entropy.ravel().tolist())):  # a -inf score's NaN
                entropy = np.nansum(terms, axis=-1, keepdims=True)  # (nansum copies: rare)
            entropy = -entropy
            distance = np.abs(-log_probs - entropy)

        rows = row_index(batch)
        for size in tiers(vocab, self.min_tokens_to_keep):
            if size < vocab:
                cand = closest(distance, size)
                reached = probs[rows, cand].astype(np.float64).sum(axis=-1).astype(np.float32)
                if not np.all((reached >= mass) | ~valid):
                    continue
                cand = cand[rows, np.argsort(distance[rows, cand], axis=-1)]
            else:
                cand = np.argsort(distance, axis=-1)
            break

        # HF clamps to vocab - 1; a partial candidate set can only need it in rounding cases
        last = np.minimum(count_prefix(probs[rows, cand], mass, strict=True), cand.shape[1] - 1)
        limit = distance[rows[:, 0], cand[rows[:, 0], last]]
        limit[~valid] = np.inf
        remove = distance > limit[:, None]
        remove[rows, cand[:, : self.min_tokens_to_keep]] = False
        return remove, few_kept(remove)
