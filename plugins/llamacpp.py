"""llama.cpp's samplers: DRY, top-n-sigma, XTC (logits processors) and mirostat v2 (sampler).

Each reproduces the function of the same name in llama.cpp's ``src/llama-sampling.cpp``
(ggml-org/llama.cpp at commit 0344068cf112e524eb3fbdbd58c171870b63e56c):
``llama_sampler_dry_apply``, ``llama_sampler_top_n_sigma_apply``,
``llama_sample_xtc_apply`` and ``llama_sampler_mirostat_v2_apply``; parameter names
and defaults follow ``common/common.h`` (``dry_*``, ``top_n_sigma``, ``xtc_*``,
``mirostat_tau``/``mirostat_eta``).

llama.cpp shrinks its candidate array when a sampler removes tokens; ortgen keeps the
full row and writes ``-inf``. So "the candidates" below are the entries that are not
``-inf``, which is what llama.cpp would still hold after the same earlier samplers.
llama.cpp samples one sequence; here every row is independent (its own XTC draw, its
own mirostat ``mu``). Random draws come from numpy generators seeded from
``ctx.seed``: XTC uses its own stream so enabling it never changes the sampler's draws.
Every processor returns a new float32 array and leaves its inputs alone.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ortgen import Candidates, ComponentError, ConfigError, GenerationContext, Register, hookimpl
from ortgen.plugins._args import as_float, is_int
from ortgen.plugins._numeric import present_scores
from ortgen.plugins.samplers import MultinomialSampler, _unusable_rows

_NEG_INF = np.float32(-np.inf)
# spawn key of XTC's random stream: independent of the sampler's default_rng(ctx.seed)
_XTC_STREAM = 0x585443
# llama_sampler_init_dry: breakers are cut to 40 characters, their tails to 20 tokens
_MAX_CHAR_LEN = 40
_MAX_SEQ_LEN = 20
# llama_sampler_dry_apply: log(FLT_MAX), bounds the exponent of the penalty
_FLOAT_MAX_LOG = 88.7228391


@hookimpl
def register_logits_processors(register: Register) -> None:
    register("dry", DryProcessor)
    register("top_n_sigma", TopNSigmaProcessor)
    register("xtc", XtcProcessor)


@hookimpl
def register_samplers(register: Register) -> None:
    register("mirostat_v2", MirostatV2Sampler)


# --- DRY ------------------------------------------------------------------------


@dataclass(frozen=True)
class Breakers:
    """DRY's processed sequence breakers (llama.cpp's ``dry_processed_breakers``).

    ``single``: sorted ids of tokens that are a breaker on their own (the token's
    text contains a breaker string); ``longer``: by tail length L, an (n, L + 1)
    array of head token + the tokens the rest of the breaker string encodes to.
    """

    single: np.ndarray
    longer: dict[int, np.ndarray]

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]]) -> Breakers:
        """From token sequences (head first), as llama.cpp's ``llama_sampler_init_dry_testing``."""
        single = sorted({int(s[0]) for s in sequences if len(s) == 1})
        longer: dict[int, set[tuple[int, ...]]] = {}
        for seq in sequences:
            if len(seq) > 1:
                longer.setdefault(len(seq) - 1, set()).add(tuple(int(t) for t in seq))
        return cls(
            np.array(single, dtype=np.int64),
            {n: np.array(sorted(s), dtype=np.int64) for n, s in sorted(longer.items())},
        )


_BREAKER_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], Breakers]] = (
    weakref.WeakKeyDictionary()
)


