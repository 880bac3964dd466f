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

Candidates "end" on EOS and on the length limit, as with transformers' default stopping
criteria; other criteria (``max_time``, plugins) end the whole search, and the running
beams are then scored as if they ended there.
"""

from __future__ import annotations

import numpy as np

from ortgen import ConfigError, GenerationContext, hookimpl

_NEG = np.float32(-1.0e9)


@hookimpl
def register_samplers(register):  # type: ignore[no-untyped-def]
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
        # each token's processed log-probability, kept like the tokens (``logprobs``)
        self.logprobs = bool(logprobs)
        self.finished_lp = np.zeros((*shape, width), dtype=np.float32)
        self.running_lp = np.zeros((*shape, width), dtype=np.float32)
        self.sequence_logprobs: list[list[float]] | None = None
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
        cur_len = input_ids.shape[1]
        log_probs = scores.astype(np.float32).reshape(items, beams, vocab)
        log_probs = (log_probs + self.running_scores[:, :, None]).reshape(items, beams * vocab)
        top = self._top_k(log_probs, keep)  # (items, keep) flat indices
        top_scores = np.take_along_axis(log_probs, top, axis=1)
        top_beams, top_ids = top // vocab, top % vocab
        hits = np.isin(top_ids, self.eos) | (cur_len + 1 >= self.max_length)

        # candidates' generated tokens (the running beam's plus the new one)
        generated = input_ids[:, self.prompt_length :].reshape(items, beams, -1)
        cand = np.take_along_axis(generated, top_beams[:, :, None], axis=1)
        cand = np.concatenate([cand, top_ids[:, :, None]], axis=2)
        cand_lp = None
        if self.logprobs:  # the running beam's token log-probs plus the new token's
            step_lp = scores.astype(np.float32).reshape(items, beams, vocab)
            new_lp = step_lp[np.arange(items)[:, None], top_beams, top_ids]
            held = self.running_lp[:, :, : cand.shape[2] - 1]
            cand_lp = np.take_along_axis(held, top_beams[:, :, None], axis=1)
            cand_lp = np.concatenate([cand_lp, new_lp[:, :, None]], axis=2)
        self._update_finished(cand, top_scores, hits, cur_len, cand_lp)

        # the best num_beams candidates that go on become the running beams
        running = top_scores + hits.astype(np.float32) * _NEG
        best = _top_indices(running, beams)
        self.running_scores = np.take_along_axis(running, best, axis=1)
        chosen_beams = np.take_along_axis(top_beams, best, axis=1)
        next_ids = np.take_along_axis(top_ids, best, axis=1)
        if cand_lp is not None:
            chosen_lp = np.take_along_axis(cand_lp, best[:, :, None], axis=1)
            self.running_lp[:, :, : chosen_lp.shape[2]] = chosen_lp
        offsets = (np.arange(items) * beams)[:, None]
        self.parents = (chosen_beams + offsets).reshape(-1)

        self._check_early_stop(cur_len + 1)
        exists_open = not (self.is_finished.all() and self.early_stopping is True)
        self.done = not (self.improvable.any() and exists_open and not hits.all())
        return next_ids.reshape(-1).astype(np.int64)

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
        cand_lp: np.ndarray | None = None,
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
        self.finished = np.take_along_axis(merged_tokens, best[:, :, None], axis=1)
        self.scores = np.take_along_axis(merged_scores, best, axis=1)
        self.finished_length = np.take_along_axis(merged_lengths, best, axis=1)
        self.is_finished = np.take_along_axis(merged_done, best, axis=1)
        if cand_lp is not None:
            padded_lp = np.zeros((*cand_lp.shape[:2], width), dtype=np.float32)
            padded_lp[:, :, : cand_lp.shape[2]] = cand_lp[:, :, :width]
            merged_lp = np.concatenate([self.finished_lp, padded_lp], axis=1)
            self.finished_lp = np.take_along_axis(merged_lp, best[:, :, None], axis=1)

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
            held_lp = self.running_lp[:, :, : generated.shape[2]] if self.logprobs else None
            self._update_finished(generated, self.running_scores, hits, cur_len - 1, held_lp)
            self.done = True
        sequences, scores, logprobs = [], [], []
        for item in range(self.items):
            for rank in range(self.num_return_sequences):
                length = int(self.finished_length[item, rank])
                sequences.append(self.finished[item, rank, :length].tolist())
                scores.append(float(self.scores[item, rank]))
                logprobs.append(self.finished_lp[item, rank, :length].tolist())
        # each chosen token's processed log-probability, as transformers'
        # compute_transition_scores(sequences, scores, beam_indices) gives them
        self.sequence_logprobs = logprobs if self.logprobs else None
        return sequences, scores


def _top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values per row, best first (ties: lower index
    first, as torch.topk gives on CPU in practice)."""
    k = min(k, values.shape[1])
    part = np.argpartition(-values, k - 1, axis=1)[:, :k]
    picked = np.take_along_axis(values, part, axis=1)
    order = np.lexsort((part, -picked), axis=1)
    return np.take_along_axis(part, order, axis=1)
