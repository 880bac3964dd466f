"""Which processors removed every token a constraint allows, found when it says so.

A constraint (the grammar) that finds every token it allows already at ``-inf`` raises
:class:`~ortgen.NoTokenLeft` with the row and those tokens. The step's processors ran in
chain order and kept no intermediate scores (the normal step pays nothing for this), so
the ones before it are run again, here, on a copy of the step's scores, and each is
charged with the allowed tokens it turned to ``-inf``. Only a failing step gets here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import NoTokenLeft
from ..protocols.candidates import Candidates

#: processors that keep only the likeliest tokens (transformers' warpers): given in
#: ``logits_processors`` they run before a constraint and may cut away every token it
#: allows; as settings of the same names they run after it
CUTOFFS = ("top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def blame(
    error: NoTokenLeft,
    processors: Sequence[tuple[str, Any, Any]],
    index: int,
    input_ids: np.ndarray,
    scores: np.ndarray | Candidates,
) -> NoTokenLeft:
    """``error`` (raised by ``processors[index]``) with the processors before it that
    removed the tokens it allows named, or ``error`` itself when they cannot be found
    (it says no row and tokens, or running them again does not remove them all)."""
    row, allowed = error.row, error.allowed
    if row is None or allowed is None or not len(allowed) or index == 0:
        return error
    tokens = np.asarray(allowed, dtype=np.int64)
    held = np.array(scores.dense() if isinstance(scores, Candidates) else scores, np.float32)
    alive = held[row, tokens] != -np.inf
    culprits: list[str] = []
    try:
        for name, processor, _ in processors[:index]:
            held = np.asarray(processor(input_ids, held.copy()), dtype=np.float32)
            now = held[row, tokens] != -np.inf
            if (alive & ~now).any() and name not in culprits:
                culprits.append(name)
            alive = now
    except Exception:  # a processor that does not run twice: say what was known
        return error
    if alive.any() or not culprits:
        return error
    constraint = processors[index][0]
    found = NoTokenLeft(
        f"logits processor {constraint!r}: row {row}: {_sentence(culprits, constraint)}"
    )
    found.row, found.allowed, found.field = row, allowed, error.field
    return found


def _sentence(culprits: list[str], constraint: str) -> str:
    names = " and ".join(culprits)
    removed = f"{names} (before the {constraint}) removed every token the {constraint} allows here"
    cut = [name for name in culprits if name in CUTOFFS]
    rules = [name for name in culprits if name not in CUTOFFS]
    advice = []
    if cut:
        them = " and ".join(cut)
        where = f"the {them} setting runs" if len(cut) == 1 else "as settings they run"
        it = "it" if len(cut) == 1 else "them"
        advice.append(
            f"put {them} after the {constraint} ({where} after it; logits_processors run "
            f"before it) or drop {it}"
        )
    if rules:
        advice.append(f"loosen or drop {' and '.join(rules)}")
    return f"{removed}: {'; '.join(advice)}"