def tokenize_breakers(tokenizer: Any, breakers: tuple[str, ...]) -> Breakers:
    """llama.cpp's ``get_overlapping_token_sequences`` for each breaker, via ``tokenizer``.

    A token whose text contains the breaker is a one-token breaker. A token whose
    text *ends with* a proper prefix of the breaker is the head of a longer one, its
    tail the encoding (no special tokens, at most 20 ids) of the rest of the string.
    Token texts are ``decode([id], skip_special_tokens=False)``; llama.cpp compares
    bytes, so unlike it a token holding only part of a multi-byte character cannot
    match here. Scanning the vocabulary costs a fraction of a second on 150k tokens,
    so the result is cached per tokenizer and breaker tuple.
    """
    try:
        cached = _BREAKER_CACHE.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no cache
        cached = {}
    if breakers in cached:
        return cached[breakers]
    backend = tokenizer.backend
    words_list = backend.decode_batch(
        [[i] for i in range(tokenizer.vocab_size)], skip_special_tokens=False
    )
    words = np.array(words_list, dtype=np.dtypes.StringDType())
    sequences: list[tuple[int, ...]] = []
    for breaker in breakers:
        text = breaker.encode()[:_MAX_CHAR_LEN].decode(errors="ignore")
        if not text:
            continue
        contains = np.strings.find(words, text) >= 0
        sequences.extend((int(i),) for i in np.flatnonzero(contains))
        for m in range(1, len(text)):
            heads = np.flatnonzero(np.strings.endswith(words, text[:m]) & ~contains)
            if heads.size:
                tail = tuple(tokenizer.encode(text[m:], add_special_tokens=False)[:_MAX_SEQ_LEN])
                sequences.extend((int(i), *tail) for i in heads)
    result = Breakers.from_sequences(sequences)
    cached[breakers] = result
    return result


