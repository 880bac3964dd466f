"""What a component must look like, and what it is told about the request.

These are structural protocols: a plugin needs no base class, only the call
shape. Arrays are numpy and batch-first.

Five kinds of component have a call contract (:class:`LogitsProcessor`, :class:`Sampler`,
:class:`StoppingCriterion`, :class:`~ortgen.protocols.KVCache`, :class:`Drafter`).
Everything else the loop uses is an optional capability: one small ``runtime_checkable``
protocol each, found with ``isinstance`` once, when a request's components are built
(``ortgen.loop.chain.Chain``, ``ortgen.loop.cache_view.CacheView``), never by asking a
component for a member by name, and never per step. A type checker then checks a
plugin against the very members the loop calls. The KV cache's protocols live in
``cache_protocols.py`` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

import numpy as np

from .caches import (
    BelongsToGraph,
    CopiesRows,
    FeedsMask,
    ForksCache,
    KVCache,
    LiftsContext,
    LimitsFeed,
    OwnsPresents,
    ReusesPrefixes,
    ReusesRowPrefixes,
    RowSlots,
    SelectsRow,
    ShiftsColumns,
)
from .chat_formats import ChatFormat, MarksReasoning, ShapesText

if TYPE_CHECKING:
    from ..config import GenerationConfig
    from ..model.session import GraphSignature

__all__ = [
    "AdaptsDrafts",
    "BeamsPerPrompt",
    "BelongsToGraph",
    "ChatFormat",
    "ChecksDrafts",
    "CopiesRows",
    "DeclaresScoreUse",
    "Drafter",
    "FeedsMask",
    "FollowsTokens",
    "ForcesTokens",
    "ForksCache",
    "ForksState",
    "GenerationContext",
    "KVCache",
    "KeepsSequenceLogprobs",
    "LiftsContext",
    "LimitsFeed",
    "LogitsProcessor",
    "MarksReasoning",
    "NamesFinishReason",
    "OwnsPresents",
    "PreparesAhead",
    "Reseedable",
    "ReusesPrefixes",
    "ReusesRowPrefixes",
    "RowSlots",
    "Sampler",
    "SearchStrategy",
    "SelectsRow",
    "ShapesText",
    "ShiftsColumns",
    "StoppingCriterion",
    "WorksOnCandidates",
]


# -- the five call contracts ---------------------------------------------------------------


@runtime_checkable
class LogitsProcessor(Protocol):
    """``(input_ids (B,T) int64, scores (B,V) float32) -> (B,V) float32``; pure."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class Sampler(Protocol):
    """``(input_ids (B,T), scores (B,V)) -> next_ids (B,) int64``."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class StoppingCriterion(Protocol):
    """``(input_ids (B,T), scores (B,V)) -> (B,) bool``; True = that row is finished.

    Optional: :class:`NamesFinishReason` (the reason a row it ends finishes with; default
    the name it is registered under) and :class:`DeclaresScoreUse`.
    """

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes the next tokens of one row (speculative decoding).

    ``draft(tokens, limit)`` gets the row's tokens so far (prompt and generated, 1-D
    int64, no padding; a view: do not write) and returns at most ``limit`` token ids it
    expects next (empty: no guess). The loop feeds them after the row's newest token in
    one forward, samples the model at each position as it would without drafts, keeps
    the drafts up to the first one the model did not pick plus the model's own token
    there, and forgets the rest: output is exactly what decoding without drafts gives.
    Optional: :class:`AdaptsDrafts`.
    """

    def draft(self, tokens: np.ndarray, limit: int) -> Sequence[int]: ...


# -- optional capabilities of processors and samplers --------------------------------------


@runtime_checkable
class WorksOnCandidates(Protocol):
    """Optional capability of a processor or sampler: ``sparse(input_ids, scores)``
    works on :class:`~ortgen.Candidates` (the few tokens a truncation such as
    top-k left) instead of the whole vocabulary. A processor returns Candidates (or
    None to decline: it then gets dense scores); a sampler returns next ids. The loop
    calls it whenever the scores it holds are sparse; it must give what ``__call__``
    would on the dense scores."""

    def sparse(self, input_ids: np.ndarray, scores: Any) -> Any: ...


