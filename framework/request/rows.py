"""Per-row settings and the grouping of rows into chains."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..structured.settings import CONSTRAINT_FIELDS

if TYPE_CHECKING:
    from ..config import GenerationConfig


def row_settings(call: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """A row's settings over the call's: each of the row's own keys overrides the call's,
    and a row's own constraint (``json_schema``, ``regex``, ...) *replaces* the call's, as
    a request follows one constraint; a row that names none keeps the call's. The library's
    per-row prompts, the server's rows and a job's input lines all resolve through this."""
    if any(key in own for key in CONSTRAINT_FIELDS):
        call = {k: v for k, v in call.items() if k not in CONSTRAINT_FIELDS}
    return {**call, **own}


def settings_key(config: GenerationConfig) -> str:
    """Rows whose settings differ only in their seed share one chain (a per-row seed is
    each row's own random stream within it)."""
    values = config.to_dict()
    values.pop("seed")
    return json.dumps(values, sort_keys=True, default=str)


def group_rows(configs: Sequence[GenerationConfig]) -> dict[str, list[int]]:
    """Row indices by settings group, groups in order of their first row."""
    groups: dict[str, list[int]] = {}
    for row, config in enumerate(configs):
        groups.setdefault(settings_key(config), []).append(row)
    return groups
