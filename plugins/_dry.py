"""llama.cpp's DRY ("don't repeat yourself") processor, registered by ``llamacpp``.

It reproduces ``llama_sampler_dry_apply`` in llama.cpp's ``src/llama-sampling.cpp``
(ggml-org/llama.cpp at commit 0344068cf112e524eb3fbdbd58c171870b63e56c): a token that
would extend a repeat of an earlier stretch of the text is penalised by
``multiplier * base ** (length - allowed_length)``; sequence breakers (strings such as a
newline) end the stretches a repeat may match across.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ortgen import ConfigError, GenerationContext
from ortgen.checks import as_float, is_int

_NEG_INF = np.float32(-np.inf)
# llama_sampler_init_dry: breakers are cut to 40 characters, their tails to 20 tokens
_MAX_CHAR_LEN = 40
_MAX_SEQ_LEN = 20
# llama_sampler_dry_apply: log(FLT_MAX), bounds the exponent of the penalty
_FLOAT_MAX_LOG = 88.7228391


# --- DRY ------------------------------------------------------------------------


@dataclass(frozen=True)
class Breakers:
    """DRY's processed sequence breakers (llama.cpp's ``dry_processed_breakers``).

    ``single``: sorted ids of tokens that are a breaker on their own (the token's
    text contains a breaker string); ``longer``: by tail length L, an (n, L + 1)
    array of head token + the tokens the rest of the breaker string encodes to.
    """

    single: np.ndarray
    longer: dict[int, np.ndarray]

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]]) -> Breakers:
        """From token sequences (head first), as llama.cpp's ``llama_sampler_init_dry_testing``."""
        single = sorted({int(s[0]) for s in sequences if len(s) == 1})
        longer: dict[int, set[tuple[int, ...]]] = {}
        for seq in sequences:
            if len(seq) > 1:
                longer.setdefault(len(seq) - 1, set()).add(tuple(int(t) for t in seq))
        return cls(
            np.array(single, dtype=np.int64),
            {n: np.array(sorted(s), dtype=np.int64) for n, s in sorted(longer.items())},
        )


_BREAKER_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], Breakers]] = (
    weakref.WeakKeyDictionary()
)


def tokenize_breakers(tokenizer: Any, breakers: tuple[str, ...]) -> Breakers:
    """llama.cpp's ``get_overlapping_token_sequences`` for each breaker, via ``tokenizer``.

    A token whose text contains the breaker is a one-token breaker. A token whose
    text *ends with* a proper prefix of the breaker is the head of a longer one, its
    tail the encoding (no special tokens, at most 20 ids) of the rest of the string.
    Token texts are ``decode([id], skip_special_tokens=False)``; llama.cpp compares
    bytes, so unlike it a token holding only part of a multi-byte character cannot
    match here. Scanning the vocabulary costs a fraction of a second on 150k tokens,
    so the result is cached per tokenizer and breaker tuple.
    """
    try:
        cached = _BREAKER_CACHE.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no cache
        cached = {}
    if breakers in cached:
        return cached[breakers]
    backend = tokenizer.backend
    words_list = backend.decode_batch(
        [[i] for i in range(tokenizer.vocab_size)], skip_special_tokens=False
    )
    words = np.array(words_list, dtype=np.dtypes.StringDType())
    sequences: list[tuple[int, ...]] = []
    for breaker in breakers:
        text = breaker.encode()[:_MAX_CHAR_LEN].decode(errors="ignore")
        if not text:
            continue
        contains = np.strings.find(words, text) >= 0
        sequences.extend((int(i),) for i in np.flatnonzero(contains))
        for m in range(1, len(text)):
            heads = np.flatnonzero(np.strings.endswith(words, text[:m]) & ~contains)
            if heads.size:
                tail = tuple(tokenizer.encode(text[m:], add_special_tokens=False)[:_MAX_SEQ_LEN])
                sequences.extend((int(i), *tail) for i in heads)
    result = Breakers.from_sequences(sequences)
    cached[breakers] = result
    return result


