"""What a constrained request's output means: its text parsed as JSON.

A JSON constraint (``json_schema``, ``json_object``) guarantees that a row whose grammar
finished is whole JSON of that schema; a row cut off first (``max_new_tokens``, a stop
string, an error) is a prefix of it. ``parse_json_output`` says which, so a caller gets
the value or the reason, never an exception from ``json.loads`` later.
"""

from __future__ import annotations

import json
from typing import Any


def parse_json_output(text: str, finish_reason: str) -> tuple[Any, str | None]:
    """(the parsed value, None), or (None, why the row's text is not whole JSON)."""
    if finish_reason not in ("eos", "stop"):
        cut = {"length": "max_new_tokens", "stop_string": "a stop string"}.get(finish_reason)
        why = f"it stopped at {cut}" if cut else f"it ended with finish_reason {finish_reason!r}"
        return None, f"the output is not whole JSON: {why} before the JSON was complete"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"the output is not valid JSON: {exc}"
