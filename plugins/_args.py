"""Argument checks shared by the built-in components (messages follow transformers' own).

A private helper of the built-in plugin package: third-party plugins write their own
checks and raise ``ortgen.ConfigError`` the same way.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from ortgen import ConfigError, GenerationContext


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
