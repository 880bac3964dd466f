"""Built-in drafter for speculative decoding: prompt lookup.

``prompt_lookup`` (Hugging Face's ``prompt_lookup_num_tokens``, vLLM's and llama.cpp's
n-gram drafting) looks for the latest earlier occurrence of the row's last n tokens (n
from ``max_ngram`` down to ``min_ngram``) and proposes the tokens that followed it. It
pays on text that copies from the prompt or from itself (code edits, extraction,
answers from a passage) and proposes nothing when no n-gram repeats. Matches of one
token are not tried: they propose often and are rejected often (a simulation on chat,
QA and code fell to 0.86-0.97x of plain decoding with them, docs/NOTES).

How many tokens it proposes adapts: one more than the model kept last time, up to
``num_tokens``, so writing that stops copying soon costs little; a draft fully kept
grows it again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ortgen import ConfigError, DrafterFactory, Register, hookimpl
from ortgen.checks import is_int


class PromptLookupDrafter:
    """Drafts by n-gram match over the row's own tokens (prompt and generated)."""

    def __init__(self, *, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 2) -> None:
        for name, value, least in (
            ("num_tokens", num_tokens, 1),
            ("max_ngram", max_ngram, 1),
            ("min_ngram", min_ngram, 1),
        ):
            if not is_int(value) or value < least:
                raise ConfigError(
                    f"drafter 'prompt_lookup': {name} must be an integer >= {least}, got {value!r}"
                )
        if min_ngram > max_ngram:
            raise ConfigError(
                f"drafter 'prompt_lookup': min_ngram ({min_ngram}) > max_ngram ({max_ngram})"
            )
        self.num_tokens = int(num_tokens)
        self.max_ngram = int(max_ngram)
        self.min_ngram = int(min_ngram)
        self.next_count = self.num_tokens  # adapted by ``accepted``

    def draft(self, tokens: np.ndarray, limit: int) -> Sequence[int]:
        count = min(limit, self.next_count)
        size = len(tokens)
        if count < 1:
            return []
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            pattern = tokens[size - n :]
            # every earlier n-gram that has a token after it (the last one is the pattern)
            windows = sliding_window_view(tokens[: size - 1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # the latest match: the nearest context
                return tokens[start : start + count].tolist()
        return []

    def accepted(self, drafted: int, kept: int) -> None:
        """Propose one more than the model kept this time (at most ``num_tokens``)."""
        self.next_count = max(1, min(self.num_tokens, kept + 1))


@hookimpl
def register_drafters(register: Register[DrafterFactory]) -> None:
    register("prompt_lookup", PromptLookupDrafter)
