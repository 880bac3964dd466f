"""Judging a quantised model's output against a reference graph of the same weights.

A graph whose MatMulNBits quantise activations to int8 (accuracy level 4, the default
model's) computes logits that differ from float32 arithmetic on the same weights by up to
~1.6 in the top candidates' logits relative to each other (measured on the default model:
median 0.49), and different CPUs round those int8 products differently (VNNI or not, other
summation orders). So greedy text from such a graph is CPU-dependent exactly where the
float32 reference is nearly tied, and only there. A test of such a graph is portable when it
asserts what the float32 reference decides with a margin:

- ``agreement(reference, prompt, tokens)``: the tokens teacher-forced through the reference,
  each with the reference's own pick, its top-1/top-2 margin and how far below its top the
  token is (its *gap*). A correct quantised model has every gap under ``NEAR_TIE``;
  a wrong one (stale positions, another row's cache, a wrong weight) has gaps of several
  logits.
- ``reference_greedy(reference, prompt, n)``: the reference's own greedy tokens, with
  margins; ``stable_length()`` counts the leading tokens decided by more than ``NEAR_TIE``,
  which every CPU's int8 graph reproduces.
- ``near_tie_paths(reference, prompt, n, stop=...)``: every greedy continuation an int8
  graph could take, branching wherever another token is within ``NEAR_TIE`` of the
  reference's top. A claim about the answer ("it names Berlin") holds on every CPU when it
  holds on every path.

Exact checks (a batch equals each row alone, a cache equals another) belong on float32 or
accuracy-level-0 graphs, whose arithmetic differs between CPUs by float rounding alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["NEAR_TIE", "Agreement", "agreement", "near_tie_paths", "reference_greedy"]

#: Logits within which an int8-activation graph may prefer another token than its float32
#: reference. Measured on the default model over 400 teacher-forced positions (AMD EPYC Zen
#: 3): the int8 graph's pick was at most 0.67 below the float32 top, and the top-10 logits
#: relative to the top moved by at most 1.63 (median 0.49); issue 36 saw 0.95 on Zen 4 with
#: a 4-bit cache on top. Different CPUs round the int8 products differently (~1e-6 of a
#: value), which moves *which* near-ties flip, not how large the quantisation noise is.
NEAR_TIE = 2.0


@dataclass(frozen=True)
class Agreement:
    """Tokens as a reference graph sees them, position by position (teacher-forced)."""

    tokens: tuple[int, ...]
    top: tuple[int, ...]  # the reference's own pick at each position
    margins: tuple[float, ...]  # its top-1 minus top-2 logit there
    gaps: tuple[float, ...]  # its top logit minus the given token's (0: its pick)

    @property
    def first_difference(self) -> int | None:
        """The first position where the token is not the reference's pick (None: none)."""
        return next(
            (i for i, (a, b) in enumerate(zip(self.tokens, self.top, strict=True)) if a != b), None
        )

    @property
    def largest_gap(self) -> float:
        return max(self.gaps, default=0.0)

    def differs_only_at_near_ties(self, tie: float = NEAR_TIE) -> bool:
        """Whether every token is the reference's pick or within ``tie`` of it."""
        return self.largest_gap <= tie

    def stable_length(self, tie: float = NEAR_TIE) -> int:
        """How many leading positions the reference decides by more than ``tie``: a graph
        of these weights whose logits stay within ``tie`` of the reference's picks the same
        tokens there."""
        return next((i for i, m in enumerate(self.margins) if m <= tie), len(self.margins))

    def explain(self) -> str:
        """The positions off the reference's pick, for an assertion message."""
        off = [
            f"{i}: {t} (ref {r}, gap {g:.3f}, margin {m:.3f})"
            for i, (t, r, g, m) in enumerate(
                zip(self.tokens, self.top, self.gaps, self.margins, strict=True)
            )
            if t != r
        ]
        return f"{len(off)} of {len(self.tokens)} off the reference's pick: " + "; ".join(off)


def agreement(reference: Any, prompt: Sequence[int], tokens: Sequence[int]) -> Agreement:
    """``tokens`` after ``prompt`` teacher-forced through ``reference`` (a loaded model,
    e.g. ``ortgen.load(fp32_folder)``), one position per forward as decoding feeds them."""
    state = reference.start([list(prompt)], max_new_tokens=len(tokens) + 1, eos_token_id=None)
    logits = state.force()[0]
    rows: list[tuple[int, float, float]] = []
    for i, token in enumerate(tokens):
        rows.append(_position(logits, int(token)))
        if i + 1 < len(tokens):
            logits = state.force([int(token)])[0]
    return Agreement(
        tuple(int(t) for t in tokens),
        tuple(r[0] for r in rows),
        tuple(r[1] for r in rows),
        tuple(r[2] for r in rows),
    )


def reference_greedy(reference: Any, prompt: Sequence[int], max_new_tokens: int) -> Agreement:
    """The reference's own greedy continuation of ``prompt`` (end of text not special:
    ``max_new_tokens`` tokens), with its margin at each position."""
    state = reference.start([list(prompt)], max_new_tokens=max_new_tokens + 1, eos_token_id=None)
    logits = state.force()[0]
    rows: list[tuple[int, float, float]] = []
    for i in range(max_new_tokens):
        pick = int(np.argmax(logits))
        rows.append(_position(logits, pick))
        if i + 1 < max_new_tokens:
            logits = state.force([pick])[0]
    picks = tuple(r[0] for r in rows)
    return Agreement(picks, picks, tuple(r[1] for r in rows), tuple(r[2] for r in rows))


def near_tie_paths(
    reference: Any,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    tie: float = NEAR_TIE,
    stop: Any = None,
    eos: Sequence[int] = (),
    limit: int = 32,
) -> list[list[int]]:
    """Every greedy path through ``reference`` that a graph whose logits stay within ``tie``
    of it could take: at each position, every token within ``tie`` of the top is a branch
    (its own prefix teacher-forced, through ``fork()``). A path ends after
    ``max_new_tokens``, at a token in ``eos``, or once ``stop(tokens)`` is true (the answer
    is decided). More than ``limit`` paths is a ValueError: the prompt is too open-ended to
    say anything about all of them."""
    state = reference.start([list(prompt)], max_new_tokens=max_new_tokens + 1, eos_token_id=None)
    done: list[list[int]] = []
    todo: list[tuple[Any, np.ndarray, list[int]]] = [(state, state.force()[0], [])]
    while todo:
        branch, logits, tokens = todo.pop()
        row = np.asarray(logits, np.float64)
        picks = [int(t) for t in np.flatnonzero(row >= row.max() - tie)]
        picks.sort(key=lambda t: -row[t])
        for n, token in enumerate(picks):
            path = [*tokens, token]
            if len(path) >= max_new_tokens or token in eos or (stop is not None and stop(path)):
                done.append(path)
            else:
                child = branch if n == len(picks) - 1 else branch.fork()
                todo.append((child, child.force([token])[0].copy(), path))
            if len(done) + len(todo) > limit:
                raise ValueError(
                    f"more than {limit} near-tie paths after {len(tokens)} tokens: the prompt "
                    "is too open to check every path"
                )
    return done


def _position(logits: np.ndarray, token: int) -> tuple[int, float, float]:
    """(the top token, top-1 minus top-2, top minus ``token``'s logit) in float64."""
    row = np.asarray(logits, np.float64)
    top = int(np.argmax(row))
    second = np.partition(row, -2)[-2]
    return top, float(row[top] - second), float(row[top] - row[token])
