"""The ``grammar`` logits processor: structured output on llguidance.

Each row of the request gets a matcher for the constraint (a JSON Schema, any JSON
object, a regular expression, a Lark grammar or a list of choices). Before the warpers,
the processor keeps only the tokens the matcher allows, so temperature, top-k, top-p and
min-p shape a distribution that cannot leave the grammar. It is a stateful component in
the open (``FollowsTokens``): the loop tells it each row's new tokens (``advance``),
rewinds (``rewind``), beam moves (``reorder``) and forks (``fork``); and where the
grammar leaves one continuation (``{"name":`` after ``{``), it says so
(``ForcesTokens``), so the loop takes those tokens without sampling them and, for a
request whose rows are all forced, without a forward of their own.

A finished grammar allows only the end-of-sequence token, so the row ends there; a row
whose grammar allows no token at all (a contradiction with an earlier processor, or a
token appended from outside that the grammar rejects) fails the request with an error
naming the row, never a sample from nothing.

Masks: llguidance writes one bit per token; a row that allows few tokens (JSON keys,
punctuation, numbers) goes on as :class:`~ortgen.Candidates` (just those scores), a row
that allows many (free text inside a string) as a dense copy with ``-inf`` elsewhere.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ortgen import (
    Candidates,
    ConfigError,
    GenerationContext,
    LogitsProcessorFactory,
    NoTokenLeft,
    Register,
    hookimpl,
)

from .grammar_compile import check_grammar, grammar_text, shared_tokenizer

_SETTINGS = ("json_schema", "json_object", "regex", "grammar", "choice")


class GrammarConstraint:
    """Keep each row inside one grammar (see module doc).

    Args:
        json_schema, json_object, regex, grammar, choice: the constraint; exactly one.
        fast_forward: take the tokens the grammar forces without sampling them.
    """

    def __init__(
        self,
        *,
        ctx: GenerationContext,
        json_schema: dict[str, Any] | None = None,
        json_object: bool = False,
        regex: str | None = None,
        grammar: str | None = None,
        choice: Sequence[str] | None = None,
        fast_forward: bool = True,
    ) -> None:
        import llguidance

        given = {
            key: value
            for key, value in zip(
                _SETTINGS, (json_schema, json_object, regex, grammar, choice), strict=True
            )
            if (value is not None if key == "json_schema" else value)
        }
        if len(given) != 1:
            raise ConfigError(
                f"give exactly one of {', '.join(_SETTINGS)} (got {', '.join(given) or 'none'})"
            )
        if ctx.tokenizer is None:
            raise ConfigError(
                "structured output needs the model's tokenizer (to know which text each token "
                "is), and this model folder has none"
            )
        if not ctx.eos_token_ids:
            raise ConfigError(
                "a constrained row ends with an end-of-sequence token once its grammar is "
                "complete, and eos_token_id is unset: set eos_token_id"
            )
        ((self.setting, value),) = given.items()
        self.eos = tuple(int(t) for t in ctx.eos_token_ids)
        self.vocab = ctx.vocab_size
        self.fast_forward = bool(fast_forward)
        self.tokenizer = shared_tokenizer(ctx.model_state, ctx.tokenizer, self.vocab, self.eos)
        self.grammar = grammar_text(self.setting, value)
        check_grammar(self.setting, self.grammar, self.tokenizer)
        first = llguidance.LLMatcher(self.tokenizer, self.grammar)
        if first.is_error():
            raise ConfigError(f"{self.setting}: llguidance refused it: {_reason(first)}")
        self.matchers = [first] + [first.deep_copy() for _ in range(ctx.batch_size - 1)]
        #: special tokens that are not the end of sequence: llguidance may allow one it
        #: cannot then consume (a WordLevel vocabulary's <unk> for text it cannot spell)
        self._specials = np.array(
            sorted(set(ctx.tokenizer.special_ids) - set(self.eos) - {None}), dtype=np.int64
        )
        self._specials = self._specials[self._specials < self.vocab]
        words = (self.vocab + 31) // 32
        self._bits = np.zeros((ctx.batch_size, words), dtype=np.int32)
        self._held: tuple[int, Any] | None = None  # (id of scores, mask) of this step
        self._pending: Future[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]] | None = (
            None  # a mask being computed beside a forward
        )

    # -- the mask ------------------------------------------------------------------

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        allowed, _, bias = self._mask_for(scores)
        if bias is None:  # called dense though few are allowed (outside the loop)
            bias = np.where(allowed, np.float32(0), np.float32(-np.inf))
        out = np.add(scores, bias, dtype=np.float32)  # -inf where not allowed: a new array
        self._check_rows(out)
        return out

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The allowed scores as Candidates when few tokens are allowed; None (the dense
        ``__call__``) when many are, e.g. free text inside a JSON string."""
        allowed, flat, _ = self._mask_for(scores)
        if isinstance(scores, Candidates):  # an earlier processor left few: keep the allowed
            remove = np.zeros(scores.packed.shape, dtype=bool)
            remove.reshape(-1)[scores.slots] = ~allowed.reshape(-1)[scores.flat]
            kept = scores.keep(remove)
            self._check_rows(kept.packed)
            return kept
        if flat is None:  # many allowed: the dense mask is cheaper
            return None
        kept = Candidates.at(np.asarray(scores, dtype=np.float32), flat)
        self._check_rows(kept.packed)
        return kept

    def _mask_for(self, scores: Any) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """This step's mask, computed once for the scores it masks (``sparse`` then
        ``__call__`` on the same scores; ``advance`` forgets it): the allowed tokens
        (B, V) bool, their flat indices when few enough for Candidates, else a 0/-inf
        float32 row to add (see ``_compute``)."""
        if self._held is not None and self._held[0] == id(scores):
            return self._held[1]
        if self._bits.shape[0] != scores.shape[0]:
            raise ValueError(
                f"expected {self._bits.shape[0]} rows of scores, got {scores.shape[0]}"
            )
        if self._pending is not None:  # computed beside the forward (``prepare``)
            pending, self._pending = self._pending, None
            mask = pending.result()
        else:
            mask = self._compute()
        self._held = (id(scores), mask)
        return mask

    def _compute(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """llguidance's bits for every row (it drops the GIL while it computes), unpacked
        once (a bool view); then the allowed tokens' flat indices when they are at most
        1/16 of the scores (above that Candidates cost more than they save), else a
        0/-inf bias the step adds to the scores: on the worker, this turns the dense
        mask's ``putmask`` on the step's path (p50 320 us) into one add (182 us)."""
        import llguidance.numpy

        bits = self._bits
        for row, matcher in enumerate(self.matchers):
            if matcher.is_error():
                raise ValueError(f"row {row}: the grammar failed: {_reason(matcher)}")
            llguidance.numpy.fill_next_token_bitmask(matcher, bits, row)
        unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
        allowed = unpacked.view(bool)[:, : self.vocab]
        self._drop_unconsumable(allowed)
        empty = ~allowed.any(axis=1)
        if empty.any():  # the request's constraint, not a failure of the component
            row = int(np.flatnonzero(empty)[0])
            why = _reason(self.matchers[row])
            raise NoTokenLeft(
                f"logits processor 'grammar': row {row}: no token of this model's vocabulary "
                f"continues the {self.setting} here{f' ({why})' if why else ''}: it asks for "
                "text the vocabulary cannot spell (a character the tokenizer has no token or "
                "byte for), so the text so far cannot be completed"
            )
        flat = np.flatnonzero(allowed)
        if flat.size * 16 <= allowed.size:
            return allowed, flat, None
        return allowed, None, np.where(allowed, np.float32(0), np.float32(-np.inf))

    def _drop_unconsumable(self, allowed: np.ndarray) -> None:
        """Clear the special tokens the mask allows but the matcher would refuse (llguidance
        lets an unknown token stand for text the vocabulary cannot spell, then fails
        when it comes): checked one by one, and only those allowed (almost never)."""
        if not self._specials.size:
            return
        rows, columns = np.nonzero(allowed[:, self._specials])
        for row, column in zip(rows.tolist(), columns.tolist(), strict=True):
            token = int(self._specials[column])
            if not self.matchers[row].validate_tokens([token]):
                allowed[row, token] = False

    def prepare(self) -> None:
        """Start the next mask on another core while the forward runs: it depends only on
        the tokens so far, and a forward leaves the caches cold for llguidance (a mask
        cost ~5x inside the loop what it costs alone). Waited for in ``_mask_for``;
        anything that moves the matchers waits for it first (``_settle``)."""
        self._settle()
        self._pending = _worker().submit(self._compute)

    def _settle(self) -> None:
        """Wait for a mask computed beside the forward before the matchers move."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.exception()  # its error, if any, belongs to the mask nobody will use
        self._held = None

    def _check_rows(self, scores: np.ndarray) -> None:
        """A row whose allowed tokens are all -inf would be sampled from nothing: name
        it. A NaN or +inf score is the sampler's to judge (it names a NaN row itself;
        greedy takes +inf), not a token an earlier processor removed. The error carries
        the row and the tokens the grammar allows there, so the loop can name the
        processor that removed them (this message is what is left without it)."""
        dead = ~((scores != -np.inf).any(axis=1))
        if dead.any():
            row = int(np.flatnonzero(dead)[0])
            error = NoTokenLeft(
                f"logits processor 'grammar': row {row}: every token the grammar allows here "
                "was removed by an earlier processor (bad_words_ids, suppress_tokens or "
                "min_new_tokens holding back the end of sequence, say), so nothing can be "
                "sampled"
            )
            if self._held is not None:
                error.row = row
                error.allowed = np.flatnonzero(self._held[1][0][row]).tolist()
            raise error

    # -- following the text ----------------------------------------------------------

    def advance(self, tokens: Sequence[Sequence[int]]) -> None:
        self._settle()  # the grammar moves on: the next mask is a new one
        for row, (matcher, new) in enumerate(zip(self.matchers, tokens, strict=True)):
            for token in new:
                if matcher.is_stopped() and token in self.eos:
                    continue  # the end the finished grammar asked for
                if not matcher.consume_token(int(token)):
                    raise ValueError(
                        f"row {row}: token {int(token)} "
                        f"({self.tokenizer.dbg_tokens([int(token)])}) does not continue the "
                        f"grammar: {_reason(matcher)}"
                    )

    def rewind(self, counts: Sequence[int]) -> None:
        self._settle()
        for row, (matcher, count) in enumerate(zip(self.matchers, counts, strict=True)):
            if count and not matcher.rollback(int(count)):
                raise ValueError(f"row {row}: cannot roll the grammar back {count} tokens")

    def reorder(self, rows: np.ndarray) -> None:
        self._settle()
        seen: set[int] = set()
        matchers = []
        for row in np.asarray(rows).tolist():
            matcher = self.matchers[row]
            matchers.append(matcher.deep_copy() if row in seen else matcher)
            seen.add(row)
        self.matchers = matchers
        self._held = None

    def fork(self) -> GrammarConstraint:
        """An independent copy at the same place in the grammar (``Generation.fork``)."""
        self._settle()
        twin = object.__new__(GrammarConstraint)
        twin.__dict__.update(self.__dict__)
        twin.matchers = [m.deep_copy() for m in self.matchers]
        twin._bits = self._bits.copy()
        twin._held = None
        twin._pending = None
        return twin

    def forced_tokens(self, row: int) -> list[int]:
        """The tokens the grammar leaves as the only continuation of ``row``; the end of
        sequence once it is complete."""
        if not self.fast_forward:
            return []
        self._settle()
        matcher = self.matchers[row]
        if matcher.is_error():
            return []
        if matcher.is_stopped():
            return [self.eos[0]]
        forced = matcher.compute_ff_tokens()
        # llguidance tokenizes forced text with the model's tokenizer, which may give the
        # unknown token for text the vocabulary cannot spell; keep only what continues
        # the grammar (the mask then says that nothing does: NoTokenLeft, not a crash)
        return forced[: matcher.validate_tokens(forced)] if forced else forced

    def valid_prefix(self, row: int, tokens: Sequence[int]) -> int:
        """How many of the drafted ``tokens`` continue ``row``'s grammar, in order
        (``ChecksDrafts``: the loop verifies only those)."""
        self._settle()
        matcher = self.matchers[row]
        if matcher.is_error() or matcher.is_stopped():
            return 0
        return int(matcher.validate_tokens([int(t) for t in tokens]))

    def is_complete(self, row: int) -> bool:
        """Whether ``row``'s text so far is a whole sentence of the grammar."""
        self._settle()
        return self.matchers[row].is_accepting()


_WORKER: ThreadPoolExecutor | None = None
_WORKER_LOCK = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    """One thread that computes masks beside forwards, for every request of the process
    (each task is one request's own matchers)."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortgen-grammar")
        return _WORKER


def _reason(matcher: Any) -> str:
    """llguidance's error, first line: the rest is a dump of its parser state."""
    error = matcher.get_error().strip()
    return error.splitlines()[0] if error else ""


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("grammar", GrammarConstraint)
