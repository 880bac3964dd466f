"""What a component must look like, and what it is told about the request.

These are structural protocols: a plugin needs no base class, only the call
shape. Arrays are numpy and batch-first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .config import GenerationConfig
    from .model import GraphSignature


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

    Optional attributes: ``finish_reason`` (str; default the name it is registered
    under) is the reason a row it ends finishes with; ``uses_scores = False`` says it
    never reads ``scores``, which it then receives as None when the step's scores are
    sparse (the loop skips making them dense for it).
    """

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class WorksOnCandidates(Protocol):
    """Optional capability of a processor or sampler: ``sparse(input_ids, scores)``
    works on :class:`~ortgen.candidates.Candidates` (the few tokens a truncation such as
    top-k left) instead of the whole vocabulary. A processor returns Candidates (or
    None to decline: it then gets dense scores); a sampler returns next ids. The loop
    calls it whenever the scores it holds are sparse; it must give what ``__call__``
    would on the dense scores."""

    def sparse(self, input_ids: np.ndarray, scores: Any) -> Any: ...


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

    A fork of the request (``Generation.fork``) deep-copies every component; one that
    holds native state gives a ``fork()`` returning its independent copy instead.
    """

    def advance(self, tokens: Sequence[Sequence[int]]) -> None: ...

    def rewind(self, counts: Sequence[int]) -> None: ...

    def reorder(self, rows: np.ndarray) -> None: ...


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


@runtime_checkable
class Reseedable(Protocol):
    """Optional capability of a sampler with a random stream: ``fork(seed=...)`` reseeds it
    (``multinomial`` and the llama.cpp samplers have it)."""

    def reseed(self, seed: int) -> None: ...


@runtime_checkable
class SearchStrategy(Protocol):
    """Optional capability of a sampler that searches over rows (beam search).

    After each call it sets ``parents`` (the row each picked token continues: the loop
    moves its rows, the cache's keys/values and followers accordingly) and ``done`` (True
    ends every row). ``finalize(sequences)`` returns the chosen sequences (generated
    tokens) and their scores, best first per prompt.

    Optional attributes, read with these defaults when absent (:data:`SEARCH_DEFAULTS`):
    ``num_beams`` (1: rows of the batch per prompt), ``eos`` (() : a chosen sequence
    ending in one of these ids finished with "eos", else "length"),
    ``sequence_logprobs`` and ``sequence_top_logprobs`` (None: the chosen tokens'
    log-probabilities, which the loop cannot keep itself since rows move).
    """

    parents: np.ndarray | None
    done: bool

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray: ...

    def finalize(self, sequences: np.ndarray) -> tuple[list[list[int]], list[float]]: ...


#: what a search strategy without the optional attributes is taken to have
SEARCH_DEFAULTS: dict[str, Any] = {
    "num_beams": 1,
    "eos": (),
    "sequence_logprobs": None,
    "sequence_top_logprobs": None,
}


@runtime_checkable
class KVCache(Protocol):
    """Past keys/values kept between forwards of one request.

    ``inputs()`` gives the past feeds by graph input name; ``update(presents)``
    takes the graph's present outputs (same order as ``GraphSignature.past_inputs``)
    after a forward; ``reorder(rows)`` keeps/duplicates batch rows (beam search);
    ``crop(length)`` forgets positions past ``length`` (rewind). The optional
    capabilities the loop uses when a cache has them are the protocols below
    (:class:`ForksCache`, :class:`SelectsRow`, :class:`OwnsPresents`, :class:`FeedsMask`,
    :class:`ReusesPrefixes`, :class:`RowSlots`), and two optional attributes:
    ``signature`` (the ``GraphSignature`` its keys/values belong to: a cache made for
    another graph is refused) and ``max_feed`` (the most positions one forward may feed).
    """

    def inputs(self) -> dict[str, Any]: ...

    def update(self, presents: list[Any]) -> None: ...

    def reorder(self, rows: np.ndarray) -> None: ...

    def crop(self, length: int) -> None: ...

    @property
    def length(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


@runtime_checkable
class ForksCache(Protocol):
    """``fork()``: an independent copy holding the same positions (``Generation.fork``)."""

    def fork(self) -> KVCache: ...


@runtime_checkable
class SelectsRow(Protocol):
    """``select(row)``: until ``select(None)``, ``inputs()``/``update()`` (and ``outputs()``)
    cover ``row`` alone, from its own first position: rows of different lengths are
    prefilled one by one on a shared-buffer graph, and a row joining an open batch alone."""

    def select(self, row: int | None) -> None: ...


@runtime_checkable
class OwnsPresents(Protocol):
    """``outputs(total)``: the buffers the graph writes its presents into, for a forward
    whose keys/values span ``total`` positions (a preallocated cache binds them, so
    nothing is copied); ``update()`` then receives those same buffers."""

    def outputs(self, total: int) -> list[Any]: ...


@runtime_checkable
class FeedsMask(Protocol):
    """``feed_mask(mask, new)``: the attention mask the graph is fed, from the loop's
    (B, positions) mask and the ``new`` positions of this forward (a window or attention
    sinks keep fewer positions than the loop has seen)."""

    def feed_mask(self, mask: np.ndarray, new: int) -> np.ndarray: ...


@runtime_checkable
class ReusesPrefixes(Protocol):
    """Keys/values kept across requests of one model: ``reuse(prompts)`` loads the
    longest prefix of each prompt it holds and returns those lengths (the loop feeds the
    rest); ``remember(rows)`` is told each row's tokens when a request ends."""

    def reuse(self, prompts: list[list[int]]) -> list[int]: ...

    def remember(self, rows: list[list[int]]) -> None: ...