@runtime_checkable
class Reseedable(Protocol):
    """Optional capability of a sampler with a random stream: ``reseed(seed)`` starts new
    streams from ``seed`` (``Generation.fork(seed=...)``; ``multinomial`` and the llama.cpp
    samplers have it)."""

    def reseed(self, seed: int) -> None: ...


@runtime_checkable
class SearchStrategy(Protocol):
    """Optional capability of a sampler that searches over rows (beam search).

    After each call it sets ``parents`` (the row each picked token continues: the loop
    moves its rows, the cache's keys/values and followers accordingly) and ``done`` (True
    ends every row). ``finalize(sequences)`` returns the chosen sequences (generated
    tokens) and their scores, best first per prompt. Optional beside it:
    :class:`BeamsPerPrompt` and :class:`KeepsSequenceLogprobs`.
    """

    parents: np.ndarray | None
    done: bool

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray: ...

    def finalize(self, sequences: np.ndarray) -> tuple[list[list[int]], list[float]]: ...


@runtime_checkable
class BeamsPerPrompt(Protocol):
    """Optional capability of a :class:`SearchStrategy`: how its rows and results map to
    prompts. ``num_beams``: rows of the batch per prompt (without it: 1); ``eos``: a chosen
    sequence ending in one of these ids finished with "eos", else "length" (without it:
    every one with "length")."""

    @property
    def num_beams(self) -> int: ...

    @property
    def eos(self) -> Iterable[int]: ...


@runtime_checkable
class KeepsSequenceLogprobs(Protocol):
    """Optional capability of a :class:`SearchStrategy`: the chosen sequences'
    log-probabilities, which the loop cannot keep itself since rows move. Read after
    ``finalize``; None where they were not asked for (``logprobs``/``top_logprobs``)."""

    @property
    def sequence_logprobs(self) -> list[list[float]] | None: ...

    @property
    def sequence_top_logprobs(self) -> list[list[list[tuple[int, float]]]] | None: ...


# -- optional capabilities of stopping criteria --------------------------------------------


@runtime_checkable
class NamesFinishReason(Protocol):
    """Optional capability of a stopping criterion: ``finish_reason`` (a short string such
    as ``"eos"``) is what the rows it ends report in ``finish_reasons``. Without it, the
    name it is registered under. A class attribute is enough."""

    @property
    def finish_reason(self) -> str: ...


@runtime_checkable
class DeclaresScoreUse(Protocol):
    """Optional capability of a stopping criterion: ``uses_scores = False`` says it never
    reads ``scores``, which it then receives as None when the step's scores are
    :class:`~ortgen.Candidates` (the loop skips making them dense for it). Without it (or
    with True) it gets dense scores."""

    @property
    def uses_scores(self) -> bool: ...


# -- optional capabilities of any component that follows each row's tokens ----------------


@runtime_checkable
class FollowsTokens(Protocol):
    """Optional capability of any component (processor, sampler, stopping criterion) that
    keeps state over each row's tokens, such as a grammar that must know where it is.

    The loop tells it what happened, so it never has to diff ``input_ids`` to guess;
    resolved once when the request's chain is built (``isinstance`` on this protocol).
    Rows are the rows the component serves (its settings group, in its own order).

    - ``advance(tokens)``: one list per row of the tokens appended to that row since
      the last call (one sampled token, several forced ones, or none for a finished
      row). Called after the tokens are in ``input_ids`` and before the next forward.
    - ``rewind(counts)``: per row, forget the last ``counts[row]`` tokens it was told
      (``Generation.rewind``, and speculation's rejected drafts); never more than told.
    - ``reorder(rows)``: row ``i`` becomes a copy of old row ``rows[i]`` (beam search);
      a row may be copied several times.

    Optional beside it: :class:`ForksState`, :class:`PreparesAhead`,
    :class:`ForcesTokens`, :class:`ChecksDrafts`.
    """

    def advance(self, tokens: Sequence[Sequence[int]]) -> None: ...

    def rewind(self, counts: Sequence[int]) -> None: ...

    def reorder(self, rows: np.ndarray) -> None: ...


@runtime_checkable
class ForksState(Protocol):
    """Optional capability of a :class:`FollowsTokens` component that holds native state
    (a compiled matcher): ``fork()`` returns its independent copy when the request is
    forked (``Generation.fork``). Without it the component is deep-copied with the rest
    of the request, which is enough for plain Python state."""

    def fork(self) -> Self: ...