class DryProcessor:
    """DRY, "Don't Repeat Yourself" (``llama_sampler_dry_apply``, ported from koboldcpp).

    The context is the last ``penalty_last_n`` ids of the row (-1: the whole row,
    prompt included, as llama.cpp's server feeds the prompt to the sampler; 0: off).
    If emitting token t would extend a suffix of the context that already occurred
    earlier (found with the reverse Z-algorithm), with that earlier match at least
    ``allowed_length`` long, t's logit drops by ``multiplier * base ** (len -
    allowed_length)`` for the longest such ``len`` (the exponent is capped so the
    penalty stays a finite float32). Sequence breakers (strings such as newline) stop
    the matching: a repeat may not reach back across the most recent breaker, and a
    one-token breaker is never penalised. Breaker strings become token sequences via
    ``ctx.tokenizer`` (see :func:`tokenize_breakers`); without one, pass
    ``sequence_breakers=[]``. ``multiplier=0`` is off.
    """

    def __init__(
        self,
        multiplier: float,
        base: float = 1.75,
        allowed_length: int = 2,
        penalty_last_n: int = -1,
        sequence_breakers: Sequence[str] = ("\n", ":", '"', "*"),
        *,
        ctx: GenerationContext,
    ) -> None:
        self.multiplier = as_float("multiplier", multiplier, "a float >= 0")
        if self.multiplier < 0:
            raise ConfigError(f"DRY `multiplier` has to be a float >= 0, but is {multiplier!r}")
        self.base = as_float("base", base, "a float >= 1")
        if self.base < 1.0:
            raise ConfigError(f"DRY `base` has to be a float >= 1, but is {base!r}")
        if not is_int(allowed_length) or allowed_length < 0:
            raise ConfigError(
                f"DRY `allowed_length` has to be an integer >= 0, but is {allowed_length!r}"
            )
        if not is_int(penalty_last_n) or penalty_last_n < -1:
            raise ConfigError(
                "DRY `penalty_last_n` has to be an integer >= -1 (-1: the whole context, "
                f"0: off), but is {penalty_last_n!r}"
            )
        texts = (sequence_breakers,) if isinstance(sequence_breakers, str) else sequence_breakers
        if not isinstance(texts, Sequence) or not all(isinstance(s, str) for s in texts):
            raise ConfigError(
                f"DRY `sequence_breakers` has to be a list of strings, but is {sequence_breakers!r}"
            )
        self.allowed_length = int(allowed_length)
        self.penalty_last_n = int(penalty_last_n)
        self.sequence_breakers = tuple(s for s in texts if s)  # llama.cpp skips empty ones
        self.enabled = self.multiplier != 0.0 and self.penalty_last_n != 0
        self.breakers = Breakers.from_sequences([])
        if self.enabled and self.sequence_breakers:
            if ctx.tokenizer is None:
                raise ConfigError(
                    "DRY `sequence_breakers` are strings and need the model's tokenizer to "
                    "become tokens, but this model has none; pass sequence_breakers=[] "
                    "(config: dry_sequence_breakers = []) to use DRY without breakers"
                )
            self.breakers = tokenize_breakers(ctx.tokenizer, self.sequence_breakers)
        # the exponent cap of llama.cpp; lengths beyond it all get the same penalty
        # (in float32 arithmetic, as the C++ computes it from float parameters)
        base32 = np.float32(self.base)
        self.max_exponent = (
            int(np.float32(_FLOAT_MAX_LOG) / np.log(base32)) if base32 > np.float32(1.000001) else 0
        )

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if not self.enabled:
            return out
        length = input_ids.shape[1]
        n = length if self.penalty_last_n == -1 else min(length, self.penalty_last_n)
        if n <= self.allowed_length:
            return out
        context = np.asarray(input_ids[:, length - n :], dtype=np.int64)
        rep_limit = self._rep_limits(context)
        # Longer repeats than `cap` get the same penalty (clamped exponent), so stop there.
        cap = rep_limit.copy()
        if self.max_exponent > 0:
            cap = np.minimum(cap, self.allowed_length + self.max_exponent)
        elif self.base == 1.0:  # every penalty is `multiplier`
            cap = np.minimum(cap, self.allowed_length)
        repeat = _suffix_repeats(context, cap)  # (B, n - 1)
        repeat[rep_limit < self.allowed_length] = -1  # llama.cpp returns early for such rows
        rows, pos = np.nonzero(repeat >= self.allowed_length)
        tokens = context[rows, pos + 1]  # the token that would continue the repeat
        lengths = repeat[rows, pos]
        usable = (tokens >= 0) & (tokens < out.shape[1]) & ~np.isin(tokens, self.breakers.single)
        rows, tokens, lengths = rows[usable], tokens[usable], lengths[usable]
        if rows.size == 0:
            return out
        # the longest repeat per (row, token): sort by key then length, take each key's last
        keys = rows * out.shape[1] + tokens
        order = np.lexsort((lengths, keys))
        keys, lengths = keys[order], lengths[order]
        last = np.r_[keys[1:] != keys[:-1], True]
        keys, lengths = keys[last], lengths[last]
        exponent = lengths - self.allowed_length
        if self.max_exponent > 0:
            exponent = np.minimum(exponent, self.max_exponent)
        # float(multiplier * pow(base, exp)) as llama.cpp: float32 params, double pow
        penalty = np.float64(np.float32(self.multiplier)) * np.power(
            np.float64(np.float32(self.base)), exponent.astype(np.float64)
        )
        out.reshape(-1)[keys] -= penalty.astype(np.float32)
        return out

    def _rep_limits(self, context: np.ndarray) -> np.ndarray:
        """Per row, how far back a repeat may reach: the distance to the most recent breaker.

        llama.cpp walks back from the newest token; at the first token that heads a
        breaker matching in full (tail included, tail within the context), the limit
        becomes that distance minus the longest matching tail. No breaker: ``n``.
        """
        batch, n = context.shape
        tail = np.full((batch, n), -1, dtype=np.int64)  # longest matching tail at each head
        tail[np.isin(context, self.breakers.single)] = 0
        for tail_len, seqs in self.breakers.longer.items():
            if tail_len >= n:
                break
            windows = sliding_window_view(context, tail_len + 1, axis=1)  # (B, n - L, L + 1)
            rows, starts = np.nonzero(np.isin(windows[:, :, 0], seqs[:, 0]))
            if rows.size == 0:
                continue
            found = windows[rows, starts]  # (c, L + 1)
            match = np.zeros(rows.size, dtype=bool)
            for chunk in range(0, seqs.shape[0], 256):  # bounded (c, 256, L + 1) compares
                part = seqs[chunk : chunk + 256]
                match |= (found[:, None, :] == part[None, :, :]).all(axis=-1).any(axis=-1)
            rows, starts = rows[match], starts[match]
            np.maximum.at(tail, (rows, starts), tail_len)
        has = tail >= 0
        newest = n - 1 - np.argmax(has[:, ::-1], axis=1)  # most recent head position
        distance = n - 1 - newest
        limit = distance - tail[np.arange(batch), newest]
        return np.where(has.any(axis=1), limit, n)


