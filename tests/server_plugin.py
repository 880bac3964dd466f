"""A plugin for the server tests (``ortgen serve --plugin tests.server_plugin``):
processors that fail or slow down on purpose, selected per request with
``logits_processors=[{"name": "explode"}]`` / ``[{"name": "slow", "delay": 0.05}]`` /
``[{"name": "says", "text": "..."}]``."""

from __future__ import annotations

import time

import numpy as np

from ortgen import hookimpl


@hookimpl
def register_logits_processors(register):  # type: ignore[no-untyped-def]
    register("explode", Explode)
    register("slow", Slow)
    register("says", Says)


class Explode:
    """Raises at its ``at_step``-th call: a plugin bug that must fail only its request."""

    def __init__(self, at_step: int = 0) -> None:
        self.at_step = at_step
        self.calls = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.calls >= self.at_step:
            raise RuntimeError("the test plugin exploded")
        self.calls += 1
        return scores


class Slow:
    """Sleeps ``delay`` seconds per step, so a request is still running when a test acts."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        time.sleep(self.delay)
        return scores


class Says:
    """Makes the answer ``text`` (then EOS), whatever the model would say: a model answer
    a test chooses, e.g. HTML for the chat page's escaping, or tool calls to read back.

    Each step it allows every token that spells the start of what is still to write
    (the longest scored highest) and nothing else, so any pick writes ``text``. It
    follows the text written so far rather than counting its own calls, and leaves the
    split to a grammar in the same request: the grammar forces some tokens without asking
    the processors (``ortgen.loop.following``), and its mask may allow only one of the
    tokens that would spell the next text (llguidance's split of text it forces). Text
    that has left ``text`` gets EOS at once, so the answer shows where it went wrong."""

    def __init__(self, text: str, *, ctx) -> None:  # type: ignore[no-untyped-def]
        self.text = text
        self.tokenizer = ctx.tokenizer
        self.start = ctx.prompt_length  # where the answer starts in a row's input_ids
        self.eos = ctx.eos_token_ids[0]
        self.pieces: dict[str, list[tuple[int, str]]] = {}  # first character -> tokens
        for token in range(min(ctx.vocab_size, self.tokenizer.vocab_size)):
            piece = self.tokenizer.decode([token])
            if piece and "\ufffd" not in piece:  # not a special token nor part of a character
                self.pieces.setdefault(piece[0], []).append((token, piece))

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        forced = np.full_like(scores, -np.inf)
        for row, ids in enumerate(input_ids):
            written = self.tokenizer.decode(ids[self.start :].tolist())
            rest = self.text[len(written) :] if self.text.startswith(written) else ""
            if not rest:
                forced[row, self.eos] = 0.0
            for token, piece in self.pieces.get(rest[:1], []):
                if rest.startswith(piece):
                    forced[row, token] = len(piece)
        return forced
