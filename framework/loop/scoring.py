"""One step's scores through a chain: the logits processors, then the sampler.

Scores travel dense, (B, V) float32, between components, until one of them leaves
few candidates (top-k over a large vocabulary): its ``sparse`` method
(``WorksOnCandidates``, found once per request by :func:`resolve`) returns
:class:`~ortgen.Candidates`, and from there every component with a ``sparse``
method works on those few scores (top-p after top-k(50) is a top-p over 50 scores;
the sampler draws among them). They are made dense only for a component without
one, and after the step only for whoever reads them (recorded scores or logprobs, a
stopping criterion that reads scores). Each ``sparse`` method gives exactly what its
``__call__`` gives on the dense scores, so the path changes the cost, not the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import NoTokenLeft
from ..protocols import LogitsProcessor, WorksOnCandidates
from ..protocols.candidates import Candidates
from .blame import blame
from .component_checks import check_candidates, check_scores

#: a processor as ``process`` calls it: (name, processor, the same object when it works
#: on candidates, else None)
Scored = tuple[str, LogitsProcessor, WorksOnCandidates | None]

#: ``call(kind, name, function, input_ids, scores)``: runs one component's function
#: (the loop's own wraps an unexpected exception in a ComponentError naming it)
Call = Callable[[str, str, Any, np.ndarray, Any], Any]


def _plain_call(kind: str, name: str, function: Any, input_ids: np.ndarray, scores: Any) -> Any:
    return function(input_ids, scores)


def resolve(processors: Sequence[tuple[str, LogitsProcessor]]) -> list[Scored]:
    """Each processor with its ``sparse`` capability found (once per request, not per step)."""
    return [(name, p, works_on_candidates(p)) for name, p in processors]


def works_on_candidates(component: object) -> WorksOnCandidates | None:
    """``component`` when it has the ``WorksOnCandidates`` capability, else None. A class
    may opt out of one it inherits with ``sparse = None``."""
    if isinstance(component, WorksOnCandidates) and component.sparse is not None:
        return component
    return None


def process(
    processors: Sequence[Scored],
    input_ids: np.ndarray,
    scores: np.ndarray,
    *,
    step: int = 0,
    call: Call = _plain_call,
) -> np.ndarray | Candidates:
    """The processed scores: dense, or Candidates when the chain left few. A constraint
    that finds every token it allows removed names the processors that removed them
    (``blame``: only then, at no cost to the normal step)."""
    shape = scores.shape
    held: np.ndarray | Candidates = scores
    try:
        for name, processor, sparse in processors:
            if sparse is not None:
                out = call("logits processor", name, sparse.sparse, input_ids, held)
                if out is not None:
                    check_candidates(name, out, shape, step)
                    held = out
                    continue
            if isinstance(held, Candidates):
                held = held.dense()
            held = call("logits processor", name, processor, input_ids, held)
            check_scores(name, held, shape, step)
    except NoTokenLeft as exc:
        index = next(i for i, p in enumerate(processors) if p[1] is processor)
        found = blame(exc, processors, index, input_ids, scores)
        if found is exc:
            raise
        raise found from exc
    return held


def pick(
    sampler: tuple[str, Any],
    sparse: WorksOnCandidates | None,
    input_ids: np.ndarray,
    scores: np.ndarray | Candidates,
    *,
    call: Call = _plain_call,
) -> Any:
    """The sampler's answer on processed scores, through ``sparse`` (the sampler, when it
    works on candidates) on Candidates."""
    name, function = sampler
    if isinstance(scores, Candidates):
        if sparse is not None:
            return call("sampler", name, sparse.sparse, input_ids, scores)
        scores = scores.dense()
    return call("sampler", name, function, input_ids, scores)


def dense(scores: np.ndarray | Candidates) -> np.ndarray:
    """Processed scores as a (B, V) array, whichever way they were held."""
    return scores.dense() if isinstance(scores, Candidates) else scores
