"""The structured-output settings of a generation config: what the output must match.

Five ways to say it, one at a time: ``json_schema`` (a JSON Schema: a dict, JSON text or
a path to a ``.json`` file), ``json_object`` (any JSON object), ``regex``, ``grammar``
(a Lark grammar, llguidance's dialect; or, as text starting with ``{``, llguidance's
TopLevelGrammar JSON, passed to it as is: several grammars, the first the start, the
others referred to as ``@name``, which is what ``ortgen.chat_formats.after_thought``
writes) and ``choice`` (one of a list of strings). This
module only shapes and checks the values; the built-in ``grammar`` logits processor
(``ortgen.plugins.grammar``) compiles them, so an unsupported schema keyword is named
when the request's components are built, before any forward.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import Problem

if TYPE_CHECKING:
    from ..config import GenerationConfig

#: The constraint fields, in the order a problem lists them.
CONSTRAINT_FIELDS = ("json_schema", "json_object", "regex", "grammar", "choice")


def normalise(key: str, value: Any) -> Any:
    """Coerce one structured-output field; TypeError says what was expected."""
    if key == "json_schema":
        return _schema(value)
    if key in ("regex", "grammar"):
        if not isinstance(value, str) or not value:
            what = "a regular expression" if key == "regex" else "a Lark grammar"
            raise TypeError(f"{what} (a non-empty string)")
        return value
    if key == "choice":
        if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
            raise TypeError("a non-empty list of strings")
        if not all(isinstance(s, str) and s for s in value):
            raise TypeError("a non-empty list of non-empty strings")
        return tuple(value)
    raise KeyError(key)


def _schema(value: Any) -> dict[str, Any]:
    """A JSON Schema as a dict: given as one, as JSON text, or as a path to a JSON file.
    The boolean schema ``true`` (any JSON) is ``{}``; ``false`` admits nothing."""
    if value is True:
        return {}
    if value is False:
        raise TypeError("a JSON Schema that admits something (false admits no value)")
    if isinstance(value, Mapping):
        try:  # a copy the request owns, and proof it is JSON (no sets, no objects)
            return json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a JSON Schema that is JSON ({exc})") from None
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        text, where = value, "JSON text"
    elif isinstance(value, str | Path):
        path = Path(value)
        if not path.is_file():
            raise TypeError(f"a JSON Schema (a dict, JSON text or a .json file); no file {path}")
        text = path.read_text(encoding="utf-8")
        where = f"file {path}"
    else:
        raise TypeError("a JSON Schema (a dict, JSON text or a path to a .json file)")
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise TypeError(f"a JSON Schema, but {where} is not JSON ({exc})") from None
    if isinstance(schema, bool):
        return _schema(schema)
    if not isinstance(schema, dict):
        raise TypeError(f"a JSON Schema object, but {where} holds a {type(schema).__name__}")
    return schema


def _given(config: GenerationConfig) -> list[str]:
    """The constraint fields set (``json_schema={}`` is set: it admits any JSON)."""
    return [
        key
        for key in CONSTRAINT_FIELDS
        if (getattr(config, key) is not None if key == "json_schema" else getattr(config, key))
    ]


def constraint(config: GenerationConfig) -> tuple[str, Any] | None:
    """The request's one constraint as (field, value), or None."""
    given = _given(config)
    return (given[0], getattr(config, given[0])) if given else None


def validate(config: GenerationConfig) -> list[Problem]:
    """Contradictions among the structured-output settings (about the first one set)."""
    given = _given(config)
    if len(given) > 1:
        return [
            (
                given[0],
                f"{' and '.join(given)} are set together: a request's output follows one "
                "constraint (json_schema, json_object, regex, grammar or choice)",
            )
        ]
    return []
