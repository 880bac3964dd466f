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

``reference`` (token ids) is text the answer is expected to follow: OpenAI's predicted
outputs (``prediction`` in a chat request to ``ortgen serve``), a file being rewritten with
a few edits. It is searched first, for the row's last n-gram (from ``max_ngram`` down to
``min_ngram``), preferring the first match at or after where the previous reference draft
left off, so the drafts walk through it in order; with no match there, a row whose last
token is the one the reference had next (its first token, at the start) goes on from
there, which drafts the answer's opening too. Then the row's own tokens, as above. Like
every draft, the model keeps a drafted token only where it would pick it anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ortgen import ConfigError, DrafterFactory, GenerationContext, Register, hookimpl
from ortgen.checks import is_int


class PromptLookupDrafter:
    """Drafts by n-gram match over ``reference`` (when given), then over the row's own
    tokens (prompt and generated)."""

    def __init__(
        self,
        *,
        num_tokens: int = 10,
        max_ngram: int = 3,
        min_ngram: int = 2,
        reference: Sequence[int] | None = None,
        ctx: GenerationContext | None = None,
    ) -> None:
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
        self.reference = _reference(reference, ctx.vocab_size if ctx is not None else 0)
        #: where in the reference the row's next token is expected (None: not known)
        self._expected: int | None = 1 if self.reference is not None else None
        self._drafted_from: int | None = None  # the reference index the last draft began at

    def draft(self, tokens: np.ndarray, limit: int) -> Sequence[int]:
        count = min(limit, self.next_count)
        size = len(tokens)
        self._drafted_from = None
        if count < 1:
            return []
        if self.reference is not None and size:
            start = self._in_reference(tokens)
            if start is not None:
                self._drafted_from = start
                return self.reference[start : start + count].tolist()
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            pattern = tokens[size - n :]
            # every earlier n-gram that has a token after it (the last one is the pattern)
            windows = sliding_window_view(tokens[: size - 1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # the latest match: the nearest context
                return tokens[start : start + count].tolist()
        return []

    def _in_reference(self, tokens: np.ndarray) -> int | None:
        """The reference index to draft from, or None: after the row's last n-gram in
        the reference (the first match at or after ``_expected``, else the latest one),
        else ``_expected`` itself when the row's last token is the reference's before it."""
        ref = self.reference
        assert ref is not None
        size, expected = len(tokens), self._expected or 0
        # positions holding the row's last token, each with a token after it
        ends = np.flatnonzero(ref[:-1] == tokens[-1])
        for n in range(min(self.max_ngram, size), self.min_ngram - 1, -1):
            hits = ends[ends >= n - 1]
            for back in range(1, n):
                hits = hits[ref[hits - back] == tokens[size - 1 - back]]
            if hits.size:
                starts = hits + 1
                ahead = starts[starts >= expected]
                return int(ahead[0] if ahead.size else starts[-1])
        known = self._expected is not None and 0 < expected < len(ref)
        return expected if known and ref[expected - 1] == tokens[-1] else None

    def accepted(self, drafted: int, kept: int) -> None:
        """Propose one more than the model kept this time (at most ``num_tokens``); after
        a draft from the reference, the row's next token is expected just past the kept
        ones and the model's own token after them."""
        self.next_count = max(1, min(self.num_tokens, kept + 1))
        start = self._drafted_from
        self._expected = start + kept + 1 if start is not None else None


def _reference(reference: Sequence[int] | None, vocab_size: int) -> np.ndarray | None:
    """``reference`` as an array of token ids (None when empty), or a ConfigError."""
    if reference is None:
        return None
    try:
        ids = np.asarray(reference) if isinstance(reference, list | tuple | np.ndarray) else None
    except (ValueError, TypeError, OverflowError):  # ragged lists, huge numbers
        ids = None
    if ids is not None and ids.size == 0:
        return None
    if ids is None or ids.ndim != 1 or ids.dtype.kind not in "iu" or int(ids.min()) < 0:
        raise ConfigError(
            f"drafter 'prompt_lookup': reference must be a list of token ids, got {reference!r:.80}"
        )
    if vocab_size and int(ids.max()) >= vocab_size:
        raise ConfigError(
            f"drafter 'prompt_lookup': reference holds id {int(ids.max())}, outside the "
            f"vocabulary (0-{vocab_size - 1})"
        )
    return ids.astype(np.int64)


@hookimpl
def register_drafters(register: Register[DrafterFactory]) -> None:
    register("prompt_lookup", PromptLookupDrafter)
