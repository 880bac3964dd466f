"""An example ortgen plugin: two logits processors, a stopping criterion, a drafter and a
KV cache composed from a built-in one.

ortgen finds this module through the ``ortgen`` entry-point group (see
``pyproject.toml``) and calls its ``@hookimpl`` functions once per ``load()``.
Each hook registers *factories*: ortgen calls a factory once per request with the
parameters the user wrote in ``logits_processors=[{"name": ..., **params}]`` (or
``stopping_criteria=[...]``, ``drafter=...``, ``cache=...``), plus ``ctx`` when its
``__init__`` asks for it. The object a factory returns is then called once per
generated token, so everything that can be worked out in advance is worked out in
``__init__``.

Only ``ortgen`` (the public API; for the composed cache also the built-in caches that
``ortgen.plugins.caches`` makes public) and numpy are imported: a plugin needs no base
class, only the call shape described in ``ortgen.LogitsProcessor``,
``ortgen.StoppingCriterion``, ``ortgen.Drafter`` and ``ortgen.KVCache``. The package
ships ``py.typed`` and passes ``mypy --strict`` against the installed ortgen (see
``[tool.mypy]`` in ``pyproject.toml``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ortgen import (
    ConfigError,
    DrafterFactory,
    GenerationContext,
    KVCacheFactory,
    LogitsProcessorFactory,
    Register,
    StoppingCriterionFactory,
    hookimpl,
)

from .cache import CappedStaticCache
from .drafter import RepeatTokenDrafter

__all__ = [
    "BanTokens",
    "CappedStaticCache",
    "RepeatTokenDrafter",
    "SeenTokenPenalty",
    "StopTokens",
]


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("ban_tokens", BanTokens)
    register("seen_token_penalty", SeenTokenPenalty)


@hookimpl
def register_stopping_criteria(register: Register[StoppingCriterionFactory]) -> None:
    register("stop_tokens", StopTokens)


@hookimpl
def register_drafters(register: Register[DrafterFactory]) -> None:
    register("repeat_token", RepeatTokenDrafter)


@hookimpl
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    register("capped_static", CappedStaticCache)


def _token_ids(component: str, value: Any, vocab_size: int) -> np.ndarray:
    """``value`` as an int64 array of ids in ``[0, vocab_size)``, or a ConfigError.

    Checked in the factory, not per token: a bad value then fails the request
    before the first forward, with a message naming the component and parameter.
    (ortgen itself only checks parameter *names* against the signature.)
    """
    is_list = isinstance(value, Sequence) and not isinstance(value, str)
    if not is_list or not value or not all(_is_id(i, vocab_size) for i in value):
        raise ConfigError(
            f"{component}: `token_ids` has to be a non-empty list of token ids in "
            f"[0, {vocab_size}), but is {value!r}"
        )
    return np.unique(np.asarray(value, dtype=np.int64))


def _is_id(value: object, vocab_size: int) -> bool:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return False
    return 0 <= int(value) < vocab_size


class BanTokens:
    """Never generate any of ``token_ids``: their scores become ``-inf``.

    Works for greedy decoding and sampling alike, because it runs before the
    sampler. Banning every token leaves nothing to pick, and the sampler then
    fails the request with a ``ComponentError``.
    """

    def __init__(self, token_ids: list[int], *, ctx: GenerationContext) -> None:
        self.token_ids = _token_ids("ban_tokens", token_ids, ctx.vocab_size)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = scores.copy()  # processors must not write into the array they were given
        out[:, self.token_ids] = -np.inf
        return out


class SeenTokenPenalty:
    """Subtract ``penalty`` from the score of every token the row has already generated.

    Unlike the built-in ``repetition_penalty`` (which scales scores and counts
    the prompt), this is OpenAI's additive presence penalty and only counts the
    generated tokens: ``ctx.prompt_length`` (the padded prompt length, the same
    for every row) is where they start in ``input_ids``. A negative penalty
    encourages repeats.
    """

    def __init__(self, penalty: float, *, ctx: GenerationContext) -> None:
        ok = isinstance(penalty, numbers.Real) and not isinstance(penalty, bool)
        if not ok or not math.isfinite(penalty):
            raise ConfigError(
                f"seen_token_penalty: `penalty` has to be a number, but is {penalty!r}"
            )
        self.penalty = np.float32(penalty)
        self.prompt_length = ctx.prompt_length

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)  # a copy, float32 whatever came in
        generated = input_ids[:, self.prompt_length :]
        if generated.shape[1] == 0 or self.penalty == 0:
            return out
        seen = np.zeros(out.shape, dtype=bool)
        np.put_along_axis(seen, generated, True, axis=1)  # one flag per (row, token), no loop
        out[seen] -= self.penalty
        return out


class StopTokens:
    """Finish a row right after it generates one of ``token_ids`` (kept in its output).

    ``finish_reason`` is what ``GenerationOutput.finish_reasons`` reports for the
    rows this criterion ended; without the attribute ortgen reports the
    registered name. The criterion runs after the new token was appended, so the
    last column of ``input_ids`` is the token just generated.
    """

    finish_reason = "stop_token"

    def __init__(self, token_ids: list[int], *, ctx: GenerationContext) -> None:
        self.token_ids = _token_ids("stop_tokens", token_ids, ctx.vocab_size)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return np.isin(input_ids[:, -1], self.token_ids)  # bool, shape (batch,)
