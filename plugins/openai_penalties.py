"""OpenAI's sampling adjustments: ``presence_penalty``, ``frequency_penalty``, ``logit_bias``.

Semantics are the OpenAI API's (the "Frequency and presence penalties" section of
OpenAI's parameter guide, and the ``logit_bias`` request field):

    logits[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty
    logits[j] += logit_bias[j]

where ``c[j]`` is how often token ``j`` was sampled *before the current position*,
i.e. counted over the generated tokens only, never the prompt. vLLM implements it
the same way (``apply_penalties`` in ``vllm/model_executor/layers/utils.py``, v0.8:
``logits -= frequency_penalties * output_bin_counts`` then ``logits -=
presence_penalties * output_mask``, both from the output tokens alone), so a request
moved between OpenAI, vLLM and ortgen means the same thing. The ranges are OpenAI's:
penalties in [-2, 2], biases in [-100, 100]; 0 / an empty map is "off" and gives an
unchanged copy.

Each ``__call__`` returns a new float32 array and leaves its inputs alone; the work
is proportional to the generated ids (counts come from one ``np.unique`` over
row-offset ids), not to the vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ortgen import ConfigError, GenerationContext, LogitsProcessorFactory, Register, hookimpl
from ortgen.checks import as_float, is_int


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("presence_penalty", PresencePenaltyProcessor)
    register("frequency_penalty", FrequencyPenaltyProcessor)
    register("logit_bias", LogitBiasProcessor)


def _penalty(name: str, value: object) -> float:
    """A float in OpenAI's [-2, 2]; outside it OpenAI rejects the request, and so do we."""
    expected = "a float in the [-2, 2] interval (OpenAI's range)"
    result = as_float(name, value, expected)
    if not -2.0 <= result <= 2.0:
        raise ConfigError(f"`{name}` has to be {expected}, but is {value!r}")
    return result


def generated_counts(
    input_ids: np.ndarray, prompt_length: int, vocab: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, token ids, counts) of every token generated so far, one entry per distinct pair.

    The generated part is ``input_ids[:, prompt_length:]``. Ids are offset by
    ``row * vocab`` so one ``np.unique`` counts all rows at once; ids outside
    ``[0, vocab)`` (none in a well-formed request) are ignored rather than wrapped.
    """
    generated = input_ids[:, prompt_length:]
    rows = np.broadcast_to(np.arange(generated.shape[0])[:, None], generated.shape)
    inside = (generated >= 0) & (generated < vocab)
    keys = rows[inside].astype(np.int64) * vocab + generated[inside]
    unique, counts = np.unique(keys, return_counts=True)
    return unique // vocab, unique % vocab, counts


class PresencePenaltyProcessor:
    """Subtract ``presence_penalty`` once from every token already generated (OpenAI).

    Positive values push the model towards new tokens (topics), negative ones
    towards repeating itself. The prompt does not count (``ctx.prompt_length``).
    """

    def __init__(self, presence_penalty: float, *, ctx: GenerationContext) -> None:
        self.presence_penalty = _penalty("presence_penalty", presence_penalty)
        self.prompt_length = int(ctx.prompt_length)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)  # always a copy
        if self.presence_penalty == 0.0:
            return out
        rows, ids, _ = generated_counts(input_ids, self.prompt_length, out.shape[1])
        out[rows, ids] -= np.float32(self.presence_penalty)
        return out


class FrequencyPenaltyProcessor:
    """Subtract ``frequency_penalty`` times its count from every generated token (OpenAI).

    Unlike the presence penalty this grows with each repetition, so it curbs
    verbatim loops. The product ``count * penalty`` is rounded to float32 once
    and subtracted once, as vLLM's ``logits -= penalty * counts`` does.
    """

    def __init__(self, frequency_penalty: float, *, ctx: GenerationContext) -> None:
        self.frequency_penalty = _penalty("frequency_penalty", frequency_penalty)
        self.prompt_length = int(ctx.prompt_length)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if self.frequency_penalty == 0.0:
            return out
        rows, ids, counts = generated_counts(input_ids, self.prompt_length, out.shape[1])
        # float32 penalty times an exact integer, rounded once: torch's float32 product
        amount = (np.float64(np.float32(self.frequency_penalty)) * counts).astype(np.float32)
        out[rows, ids] -= amount
        return out


class LogitBiasProcessor:
    """Add a fixed bias to the logits of chosen tokens (OpenAI's ``logit_bias``).

    ``logit_bias`` maps token ids (ints, or digit strings as JSON and TOML give
    them) to biases in [-100, 100]: about -100 bans a token, +100 all but forces
    it. Ids must lie in ``[0, ctx.vocab_size)``; a bad id is named in the error.
    Applies at every step, prompt or not, with or without sampling.
    """

    def __init__(self, logit_bias: Mapping[int | str, float], *, ctx: GenerationContext) -> None:
        if not isinstance(logit_bias, Mapping):
            raise ConfigError(
                f'`logit_bias` has to be a {{"token id": bias}} mapping, but is {logit_bias!r}'
            )
        bias: dict[int, float] = {}
        for key, value in logit_bias.items():
            token = _token_id(key)
            if token is None or token < 0:
                raise ConfigError(
                    f"`logit_bias` keys have to be token ids (integers >= 0), but one is {key!r}"
                )
            amount = as_float(f"logit_bias[{token}]", value, "a float in [-100, 100]")
            if not -100.0 <= amount <= 100.0:
                raise ConfigError(
                    f"`logit_bias[{token}]` has to be a float in [-100, 100] (OpenAI's range), "
                    f"but is {value!r}"
                )
            bias[token] = amount
        vocab = int(ctx.vocab_size)
        too_big = sorted(t for t in bias if vocab and t >= vocab)
        if too_big:
            raise ConfigError(
                f"`logit_bias` may only hold token ids in [0, {vocab}) (the vocabulary size), "
                f"but holds {too_big}"
            )
        self.logit_bias = bias
        self._ids = np.array(sorted(bias), dtype=np.int64)
        self._bias = np.array([bias[t] for t in sorted(bias)], dtype=np.float32)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if self._ids.size and self._ids[-1] >= out.shape[1]:
            raise ConfigError(
                f"`logit_bias` holds token id {int(self._ids[-1])} but the scores have only "
                f"{out.shape[1]} columns"
            )
        out[:, self._ids] += self._bias
        return out


def _token_id(key: Any) -> int | None:
    """``key`` as a token id: an int, or a string of decimal digits (JSON object keys)."""
    if is_int(key):
        return int(key)
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return None
