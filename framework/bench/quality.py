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
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..api import TextGenerator

EVAL_TEXT = Path(__file__).parent.parent / "data" / "eval_text.txt"


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


def score_tokens(
    gen: TextGenerator, ids: list[int], cache: Any = None, *, per_forward: int = 1
) -> TextScores:
    """Teacher-force ``ids`` through ``gen``'s model, one token per forward, with
    ``cache`` (a cache name or spec; None: the graph's default).

    One token at a time is how decoding sees the cache and the kernels: a windowed or
    quantized cache, and an int8-activation graph, are scored exactly as they generate.
    ``per_forward`` > 1 feeds that many tokens per forward (``force_positions``): the
    same scores to float rounding on a float32 graph, ~50x faster for a reference.
    """
    if len(ids) < 2:
        raise ValueError("scoring needs at least two tokens")
    state = gen.start([ids[:1]], max_new_tokens=1, eos_token_id=None, cache=cache)
    targets = np.asarray(ids[1:], dtype=np.int64)
    nll = np.empty(len(targets), dtype=np.float64)
    top1 = np.empty(len(targets), dtype=np.int64)
    rows = state.force()
    position = 0
    while position < len(targets):
        for row in rows.astype(np.float64):  # the logits after each fed token, in order
            target = int(targets[position])
            peak = row.max()
            nll[position] = peak + np.log(np.exp(row - peak).sum()) - row[target]
            top1[position] = int(row.argmax())
            position += 1
        ahead = targets[position - 1 : min(len(targets) - 1, position - 1 + per_forward)]
        if len(ahead) and position < len(targets):
            rows = _fed(state, ahead.tolist(), per_forward)
    return TextScores(nll, top1)


def _fed(state: Any, tokens: list[int], per_forward: int) -> np.ndarray:
    """(n, V) logits after each of ``tokens`` fed into ``state``."""
    if per_forward == 1:
        return state.force(tokens)
    return state.force_positions(tokens)[0]
