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

import numpy as np

from ortgen import (
    Candidates,
    ComponentError,
    ConfigError,
    GenerationContext,
    LogitsProcessorFactory,
    Register,
    SamplerFactory,
    hookimpl,
)
from ortgen.checks import as_float, check_pickable, is_int

from ._dry import DryProcessor
from ._numeric import present_scores
from .samplers import MultinomialSampler

_NEG_INF = np.float32(-np.inf)
# spawn key of XTC's random stream: independent of the sampler's default_rng(ctx.seed)
_XTC_STREAM = 0x585443


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("dry", DryProcessor)
    register("top_n_sigma", TopNSigmaProcessor)
    register("xtc", XtcProcessor)


@hookimpl
def register_samplers(register: Register[SamplerFactory]) -> None:
    register("mirostat_v2", MirostatV2Sampler)


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
        check_pickable("mirostat_v2", scores.max(axis=-1))
        truncated = self.distribution(scores, self._mu(scores.shape[0]))
        picked = self._multinomial(input_ids, truncated)
        self._update(truncated, picked)
        return picked

    def sparse(self, input_ids: np.ndarray, scores: Candidates) -> np.ndarray:
        """The same step on candidates: the same truncation, draw and update of ``mu``."""
        packed = scores.packed
        check_pickable("mirostat_v2", packed.max(axis=-1))  # packing drops only -inf
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
