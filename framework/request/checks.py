"""The components a request names, checked against the registry before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..config.fields import COMPONENT_KINDS
from ..config.values import normalise
from ..errors import Problem

if TYPE_CHECKING:
    from ..plugin_host.registry import Registry


def component_problems(registry: Registry, settings: Mapping[str, Any]) -> list[Problem]:
    """Unknown component names, and parameters their factories do not take or need, each
    as ``(setting, message)``, before any factory runs. Values of the wrong shape are
    left to ``resolve_config``, which names them; values a factory refuses (``logit_bias``
    ids outside the vocabulary, say) to the factory, whose error ``build_chain`` ties to
    the setting that asked for it."""
    found: list[Problem] = []
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
    chat_format = settings.get("chat_format")
    if isinstance(chat_format, str):
        problems = registry.problems("chat_format", chat_format, {})
        if problems:
            found.append(("chat_format", f"chat_format: {'; '.join(problems)}"))
    return found
