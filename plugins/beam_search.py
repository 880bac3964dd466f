"""Beam search (and beam sampling) as a search-strategy sampler.

Hugging Face's ``GenerationMixin._beam_search`` (transformers 4.57, the vectorised
version) transcribed to numpy, one batch item = ``num_beams`` rows of the loop. Per
step: the processed log-probabilities of every running beam plus its running score give
``num_beams * vocab`` continuations per item; the best ``beams_to_keep`` (sampled
without replacement with ``do_sample``) are taken; those that end (an EOS id, or the
length limit) may join the item's finished hypotheses, scored ``sum logprob / generated
length ** length_penalty``; the best ``num_beams`` that go on become the running beams.
``early_stopping`` (True / False / "never") decides, as in Hugging Face, when no running
beam can beat the finished ones any more.

The extended sampler contract (docs/plugins.md): after each call the sampler exposes
``parents`` (the row each picked token continues; the loop reorders its token buffer and
calls the cache's ``reorder``) and ``done`` (True ends every row); ``finalize()`` returns
the chosen sequences at the end. Any third-party search strategy can do the same.

Candidates "end" on EOS, on the length limit and on a stop string, as with transformers'
stopping criteria (its ``StopStringCriteria``: the candidate's last token completes one;
here within the generated text, as ortgen's stop strings are everywhere); other criteria
(``max_time``, plugins) end the whole search, and the running beams are then scored as
if they ended there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortgen import (
    ComponentError,
    ConfigError,
    GenerationContext,
    Register,
    SamplerFactory,
    StopStringMatcher,
    best_first,
    hookimpl,
)

_NEG = np.float32(-1.0e9)


def _check_log_probs(scores: np.ndarray) -> None:
    """A NaN or +inf is no log-probability: it would rank beams by NaN (silently, as
    torch's topk does in transformers) and poison every later score of its beam. Refused
    by name, as the samplers refuse a row they cannot draw from."""
    bad = ~(scores < np.inf).all(axis=1)  # NaN and +inf fail ``< inf``
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        what = "NaN" if np.isnan(scores[row]).any() else "+inf"
        raise ComponentError(
            f"sampler 'beam_search': the log-probabilities of row {row} contain {what}, so "
            f"its beams cannot be ranked ({int(bad.sum())} of {bad.size} rows affected); "
            "check the logits processors (remove_invalid_values=true replaces NaN and inf)"
        )


@hookimpl
def register_samplers(register: Register[SamplerFactory]) -> None:
    register("beam_search", BeamSearch)


class BeamSearch:
    """``num_beams`` running beams per batch item; returns one token per row and sets
    ``parents`` and ``done``. Expects the scores to be log-probabilities (the chain puts
    ``renormalize_logits`` first when ``num_beams > 1``, as transformers applies its
    processors to ``log_softmax(logits)``)."""

    def __init__(
        self,
        num_beams: int,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        num_return_sequences: int = 1,
        do_sample: bool = False,
        logprobs: bool = False,
        top_logprobs: int = 0,
        stop_strings: Sequence[str] = (),
        *,
        ctx: GenerationContext,
    ) -> None:
        if not isinstance(num_beams, int) or num_beams < 2:
            raise ConfigError(f"beam_search needs num_beams >= 2, got {num_beams!r}")
        if ctx.batch_size % num_beams:
            raise ConfigError(
                f"beam_search: the batch ({ctx.batch_size} rows) must hold num_beams "
                f"({num_beams}) rows per prompt"
            )
        if not 1 <= num_return_sequences <= num_beams:
            raise ConfigError(
                f"num_return_sequences ({num_return_sequences}) must be between 1 and "
                f"num_beams ({num_beams})"
            )
        if early_stopping not in (True, False, "never"):
            raise ConfigError(
                f'early_stopping must be true, false or "never", got {early_stopping!r}'
            )
        self.num_beams = num_beams
        self.length_penalty = float(length_penalty)
        self.early_stopping = early_stopping
        self.num_return_sequences = num_return_sequences
        self.do_sample = bool(do_sample)
        self.eos = np.asarray(ctx.eos_token_ids, dtype=np.int64)
        self.stop_strings = tuple(stop_strings)
        self._stops = StopStringMatcher(self.stop_strings)  # the rule RowText follows too
        if self.stop_strings and ctx.tokenizer is None:
            raise ConfigError("beam_search: stop_strings need the model's tokenizer")
        self._tokenizer = ctx.tokenizer
        # tokens enough to hold a stop string that ends in the last one (tokens of at
        # least one character), and one more for a character split across two tokens
        self._stop_window = self._stops.max_length + 2
        self.prompt_length = ctx.prompt_length
        self.max_length = ctx.max_length
        self.items = ctx.batch_size // num_beams
        self.keep = max(2, 1 + len(self.eos)) * num_beams  # beams_to_keep
        self._rng = np.random.default_rng(ctx.seed)
        width = max(1, ctx.max_length - ctx.prompt_length)
        shape = (self.items, num_beams)
        self.running_scores = np.zeros(shape, dtype=np.float32)
        self.running_scores[:, 1:] = _NEG  # at first every beam is the same prompt
        self.scores = np.full(shape, _NEG, dtype=np.float32)  # finished hypotheses
        self.finished = np.zeros((*shape, width), dtype=np.int64)
        self.finished_length = np.zeros(shape, dtype=np.int64)
        # per token, kept like the tokens: its processed log-probability (``logprobs``)
        # and the best alternatives at that step (``top_logprobs``), for the running
        # beams and the finished hypotheses
        self.logprobs = bool(logprobs)
        if not isinstance(top_logprobs, int) or top_logprobs < 0:
            raise ConfigError(f"top_logprobs must be a non-negative integer, got {top_logprobs!r}")
        self.top = top_logprobs
        trails: dict[str, tuple[tuple[int, ...], type]] = {}
        if self.logprobs or self.top:
            trails["lp"] = ((), np.float32)
        if self.top:
            trails["top_ids"] = ((self.top,), np.int64)
            trails["top_lp"] = ((self.top,), np.float32)
        self.running_trails: dict[str, np.ndarray] = {
            k: np.zeros((*shape, width, *e), t) for k, (e, t) in trails.items()
        }
        self.finished_trails = {k: np.zeros_like(v) for k, v in self.running_trails.items()}
        self.sequence_logprobs: list[list[float]] | None = None
        self.sequence_top_logprobs: list[list[list[tuple[int, float]]]] | None = None
        self.is_finished = np.zeros(shape, dtype=bool)
        self.improvable = np.ones((self.items, 1), dtype=bool)
        self.parents: np.ndarray | None = None
        self.done = False

    # -- one step ------------------------------------------------------------------

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        items, beams, keep = self.items, self.num_beams, self.keep
        rows, vocab = scores.shape
        if rows != items * beams:
            raise ValueError(f"beam_search expected {items * beams} rows, got {rows}")
        _check_log_probs(scores)
        cur_len = input_ids.shape[1]
        per_beam = scores.astype(np.float32).reshape(items, beams, vocab)
        log_probs = (per_beam + self.running_scores[:, :, None]).reshape(items, beams * vocab)
        top = self._top_k(log_probs, keep)  # (items, keep) flat indices
        top_scores = np.take_along_axis(log_probs, top, axis=1)
        top_beams, top_ids = top // vocab, top % vocab
        hits = np.isin(top_ids, self.eos) | (cur_len + 1 >= self.max_length)

        # candidates' generated tokens (the running beam's plus the new one)
        generated = input_ids[:, self.prompt_length :].reshape(items, beams, -1)
        cand = _take_beams(generated, top_beams)
        cand = np.concatenate([cand, top_ids[:, :, None]], axis=2)
        if self.stop_strings:
            hits |= self._completes_stop_string(cand)
        cand_trails = self._candidate_trails(scores, top_beams, top_ids, cand.shape[2] - 1)
        self._update_finished(cand, top_scores, hits, cur_len, cand_trails)

        # the best num_beams candidates that go on become the running beams
        running = top_scores + hits.astype(np.float32) * _NEG
        best = _top_indices(running, beams)
        self.running_scores = np.take_along_axis(running, best, axis=1)
        chosen_beams = np.take_along_axis(top_beams, best, axis=1)
        next_ids = np.take_along_axis(top_ids, best, axis=1)
        for name, trail in cand_trails.items():
            chosen = _take_beams(trail, best)
            self.running_trails[name][:, :, : chosen.shape[2]] = chosen
        offsets = (np.arange(items) * beams)[:, None]
        self.parents = (chosen_beams + offsets).reshape(-1)

        self._check_early_stop(cur_len + 1)
        exists_open = not (self.is_finished.all() and self.early_stopping is True)
        self.done = not (self.improvable.any() and exists_open and not hits.all())
        return next_ids.reshape(-1).astype(np.int64)

    def _completes_stop_string(self, cand: np.ndarray) -> np.ndarray:
        """(items, keep) bool: the candidate's last token completes a stop string, i.e.
        one occurs in its generated text and ends inside (or with) that token's text."""
        hits = np.zeros(cand.shape[:2], dtype=bool)
        window = cand[:, :, -self._stop_window :].tolist()
        decode = self._tokenizer.decode
        for item, candidates in enumerate(window):
            for j, tokens in enumerate(candidates):
                before, text = decode(tokens[:-1]), decode(tokens)
                # where the last token's text starts: the common start of the two (a token
                # completing a character may change the end of the text before it)
                start = len(before)
                while start and not text.startswith(before[:start]):
                    start -= 1
                hits[item, j] = self._stops.completed_at(text, start)
        return hits

    def _candidate_trails(
        self, scores: np.ndarray, top_beams: np.ndarray, top_ids: np.ndarray, held: int
    ) -> dict[str, np.ndarray]:
        """Each candidate's trails: its running beam's first ``held`` entries plus this
        step's (the new token's processed log-probability, the step's best alternatives
        in the beam it continues: best first, ties by token id)."""
        if not self.running_trails:
            return {}
        items, beams = self.items, self.num_beams
        step_lp = scores.astype(np.float32).reshape(items, beams, -1)
        rows = np.arange(items)[:, None]
        new = {"lp": step_lp[rows, top_beams, top_ids]}
        if self.top:
            flat = step_lp.reshape(items * beams, -1)
            best, values = best_first(flat, self.top)
            alt_ids = best.reshape(items, beams, self.top)
            alt_lp = values.reshape(items, beams, self.top)
            new["top_ids"] = _take_beams(alt_ids, top_beams)
            new["top_lp"] = _take_beams(alt_lp, top_beams)
        return {
            name: np.concatenate(
                [_take_beams(trail[:, :, :held], top_beams), new[name][:, :, None]], axis=2
            )
            for name, trail in self.running_trails.items()
        }

    def _top_k(self, log_probs: np.ndarray, k: int) -> np.ndarray:
        """The ``k`` best continuations per item, or ``k`` drawn without replacement from
        softmax(log_probs) (the Gumbel top-k trick: same distribution as torch.multinomial
        without replacement)."""
        if not self.do_sample:
            return _top_indices(log_probs, k)
        finite = np.isfinite(log_probs)
        gumbel = -np.log(-np.log(self._rng.random(log_probs.shape)))
        keyed = np.where(finite, log_probs + gumbel, -np.inf)
        return _top_indices(keyed, k)

    def _update_finished(
        self,
        cand: np.ndarray,
        top_scores: np.ndarray,
        hits: np.ndarray,
        cur_len: int,
        cand_trails: dict[str, np.ndarray],
    ) -> None:
        """transformers' ``_update_finished_beams``: the candidates among the top
        ``num_beams`` that just ended compete with the finished hypotheses."""
        beams = self.num_beams
        just_finished = hits.copy()
        just_finished[:, beams:] = False
        generated = cur_len + 1 - self.prompt_length
        scored = top_scores / np.float32(generated**self.length_penalty)
        full = self.is_finished.all(axis=1, keepdims=True) & (self.early_stopping is True)
        scored = scored + full.astype(np.float32) * _NEG
        scored = scored + (~self.improvable).astype(np.float32) * _NEG
        scored = scored + (~just_finished).astype(np.float32) * _NEG

        width = self.finished.shape[2]
        padded = np.zeros((*cand.shape[:2], width), dtype=np.int64)
        padded[:, :, : cand.shape[2]] = cand[:, :, :width]
        merged_tokens = np.concatenate([self.finished, padded], axis=1)
        merged_scores = np.concatenate([self.scores, scored], axis=1)
        lengths = np.full(cand.shape[:2], cand.shape[2], dtype=np.int64)
        merged_lengths = np.concatenate([self.finished_length, lengths], axis=1)
        merged_done = np.concatenate([self.is_finished, just_finished], axis=1)
        best = _top_indices(merged_scores, beams)
        self.finished = _take_beams(merged_tokens, best)
        self.scores = np.take_along_axis(merged_scores, best, axis=1)
        self.finished_length = np.take_along_axis(merged_lengths, best, axis=1)
        self.is_finished = np.take_along_axis(merged_done, best, axis=1)
        for name, trail in cand_trails.items():
            finished = self.finished_trails[name]
            padded_trail = np.zeros((*trail.shape[:2], *finished.shape[2:]), dtype=trail.dtype)
            padded_trail[:, :, : trail.shape[2]] = trail[:, :, :width]
            merged = np.concatenate([finished, padded_trail], axis=1)
            self.finished_trails[name] = _take_beams(merged, best)

    def _check_early_stop(self, cur_len: int) -> None:
        """transformers' ``_check_early_stop_heuristic``."""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_length - self.prompt_length
        else:
            best_length = cur_len - self.prompt_length
        best_running = self.running_scores[:, :1] / np.float32(best_length**self.length_penalty)
        worst = np.where(
            self.is_finished, self.scores.min(axis=1, keepdims=True), np.float32(-1.0e9)
        )
        self.improvable = self.improvable & (best_running > worst).any(axis=1, keepdims=True)

    # -- the end -------------------------------------------------------------------

    def finalize(self, input_ids: np.ndarray) -> tuple[list[list[int]], list[float]]:
        """The ``num_return_sequences`` best hypotheses per item (generated tokens, no
        padding) and their scores. If the search was cut short (``max_time``, a plugin's
        criterion), the running beams compete as if they ended where they stand."""
        if not self.done:
            cur_len = input_ids.shape[1]
            items, beams = self.items, self.num_beams
            generated = input_ids[:, self.prompt_length :].reshape(items, beams, -1)
            hits = np.ones((items, beams), dtype=bool)
            self.improvable = np.ones((items, 1), dtype=bool)
            held = {k: v[:, :, : generated.shape[2]] for k, v in self.running_trails.items()}
            self._update_finished(generated, self.running_scores, hits, cur_len - 1, held)
            self.done = True
        sequences, scores, logprobs, alternatives = [], [], [], []
        trails = self.finished_trails
        for item in range(self.items):
            for rank in range(self.num_return_sequences):
                length = int(self.finished_length[item, rank])
                sequences.append(self.finished[item, rank, :length].tolist())
                scores.append(float(self.scores[item, rank]))
                if "lp" in trails:
                    logprobs.append(trails["lp"][item, rank, :length].tolist())
                if self.top:
                    ids = trails["top_ids"][item, rank, :length].tolist()
                    values = trails["top_lp"][item, rank, :length].tolist()
                    alternatives.append(
                        [list(zip(i, v, strict=True)) for i, v in zip(ids, values, strict=True)]
                    )
        # each chosen token's processed log-probability, as transformers'
        # compute_transition_scores(sequences, scores, beam_indices) gives them, and the
        # best alternatives of the beam it was picked in
        self.sequence_logprobs = logprobs if "lp" in trails else None
        self.sequence_top_logprobs = alternatives if self.top else None
        return sequences, scores


def _take_beams(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``array[item, index[item, j], ...]`` for (items, beams, ...) arrays."""
    shaped = index.reshape(index.shape + (1,) * (array.ndim - 2))
    return np.take_along_axis(array, shaped, axis=1)


def _top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values per row, best first (ties: lower index
    first, as torch.topk gives on CPU in practice)."""
    return best_first(values, k)[0]
