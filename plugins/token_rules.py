"""Hugging Face's token rules: sequence bias, minimum length, suppressed and forced tokens,
the exponential length penalty, invalid-value removal and renormalisation.

Each one reproduces the Hugging Face logits processor it is named after (transformers
4.57, ``generation/logits_process.py``) under the names and parameters
:func:`ortgen.loop.chain.processor_specs` passes: the same output for the same scores, the
same range checks in ``__init__`` (raising :class:`ortgen.ConfigError`), and the value
``generate()`` treats as "off" (an empty token list, ``min_length=0``, a decay factor
of 1) accepted as an unchanged copy. Every ``__call__`` returns a new float32 array and
leaves its inputs alone; the work is vectorised numpy over the ids it must touch.

Deliberate differences, all where Hugging Face fails or produces NaN:

* a token id the scores have no column for is a ``ConfigError`` (at creation when the
  context knows the vocabulary, else at the first call) where torch raises an
  ``IndexError``; the rules HF applies with ``isin`` (minimum length, suppression)
  ignore such ids, as HF does;
* ``sequence_bias`` accepts token id 0 and integer biases (HF's list form refuses
  both, its dict form accepts the id);
* the exponential length penalty leaves an EOS score that is ``±inf`` or 0 alone (HF
  turns ``-inf``, e.g. an EOS the minimum length forbids, into NaN, so greedy
  decoding picks the forbidden EOS), and saturates instead of raising
  ``OverflowError`` when ``decay_factor ** steps`` leaves the float range.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from ortgen import ConfigError, GenerationContext, LogitsProcessorFactory, Register, hookimpl
from ortgen.checks import as_float, eos_ids, is_int, token_ids

_NEG_INF = np.float32(-np.inf)


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("sequence_bias", SequenceBiasProcessor)
    register("min_length", MinLengthProcessor)
    register("forced_bos_token_id", ForcedBOSTokenProcessor)
    register("forced_eos_token_id", ForcedEOSTokenProcessor)
    register("remove_invalid_values", RemoveInvalidValuesProcessor)
    register("exponential_decay_length_penalty", ExponentialDecayLengthPenaltyProcessor)
    register("suppress_tokens", SuppressTokensProcessor)
    register("begin_suppress_tokens", BeginSuppressTokensProcessor)
    register("renormalize_logits", RenormalizeLogitsProcessor)


# --- helpers ----------------------------------------------------------------------


def _copy(scores: np.ndarray) -> np.ndarray:
    return np.array(scores, dtype=np.float32)  # always a new array


def _non_negative_int(name: str, value: Any, *, positive: bool = False) -> int:
    if not is_int(value) or value < (1 if positive else 0):
        kind = "a strictly positive" if positive else "a non-negative"
        raise ConfigError(f"`{name}` has to be {kind} integer, but is {value!r}")
    return int(value)


def _in_vocab(name: str, ids: tuple[int, ...] | list[int], vocab: int) -> None:
    """ConfigError for ids the scores have no column for (torch would raise IndexError)."""
    too_big = sorted({i for i in ids if i >= vocab})
    if too_big:
        raise ConfigError(
            f"`{name}` may only hold ids in [0, {vocab}) (the vocabulary size), but holds {too_big}"
        )


def _vocab(ctx: GenerationContext | None) -> int | None:
    return ctx.vocab_size if ctx is not None and ctx.vocab_size else None


class _Suppress:
    """``-inf`` at a fixed set of ids, ignoring those outside the vocabulary (HF's ``isin``)."""

    def __init__(self, ids: tuple[int, ...]) -> None:
        self._ids = np.unique(np.array(ids, dtype=np.int64))

    def apply(self, out: np.ndarray) -> np.ndarray:
        out[:, self._ids[self._ids < out.shape[1]]] = _NEG_INF
        return out


# --- sequence bias ------------------------------------------------------------------


def _bias_pairs(value: object) -> list[tuple[tuple[int, ...], float]]:
    """HF's two shapes, ``[[ids, bias], ...]`` or ``{(ids...): bias}``, as (ids, bias) pairs."""
    items: Any = value.items() if isinstance(value, Mapping) else value
    shape = (
        "a list of [token-id list, bias] pairs (or a {tuple of ids: bias} dict) with "
        "non-empty lists of non-negative ids and numeric biases (NaN and +inf refused)"
    )
    if not isinstance(items, (list, tuple)) and not isinstance(value, Mapping):
        raise ConfigError(f"`sequence_bias` has to be {shape}, but is {value!r}")
    pairs = []
    for item in items:
        ok = isinstance(item, (list, tuple)) and len(item) == 2
        ids: Any
        bias: Any
        ids, bias = item if ok else ((), None)
        ok = ok and isinstance(ids, (list, tuple)) and len(ids) > 0
        ok = ok and all(is_int(i) and i >= 0 for i in ids)
        ok = ok and isinstance(bias, numbers.Real) and not isinstance(bias, (bool, np.bool_))
        if not ok or math.isnan(bias) or bias == math.inf:
            raise ConfigError(f"`sequence_bias` has to be {shape}, but is {value!r}")
        pairs.append((tuple(int(i) for i in ids), float(bias)))
    return pairs


class SequenceBiasProcessor:
    """Add a bias to a token when it would complete a given sequence (SequenceBiasLogitsProcessor).

    A one-token sequence biases its token at every step; a longer one biases its last
    token in the rows that end with the rest of it (and, as in HF, only once the row
    is at least as long as the whole sequence). Biases of sequences that share a last
    token add up. A sequence given twice keeps its last bias (HF builds a dict). An
    empty list is "off". ``-inf`` forbids, as HF's bad words do.
    """

    def __init__(
        self,
        sequence_bias: list[list[object]] | Mapping[tuple[int, ...], float],
        *,
        ctx: GenerationContext | None = None,
    ) -> None:
        self.sequence_bias = dict(_bias_pairs(sequence_bias))
        singles = [(ids[0], b) for ids, b in self.sequence_bias.items() if len(ids) == 1]
        longer = [(ids, b) for ids, b in self.sequence_bias.items() if len(ids) > 1]
        self._single_ids = np.array([i for i, _ in singles], dtype=np.int64)
        self._single_bias = np.array([b for _, b in singles], dtype=np.float32)
        # longer sequences in dict order (the order HF adds their biases in), matched by length
        self._last = np.array([ids[-1] for ids, _ in longer], dtype=np.int64)
        self._bias = np.array([b for _, b in longer], dtype=np.float32)
        self._groups: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for length in sorted({len(ids) for ids, _ in longer}):
            which = np.array([k for k, (ids, _) in enumerate(longer) if len(ids) == length])
            prefixes = np.array([longer[k][0][:-1] for k in which], dtype=np.int64)
            self._groups[length] = (which, prefixes)
        self._all_ids = [i for ids in self.sequence_bias for i in ids]
        vocab = _vocab(ctx)
        if vocab is not None:
            _in_vocab("sequence_bias", self._all_ids, vocab)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        batch, vocab = scores.shape
        _in_vocab("sequence_bias", self._all_ids, vocab)
        bias = np.zeros(vocab, dtype=np.float32)
        bias[self._single_ids] = self._single_bias
        length = input_ids.shape[1]
        match = np.zeros((batch, self._last.size), dtype=bool)
        for seq_length, (which, prefixes) in self._groups.items():
            if seq_length > length:  # HF ignores sequences longer than the row
                break
            tail = input_ids[:, length - seq_length + 1 :]
            match[:, which] = (tail[:, None, :] == prefixes[None, :, :]).all(axis=-1)
        rows, seqs = np.nonzero(match)  # row-major: each row's sequences in dict order
        if rows.size == 0:
            return np.asarray(scores, dtype=np.float32) + bias
        full = np.broadcast_to(bias, (batch, vocab)).copy()
        np.add.at(full, (rows, self._last[seqs]), self._bias[seqs])  # in order, as HF adds
        return np.asarray(scores, dtype=np.float32) + full


# --- length rules -----------------------------------------------------------------------


class MinLengthProcessor:
    """Forbid EOS while the row is shorter than ``min_length`` (MinLengthLogitsProcessor).

    The length is ``input_ids.shape[-1]``, prompt (and its left padding) included, as
    in HF; ``min_new_tokens`` counts generated tokens only. The EOS ids are
    ``eos_token_id`` when given, else the request's; ids outside the vocabulary are
    ignored, as HF does.
    """

    def __init__(
        self,
        min_length: int,
        eos_token_id: int | list[int] | None = None,
        *,
        ctx: GenerationContext | None = None,
    ) -> None:
        self.min_length = _non_negative_int("min_length", min_length)
        self.eos_token_id = eos_ids(eos_token_id, ctx)
        self._eos = _Suppress(self.eos_token_id)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = _copy(scores)
        if input_ids.shape[-1] < self.min_length:
            self._eos.apply(out)
        return out


class ForcedBOSTokenProcessor:
    """Force ``bos_token_id`` as the first token (ForcedBOSTokenLogitsProcessor).

    Applies when the row holds exactly one token (``input_ids.shape[-1] == 1``, the
    decoder start of an encoder-decoder model in HF); every other score becomes
    ``-inf`` and the forced one 0.
    """

    def __init__(self, bos_token_id: int, *, ctx: GenerationContext | None = None) -> None:
        self.bos_token_id = _non_negative_int("forced_bos_token_id", bos_token_id)
        vocab = _vocab(ctx)
        if vocab is not None:
            _in_vocab("forced_bos_token_id", [self.bos_token_id], vocab)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if input_ids.shape[-1] != 1:
            return _copy(scores)
        _in_vocab("forced_bos_token_id", [self.bos_token_id], scores.shape[1])
        out = np.full(scores.shape, _NEG_INF, dtype=np.float32)
        out[:, self.bos_token_id] = 0.0
        return out


class ForcedEOSTokenProcessor:
    """Force an EOS id as the last token (ForcedEOSTokenLogitsProcessor).

    Applies when the row holds ``max_length - 1`` tokens (prompt included): every
    score becomes ``-inf`` and those of ``eos_token_id`` 0, so with several ids the
    sampler still picks among them.
    """

    def __init__(
        self,
        max_length: int,
        eos_token_id: int | list[int],
        *,
        ctx: GenerationContext | None = None,
    ) -> None:
        self.max_length = _non_negative_int("max_length", max_length, positive=True)
        self.eos_token_id = token_ids("eos_token_id", eos_token_id)
        if not self.eos_token_id:
            raise ConfigError("`eos_token_id` has to name at least one token, but is []")
        vocab = _vocab(ctx)
        if vocab is not None:
            _in_vocab("forced_eos_token_id", self.eos_token_id, vocab)
        self._eos = np.array(self.eos_token_id, dtype=np.int64)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if input_ids.shape[-1] != self.max_length - 1:
            return _copy(scores)
        _in_vocab("forced_eos_token_id", self.eos_token_id, scores.shape[1])
        out = np.full(scores.shape, _NEG_INF, dtype=np.float32)
        out[:, self._eos] = 0.0
        return out


class ExponentialDecayLengthPenaltyProcessor:
    """Raise the EOS scores exponentially once the row is long (ExponentialDecayLengthPenalty).

    From ``regulation_start = start_index + input_ids_seq_length`` (the prompt length:
    ``start_index`` counts generated tokens) the EOS scores get ``|score| *
    (decay_factor ** (cur_len - regulation_start) - 1)`` added, which raises a negative
    score as much as a positive one; it bites from the step after ``regulation_start``.
    A factor below 1 lowers EOS instead; 1 is "off". Scores that are ``±inf`` or 0 are
    left alone (see the module docstring).
    """

    def __init__(
        self,
        start_index: int,
        decay_factor: float,
        eos_token_id: int | list[int] | None = None,
        input_ids_seq_length: int | None = None,
        *,
        ctx: GenerationContext | None = None,
    ) -> None:
        self.start_index = _non_negative_int("start_index", start_index)
        self.decay_factor = as_float("decay_factor", decay_factor, "a finite number")
        if input_ids_seq_length is None:
            input_ids_seq_length = ctx.prompt_length if ctx is not None else 0
        seq_length = _non_negative_int("input_ids_seq_length", input_ids_seq_length)
        self.regulation_start = self.start_index + seq_length
        self.eos_token_id = eos_ids(eos_token_id, ctx)
        vocab = _vocab(ctx)
        if vocab is not None:
            _in_vocab("eos_token_id", self.eos_token_id, vocab)
        self._eos = np.unique(np.array(self.eos_token_id, dtype=np.int64))

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = _copy(scores)
        steps = input_ids.shape[-1] - self.regulation_start
        if steps <= 0 or self._eos.size == 0 or self.decay_factor == 1.0:
            return out
        _in_vocab("eos_token_id", self.eos_token_id, out.shape[1])
        try:
            growth = np.float32(self.decay_factor**steps - 1.0)  # torch: a float32 multiply
        except OverflowError:  # HF raises; the penalty saturates here
            growth = np.float32(np.inf)
        eos = out[:, self._eos]
        with np.errstate(over="ignore", invalid="ignore"):  # only where np.where drops it
            raised = eos + np.abs(eos) * growth
        out[:, self._eos] = np.where(np.isfinite(eos) & (eos != 0), raised, eos)
        return out


# --- suppression --------------------------------------------------------------------------


class SuppressTokensProcessor:
    """Forbid ``suppress_tokens`` at every step (SuppressTokensLogitsProcessor).

    Ids outside the vocabulary are ignored, as HF does; an empty list is "off".
    """

    def __init__(self, suppress_tokens: list[int]) -> None:
        self.suppress_tokens = token_ids("suppress_tokens", suppress_tokens)
        self._suppress = _Suppress(self.suppress_tokens)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return self._suppress.apply(_copy(scores))


class BeginSuppressTokensProcessor:
    """Forbid ``begin_suppress_tokens`` at the first generated step only
    (SuppressTokensAtBeginLogitsProcessor).

    That step is the one where ``input_ids.shape[-1] == begin_index``; ``begin_index``
    defaults to the request's (padded) prompt length. Ids outside the vocabulary are
    ignored; an empty list is "off".
    """

    def __init__(
        self,
        begin_suppress_tokens: list[int],
        begin_index: int | None = None,
        *,
        ctx: GenerationContext | None = None,
    ) -> None:
        self.begin_suppress_tokens = token_ids("begin_suppress_tokens", begin_suppress_tokens)
        if begin_index is None:
            begin_index = ctx.prompt_length if ctx is not None else 0
        self.begin_index = _non_negative_int("begin_index", begin_index)
        self._suppress = _Suppress(self.begin_suppress_tokens)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = _copy(scores)
        if input_ids.shape[-1] == self.begin_index:
            self._suppress.apply(out)
        return out


# --- whole-row transforms ------------------------------------------------------------------


class RemoveInvalidValuesProcessor:
    """NaN to 0, ``+inf`` to the largest float32 and ``-inf`` to the lowest
    (InfNanRemoveLogitsProcessor), so sampling never sees them.

    Note that a forbidden (``-inf``) token becomes merely very unlikely, as in HF;
    transformers runs this before the sampling warpers, which cut with ``-inf`` again.
    """

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        finfo = np.finfo(np.float32)
        return np.nan_to_num(
            _copy(scores), nan=0.0, posinf=float(finfo.max), neginf=float(finfo.min)
        )


class RenormalizeLogitsProcessor:
    """``log_softmax`` of the scores (LogitNormalization), last in the chain as in HF.

    Rows that are all ``-inf`` or hold NaN or ``+inf`` come out NaN, as torch's do.
    """

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores, dtype=np.float32)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            shifted = scores - scores.max(axis=-1, keepdims=True)
            return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
