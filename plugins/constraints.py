"""Built-in penalties and constraints: repetition penalty, no-repeat n-grams,
minimum new tokens and bad words.

Each one reproduces the Hugging Face logits processor of the same name
(transformers 4.57, ``generation/logits_process.py``): the same parameters
(under their ``GenerationConfig`` names), the same range checks in ``__init__``
(raising :class:`ortgen.ConfigError`) and the same output. The value Hugging
Face's ``generate()`` treats as "off" (``repetition_penalty=1.0``,
``no_repeat_ngram_size=0``, ``min_new_tokens=0``) is accepted and gives an
unchanged copy, and an int is accepted where HF insists on a float. Every
``__call__`` returns a new float32 array and leaves its inputs alone; the work is
vectorised numpy proportional to the ids it must read. ``input_ids`` must hold
ids in ``[0, vocab)``: numpy would wrap a negative id where torch raises.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ortgen import ConfigError, GenerationContext, LogitsProcessorFactory, Register, hookimpl
from ortgen.checks import eos_ids, is_int

_NEG_INF = np.float32(-np.inf)


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("repetition_penalty", RepetitionPenaltyProcessor)
    register("no_repeat_ngram_size", NoRepeatNGramProcessor)
    register("min_new_tokens", MinNewTokensProcessor)
    register("bad_words_ids", BadWordsProcessor)


class RepetitionPenaltyProcessor:
    """Penalise every token already in ``input_ids`` once (RepetitionPenaltyLogitsProcessor).

    A seen token's score is divided by ``repetition_penalty`` when positive and
    multiplied by it when negative; ``> 1`` discourages repetition, ``< 1``
    encourages it. The prompt counts too, except its first
    ``prompt_ignore_length`` tokens when that is given.
    """

    def __init__(self, repetition_penalty: float, prompt_ignore_length: int | None = None) -> None:
        penalty = repetition_penalty
        ok = isinstance(penalty, numbers.Real) and not isinstance(penalty, bool)
        if not ok or not (math.isfinite(penalty) and penalty > 0):
            raise ConfigError(
                "`repetition_penalty` has to be a strictly positive float (> 0), "
                f"but is {repetition_penalty!r}"
            )
        if prompt_ignore_length is not None and (
            not is_int(prompt_ignore_length) or prompt_ignore_length < 0
        ):
            raise ConfigError(
                "`prompt_ignore_length` has to be a non-negative integer, "
                f"but is {prompt_ignore_length!r}"
            )
        self.repetition_penalty = float(repetition_penalty)
        self.prompt_ignore_length = prompt_ignore_length

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32, order="C")  # always a copy
        if self.repetition_penalty == 1.0:
            return out
        ids = input_ids[:, self.prompt_ignore_length or 0 :]
        batch, vocab = out.shape
        # One index array into the flat scores: numpy's fast path for a single
        # integer index, ~2x cheaper than out[rows, ids] with broadcast rows.
        index = ids[0] if batch == 1 else ids + np.arange(0, batch * vocab, vocab)[:, None]
        flat = out.reshape(-1)  # a view, as out is C-contiguous
        seen = flat[index]
        penalty = self.repetition_penalty
        flat[index] = np.where(seen < 0, seen * penalty, seen / penalty)
        return out


class NoRepeatNGramProcessor:
    """Forbid tokens that would repeat an n-gram already in the row (NoRepeatNGramLogitsProcessor).

    The n-grams are looked up with one vectorised comparison of every window of
    ``input_ids`` against the last ``n - 1`` ids (prompt included, as in HF).
    """

    def __init__(self, no_repeat_ngram_size: int) -> None:
        if not is_int(no_repeat_ngram_size) or no_repeat_ngram_size < 0:
            raise ConfigError(
                "`no_repeat_ngram_size` has to be a strictly positive integer (or 0 to disable), "
                f"but is {no_repeat_ngram_size!r}"
            )
        self.no_repeat_ngram_size = int(no_repeat_ngram_size)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        n = self.no_repeat_ngram_size
        length = input_ids.shape[1]
        if n == 0 or length < n:  # no complete n-gram yet
            return out
        windows = sliding_window_view(input_ids, n, axis=1)  # (B, T - n + 1, n), no copy
        prefix = input_ids[:, length - n + 1 :]  # the n - 1 ids the next token would extend
        match = (windows[:, :, :-1] == prefix[:, None, :]).all(axis=-1)
        rows, starts = np.nonzero(match)
        out[rows, windows[rows, starts, -1]] = _NEG_INF
        return out


class MinNewTokensProcessor:
    """Forbid EOS until ``min_new_tokens`` new tokens exist (MinNewTokensLengthLogitsProcessor).

    Generated tokens are counted from ``ctx.prompt_length``; the EOS ids are
    ``eos_token_id`` when given, else the request's. EOS ids outside the
    vocabulary are ignored, as HF does.
    """

    def __init__(
        self,
        min_new_tokens: int,
        eos_token_id: int | list[int] | None = None,
        *,
        ctx: GenerationContext,
    ) -> None:
        if not is_int(min_new_tokens) or min_new_tokens < 0:
            raise ConfigError(
                f"`min_new_tokens` has to be a non-negative integer, but is {min_new_tokens!r}"
            )
        self.min_new_tokens = int(min_new_tokens)
        self.eos_token_id = eos_ids(eos_token_id, ctx)
        self.prompt_length = int(ctx.prompt_length)
        self._eos = np.array(self.eos_token_id, dtype=np.int64)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if input_ids.shape[1] - self.prompt_length < self.min_new_tokens:
            out[:, self._eos[self._eos < out.shape[1]]] = _NEG_INF
        return out


class BadWordsProcessor:
    """Forbid tokens that complete a sequence in ``bad_words_ids`` (NoBadWordsLogitsProcessor).

    A one-token sequence is always forbidden; a longer one only when the row ends
    with all but its last token (and, as in HF, only once the row is at least as
    long as the sequence). One-token sequences equal to an EOS id are dropped, as
    HF does (if that leaves nothing, nothing is forbidden). Forbidding adds
    ``-inf``, as HF's sequence bias does. An empty word is refused here (HF
    accepts it and fails at the first call).
    """

    def __init__(
        self,
        bad_words_ids: list[list[int]],
        eos_token_id: int | list[int] | None = None,
        *,
        ctx: GenerationContext | None = None,
    ) -> None:
        words = bad_words_ids
        if not isinstance(words, (list, tuple)) or len(words) == 0:
            raise ConfigError(f"`bad_words_ids` has to be a non-empty list, but is {words!r}")
        if any(not isinstance(word, (list, tuple)) for word in words):
            raise ConfigError(f"`bad_words_ids` has to be a list of lists, but is {words!r}")
        if any(not word or any(not is_int(i) or i < 0 for i in word) for word in words):
            raise ConfigError(
                "Each list in `bad_words_ids` has to be a non-empty list of non-negative integers, "
                f"but is {words!r}"
            )
        self.eos_token_id = eos_ids(eos_token_id, ctx)
        unique = {tuple(int(i) for i in word) for word in words}
        unique -= {(eos,) for eos in self.eos_token_id}
        self.bad_words_ids = sorted(unique)
        self._max_id = max((max(word) for word in unique), default=-1)
        if ctx is not None and ctx.vocab_size and self._max_id >= ctx.vocab_size:
            raise ConfigError(self._vocab_message(ctx.vocab_size))
        self._single = np.array(sorted(w[0] for w in unique if len(w) == 1), dtype=np.int64)
        # longer words grouped by length: (prefixes (n, L-1), last tokens (n,))
        self._longer: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for length in sorted({len(w) for w in unique if len(w) > 1}):
            group = np.array([w for w in self.bad_words_ids if len(w) == length], dtype=np.int64)
            self._longer[length] = (group[:, :-1], group[:, -1])

    def _vocab_message(self, vocab_size: int) -> str:
        too_big = sorted({i for w in self.bad_words_ids for i in w if i >= vocab_size})
        return (
            f"`bad_words_ids` may only hold ids in [0, {vocab_size}) (the vocabulary size), "
            f"but holds {too_big}"
        )

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if self._max_id >= out.shape[1]:
            raise ConfigError(self._vocab_message(out.shape[1]))
        if self._single.size:
            out[:, self._single] += _NEG_INF
        length = input_ids.shape[1]
        for word_length, (prefixes, last) in self._longer.items():
            if word_length > length:  # HF skips words longer than the row
                break
            tail = input_ids[:, length - word_length + 1 :]
            match = (tail[:, None, :] == prefixes[None, :, :]).all(axis=-1)  # (B, n)
            rows, words = np.nonzero(match)
            out[rows, last[words]] += _NEG_INF
        return out
