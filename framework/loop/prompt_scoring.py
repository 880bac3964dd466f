"""Prompt logprobs: each prompt token's log-probability given the tokens before it.

What Hugging Face computes as ``log_softmax(model(ids).logits[:, :-1])`` gathered at
``ids[:, 1:]``, and vLLM returns as ``prompt_logprobs``: per prompt position after the
first, the log-probability of the token that is there, its rank in the vocabulary
(1 = the model's first choice; ties count as ahead, as vLLM counts them) and the N best
alternatives. The first token has none (nothing comes before it).

The scores are the raw model's (the log-softmax of the logits), not what a request's
processors would make of them: a prompt is not sampled.

They come from the prefill's own forwards: a request that asks for them is fed as
always, in chunks, but the graph returns the logits of every fed position (a fused
graph is asked through ``logits_to_keep``; an optimum graph returns them anyway), and
:func:`score_positions` reads those in blocks of ``BLOCK`` positions: per block one
(BLOCK, V) copy, its ``exp`` and a comparison, so no (T, V) log-softmax is ever made
(a 2,048-token prompt over a 49,152-token vocabulary would be 400 MB of float32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..protocols.candidates import best_first

#: positions whose log-softmax is worked out at once (a (BLOCK, V) float32 temporary:
#: 6.3 MB at a 49,152-token vocabulary)
BLOCK = 32


@dataclass
class TokenLogprob:
    """One prompt position: the token there, its log-probability given the tokens before
    it, its rank (1: the most likely token), and the best ``(token, logprob)``
    alternatives, best first (as many as ``prompt_logprobs`` asked for)."""

    token: int
    logprob: float
    rank: int
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class PositionScores:
    """What :func:`score_positions` found for ``n`` positions."""

    logprobs: np.ndarray  # (n,) float32: each target token's log-probability
    ranks: np.ndarray  # (n,) int64: its rank (1-based)
    top_ids: np.ndarray  # (n, k) int64: the k best tokens, best first
    top_values: np.ndarray  # (n, k) float32: their log-probabilities


def score_positions(
    logits: np.ndarray,
    rows: np.ndarray,
    steps: np.ndarray,
    targets: np.ndarray,
    top: int,
    block: int | None = None,
) -> PositionScores:
    """The log-probability of ``targets[i]`` under ``logits[rows[i], steps[i]]`` (logits
    (R, T, V)), its rank and the ``top`` best alternatives, ``block`` positions at a time
    (None: ``BLOCK``)."""
    block = block or BLOCK
    count = len(rows)
    logprobs = np.empty(count, dtype=np.float32)
    ranks = np.empty(count, dtype=np.int64)
    top_ids = np.empty((count, top), dtype=np.int64)
    top_values = np.empty((count, top), dtype=np.float32)
    for start in range(0, count, block):
        end = min(count, start + block)
        x = np.asarray(logits[rows[start:end], steps[start:end]], dtype=np.float32)
        peak = x.max(axis=1)
        total = np.exp(x - peak[:, None]).sum(axis=1, dtype=np.float64)
        lse = (peak + np.log(total)).astype(np.float32)
        chosen = x[np.arange(end - start), targets[start:end]]
        logprobs[start:end] = chosen - lse
        ranks[start:end] = np.count_nonzero(x >= chosen[:, None], axis=1)
        if top:
            ids, values = best_first(x, top)
            top_ids[start:end] = ids
            top_values[start:end] = values - lse[:, None]
    return PositionScores(logprobs, ranks, top_ids, top_values)
