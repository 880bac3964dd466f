"""The components a request names, checked against the registry before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..config.fields import COMPONENT_KINDS
from ..config.values import normalise
from ..errors import Problem

if TYPE_CHECKING:
    from ..plugin_host.registry import Registry


def component_problems(
    registry: Registry, settings: Mapping[str, Any], vocab_size: int | None
) -> list[Problem]:
    """Unknown component names, parameters their factories do not take or need, and
    ``logit_bias`` ids outside the vocabulary (the processor would index past the logits),
    each as ``(setting, message)``. Values of the wrong shape are left to
    ``resolve_config``, which names them."""
    found: list[Problem] = []
    bias = settings.get("logit_bias")
    if bias and vocab_size:
        try:
            outside = sorted(t for t in normalise("logit_bias", bias) if t >= vocab_size)
        except TypeError:
            outside = []
        if outside:
            found.append(
                (
                    "logit_bias",
                    f"logit_bias names token ids outside the vocabulary [0, {vocab_size}): "
                    f"{outside[:5]}",
                )
            )
    for key, kind in COMPONENT_KINDS.items():
        if settings.get(key) is None:
            continue
        try:
            value = normalise(key, settings[key])
        except TypeError:
            continue
        for spec in value if isinstance(value, tuple) else (value,):
            params = {k: v for k, v in spec.items() if k != "name"}
            problems = registry.problems(kind, spec["name"], params)
            if problems:
                found.append((key, f"{key} ({spec['name']}): {'; '.join(problems)}"))
    return found
