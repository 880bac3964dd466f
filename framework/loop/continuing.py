"""Branching and continuing a request: fork, teacher forcing, append and rewind.

Split out of ``generate.py``: ``Continuing`` is a mixin of ``Generation`` (its fields
``rows``, ``length``, ``fed``, ``chain``, ``record``). Every method here edits the rows'
tokens outside the step: the next ``step()`` feeds what the cache has not seen, through
the one feeding path.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Self

import numpy as np

from ..errors import ComponentError, InputError
from ..protocols import ForksState, Reseedable
from .chain import Chain
from .step_fields import StepFields
from .step_record import StepRecord


class Continuing(StepFields):
    """fork(), force(), append() and rewind() of a step object (see module doc)."""

    # -- branching, teacher forcing, search ----------------------------------------------

    def fork(self, *, seed: int | None = None) -> Self:
        """An independent copy of this request as it stands, to continue on its own.

        The copy has the same tokens, texts, records and component state, and its own
        copy of the KV cache (the backend's ``fork()``): a prompt prefilled once can go
        on as several branches (append a different question to each, say) without
        feeding it again. Both share the model, the tokenizer and the request's facts
        (``GenerationContext``). A sampler's random stream is copied too, so a fork
        picks what the original would; ``seed`` reseeds the fork's samplers instead
        (those with a ``reseed(seed)`` method, like ``multinomial``).
        """
        if self._kv.forks is None:
            raise InputError(
                f"kv cache {self.chain.cache_name!r} cannot be forked: it has no fork() method"
            )
        if seed is not None:
            for _, chain in self._groups:
                name, sampler = chain.sampler
                if not isinstance(sampler, Reseedable):
                    raise InputError(f"sampler {name!r} cannot be reseeded (no reseed method)")
        with self._driver.hold("fork"):
            return self._fork(seed)

    def _fork(self, seed: int | None) -> Self:
        forks = self._kv.forks
        assert forks is not None, "fork() checked that the cache forks"
        cache = self._cache_call(forks.fork)
        memo: dict[int, Any] = {id(self.model): self.model, id(self._kv.cache): cache}
        if self.tokenizer is not None:
            memo[id(self.tokenizer)] = self.tokenizer
        for _, chain in self._groups:  # components with native state copy themselves
            for name, component in chain.followers:
                if isinstance(component, ForksState) and id(component) not in memo:
                    memo[id(component)] = self._tell(name, component.fork)
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
                sampler = chain.sampler[1]
                if isinstance(sampler, Reseedable):  # every one is: fork() checked
                    sampler.reseed(seed)
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

    def force_positions(self, tokens: Sequence[int]) -> np.ndarray:
        """Teacher forcing of several tokens in as few forwards as the graph allows: write
        ``tokens`` after every row of a request whose tokens are all fed, feed them, and
        return the logits after each of them (B, len(tokens), V), sampling nothing.

        On a float32 graph these equal ``force()`` token by token to float rounding, in
        ~len(tokens)/256 forwards instead of len(tokens): what a reference graph scores a
        text with. An int8-activation graph rounds a several-position forward differently
        from a one-position one (docs/architecture.md), so a quantised model is scored as
        it decodes, with ``force()``.
        """
        with self._driver.hold("force_positions"):
            if self.fed != self.length:
                raise InputError("force_positions() needs every token before it fed (force())")
            if self.batch_size != 1:
                raise InputError("force_positions() feeds one row (a batch: force() per token)")
            if not tokens:
                raise InputError("force_positions() needs tokens")
            self._write(np.asarray([list(tokens)], dtype=np.int64))
            chunk = self._chunk()
            parts = []
            while self.fed < self.length:
                start, end = self.fed, min(self.length, self.fed + chunk)
                parts.append(self._forward_chunk(start, end, keep=end - start)[:, -(end - start) :])
                self.fed = end
            return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def prefill(self) -> None:
        """Feed the prompt and pick nothing: what ``TextGenerator.score()`` runs for the
        prompt logprobs the request asked for (``prompt_logprobs``; read them with
        ``prompt_logprobs(row)``). Only ``force()`` may follow: there is no token to
        pick after, since the model has seen every one."""
        with self._driver.hold("prefill"):
            if self.fed >= self.length:
                raise InputError("prefill() needs tokens the model has not seen")
            self._forward()

    def _force(self, tokens: Sequence[int]) -> np.ndarray:
        width = len(tokens)
        if width:
            self._write(np.asarray([list(tokens)] * self.batch_size, dtype=np.int64))
        if self.fed >= self.length:
            raise InputError("force() needs tokens the model has not seen")
        return self._forward()

    # -- continuing: append and rewind ---------------------------------------------------

    def append(self, tokens: Sequence[Sequence[int]], *, chain: Chain | None = None) -> None:
        """Add tokens to every row and reopen the rows; they are fed on the next step.

        With ``chain`` this starts a new turn (a chat continuing): the new components
        take over (the cache stays), and ``generated()`` counts from after ``tokens``.
        """
        with self._driver.hold("append"):
            self._append(tokens, chain)

    def _append(self, tokens: Sequence[Sequence[int]], chain: Chain | None) -> None:
        if self._batch.joins:
            raise InputError("an open batch takes new rows through admit(), not append()")
        if len(tokens) != self.batch_size:
            raise InputError(f"append() needs one token list per row ({self.batch_size} rows)")
        width = len(tokens[0])
        if any(len(t) != width for t in tokens) or width == 0:
            raise InputError("append() needs non-empty token lists of equal length")
        self._write(np.asarray(tokens, dtype=np.int64))
        if chain is not None:
            self.chain = chain
            self.rows.chains = [chain] * self.batch_size
            self._regroup()
            self.prompt_length = self.length
            self.rows.prompt_end[:] = self.length
            self.record = StepRecord(self.batch_size, self.rows.ids.shape[1], **chain.record)
            self._scoring = chain.record.get("prompt_logprobs") is not None  # this turn's
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
        if self._batch.joins:
            raise InputError("an open batch's rows cannot be rewound together")
        shortest = self.length - int(self.rows.pads.max())
        if not 0 < count < shortest:
            raise InputError(
                f"cannot rewind {count} tokens: the shortest row holds {shortest} "
                "(a rewind keeps at least one token per row)"
            )
        self._rewind_followers(self.length - count)
        self.length -= count
        self.rows.mask[:, self.length :] = 0
        self.record.forget_steps(count)
        self.prompt_length = min(self.prompt_length, self.length)  # into it: the rest is it
        np.minimum(self.rows.prompt_end, self.length, out=self.rows.prompt_end)
        if self.fed >= self.length:  # re-feed the last kept token to get its logits again
            self.fed = self.length - 1
            self._cache_call(self._kv.cache.crop, self.fed)
        self._reopen()
        self._reset_forced()

    # -- internals -----------------------------------------------------------------------

    def _write(self, tokens: np.ndarray) -> None:
        """Write (B, n) tokens after every row's last column."""
        width = tokens.shape[1]
        self.reserve(self.length + width)
        self.rows.ids[:, self.length : self.length + width] = tokens
        self.rows.mask[:, self.length : self.length + width] = 1
        self.length += width

    def _reopen(self) -> None:
        rows = self.rows
        rows.unfinished[:] = True
        rows.finish_reasons[:] = [None] * self.batch_size
        rows.finished_at[:] = -1
        rows.errors[:] = [None] * self.batch_size
        self._new_texts()
