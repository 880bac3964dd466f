"""The loop: prefill, then forward → processors → sampler → append → stopping, per step.

``Generation`` is the one step object under ``start()``, ``generate()``, ``stream()``
and chat sessions. It holds a preallocated token buffer and the KV cache, and feeds the
model only what the cache has not seen yet: the whole prompt on the first step (prefill),
one token per row after that, or a whole appended turn when a chat continues. With a
tokenizer it also keeps each row's text (:class:`~ortgen.text.RowText`) and applies the
per-row text rule, stop strings, so every driver stops at the same place. No plugin code
and no I/O live here; components arrive as plain callables in a ``Chain``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import scoring
from .candidates import Candidates
from .chain import Chain
from .component_checks import check_ids, check_not_nan, check_stop
from .errors import ComponentError, InputError
from .exclusive import Exclusive
from .feeding import PREFILL_CHUNK, Feeding
from .following import Following
from .model import ExportedModel
from .step_record import StepRecord
from .text import RowText, Tokenizer


class Generation(Feeding, Following):
    """One request's sequences and cache, advanced one token per row per ``step()``."""

    def __init__(
        self,
        model: ExportedModel,
        chain: Chain,
        prompts: Sequence[Sequence[int]],
        *,
        max_length: int,
        pad_token_id: int,
        tokenizer: Tokenizer | None = None,
        row_chains: Sequence[Chain] | None = None,
    ) -> None:
        if not prompts:
            raise InputError("no prompts given")
        # rows sharing one settings group share one chain; ``chain`` holds the cache
        self._groups = _group_rows(chain, row_chains, len(prompts))
        if any(c.stop_strings for _, c in self._groups) and tokenizer is None:
            raise InputError(
                f"stop_strings need a tokenizer, and the model in {model.path} has none; "
                "stop on token ids with eos_token_id or a stopping criterion instead"
            )
        self.model = model
        #: what this request binds to the model's session; never shared with another
        self._binding = model.binding()
        #: one thread drives a request at a time; a second one gets an error, not a race
        self._driver = Exclusive("this request (a Generation step object)")
        self.chain = chain
        self.pad_token_id = pad_token_id
        self.prompt_length = max(len(p) for p in prompts)
        batch = len(prompts)
        self.ids = np.full((batch, max_length), pad_token_id, dtype=np.int64)
        self.mask = np.zeros((batch, max_length), dtype=np.int64)
        for row, prompt in enumerate(prompts):  # left padding
            if len(prompt):
                self.ids[row, self.prompt_length - len(prompt) : self.prompt_length] = prompt
                self.mask[row, self.prompt_length - len(prompt) : self.prompt_length] = 1
        self.length = self.prompt_length  # tokens in the buffer, per row (padding included)
        self.fed = 0  # positions the cache holds
        # per row, left padding columns: the next token's position is length - pads
        self._pads = self.prompt_length - self.mask.sum(axis=1)
        self._prompt_end = np.full(batch, self.prompt_length)  # per row: generated from here
        self._solo: set[int] = set()  # ids of chains that see their one row without padding
        self._check_cache_signature(chain, model)
        self._cache_outputs = hasattr(chain.cache, "outputs")  # the cache owns the presents
        self._cache_feeds_mask = hasattr(chain.cache, "feed_mask")  # a window, a sink
        # prompt tokens per row whose keys/values the cache already holds (prefix reuse)
        self._reused = self._reuse([list(p) for p in prompts])
        # a shared-buffer graph packs rows from position 0: padded prompts, or rows that
        # reuse different prefixes, go row by row
        starts = self._pads + self._reused
        self._packed_prefill = model.signature.shared_kv and bool((starts != starts[0]).any())
        if not self._packed_prefill:
            self.fed = self._first_unfed()
        #: real prompt tokens fed by the prefill (reused ones excluded)
        self.prefill_tokens = int((self.prompt_length - starts).sum())
        if self._packed_prefill and not hasattr(chain.cache, "select"):
            raise InputError(
                f"kv cache {chain.cache_name!r} cannot hold prompts of different lengths for "
                f"this graph ({model.path}: each row's keys/values start at position 0); "
                "use cache='static' (the default) or prompts of equal length"
            )
        self.unfinished = np.ones(batch, dtype=bool)
        self.finish_reasons: list[str | None] = [None] * batch
        self._finished_at: dict[int, int] = {}  # row -> buffer length when it finished
        self.steps = 0
        self.prefill_chunk = PREFILL_CHUNK
        self.tokenizer = tokenizer
        self._texts: list[RowText] = []
        self._new_texts()
        self.record = StepRecord(batch, max_length, **chain.record)
        self._init_following()

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]

    @property
    def is_done(self) -> bool:
        return not self.unfinished.any()

    @property
    def sequences(self) -> np.ndarray:
        """(B, T) left-padded prompts and generated tokens; a view of the buffer."""
        return self.ids[:, : self.length]

    def row_chain(self, row: int) -> Chain:
        """The components ``row`` runs with (its settings group's chain)."""
        for rows, chain in self._groups:
            if rows is None or row in rows:
                return chain
        raise InputError(f"no row {row} in a batch of {self.batch_size}")

    def generated(self, row: int) -> list[int]:
        """Tokens generated for ``row``: no prompt, no padding after it finished."""
        return self.ids[row, self._prompt_end[row] : self._end(row)].tolist()

    def _end(self, row: int) -> int:
        """Buffer index after ``row``'s last token of this turn."""
        return self._finished_at[row] if self.finish_reasons[row] is not None else self.length

    def logprobs(self, row: int = 0) -> list[float]:
        """Log-probability of each token generated for ``row`` in this turn (needs
        ``logprobs=True`` or ``top_logprobs``): the log-softmax of the scores the sampler
        saw, as transformers' ``compute_transition_scores(..., normalize_logits=True)``.
        NaN marks tokens that were appended, not sampled."""
        self._need_record("logprobs", self.record.want_logprobs)
        return self.record.logprobs(row, int(self._prompt_end[row]), self._end(row))

    def top_logprobs(self, row: int = 0) -> list[list[tuple[int, float]]]:
        """Per generated token of ``row``, the ``top_logprobs`` best (token, logprob) pairs."""
        self._need_record("top_logprobs", self.record.top > 0)
        return self.record.top_logprobs(row, int(self._prompt_end[row]), self._end(row))

    def text(self, row: int = 0) -> str:
        """The text generated for ``row`` in this turn, cut before a stop string; the
        final text once the row finished. Needs a tokenizer."""
        return self._row_text(row).text

    def new_text(self, row: int = 0) -> str:
        """Text of ``row`` that became safe to show since the last call (for streaming):
        what may be the start of a stop string is held back until it is known not to be,
        and a finished row releases the rest. Needs a tokenizer."""
        return self._row_text(row).take()

    def step(self) -> np.ndarray:
        """Pick one token per row; returns them (pad for rows already finished)."""
        with self._driver.hold("step"):
            return self._step()

    def _step(self) -> np.ndarray:
        if self.is_done:
            raise InputError("generation is finished; append() more tokens to continue")
        forced = self._forced_column()  # tokens a component knows for certain, if any
        logits: np.ndarray | None
        if forced is not None and self._skips_forward(forced):  # fed with the next step's
            logits = None
            next_ids, scores = self._forced_pick(forced)
        else:
            logits = self._forward()
            next_ids, scores = self._pick(self.ids[:, : self.length], logits, forced)
        parents = getattr(self._groups[0][1].sampler[1], "parents", None)
        if parents is not None:  # a search strategy moved its beams: follow them
            self._reorder(np.asarray(parents, dtype=np.int64))
        active = self.unfinished.copy()
        # Python bools, not np.where: right after a forward, np.where with a Python-int
        # fill value runs ~75 us of cold promotion code; the usual step has no row to pad
        if not all(active.tolist()):
            next_ids = next_ids.copy()
            next_ids[~active] = self.pad_token_id
        if self.record.active:
            self.record.reserve(self.ids.shape[1])
            self.record.record(self.length, next_ids, logits, scoring.dense(scores))
        self._append_column(next_ids)
        self._advance_column(next_ids, active)
        stopped = self._push_text(next_ids, active)
        self._stop(scores)
        for row in stopped:  # after the criteria: an EOS in the same step keeps its reason
            self.finish(row, "stop_string")
        if getattr(self._groups[0][1].sampler[1], "done", False):
            for row in np.flatnonzero(self.unfinished).tolist():
                self.finish(row, "search_done")
        self.steps += 1
        self._take_forced(forced)
        self._prepare_next()
        if self.is_done and hasattr(self.chain.cache, "remember"):
            self._cache_call("remember", self._held_rows())
        return next_ids

    def fork(self, *, seed: int | None = None) -> Generation:
        """An independent copy of this request as it stands, to continue on its own.

        The copy has the same tokens, texts, records and component state, and its own
        copy of the KV cache (the backend's ``fork()``): a prompt prefilled once can go
        on as several branches (append a different question to each, say) without
        feeding it again. Both share the model, the tokenizer and the request's facts
        (``GenerationContext``). A sampler's random stream is copied too, so a fork
        picks what the original would; ``seed`` reseeds the fork's samplers instead
        (those with a ``reseed(seed)`` method, like ``multinomial``).
        """
        if not hasattr(self.chain.cache, "fork"):
            raise InputError(
                f"kv cache {self.chain.cache_name!r} cannot be forked: it has no fork() method"
            )
        if seed is not None:
            for _, chain in self._groups:
                name, sampler = chain.sampler
                if not hasattr(sampler, "reseed"):
                    raise InputError(f"sampler {name!r} cannot be reseeded (no reseed method)")
        with self._driver.hold("fork"):
            return self._fork(seed)

    def _fork(self, seed: int | None) -> Generation:
        cache = self._cache_call("fork")
        memo: dict[int, Any] = {id(self.model): self.model, id(self.chain.cache): cache}
        if self.tokenizer is not None:
            memo[id(self.tokenizer)] = self.tokenizer
        for _, chain in self._groups:  # components with native state copy themselves
            for name, component in chain.followers:
                if hasattr(component, "fork") and id(component) not in memo:
                    memo[id(component)] = self._tell("fork", name, component)
        try:
            twin = copy.deepcopy(self, memo)
        except Exception as exc:
            raise ComponentError(
                f"cannot fork this generation: a component cannot be copied "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        twin._solo = {id(memo[chain_id]) for chain_id in self._solo}
        if seed is not None:
            for _, chain in twin._groups:
                chain.sampler[1].reseed(seed)
        return twin

    def force(self, tokens: Sequence[int] = ()) -> np.ndarray:
        """Teacher forcing: write ``tokens`` after every row, feed what the cache has not
        seen, and return the logits for the next position (B, V), sampling nothing.

        Scoring a text this way (perplexity, top-1 agreement) goes through the same
        cache calls as generation, so a cache backend is measured as it runs. Rows are
        not reopened and no text is kept: mix it with ``step()`` only knowingly.
        """
        with self._driver.hold("force"):
            return self._force(tokens)

    def _force(self, tokens: Sequence[int]) -> np.ndarray:
        width = len(tokens)
        if width:
            self.reserve(self.length + width)
            self.ids[:, self.length : self.length + width] = np.asarray(tokens, dtype=np.int64)
            self.mask[:, self.length : self.length + width] = 1
            self.length += width
        if self.fed >= self.length:
            raise InputError("force() needs tokens the model has not seen")
        return self._forward()

    def search_results(self) -> tuple[list[list[int]], list[float]] | None:
        """A search strategy's chosen sequences (generated tokens) and their scores, or
        None for samplers that pick one token per row (see ``finalize`` in the sampler
        contract)."""
        finalize = self._finalize
        return finalize(self.ids[:, : self.length]) if finalize is not None else None

    @property
    def is_search(self) -> bool:
        """True when the sampler is a search strategy (beam search): it moves rows, and
        the text exists only once it has chosen (``search_results()``)."""
        return self._finalize is not None

    @property
    def _finalize(self) -> Any:
        """A search strategy's ``finalize`` (see the sampler contract), or None."""
        return getattr(self._groups[0][1].sampler[1], "finalize", None)

    def _reorder(self, parents: np.ndarray) -> None:
        """Rows become copies of ``parents`` (beam search keeps its best beams): token
        buffer, mask, positions and the cache's keys and values."""
        if parents.shape != (self.batch_size,):
            raise ComponentError(
                f"sampler returned parents of shape {parents.shape}; expected ({self.batch_size},)"
            )
        if (parents == np.arange(self.batch_size)).all():
            return
        n = self.length
        self.ids[:, :n] = self.ids[parents, :n]
        self.mask[:, :n] = self.mask[parents, :n]
        self._pads = self._pads[parents]
        self._prompt_end = self._prompt_end[parents]
        self._reused = self._reused[parents]
        self._cache_call("reorder", parents)
        self._reorder_followers(parents)

    def _pick(
        self, input_ids: np.ndarray, logits: np.ndarray, forced: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | Candidates]:
        """Each settings group's processors and sampler on its rows; (next ids, scores).
        ``forced``: per row, a token it must take (-1: none), or None."""
        if len(self._groups) == 1:
            return self._pick_group(self._groups[0][1], input_ids, logits, forced)
        next_ids = np.empty(self.batch_size, dtype=np.int64)
        scores = np.empty_like(logits)
        for rows, chain in self._groups:
            ids, group_logits = self._group_view(rows, chain, input_ids, logits)
            group_forced = forced[rows] if forced is not None else None
            next_ids[rows], group_scores = self._pick_group(chain, ids, group_logits, group_forced)
            scores[rows] = scoring.dense(group_scores)
        return next_ids, scores

    def _group_view(
        self, rows: np.ndarray | None, chain: Chain, input_ids: np.ndarray, scores: Any
    ) -> tuple[np.ndarray, Any]:
        """What a settings group's components see: its rows, and for a chain serving one
        row alone (a request in a continuous batch) that row without its padding, as
        the request would look on its own."""
        if rows is None:
            return input_ids, scores
        # scores None: for stopping criteria that read none (see _stop)
        if id(chain) in self._solo:
            row = int(rows[0])
            solo = None if scores is None else scores[row : row + 1]
            return input_ids[row : row + 1, self._pads[row] :], solo
        return input_ids[rows], None if scores is None else scores[rows]

    def _pick_group(
        self,
        chain: Chain,
        input_ids: np.ndarray,
        logits: np.ndarray,
        forced: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | Candidates]:
        """(next ids, processed scores: dense, or Candidates when the chain left few).
        Rows with a ``forced`` token (>= 0) see a point mass on it."""
        scores = scoring.process(
            chain.processors, input_ids, logits, step=self.steps, call=self._call
        )
        # raw model logits go straight to the sampler, which checks; Candidates cannot
        # be NaN everywhere (the scores outside them are -inf)
        if chain.processors and not isinstance(scores, Candidates):
            check_not_nan(scores, chain, self.steps)
        scores = self._force_scores(scores, forced)
        next_ids = self._sample(chain, input_ids, scores)
        if forced is not None:
            self._check_forced(forced, next_ids)
        return next_ids, scores

    def _sample(
        self, chain: Chain, input_ids: np.ndarray, scores: np.ndarray | Candidates
    ) -> np.ndarray:
        """The chain's sampler on processed scores, its answer checked."""
        next_ids = scoring.pick(chain.sampler, input_ids, scores, call=self._call)
        batch, vocab = scores.shape
        return check_ids(chain.sampler[0], next_ids, batch, vocab, self.steps)

    def finish(self, row: int, reason: str) -> None:
        """Mark ``row`` finished from outside the chain (e.g. a stop string in its text)."""
        if self.unfinished[row]:
            self.unfinished[row] = False
            self._finished_at[row] = self.length
            if self._texts:
                self._texts[row].close()  # a stop string in the held-back end is found here
                if self._texts[row].stopped:
                    reason = "stop_string"  # the text was cut: that is why it ends there
            self.finish_reasons[row] = reason

    def append(self, tokens: Sequence[Sequence[int]], *, chain: Chain | None = None) -> None:
        """Add tokens to every row and reopen the rows; they are fed on the next step.

        With ``chain`` this starts a new turn (a chat continuing): the new components
        take over (the cache stays), and ``generated()`` counts from after ``tokens``.
        """
        with self._driver.hold("append"):
            self._append(tokens, chain)

    def _append(self, tokens: Sequence[Sequence[int]], chain: Chain | None) -> None:
        if len(tokens) != self.batch_size:
            raise InputError(f"append() needs one token list per row ({self.batch_size} rows)")
        width = len(tokens[0])
        if any(len(t) != width for t in tokens) or width == 0:
            raise InputError("append() needs non-empty token lists of equal length")
        self.reserve(self.length + width)
        self.ids[:, self.length : self.length + width] = np.asarray(tokens, dtype=np.int64)
        self.mask[:, self.length : self.length + width] = 1
        self.length += width
        if chain is not None:
            self.chain = chain
            self._groups = [(None, chain)]
            self.prompt_length = self.length
            self._prompt_end[:] = self.length
            self.record = StepRecord(self.batch_size, self.ids.shape[1], **chain.record)
            self._note_components()
        else:  # the same components go on: those that follow tokens are told
            self._advance([list(map(int, row)) for row in tokens])
        self._reopen()
        self._reset_forced()

    def rewind(self, count: int) -> None:
        """Forget the last ``count`` tokens of every row (and their cached keys/values).

        The rewind may reach into the prompt (editing, speculative decoding): each row
        keeps at least one token, and what is left of the prompt becomes the prompt, so
        ``generated()`` then starts after it.
        """
        with self._driver.hold("rewind"):
            self._rewind(count)

    def _rewind(self, count: int) -> None:
        shortest = self.length - int(self._pads.max())
        if not 0 < count < shortest:
            raise InputError(
                f"cannot rewind {count} tokens: the shortest row holds {shortest} "
                "(a rewind keeps at least one token per row)"
            )
        self._rewind_followers(self.length - count)
        self.length -= count
        self.mask[:, self.length :] = 0
        self.record.forget_steps(count)
        self.prompt_length = min(self.prompt_length, self.length)  # into it: the rest is it
        np.minimum(self._prompt_end, self.length, out=self._prompt_end)
        if self.fed >= self.length:  # re-feed the last kept token to get its logits again
            self.fed = self.length - 1
            self._cache_call("crop", self.fed)
        self._reopen()
        self._reset_forced()

    # -- internals ---------------------------------------------------------------

    def _append_column(self, next_ids: np.ndarray) -> None:
        self.reserve(self.length + 1)
        self.ids[:, self.length] = next_ids
        self.mask[:, self.length] = 1
        self.length += 1

    def _stop(self, scores: np.ndarray | Candidates) -> None:
        """Each settings group's stopping criteria. Scores that were left as Candidates
        are made dense only when a criterion reads them (``uses_scores``, default
        True); the others get None."""
        input_ids = self.ids[:, : self.length]
        if isinstance(scores, Candidates):
            read = any(
                getattr(criterion, "uses_scores", True)
                for _, chain in self._groups
                for _, criterion in chain.stopping
            )
            scores = scores.dense() if read else None
        for rows, chain in self._groups:
            ids, group_scores = self._group_view(rows, chain, input_ids, scores)
            self._stop_group(rows, chain, ids, group_scores)
        if self.length >= self.ids.shape[1]:
            for row in np.flatnonzero(self.unfinished):
                self.finish(int(row), "length")

    def _stop_group(
        self, rows: np.ndarray | None, chain: Chain, ids: np.ndarray, scores: np.ndarray
    ) -> None:
        """Run one settings group's stopping criteria and finish the rows they end."""
        for name, criterion in chain.stopping:
            done = self._call("stopping criterion", name, criterion, ids, scores)
            done = check_stop(name, done, ids.shape[0], self.steps)
            newly = done.nonzero()[0]  # done is 1-D (check_stop)
            if rows is not None:
                newly = rows[newly]
            reason = getattr(criterion, "finish_reason", name)
            for row in newly.tolist():
                self.finish(row, reason)

    def _reopen(self) -> None:
        self.unfinished[:] = True
        self.finish_reasons = [None] * self.batch_size
        self._finished_at.clear()
        self._new_texts()

    # -- text --------------------------------------------------------------------

    def _new_texts(self) -> None:
        """One text per row for this turn; tokens it already generated (kept by a rewind
        or an appended continuation) count as shown text."""
        if self.tokenizer is None or self.is_search:  # a search's rows move: text at the end
            return
        stops = [self.chain.stop_strings] * self.batch_size
        for rows, chain in self._groups:
            if rows is not None:
                for row in rows.tolist():
                    stops[row] = chain.stop_strings
        self._texts = [
            RowText(self.tokenizer, stops[row], history=self.generated(row))
            for row in range(self.batch_size)
        ]

    def _push_text(self, next_ids: np.ndarray, active: np.ndarray) -> list[int]:
        """Feed each running row's new token to its text; the rows a stop string ended."""
        if not self._texts:
            return []
        stopped = []
        for row in active.nonzero()[0].tolist():
            if self._texts[row].push(int(next_ids[row])):
                stopped.append(row)
        return stopped

    def _need_record(self, what: str, asked: bool) -> None:
        if not asked:
            raise InputError(f"{what} were not recorded; pass {what}=... when starting the request")

    def _row_text(self, row: int) -> RowText:
        if self.is_search and self.tokenizer is not None:  # no per-row text (see _new_texts)
            raise InputError(
                "a search strategy's rows move between beams, so a row has no text until "
                "it has chosen: read search_results(), or use generate() or stream()"
            )
        if not self._texts:
            raise InputError(
                f"the model in {self.model.path} has no tokenizer, so there is no text; "
                "read the token ids with generated(row)"
            )
        return self._texts[row]

    def reserve(self, needed: int) -> None:
        """Make the buffers hold at least ``needed`` tokens per row (grows by doubling)."""
        capacity = self.ids.shape[1]
        if needed <= capacity:
            return
        grow = max(needed, 2 * capacity) - capacity
        self.ids = np.pad(self.ids, ((0, 0), (0, grow)), constant_values=self.pad_token_id)
        self.mask = np.pad(self.mask, ((0, 0), (0, grow)))

    def _call(self, kind: str, name: str, component, input_ids, scores):
        try:
            return component(input_ids, scores)
        except ComponentError:
            raise
        except Exception as exc:
            raise ComponentError(
                f"{kind} {name!r} failed at step {self.steps}: {type(exc).__name__}: {exc}"
            ) from exc


def _group_rows(
    chain: Chain, row_chains: Sequence[Chain] | None, batch: int
) -> list[tuple[np.ndarray | None, Chain]]:
    """(rows, chain) per settings group; one group of every row (None) without per-row
    chains, so the common case indexes nothing."""
    if row_chains is None or all(c is row_chains[0] for c in row_chains):
        return [(None, row_chains[0] if row_chains else chain)]
    if len(row_chains) != batch:
        raise InputError(f"row_chains needs one chain per row ({batch} rows)")
    groups: dict[int, list[int]] = {}
    chains: dict[int, Chain] = {}
    for row, row_chain in enumerate(row_chains):
        groups.setdefault(id(row_chain), []).append(row)
        chains[id(row_chain)] = row_chain
    return [(np.asarray(rows), chains[key]) for key, rows in groups.items()]
