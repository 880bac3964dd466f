"""What a constrained request's output means, and OpenAI's way of asking for one.

A JSON constraint (``json_schema``, ``json_object``) guarantees that a row whose grammar
finished is whole JSON of that schema; a row cut off first (``max_new_tokens``, a stop
string, an error) is a prefix of it. ``parse_json_output`` says which, so a caller gets
the value or the reason, never an exception from ``json.loads`` later.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InputError


def parse_json_output(text: str, finish_reason: str | None) -> tuple[Any, str | None]:
    """(the parsed value, None), or (None, why the row's text is not whole JSON)."""
    if finish_reason not in ("eos", "stop"):
        cut = {"length": "max_new_tokens", "stop_string": "a stop string"}.get(finish_reason or "")
        why = f"it stopped at {cut}" if cut else f"it ended with finish_reason {finish_reason!r}"
        return None, f"the output is not whole JSON: {why} before the JSON was complete"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"the output is not valid JSON: {exc}"


def response_format_settings(response_format: Any) -> dict[str, Any]:
    """OpenAI's ``response_format`` as ortgen settings.

    ``{"type": "text"}`` (nothing), ``{"type": "json_object"}`` (any JSON object; with a
    ``"schema"``, llama.cpp's form, that schema), ``{"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}}``; a Pydantic model class (what the
    ``openai`` client's ``parse()`` takes) is turned into its JSON Schema.
    """
    if response_format is None:
        return {}
    schema_of = getattr(response_format, "model_json_schema", None)
    if callable(schema_of):
        return {"json_schema": schema_of()}
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise InputError(
            'response_format must be {"type": "text" | "json_object" | "json_schema", ...}, '
            f"got {response_format!r:.80}",
            field="response_format",
        )
    kind = response_format["type"]
    if kind == "text":
        return {}
    if kind == "json_object":
        schema = response_format.get("schema")
        return {"json_schema": schema} if schema is not None else {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict | bool):
            raise InputError(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": '
                "{...}}}: the schema is missing",
                field="response_format",
            )
        return {"json_schema": spec["schema"]}
    raise InputError(
        f"response_format type {kind!r} is not supported; use text, json_object or json_schema",
        field="response_format",
    )
