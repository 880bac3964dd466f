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

import math
from collections.abc import Callable

import numpy as np

from ortgen import Candidates, ConfigError, LogitsProcessorFactory, Register, hookimpl
from ortgen.checks import as_float

from ._cuts import check_min_tokens_to_keep, f32, few_kept, fill
from ._numeric import present_scores

_F32_MIN = np.finfo(np.float32).min


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("epsilon_cutoff", EpsilonCutoffProcessor)
    register("eta_cutoff", EtaCutoffProcessor)


def _check_epsilon(field: str, epsilon: object) -> float:
    expected = "a float > 0 and < 1 (or 0 to disable)"
    value = as_float(field, epsilon, expected)
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"`{field}` has to be {expected}, but is {epsilon!r}")
    return value


def _removed(
    rows: np.ndarray, remove: Callable[[np.ndarray], np.ndarray], min_tokens_to_keep: int
) -> np.ndarray:
    """(B, W) bool: what ``remove`` cuts from each row's scores that are not ``-inf``,
    except the ``min_tokens_to_keep`` highest and every score tied with the last of them.

    Each row is decided on its present scores alone (``present_scores``), so dense and
    packed rows (after top-k) give the same bits. A row whose softmax is undefined (all
    ``-inf``, NaN, ``+inf``) loses nothing, as HF's epsilon warper removes nothing there.
    Probabilities rise with scores, so a row that keeps at least k keeps the top k and
    every tie of the k-th already; only rows keeping fewer need the k-th value (HF
    compares with the k-th of ``torch.topk``; with fewer than k present that is ``-inf``
    and nothing is removed).
    """
    out = np.zeros(rows.shape, dtype=bool)
    for index, row in enumerate(rows):
        values, columns = present_scores(row)
        if not values.size or not math.isfinite(float(values.max())):
            continue
        cut = remove(values)
        k = min_tokens_to_keep
        kept = values.size - int(np.count_nonzero(cut))
        if kept < k:
            if values.size < k:
                continue
            kth = np.partition(values, values.size - k)[values.size - k]
            cut &= values < kth
        out[index, columns] = cut
    return out


def _softmax(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(probabilities, values - max, sum of exp) of one row's present scores, float32 as
    torch computes."""
    shifted = values - values.max()
    weights = np.exp(shifted)
    total = weights.sum()
    return weights / total, shifted, total


class _Cutoff:
    """A cut-off decided per row on its present scores: ``_remove(values)`` says which go.
    ``epsilon = 0`` (HF's "off") gives an unchanged copy."""

    epsilon: float
    min_tokens_to_keep: int

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = f32(scores)
        if self.epsilon == 0.0:
            return scores.copy()
        remove = _removed(scores, self._remove, self.min_tokens_to_keep)
        return fill(scores, remove, few_kept=few_kept(remove))

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """The same cut on candidates."""
        if not isinstance(scores, Candidates):
            return None
        if self.epsilon == 0.0:
            return scores
        return scores.keep(_removed(scores.packed, self._remove, self.min_tokens_to_keep))

    def _remove(self, values: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class EpsilonCutoffProcessor(_Cutoff):
    """Remove tokens with probability below ``epsilon`` (EpsilonLogitsWarper, ``epsilon_cutoff``).

    The threshold is absolute: suggested values are 3e-4 to 9e-4 for large models.
    """

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = _check_epsilon("epsilon_cutoff", epsilon)
        self.min_tokens_to_keep = check_min_tokens_to_keep(min_tokens_to_keep)

    def _remove(self, values: np.ndarray) -> np.ndarray:
        return _softmax(values)[0] < np.float32(self.epsilon)


class EtaCutoffProcessor(_Cutoff):
    """Remove tokens with probability below ``eta = min(epsilon, sqrt(epsilon) * exp(-H))``
    (EtaLogitsWarper, ``eta_cutoff``), ``H`` the entropy of the row's distribution.

    A flat (high-entropy) distribution gets a lower threshold than a peaked one, so
    fewer of its plausible tokens are cut; suggested values are 3e-4 to 2e-3.
    """

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1) -> None:
        self.epsilon = _check_epsilon("eta_cutoff", epsilon)
        self.min_tokens_to_keep = check_min_tokens_to_keep(min_tokens_to_keep)

    def _remove(self, values: np.ndarray) -> np.ndarray:
        probs, shifted, total = _softmax(values)
        # Categorical(logits=scores).entropy(); a -inf score (not among these) adds 0
        entropy = -(np.maximum(shifted - np.log(total), _F32_MIN) * probs).sum()
        epsilon = np.float32(self.epsilon)
        return probs < np.minimum(epsilon, np.sqrt(epsilon) * np.exp(-entropy))