@runtime_checkable
class PreparesAhead(Protocol):
    """Optional capability of a :class:`FollowsTokens` component: ``prepare()`` starts the
    work the next step needs (the ``grammar`` processor computes its mask on another
    thread beside the forward, since onnxruntime releases the GIL). Called when the next
    step runs a forward, after ``advance`` and ``forced_tokens``; anything that moves the
    component's state must first wait for that work."""

    def prepare(self) -> None: ...


@runtime_checkable
class ForcesTokens(Protocol):
    """Optional capability of a :class:`FollowsTokens` component that sometimes knows the
    next tokens of a row for certain (a grammar whose only continuation is ``":"``).

    ``forced_tokens(row)`` returns the tokens that must come next in ``row`` (empty when
    the model has a choice). The loop takes them instead of sampling: the processed
    scores of that row become a point mass on the token (log-probability 0), the
    sampler picks it as it would any certain token (drawing its random number, so a
    seeded row draws the same numbers however its tokens were fed), and when every
    running row of the batch is forced the step needs no forward: the tokens are fed
    together with the next sampled one (``stats["fast_forward_tokens"]``). Asked after
    ``advance``, once per token it returned are used up.
    """

    def forced_tokens(self, row: int) -> Sequence[int]: ...


@runtime_checkable
class ChecksDrafts(Protocol):
    """Optional capability of a :class:`FollowsTokens` component that limits what may come
    next in a row (a grammar): ``valid_prefix(row, tokens)`` is how many of the drafted
    ``tokens`` it allows, in order, after the row's tokens so far. The loop drops the
    drafts from the first one refused before the verifying forward: the model could never
    pick it there, so feeding it (and what follows it) would cost positions for nothing.
    """

    def valid_prefix(self, row: int, tokens: Sequence[int]) -> int: ...


# -- optional capabilities of drafters -----------------------------------------------------


@runtime_checkable
class AdaptsDrafts(Protocol):
    """Optional capability of a :class:`Drafter`: ``accepted(drafted, kept)`` after each
    verifying forward, with how many tokens it drafted and how many the model kept, for a
    drafter that adapts how many it proposes (the built-in ``prompt_lookup``)."""

    def accepted(self, drafted: int, kept: int) -> None: ...


# -- what a factory is told ----------------------------------------------------------------


@dataclass(frozen=True)
class GenerationContext:
    """Facts about one request, handed to factories that ask for ``ctx``.

    Attributes:
        config: the fully resolved generation config of the request.
        batch_size: rows in the batch (prompts x num_return_sequences).
        prompt_length: padded prompt length; generated tokens start at this index.
        vocab_size: width of the scores.
        eos_token_ids: every id that ends a row (may be empty).
        pad_token_id: id written into finished rows.
        max_length: total length (prompt + new tokens) the buffer holds.
        signature: the model graph's signature (cache backends need it).
        seed: the request's seed, or None for a fresh random one.
        tokenizer: the model's :class:`ortgen.text.Tokenizer`, or None when the folder
            has none (components that work on text, like DRY's sequence breakers, need it).
        row_seeds: with per-row settings, the seed of each row this component serves
            (None: the row has none). A sampler then keeps one random stream per row, so
            a seeded row draws what it would draw alone; empty: one stream from ``seed``.
        model_config: the model folder's ``config.json`` (read-only): facts a cache
            backend needs, like ``sliding_window`` or the rotary settings.
        model_state: a dict that lives as long as the loaded model, shared by every
            request: where a backend keeps what outlives one request (the ``prefix``
            cache's store). Key it by your plugin's name.
    """

    config: GenerationConfig
    batch_size: int
    prompt_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    max_length: int
    signature: GraphSignature | None = None
    seed: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    row_seeds: tuple[int | None, ...] = ()
    model_config: Mapping[str, Any] = field(default_factory=dict)
    model_state: dict[str, Any] = field(default_factory=dict)

    def __deepcopy__(self, memo: dict[int, Any]) -> GenerationContext:
        """The same object: a request's facts are read-only, and a fork of the request
        (``Generation.fork``) shares them, tokenizer and per-model state included."""
        return self
