"""Checks a plugin's components run, raising ortgen's errors the way the built-ins do.

A public module (docs/plugins.md, "What a plugin may import"): the built-in plugins use
these exactly as a third-party plugin may, so the same mistake gets the same message
whichever plugin it is made in.

- On a factory's parameters (in ``__init__``, before any forward): :func:`is_int`,
  :func:`as_float`, :func:`token_ids`, :func:`eos_ids`; a bad value is a
  :class:`~ortgen.ConfigError` whose message follows transformers' own.
- On the scores a sampler picks from: :func:`check_pickable`.
- On what a KV cache needs from the request: :func:`graph_signature`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .errors import ComponentError, ConfigError, NoTokenLeft
from .protocols import GenerationContext

if TYPE_CHECKING:
    from .model.session import GraphSignature

__all__ = ["as_float", "check_pickable", "eos_ids", "graph_signature", "is_int", "token_ids"]


def is_int(value: object) -> bool:
    """An integer that is not a bool (TOML and JSON give bools where ints are expected)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def as_float(name: str, value: object, expected: str) -> float:
    """``value`` as a finite float, or ConfigError naming ``name`` and ``expected``."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        result = float(value)
        if math.isfinite(result):
            return result
    raise ConfigError(f"`{name}` has to be {expected}, but is {value!r}")


def token_ids(name: str, value: object) -> tuple[int, ...]:
    """An int or a sequence of ints, each >= 0, as a tuple (may be empty)."""
    items = [value] if is_int(value) else value
    if (
        isinstance(items, Sequence)
        and not isinstance(items, str)
        and all(is_int(i) and i >= 0 for i in items)
    ):
        return tuple(int(i) for i in items)
    raise ConfigError(
        f"`{name}` has to be a non-negative integer or a list of them, but is {value!r}"
    )


def eos_ids(eos_token_id: object, ctx: GenerationContext | None) -> tuple[int, ...]:
    """``eos_token_id`` when given, else the request's EOS ids (HF's ``_eos_token_tensor``)."""
    if eos_token_id is not None:
        return token_ids("eos_token_id", eos_token_id)
    return tuple(ctx.eos_token_ids) if ctx is not None else ()


def graph_signature(ctx: GenerationContext, name: str) -> GraphSignature:
    """``ctx.signature``, which a KV cache needs (its past inputs, heads, sizes, layout);
    a ConfigError naming cache ``name`` when the request has none (a context made by hand
    without a model, say)."""
    if ctx.signature is None:
        raise ConfigError(
            f"kv cache {name!r} needs the model's graph signature (ctx.signature), and this "
            "request has none; a request of a loaded model always has one"
        )
    return ctx.signature


def check_pickable(name: str, best: np.ndarray, *, allow_inf: bool = False) -> None:
    """Raise for rows a sampler cannot pick from, given each row's best score ``best`` (B,):
    NaN, ``-inf`` (every score is), or ``+inf`` unless ``allow_inf`` (an argmax may take it).

    A row whose scores are all ``-inf`` raises :class:`~ortgen.NoTokenLeft` (the processors
    ruled every token out: a constraint, not a broken number); NaN and ``+inf`` raise
    :class:`~ortgen.ComponentError`. The message names sampler ``name`` and the first row,
    instead of a silent pick of token 0. Call it on the scores the sampler draws from
    (packed candidates are fine: packing drops only ``-inf`` scores, so a row's best is the
    same); it is cheap when every row is fine, so a hot sampler may call it unguarded.
    """
    bad = np.isnan(best) | (best == -np.inf) if allow_inf else ~np.isfinite(best)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = best[row]
        if np.isnan(value):
            why = "contain NaN"
        elif value > 0:
            why = "contain +inf"
        else:
            why = "are all -inf"
        error = NoTokenLeft if why == "are all -inf" else ComponentError
        raise error(
            f"sampler {name!r}: the scores of row {row} {why}, so no token can be picked "
            f"({int(bad.sum())} of {bad.size} rows affected); check the logits processors"
        )
