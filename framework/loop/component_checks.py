"""What the loop checks about each component's answer, named after the component and the
step, so a plugin's mistake is a clear ``ComponentError`` and not a crash deep in numpy.
``ortgen.testing`` runs the same checks for plugin authors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import ComponentError
from ..protocols.candidates import Candidates

if TYPE_CHECKING:
    from .chain import Chain


def check_scores(name: str, scores: object, shape: tuple[int, ...], step: int) -> None:
    if not isinstance(scores, np.ndarray) or scores.shape != shape:
        got = getattr(scores, "shape", type(scores).__name__)
        raise ComponentError(
            f"logits processor {name!r} returned {got} at step {step}; expected a float "
            f"array of shape {shape}"
        )
    if scores.dtype.kind != "f":
        raise ComponentError(
            f"logits processor {name!r} returned {scores.dtype} scores at step {step}; "
            "expected floats"
        )


def check_candidates(name: str, out: object, shape: tuple[int, ...], step: int) -> None:
    """What a ``sparse`` method returns: Candidates standing for scores of ``shape``."""
    if not isinstance(out, Candidates) or out.shape != shape:
        got = getattr(out, "shape", type(out).__name__)
        raise ComponentError(
            f"logits processor {name!r}: its sparse method returned {got} at step {step}; "
            f"expected Candidates of shape {shape} or None"
        )


def check_not_nan(scores: np.ndarray, chain: Chain, step: int) -> None:
    """Scores with a NaN cannot be sampled from soundly (argmax takes the first NaN,
    softmax turns the whole row into NaN): name the processors that produced them, so
    the request fails with a clear error instead of a token nobody chose. One pass over
    the scores, as the sampler's own takes."""
    bad = np.isnan(scores).any(axis=1)
    if bad.any():
        names = [n for n, _ in chain.processors]
        row = int(np.flatnonzero(bad)[0])
        where = "everywhere" if np.isnan(scores[row]).all() else "in places"
        raise ComponentError(
            f"scores of row {row} are NaN {where} at step {step} after "
            f"{' -> '.join(names)}; a logits processor must return numbers (-inf to rule "
            "a token out)"
        )


def check_ids(name: str, ids: object, batch: int, vocab: int, step: int) -> np.ndarray:
    array = np.asarray(ids)
    if array.shape != (batch,) or array.dtype.kind not in "iu":
        raise ComponentError(
            f"sampler {name!r} returned {array.dtype} {array.shape} at step {step}; expected "
            f"integer token ids of shape ({batch},)"
        )
    # Python ints: a batch is a few ids, and right after a forward has swept the caches
    # every distinct numpy reduction costs tens of microseconds of cold code
    values = array.tolist()
    if values and (min(values) < 0 or max(values) >= vocab):
        raise ComponentError(
            f"sampler {name!r} returned a token id outside [0, {vocab}) at step {step}"
        )
    return array.astype(np.int64, copy=False)


def check_stop(name: str, done: object, batch: int, step: int) -> np.ndarray:
    array = np.asarray(done)
    if array.shape != (batch,) or array.dtype != bool:
        raise ComponentError(
            f"stopping criterion {name!r} returned {array.dtype} {array.shape} at step {step}; "
            f"expected bool ({batch},)"
        )
    return array
