"""The loop: prefill, then forward → processors → sampler → append → stopping, per step.

``Generation`` is the one step object under ``start()``, ``generate()``, ``stream()``,
chat sessions and the server's continuous batch. It holds a preallocated token buffer and
the KV cache, and feeds the model only what the cache has not seen yet: the whole prompt
on the first step (prefill), one token per row after that, or a whole appended turn when
a chat continues. Rows may join a running batch and leave it (``admission.py``); every
per-row field lives in one ``RowState`` (``rows.py``), so moving, adding and dropping
rows are one operation each. With a tokenizer it also keeps each row's text
(:class:`~ortgen.text.RowText`) and applies the per-row text rule, stop strings, so every
driver stops at the same place. No plugin code and no I/O live here; components arrive as
plain callables in a ``Chain``.

A component that raises fails the rows it serves (finish reason ``"error"``, the error
kept in ``errors[row]``); the other rows go on. ``step()`` then raises that error, unless
the batch is open (the server reads ``errors`` instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ComponentError, InputError
from ..model.session import ExportedModel
from ..protocols.candidates import Candidates
from ..text import RowText, Tokenizer
from ..util.exclusive import Exclusive
from . import scoring
from .admission import Admission
from .batch_kind import REQUEST, BatchKind
from .cache_view import CacheView
from .chain import Chain
from .continuing import Continuing
from .feeding import PREFILL_CHUNK, Feeding
from .following import Following
from .picking import Picking
from .prompt_scoring import TokenLogprob
from .rows import RowState
from .speculating import Speculating
from .step_record import StepRecord
from .step_report import StepReport, StepStart


class Generation(Feeding, Following, Picking, Speculating, Continuing, Admission):
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
        batch: BatchKind = REQUEST,
    ) -> None:
        """The one constructor. ``batch``: ``REQUEST`` (these ``prompts``, prefilled by
        the first step) or ``OPEN`` (no prompts: rows join with ``admit()``; what
        ``Generation.open()`` makes)."""
        if batch.joins:
            if prompts or row_chains:
                raise InputError("an open batch starts empty: rows join with admit()")
            self._setup(model, chain, pad_token_id, tokenizer, [], batch)
            self._init_open()
            return
        if not prompts:
            raise InputError("no prompts given")
        chains = list(row_chains) if row_chains is not None else [chain] * len(prompts)
        if len(chains) != len(prompts):
            raise InputError(f"row_chains needs one chain per row ({len(prompts)} rows)")
        self._setup(model, chain, pad_token_id, tokenizer, chains, batch)
        self.prompt_length = max(len(p) for p in prompts)
        self.rows = _rows_for(prompts, self.prompt_length, max_length, pad_token_id, chains)
        self.length = self.prompt_length  # tokens in the buffer, per row (padding included)
        self._regroup()
        # prompt logprobs need every prompt position's logits: nothing is taken from a cache
        self._scoring = chain.record.get("prompt_logprobs") is not None
        # prompt tokens per row whose keys/values the cache already holds (prefix reuse)
        if not self._scoring:
            self.rows.reused = self._reuse([list(p) for p in prompts])
        # a shared-buffer graph packs rows from position 0: padded prompts, or rows that
        # reuse different prefixes, go row by row
        starts = self.rows.pads + self.rows.reused
        self._packed_prefill = model.signature.shared_kv and bool((starts != starts[0]).any())
        if not self._packed_prefill:
            self.fed = self._first_unfed()
        #: real prompt tokens fed by the prefill (reused ones excluded)
        self.prefill_tokens = int((self.prompt_length - starts).sum())
        if self._packed_prefill and self._kv.selects is None:
            raise InputError(
                f"kv cache {chain.cache_name!r} cannot hold prompts of different lengths for "
                f"this graph ({model.path}: each row's keys/values start at position 0); "
                "use cache='static' (the default) or prompts of equal length"
            )
        self._new_texts()
        self.record = StepRecord(len(prompts), max_length, **chain.record)
        self._init_following()
        self._init_speculation()
        self._check_speculation()

    def _setup(
        self,
        model: ExportedModel,
        chain: Chain,
        pad_token_id: int,
        tokenizer: Tokenizer | None,
        chains: Sequence[Chain],
        batch: BatchKind,
    ) -> None:
        """What every step object has, whatever its rows."""
        if any(c.stop_strings for c in chains) and tokenizer is None:
            raise InputError(
                f"stop_strings need a tokenizer, and the model in {model.path} has none; "
                "stop on token ids with eos_token_id or a stopping criterion instead"
            )
        self.model = model
        #: what this request binds to the model's session; never shared with another
        self._binding = model.binding()
        #: one thread drives a request at a time; a second one gets an error, not a race
        self._driver = Exclusive("this request (a Generation step object)")
        self.chain = chain  # holds the cache every row shares
        self.pad_token_id = pad_token_id
        self.tokenizer = tokenizer
        self.fed = 0  # positions the cache holds
        self.steps = 0
        self.prefill_chunk = PREFILL_CHUNK
        self._scoring = False
        self._solo: set[int] = set()  # ids of chains that see their one row without padding
        self._batch = batch  # a request's own rows, or rows that join and leave
        #: the cache every row shares, with its optional capabilities found once
        self._kv = CacheView.of(chain.cache, chain.cache_name)
        self._check_cache_signature(self._kv, chain.cache_name, model)

    # -- what a caller reads -----------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def ids(self) -> np.ndarray:
        """(B, capacity) left-padded prompts and generated tokens (the whole buffer)."""
        return self.rows.ids

    @property
    def unfinished(self) -> np.ndarray:
        """(B,) bool: the rows still generating."""
        return self.rows.unfinished

    @property
    def finish_reasons(self) -> list[str | None]:
        """Per row, why it finished (None while it runs)."""
        return self.rows.finish_reasons

    @property
    def errors(self) -> list[Exception | None]:
        """Per row, the error of its own component that ended it (finish reason "error")."""
        return self.rows.errors

    @property
    def is_done(self) -> bool:
        return not self.rows.unfinished.any()

    @property
    def sequences(self) -> np.ndarray:
        """(B, T) left-padded prompts and generated tokens; a view of the buffer."""
        return self.rows.ids[:, : self.length]

    def row_chain(self, row: int) -> Chain:
        """The components ``row`` runs with (its settings group's chain)."""
        if not 0 <= row < self.batch_size:
            raise InputError(f"no row {row} in a batch of {self.batch_size}")
        return self.rows.chains[row]

    def generated(self, row: int) -> list[int]:
        """Tokens generated for ``row``: no prompt, no padding after it finished."""
        return self.rows.ids[row, self.rows.prompt_end[row] : self.row_end(row)].tolist()

    def row_end(self, row: int) -> int:
        """Buffer index after ``row``'s last token of this turn."""
        finished = int(self.rows.finished_at[row])
        return finished if finished >= 0 else self.length

    def logprobs(self, row: int = 0) -> list[float]:
        """Log-probability of each token generated for ``row`` in this turn (needs
        ``logprobs=True`` or ``top_logprobs``): the log-softmax of the scores the sampler
        saw, as transformers' ``compute_transition_scores(..., normalize_logits=True)``.
        NaN marks tokens that were appended, not sampled."""
        self._need_record("logprobs", bool(self.record.wanted[row]))
        return self.record.logprobs(row, int(self.rows.prompt_end[row]), self.row_end(row))

    def top_logprobs(self, row: int = 0) -> list[list[tuple[int, float]]]:
        """Per generated token of ``row``, the ``top_logprobs`` best (token, logprob) pairs."""
        self._need_record("top_logprobs", bool(self.record.tops[row] > 0))
        return self.record.top_logprobs(row, int(self.rows.prompt_end[row]), self.row_end(row))

    def prompt_logprobs(self, row: int = 0) -> list[TokenLogprob | None]:
        """Each prompt token of ``row`` (``prompt_logprobs=N``): its log-probability under
        the raw model given the tokens before it, its rank and the N best alternatives
        (``TokenLogprob``); None for the first token, which has nothing before it, and
        for tokens not scored (a turn's history when an appended turn asked)."""
        self._need_record("prompt_logprobs", bool(self.record.prompt_tops[row] >= 0))
        pad, end = int(self.rows.pads[row]), int(self.rows.prompt_end[row])
        return self.record.prompt_logprobs(row, pad, self.rows.ids[row, pad:end].tolist())

    def text(self, row: int = 0) -> str:
        """The text generated for ``row`` in this turn, cut before a stop string; the
        final text once the row finished. Needs a tokenizer."""
        return self._row_text(row).text

    def new_text(self, row: int = 0) -> str:
        """Text of ``row`` that became safe to show since the last call (for streaming):
        what may be the start of a stop string is held back until it is known not to be,
        and a finished row releases the rest. Needs a tokenizer."""
        return self._row_text(row).take()

    # -- one step ------------------------------------------------------------------------

    def step(self) -> StepReport:
        """Pick one token per row (a speculative step may keep several); returns what the
        step did per row (``StepReport``: the tokens as appended, each row's new columns,
        the rows that ended, drafts proposed and kept)."""
        with self._driver.hold("step"):
            before = StepStart(self)
            ids = self._step()
            return StepReport(before, self, ids)

    def _step(self) -> np.ndarray:
        if self.is_done:
            raise InputError("generation is finished; append() more tokens to continue")
        if self.fed >= self.length:  # force() fed every token: no newest one to pick after
            raise InputError(
                "step() after force(): the model has seen every token, so there is no "
                "newest one to feed; call force() again, or append() tokens and step()"
            )
        if self._batch.grows:  # rows end by their own limits, not the buffer's
            self.reserve(self.length + 2)
        failed: list[ComponentError] = []
        forced = self._forced_column()  # tokens a component knows for certain, if any
        drafts = self._drafts(forced)  # tokens a drafter guesses (speculating.py)
        if drafts:
            return self._speculate(drafts, failed)
        logits: np.ndarray | None
        scores: np.ndarray | Candidates
        if forced is not None and self._skips_forward(forced):  # fed with the next step's
            logits = None
            next_ids, scores = self._forced_pick(forced, failed)
        else:
            logits = self._forward()
            next_ids, scores = self._pick(self.sequences, logits, forced, failed)
        if failed and self.is_done:  # every running row failed: nothing to append
            if self._batch.isolates_errors:
                return next_ids
            raise failed[0]
        next_ids = self._commit(next_ids, logits, scores, forced, failed)
        self._finish_step(failed)
        return next_ids

    def _commit(
        self,
        next_ids: np.ndarray,
        logits: np.ndarray | None,
        scores: np.ndarray | Candidates,
        forced: np.ndarray | None,
        failed: list[ComponentError],
    ) -> np.ndarray:
        """The picked tokens become the buffer's next column: rows a search moved follow
        it, finished rows get padding, what was asked is recorded, followers are told,
        each row's text grows and the stopping criteria and stop strings run. Returns the
        tokens as appended."""
        search = self._groups[0][1].search
        if search is not None and search.parents is not None:  # it moved beams: follow
            self._reorder(np.asarray(search.parents, dtype=np.int64))
        active = self.rows.unfinished.copy()
        # Python bools, not np.where: right after a forward, np.where with a Python-int
        # fill value runs ~75 us of cold promotion code; the usual step has no row to pad
        if not all(active.tolist()):
            next_ids = next_ids.copy()
            next_ids[~active] = self.pad_token_id
        if self.record.active:
            self.record.reserve(self.rows.ids.shape[1])
            self.record.record(self.length, next_ids, logits, scoring.dense(scores))
        self._append_column(next_ids)
        self._settle(next_ids, active, scores, failed)
        if search is not None and search.done:
            for row in np.flatnonzero(self.rows.unfinished).tolist():
                self.finish(row, "search_done")
        self.steps += 1
        self._take_forced(forced, failed)
        return next_ids

    def _settle(
        self,
        next_ids: np.ndarray,
        active: np.ndarray,
        scores: np.ndarray | Candidates,
        failed: list[ComponentError],
        only: Sequence[int] | None = None,
    ) -> None:
        """What follows every picked token, for a step's column and for a joining row's
        first token alike (``admission.py``), so each per-token rule lives here once:
        followers told, each row's text grown, the stopping criteria, the stop strings.
        ``active``: the rows that got a token; ``only``: those rows when they are a
        joining row alone (``scores`` then its own (1, V) row), None for a whole step."""
        self._advance_column(next_ids, active, failed)
        stopped = self._push_text(next_ids, active)
        self._stop(scores, failed, only)
        for row in stopped:  # after the criteria: an EOS in the same step keeps its reason
            self.finish(row, "stop_string")

    def _finish_step(self, failed: list[ComponentError]) -> None:
        """After a step's tokens: work for the next step started, prefixes remembered
        when the request ends, and (outside an open batch) a component's error raised."""
        self._prepare_next(failed)
        if self.is_done and self._kv.prefixes is not None:
            self._cache_call(self._kv.prefixes.remember, self._held_rows())
        if failed and not self._batch.isolates_errors:
            raise failed[0]

    # -- search, finishing ------------------------------------------------------------------

    def search_results(self) -> tuple[list[list[int]], list[float]] | None:
        """A search strategy's chosen sequences (generated tokens) and their scores, or
        None for samplers that pick one token per row (see ``finalize`` in the sampler
        contract)."""
        finalize = self._finalize
        return finalize(self.sequences) if finalize is not None else None

    @property
    def is_search(self) -> bool:
        """True when the sampler is a search strategy (beam search): it moves rows, and
        the text exists only once it has chosen (``search_results()``)."""
        return self._finalize is not None

    @property
    def _finalize(self) -> Any:
        """A search strategy's ``finalize`` (see the sampler contract), or None."""
        if not self._groups:
            return None
        search = self._groups[0][1].search
        return search.finalize if search is not None else None

    def _reorder(self, parents: np.ndarray) -> None:
        """Rows become copies of ``parents`` (beam search keeps its best beams): every
        per-row field, the cache's keys and values, and components that follow tokens."""
        if parents.shape != (self.batch_size,):
            raise ComponentError(
                f"sampler returned parents of shape {parents.shape}; expected ({self.batch_size},)"
            )
        if (parents == np.arange(self.batch_size)).all():
            return
        self.rows.take(parents)
        self._cache_call(self._kv.cache.reorder, parents)
        self._reorder_followers(parents)

    def finish(self, row: int, reason: str) -> None:
        """Mark ``row`` finished from outside the chain (e.g. a stop string in its text)."""
        rows = self.rows
        if rows.unfinished[row]:
            rows.unfinished[row] = False
            rows.finished_at[row] = self.length
            text = rows.texts[row]
            if text is not None:
                text.close()  # a stop string in the held-back end is found here
                if text.stopped and reason != "error":
                    reason = "stop_string"  # the text was cut: that is why it ends there
            rows.finish_reasons[row] = reason

    # -- internals -----------------------------------------------------------------------

    def _regroup(self) -> None:
        """(rows, chain) per settings group, from each row's chain; one group of every
        row (None) when all share one chain, so the common case indexes nothing."""
        chains = self.rows.chains
        if not chains or all(c is chains[0] for c in chains):
            self._groups: list[tuple[np.ndarray | None, Chain]] = (
                [(None, chains[0])] if chains else []
            )
            return
        groups: dict[int, list[int]] = {}
        by_id: dict[int, Chain] = {}
        for row, row_chain in enumerate(chains):
            groups.setdefault(id(row_chain), []).append(row)
            by_id[id(row_chain)] = row_chain
        self._groups = [(np.asarray(rows), by_id[key]) for key, rows in groups.items()]

    def _append_column(self, next_ids: np.ndarray) -> None:
        self.reserve(self.length + 1)
        self.rows.ids[:, self.length] = next_ids
        self.rows.mask[:, self.length] = 1
        self.length += 1

    def reserve(self, needed: int) -> None:
        """Make the buffers hold at least ``needed`` tokens per row (grows by doubling)."""
        self.rows.reserve(needed, self.pad_token_id)

    # -- text ----------------------------------------------------------------------------

    def _new_texts(self) -> None:
        """One text per row for this turn; tokens it already generated (kept by a rewind
        or an appended continuation) count as shown text."""
        if self.tokenizer is None or self.is_search:  # a search's rows move: text at the end
            return
        self.rows.texts[:] = [
            RowText(self.tokenizer, self.rows.chains[row].stop_strings, history=self.generated(row))
            for row in range(self.batch_size)
        ]

    def _push_text(self, next_ids: np.ndarray, active: np.ndarray) -> list[int]:
        """Feed each running row's new token to its text; the rows a stop string ended."""
        if self.tokenizer is None or self.is_search:
            return []
        stopped = []
        texts = self.rows.texts
        for row in active.nonzero()[0].tolist():
            text = texts[row]
            if text is not None and text.push(int(next_ids[row])):
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
        text = self.rows.texts[row] if self.tokenizer is not None else None
        if text is None:
            raise InputError(
                f"the model in {self.model.path} has no tokenizer, so there is no text; "
                "read the token ids with generated(row)"
            )
        return text


def _rows_for(
    prompts: Sequence[Sequence[int]],
    prompt_length: int,
    capacity: int,
    pad_token_id: int,
    chains: Sequence[Chain],
) -> RowState:
    """Left-padded rows for ``prompts``, all running."""
    rows = RowState.empty(capacity, pad_token_id)
    batch = len(prompts)
    rows.ids = np.full((batch, capacity), pad_token_id, dtype=np.int64)
    rows.mask = np.zeros((batch, capacity), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        if len(prompt):
            rows.ids[row, prompt_length - len(prompt) : prompt_length] = prompt
            rows.mask[row, prompt_length - len(prompt) : prompt_length] = 1
    rows.pads = prompt_length - rows.mask.sum(axis=1)
    rows.prompt_end = np.full(batch, prompt_length, dtype=np.int64)
    rows.reused = np.zeros(batch, dtype=np.int64)
    rows.unfinished = np.ones(batch, dtype=bool)
    rows.finished_at = np.full(batch, -1, dtype=np.int64)
    rows.finish_reasons = [None] * batch
    rows.texts = [None] * batch
    rows.forced = [[] for _ in range(batch)]
    rows.errors = [None] * batch
    rows.chains = list(chains)
    return rows