class DryProcessor:
    """DRY, "Don't Repeat Yourself" (``llama_sampler_dry_apply``, ported from koboldcpp).

    The context is the last ``penalty_last_n`` ids of the row (-1: the whole row,
    prompt included, as llama.cpp's server feeds the prompt to the sampler; 0: off).
    If emitting token t would extend a suffix of the context that already occurred
    earlier (found with the reverse Z-algorithm), with that earlier match at least
    ``allowed_length`` long, t's logit drops by ``multiplier * base ** (len -
    allowed_length)`` for the longest such ``len`` (the exponent is capped so the
    penalty stays a finite float32). Sequence breakers (strings such as newline) stop
    the matching: a repeat may not reach back across the most recent breaker, and a
    one-token breaker is never penalised. Breaker strings become token sequences via
    ``ctx.tokenizer`` (see :func:`tokenize_breakers`); without one, pass
    ``sequence_breakers=[]``. ``multiplier=0`` is off.
    """

    def __init__(
        self,
        multiplier: float,
        base: float = 1.75,
        allowed_length: int = 2,
        penalty_last_n: int = -1,
        sequence_breakers: Sequence[str] = ("\n", ":", '"', "*"),
        *,
        ctx: GenerationContext,
    ) -> None:
        self.multiplier = as_float("multiplier", multiplier, "a float >= 0")
        if self.multiplier < 0:
            raise ConfigError(f"DRY `multiplier` has to be a float >= 0, but is {multiplier!r}")
        self.base = as_float("base", base, "a float >= 1")
        if self.base < 1.0:
            raise ConfigError(f"DRY `base` has to be a float >= 1, but is {base!r}")
        if not is_int(allowed_length) or allowed_length < 0:
            raise ConfigError(
                f"DRY `allowed_length` has to be an integer >= 0, but is {allowed_length!r}"
            )
        if not is_int(penalty_last_n) or penalty_last_n < -1:
            raise ConfigError(
                "DRY `penalty_last_n` has to be an integer >= -1 (-1: the whole context, "
                f"0: off), but is {penalty_last_n!r}"
            )
        texts = (sequence_breakers,) if isinstance(sequence_breakers, str) else sequence_breakers
        if not isinstance(texts, Sequence) or not all(isinstance(s, str) for s in texts):
            raise ConfigError(
                f"DRY `sequence_breakers` has to be a list of strings, but is {sequence_breakers!r}"
            )
        self.allowed_length = int(allowed_length)
        self.penalty_last_n = int(penalty_last_n)
        self.sequence_breakers = tuple(s for s in texts if s)  # llama.cpp skips empty ones
        self.enabled = self.multiplier != 0.0 and self.penalty_last_n != 0
        self.breakers = Breakers.from_sequences([])
        if self.enabled and self.sequence_breakers:
            if ctx.tokenizer is None:
                raise ConfigError(
                    "DRY `sequence_breakers` are strings and need the model's tokenizer to "
                    "become tokens, but this model has none; pass sequence_breakers=[] "
                    "(config: dry_sequence_breakers = []) to use DRY without breakers"
                )
            self.breakers = tokenize_breakers(ctx.tokenizer, self.sequence_breakers)
        # the exponent cap of llama.cpp; lengths beyond it all get the same penalty
        # (in float32 arithmetic, as the C++ computes it from float parameters)
        base32 = np.float32(self.base)
        self.max_exponent = (
            int(np.float32(_FLOAT_MAX_LOG) / np.log(base32)) if base32 > np.float32(1.000001) else 0
        )

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if not self.enabled:
            return out
        length = input_ids.shape[1]
        n = length if self.penalty_last_n == -1 else min(length, self.penalty_last_n)
        if n <= self.allowed_length:
            return out
        context = np.asarray(input_ids[:, length - n :], dtype=np.int64)
        rep_limit = self._rep_limits(context)
        # Longer repeats than `cap` get the same penalty (clamped exponent), so stop there.
        cap = rep_limit.copy()
        if self.max_exponent > 0:
            cap = np.minimum(cap, self.allowed_length + self.max_exponent)
        elif self.base == 1.0:  # every penalty is `multiplier`
            cap = np.minimum(cap, self.allowed_length)
        repeat = _suffix_repeats(context, cap)  # (B, n - 1)
        repeat[rep_limit < self.allowed_length] = -1  # llama.cpp returns early for such rows
        rows, pos = np.nonzero(repeat >= self.allowed_length)
        tokens = context[rows, pos + 1]  # the token that would continue the repeat
        lengths = repeat[rows, pos]
        usable = (tokens >= 0) & (tokens < out.shape[1]) & ~np.isin(tokens, self.breakers.single)
        rows, tokens, lengths = rows[usable], tokens[usable], lengths[usable]
        if rows.size == 0:
            return out
        # the longest repeat per (row, token): sort by key then length, take each key's last
        keys = rows * out.shape[1] + tokens
        order = np.lexsort((lengths, keys))
        keys, lengths = keys[order], lengths[order]
        last = np.r_[keys[1:] != keys[:-1], True]
        keys, lengths = keys[last], lengths[last]
        exponent = lengths - self.allowed_length
        if self.max_exponent > 0:
            exponent = np.minimum(exponent, self.max_exponent)
        # float(multiplier * pow(base, exp)) as llama.cpp: float32 params, double pow
        penalty = np.float64(np.float32(self.multiplier)) * np.power(
            np.float64(np.float32(self.base)), exponent.astype(np.float64)
        )
        out.reshape(-1)[keys] -= penalty.astype(np.float32)
        return out

    def _rep_limits(self, context: np.ndarray) -> np.ndarray:
        """Per row, how far back a repeat may reach: the distance to the most recent breaker.

        llama.cpp walks back from the newest token; at the first token that heads a
        breaker matching in full (tail included, tail within the context), the limit
        becomes that distance minus the longest matching tail. No breaker: ``n``.
        """
        batch, n = context.shape
        tail = np.full((batch, n), -1, dtype=np.int64)  # longest matching tail at each head
        tail[np.isin(context, self.breakers.single)] = 0
        for tail_len, seqs in self.breakers.longer.items():
            if tail_len >= n:
                break
            windows = sliding_window_view(context, tail_len + 1, axis=1)  # (B, n - L, L + 1)
            rows, starts = np.nonzero(np.isin(windows[:, :, 0], seqs[:, 0]))
            if rows.size == 0:
                continue
            found = windows[rows, starts]  # (c, L + 1)
            match = np.zeros(rows.size, dtype=bool)
            for chunk in range(0, seqs.shape[0], 256):  # bounded (c, 256, L + 1) compares
                part = seqs[chunk : chunk + 256]
                match |= (found[:, None, :] == part[None, :, :]).all(axis=-1).any(axis=-1)
            rows, starts = rows[match], starts[match]
            np.maximum.at(tail, (rows, starts), tail_len)
        has = tail >= 0
        newest = n - 1 - np.argmax(has[:, ::-1], axis=1)  # most recent head position
        distance = n - 1 - newest
        limit = distance - tail[np.arange(batch), newest]
        return np.where(has.any(axis=1), limit, n)


def _suffix_repeats(context: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """``out[b, j]`` = length of the longest common suffix of ``context[b, :j + 1]`` and
    ``context[b]``, capped at ``cap[b]``, for ``j < n - 1``.

    This is llama.cpp's ``dry_repeat_count`` (its reverse Z-algorithm clips every
    value to ``rep_limit`` too). Computed by extending all matches one token per
    step, vectorised over rows and positions; the steps are bounded by ``cap``.
    """
    batch, n = context.shape
    out = np.zeros((batch, n - 1), dtype=np.int64)
    last = context[:, -1]
    rows, pos = np.nonzero((context[:, :-1] == last[:, None]) & (cap[:, None] >= 1))
    k = 1
    while rows.size:
        out[rows, pos] = k
        keep = (pos >= k) & (cap[rows] > k)
        rows, pos = rows[keep], pos[keep]
        same = context[rows, pos - k] == context[rows, n - 1 - k]
        rows, pos = rows[same], pos[same]
        k += 1
    return out
