"""Hugging Face's entropy-based truncation warpers: epsilon and eta cutoff.

Both remove the tokens whose probability is below a threshold (Hewitt et al., 2022,
"Truncation Sampling as Language Model Desmoothing") and reproduce the Hugging Face
warper of the same name (transformers 4.57, ``generation/logits_process.py``): the same
parameters (``epsilon``, ``min_tokens_to_keep``), HF's range checks in ``__init__``
(raising :class:`ortgen.ConfigError`, naming the ``GenerationConfig`` field) and the
same output up to float32 rounding at the threshold. ``epsilon=0`` (what HF's
``generate()`` treats as "off") is accepted and gives an unchanged copy.

The ``min_tokens_to_keep`` highest scores always survive, with every score tied to the
last of them (HF compares with the k-th value of ``torch.topk``). A row whose softmax is
undefined (all ``-inf``, or holding NaN or ``+inf``) is left as it is: HF's epsilon
warper removes nothing there either, while its eta warper raises ``ValueError``
(``torch.distributions.Categorical`` refuses the NaN it normalises such a row to).
"""

from __future__ import annotations

import numpy as np

from ortgen import ConfigError, hookimpl
from ortgen.plugins._args import as_float
from ortgen.plugins.processors import _check_min_tokens_to_keep, _f32, _fill

_F32_MIN = np.finfo(np.float32).min


@hookimpl
def register_logits_processors(register):  # type: ignore[no-untyped-def]
    register("epsilon_cutoff", EpsilonCutoffProcessor)
    register("eta_cutoff", EtaCutoffProcessor)


def _check_epsilon(field: str, epsilon: object) -> float:
    expected = "a float > 0 and < 1 (or 0 to disable)"
    value = as_float(field, epsilon, expected)
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"`{field}` has to be {expected}, but is {epsilon!r}")
    return value


def _softmax(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(probabilities, scores - max, row sums of exp, row max), float32 as torch computes.

    Rows without a softmax (all -inf, NaN, +inf) come out NaN; comparisons with NaN
    are False, so the cut removes nothing there.
    """
    top = scores.max(axis=-1, keepdims=True)  # NaN propagates
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = scores - top
        weights = np.exp(shifted)
        total = weights.sum(axis=-1, keepdims=True)
        return weights / total, shifted, total, top


def _cut(
    scores: np.ndarray, remove: np.ndarray, top: np.ndarray, min_tokens_to_keep: int
) -> np.ndarray:
    """``-inf`` where ``remove``, except the ``min_tokens_to_keep`` highest scores and ties.

    Probabilities rise with scores, so the kept tokens are the highest ones: a row that
    keeps at least k already keeps the top k and everything tied with the k-th, and only
    rows keeping fewer need the k-th value (the max when k = 1, else a partition).
    """
    vocab = scores.shape[-1]
    k = min(min_tokens_to_keep, vocab)
    short = np.flatnonzero(vocab - np.count_nonzero(remove, axis=-1) < k)
    if short.size:
        if k == 1:
            kth = top[short]
        else:
            kth = np.partition(scores[short], vocab - k, axis=-1)[:, vocab - k, None]
        remove[short] &= scores[short] < kth
    few_kept = 8 * int(np.count_nonzero(~remove, axis=-1).max(initial=0)) < vocab
    return _fill(scores, remove, few_kept=few_kept)


class EpsilonCutoffProcessor:
    """Remove tokens with probability below ``epsilon`` (EpsilonLogitsWarper, ``epsilon_cutoff``).

    The threshold is absolute: suggested values are 3e-4 to 9e-4 for large models.
    """

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = _check_epsilon("epsilon_cutoff", epsilon)
        self.min_tokens_to_keep = _check_min_tokens_to_keep(min_tokens_to_keep)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = _f32(scores)
        if self.epsilon == 0.0:
            return scores.copy()
        probs, _, _, top = _softmax(scores)
        return _cut(scores, probs < np.float32(self.epsilon), top, self.min_tokens_to_keep)


class EtaCutoffProcessor:
    """Remove tokens with probability below ``eta = min(epsilon, sqrt(epsilon) * exp(-H))``
    (EtaLogitsWarper, ``eta_cutoff``), ``H`` the entropy of the row's distribution.

    A flat (high-entropy) distribution gets a lower threshold than a peaked one, so
    fewer of its plausible tokens are cut; suggested values are 3e-4 to 2e-3.
    """

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = _check_epsilon("eta_cutoff", epsilon)
        self.min_tokens_to_keep = _check_min_tokens_to_keep(min_tokens_to_keep)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = _f32(scores)
        if self.epsilon == 0.0:
            return scores.copy()
        probs, shifted, total, top = _softmax(scores)
        with np.errstate(invalid="ignore", divide="ignore"):
            # Categorical(logits=scores).entropy(): log-probs clamped to the lowest float32,
            # so a -inf score contributes lowest * 0 = 0 rather than NaN
            log_probs = np.maximum(shifted - np.log(total), _F32_MIN)
            entropy = -(log_probs * probs).sum(axis=-1, keepdims=True)
        epsilon = np.float32(self.epsilon)
        eta = np.minimum(epsilon, np.sqrt(epsilon) * np.exp(-entropy))
        return _cut(scores, probs < eta, top, self.min_tokens_to_keep)