@runtime_checkable
class RowSlots(Protocol):
    """Optional capability of a KV cache whose rows come and go: a continuous batch
    (``Generation.open()``, the server) admits requests as rows and releases them.

    - ``add_rows(count)``: ``count`` new rows after the last, holding nothing yet; a
      joining row is then prefilled alone through ``select(row)`` (``inputs()`` and
      ``outputs()``/``update()`` cover that row only, from its first position).
    - ``keep_rows(order)``: row ``i`` becomes old row ``order[i]``; the others are
      dropped (``order`` only moves rows down, into freed places).

    Optional, and used when present: ``shift(columns)`` (keys/values that follow the
    token buffer's columns: add that many positions on the left, negative drops them);
    ``reuse_row(row, prompt, chunk) -> int`` (copy in the longest prompt prefix the
    cache holds from any row, return its length; only what the loop would feed in
    several-token forwards anyway), ``note_row(row, prompt, taken, chunk)`` (what the
    row's prefill computed), ``copy_row(source, target, positions)`` (a row joining
    with another row's very prompt takes its keys/values).
    """

    def add_rows(self, count: int) -> None: ...

    def keep_rows(self, order: np.ndarray) -> None: ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes the next tokens of one row (speculative decoding).

    ``draft(tokens, limit)`` gets the row's tokens so far (prompt and generated, 1-D
    int64, no padding; a view: do not write) and returns at most ``limit`` token ids it
    expects next (empty: no guess). The loop feeds them after the row's newest token in
    one forward, samples the model at each position as it would without drafts, keeps
    the drafts up to the first one the model did not pick plus the model's own token
    there, and forgets the rest: output is exactly what decoding without drafts gives.
    Optional: ``accepted(drafted, kept)`` after each verification, for a drafter that
    adapts how many tokens it proposes.
    """

    def draft(self, tokens: np.ndarray, limit: int) -> Sequence[int]: ...


@runtime_checkable
class LiftsContext(Protocol):
    """Optional capability of a KV-cache *factory* (what ``register`` is given, not the
    cache it makes): a cache that keeps positions within a window lets a request run
    past the model's trained context, and ``lifts_context(signature)`` says on which
    graphs (e.g. only those whose positions stay within the window). Without it, a
    request's length is clipped at the model's context (``TextGenerator.max_length``).
    """

    def lifts_context(self, signature: Any) -> bool: ...


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