def _suffix_repeats(context: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """``out[b, j]`` = length of the longest common suffix of ``context[b, :j + 1]`` and
    ``context[b]``, capped at ``cap[b]``, for ``j < n - 1``.

    This is llama.cpp's ``dry_repeat_count`` (its reverse Z-algorithm clips every
    value to ``rep_limit`` too). Computed by extending all matches one token per
    step, vectorised over rows and positions; the steps are bounded by ``cap``.
    """
    batch, n = context.shape
    out = np.zeros((batch, n - 1), dtype=np.int64)
    last = context[:, -1]
    rows, pos = np.nonzero((context[:, :-1] == last[:, None]) & (cap[:, None] >= 1))
    k = 1
    while rows.size:
        out[rows, pos] = k
        keep = (pos >= k) & (cap[rows] > k)
        rows, pos = rows[keep], pos[keep]
        same = context[rows, pos - k] == context[rows, n - 1 - k]
        rows, pos = rows[same], pos[same]
        k += 1
    return out


# --- top-n-sigma ----------------------------------------------------------------------


class TopNSigmaProcessor:
    """Top-nσ (``llama_sampler_top_n_sigma_apply``): keep logits >= max - n * std.

    The max, mean and (population) standard deviation are over the logits that are
    not ``-inf``. Because max and std scale together, a temperature applied before
    it does not change which tokens survive. ``n <= 0`` is llama.cpp's "off" and
    gives a copy; a row with a NaN or ``+inf`` is left alone (its threshold is NaN,
    as in llama.cpp). After top-k it works on the candidates alone (``sparse``).
    """

    def __init__(self, n: float) -> None:
        self.n = as_float("n", n, "a float (> 0 to enable top-n-sigma)")

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if self.n <= 0.0 or out.shape[1] <= 1:
            return out
        out[out < self._thresholds(out)] = _NEG_INF
        return out

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The same cut on candidates (the statistics cover the same scores)."""
        if not isinstance(scores, Candidates):
            return None
        if self.n <= 0.0 or scores.vocab <= 1:
            return scores
        return scores.keep(scores.packed < self._thresholds(scores.packed))

    def _thresholds(self, rows: np.ndarray) -> np.ndarray:
        """Each row's ``max - n * std`` over its scores that are not ``-inf`` (B, 1),
        summed over those alone (see ``present_scores``)."""
        n = np.float32(self.n)
        out = np.empty((rows.shape[0], 1), dtype=np.float32)
        for index, row in enumerate(rows):
            values, _ = present_scores(row)
            top = float(values.max()) if values.size else -math.inf
            if not math.isfinite(top):  # NaN or +inf: left alone; nothing left: nothing to cut
                out[index] = np.nan if top != -math.inf else -np.inf
                continue
            wide = values.astype(np.float64)
            mean = wide.sum() / values.size
            wide -= mean
            wide *= wide
            std = math.sqrt(wide.sum() / values.size)
            out[index] = np.float32(top) - n * np.float32(std)
        return out


# --- XTC -------------------------------------------------------------------------------


class XtcProcessor:
    """XTC, "exclude top choices" (``llama_sample_xtc_apply``).

    With chance ``probability`` per row and step, every candidate whose probability
    is >= ``threshold`` is removed except the least probable of them, so the model
    takes a less obvious path while staying coherent. Nothing happens when fewer
    than two tokens reach the threshold, when the row has fewer than 2 candidates,
    when fewer than ``min_tokens_to_keep`` would remain, or when ``threshold > 0.5``
    (at most one token can be above it). Among tied least-probable tokens the one
    kept is the highest id. Each row draws one float32 uniform per call from XTC's
    own generator (seeded from ``ctx.seed``; llama.cpp keeps its own mt19937 too).
    """

    def __init__(
        self,
        probability: float,
        threshold: float = 0.1,
        min_tokens_to_keep: int = 1,
        *,
        ctx: GenerationContext,
    ) -> None:
        self.probability = as_float("probability", probability, "a float in [0, 1]")
        if not 0.0 <= self.probability <= 1.0:
            raise ConfigError(f"XTC `probability` has to be in [0, 1], but is {probability!r}")
        self.threshold = as_float("threshold", threshold, "a float in [0, 1]")
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"XTC `threshold` has to be in [0, 1], but is {threshold!r}")
        if not is_int(min_tokens_to_keep) or min_tokens_to_keep < 0:
            raise ConfigError(
                "`min_tokens_to_keep` has to be a non-negative integer, "
                f"but is {min_tokens_to_keep!r}"
            )
        self.min_tokens_to_keep = int(min_tokens_to_keep)
        self.seed = ctx.seed
        self._rng = np.random.default_rng(
            np.random.SeedSequence(ctx.seed, spawn_key=(_XTC_STREAM,))
        )

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)
        if self.probability <= 0.0 or self.threshold > 0.5:
            return out
        for row, removed in self._cuts(out):
            out[row, removed] = _NEG_INF
        return out

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The same cut on candidates (the same draw from the same stream)."""
        if not isinstance(scores, Candidates):
            return None
        if self.probability <= 0.0 or self.threshold > 0.5:
            return scores
        cuts = self._cuts(scores.packed)
        if not cuts:
            return scores
        remove = np.zeros(scores.packed.shape, dtype=bool)
        for row, removed in cuts:
            remove[row, removed] = True
        return scores.keep(remove)

    def _cuts(self, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(row, the columns it loses) for each row XTC cuts this time.

        One float32 draw per row and call, cut or not. Probabilities come from the
        row's scores that are not ``-inf`` (so dense and packed rows agree to the bit):
        float32 weights, a float64 total, each quotient rounded to float32 and compared
        in float32 as llama.cpp does. Only the weights within a hair of ``threshold *
        total`` are divided: on a full row that is a few dozen, not 49,152.
        """
        chance = np.asarray(self._rng.random(rows.shape[0], dtype=np.float32))
        threshold = np.float32(self.threshold)
        cuts = []
        for index, row in enumerate(rows):
            if chance[index] > self.probability:
                continue
            values, columns = present_scores(row)
            size = values.size
            top = float(values.max()) if size else math.nan
            if size < 2 or not math.isfinite(top):
                continue
            weights = np.exp(values - np.float32(top))
            total = weights.sum(dtype=np.float64)  # a float64 scalar: quotients in float64
            # float32(w / total) >= threshold needs w >= threshold * total * (1 - 2**-24):
            # 1e-6 of slack keeps every such weight (the exact test below decides)
            floor = _float32_at_most(self.threshold * float(total) * (1 - 1e-6))
            near = np.flatnonzero(weights >= floor)
            above = near[(weights[near] / total).astype(np.float32) >= threshold]
            pos_last = max(above.size - 1, 0)
            if pos_last == 0 or size - pos_last < self.min_tokens_to_keep:
                continue
            # the least probable token above the threshold stays (ties: the highest id)
            chosen = values[above]
            kept = above[np.flatnonzero(chosen == chosen.min())[-1]]
            removed = above[above != kept]  # positions among the present scores
            cuts.append((index, removed if isinstance(columns, slice) else columns[removed]))
        return cuts


def _float32_at_most(value: float) -> np.float32:
    """The largest float32 that is <= ``value`` (numpy rounds a float to the nearest)."""
    rounded = np.float32(value)
    return np.nextafter(rounded, _NEG_INF) if float(rounded) > value else rounded


# --- mirostat v2 --------------------------------------------------------------------


class MirostatV2Sampler:
    """Mirostat 2.0 (``llama_sampler_mirostat_v2_apply``): aim at a surprise of ``tau`` bits.

    Each row keeps ``mu`` (starting at ``2 * tau``). Per step: tokens whose surprise
    ``-log2 p`` exceeds ``mu`` are dropped (the most probable always stays), one is
    drawn from the renormalised rest, and ``mu -= eta * (-log2 p_renorm(picked) -
    tau)``. ``p`` comes from the scores the earlier processors left (so temperature
    etc. apply first). Draws use the multinomial sampler's inverse-CDF draw and its
    generator (``ctx.seed``), so seeded requests reproduce. A row with NaN, ``+inf``
    or only ``-inf`` raises :class:`ortgen.ComponentError`.
    """

    def __init__(self, tau: float = 5.0, eta: float = 0.1, *, ctx: GenerationContext) -> None:
        self.tau = as_float("tau", tau, "a float > 0")
        if not self.tau > 0:
            raise ConfigError(f"mirostat `tau` has to be a float > 0, but is {tau!r}")
        self.eta = as_float("eta", eta, "a float > 0")
        if not self.eta > 0:
            raise ConfigError(f"mirostat `eta` has to be a float > 0, but is {eta!r}")
        self.seed = ctx.seed
        self._multinomial = MultinomialSampler(ctx=ctx)
        #: per-row target surprise; created at the first call (one entry per row)
        self.mu: np.ndarray | None = None

    def distribution(self, scores: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """The scores mirostat v2 samples from at ``mu`` (B,): the truncated row, -inf elsewhere.

        Per row, over its scores that are not ``-inf`` (so a row packed after top-k
        gives the same bits as the dense row; the float32 total is summed over them
        alone, in token order). A token stays when ``-log2(w / total) <= mu``, which
        needs ``w >= total * 2**-mu``: only the weights within 1e-4 of that (far more
        than a float32 quotient and log2 can be off by) are divided and tested, so a
        full row costs one exp, one sum and one comparison, not a log per token.
        """
        scores = np.asarray(scores, dtype=np.float32)
        out = np.full(scores.shape, _NEG_INF, dtype=np.float32)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for row, (values, columns) in enumerate(map(present_scores, scores)):
                weights = np.exp(values - values.max())
                total = weights.sum()  # float32, as llama.cpp's softmax
                floor = float(total) * float(np.exp2(-np.float64(mu[row]))) * 0.9999  # inf: none
                near = np.flatnonzero(weights >= floor)
                kept = near[-np.log2(weights[near] / total) <= mu[row]]
                kept = np.append(kept, np.argmax(values))  # size 0 -> 1
                if not isinstance(columns, slice):
                    kept = columns[kept]
                out[row, kept] = scores[row, kept]
        return out

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores, dtype=np.float32)
        _unusable_rows("mirostat_v2", scores.max(axis=-1))
        truncated = self.distribution(scores, self._mu(scores.shape[0]))
        picked = self._multinomial(input_ids, truncated)
        self._update(truncated, picked)
        return picked

    def sparse(self, input_ids: np.ndarray, scores: Candidates) -> np.ndarray:
        """The same step on candidates: the same truncation, draw and update of ``mu``."""
        packed = scores.packed
        _unusable_rows("mirostat_v2", packed.max(axis=-1))  # packing drops only -inf
        truncated = self.distribution(packed, self._mu(packed.shape[0]))
        columns = self._multinomial.draw_columns(truncated)
        self._update(truncated, columns)
        return scores.token_ids(columns)

    def _mu(self, batch: int) -> np.ndarray:
        if self.mu is None:
            self.mu = np.full(batch, np.float32(2.0 * self.tau), dtype=np.float32)
        elif self.mu.shape[0] != batch:
            raise ComponentError(
                f"sampler 'mirostat_v2': the batch changed from {self.mu.shape[0]} to {batch} "
                "rows, but mirostat keeps one state per row"
            )
        return self.mu

    def _update(self, truncated: np.ndarray, picked: np.ndarray) -> None:
        """``mu -= eta * (surprise of the picked token under the truncated row - tau)``."""
        prob = np.empty(truncated.shape[0], dtype=np.float32)
        for row, (values, _) in enumerate(map(present_scores, truncated)):
            top = values.max()
            prob[row] = np.exp(truncated[row, picked[row]] - top) / np.exp(values - top).sum()
        surprise = -np.log2(prob)
        assert self.mu is not None  # set by the call that picked ``picked``
        self.mu = (self.mu - np.float32(self.eta) * (surprise - np.float32(self.tau))).astype(
            np.float32
        )
