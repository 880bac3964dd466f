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
    """Makes the answer ``text`` (its tokens one per step, then EOS), whatever the model
    would say: a model answer a test chooses, e.g. HTML for the chat page's escaping."""

    def __init__(self, text: str, *, ctx) -> None:  # type: ignore[no-untyped-def]
        self.script = ctx.tokenizer.encode(text, add_special_tokens=False) + list(
            ctx.eos_token_ids[:1]
        )
        self.calls = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        token = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        forced = np.full_like(scores, -np.inf)
        forced[:, token] = 0.0
        return forced
