"""Output quality of a model folder, measured rather than assumed.

Quantised graphs diverge from fp32 after a few greedy tokens (the continuation is
chaotic), so quality is judged teacher-forced on a fixed text: the perplexity of the
text under the model, and how often its top-1 prediction at each position equals the
fp32 reference's. The text (``data/eval_text.txt``, ~2,000 tokens) is the Declaration
of Independence (1776) and the Gettysburg Address (1863), both in the public domain,
typed for this project with their period spellings.

Each position's logits come from the graph a user runs: fused graphs keep only the
last position's logits, so they are fed one token per forward, like decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .api import TextGenerator

EVAL_TEXT = Path(__file__).parent / "data" / "eval_text.txt"
#: Positions per forward for graphs that return every position's logits.
CHUNK = 256


@dataclass
class TextScores:
    """Per predicted position: negative log-likelihood of the true next token, and the
    model's top-1 token."""

    nll: np.ndarray
    top1: np.ndarray

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.nll.mean()))

    def agreement(self, reference: TextScores) -> float:
        """Share of positions whose top-1 equals ``reference``'s."""
        if len(reference.top1) != len(self.top1):
            raise ValueError("the two scores cover different texts")
        return float((self.top1 == reference.top1).mean())


def eval_ids(gen: TextGenerator) -> list[int]:
    """The evaluation text in ``gen``'s tokens (no special tokens added)."""
    tokenizer = gen._need_tokenizer("the quality evaluation")
    return tokenizer.encode(EVAL_TEXT.read_text(encoding="utf-8"), add_special_tokens=False)


def score_tokens(gen: TextGenerator, ids: list[int]) -> TextScores:
    """Teacher-force ``ids`` through ``gen``'s model with its default (static) KV cache."""
    if len(ids) < 2:
        raise ValueError("scoring needs at least two tokens")
    model = gen.model
    config = gen.resolve_config({"max_new_tokens": 1}).config
    ctx = gen._context([ids], config)
    cache = gen.registry.create("kv_cache", "static", {}, ctx)
    targets = np.asarray(ids[1:], dtype=np.int64)
    nll = np.empty(len(targets), dtype=np.float64)
    top1 = np.empty(len(targets), dtype=np.int64)
    fed, width = 0, 1  # one token first: it tells whether the graph returns every position
    while fed < len(targets):
        end = min(fed + width, len(targets))
        logits = _forward(model, cache, ids, fed, end)
        if logits.shape[0] != end - fed:  # only the last position's logits: go one by one
            cache.crop(fed)
            width = 1
            continue
        logp = _log_softmax(logits)
        nll[fed:end] = -logp[np.arange(end - fed), targets[fed:end]]
        top1[fed:end] = logits.argmax(axis=-1)
        fed = end
        if fed == 1 and width == 1:
            width = CHUNK
    return TextScores(nll, top1)


def _forward(model, cache, ids: list[int], start: int, end: int) -> np.ndarray:
    """Logits (T', V) for feeding ids[start:end] on top of what the cache holds."""
    x = np.asarray([ids[start:end]], dtype=np.int64)
    mask = np.ones((1, end), dtype=np.int64)
    positions = (
        np.arange(start, end, dtype=np.int64)[None] if model.signature.has_position_ids else None
    )
    presents = cache.outputs(end)
    logits, presents = model.forward(x, mask, positions, cache.inputs(), presents)
    cache.update(presents)
    return np.array(logits[0], dtype=np.float64)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
