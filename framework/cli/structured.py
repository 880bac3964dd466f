"""The structured-output flags of ``ortgen generate`` and ``ortgen chat``, kept out of
``cli.py`` so that it stays a page of small commands.

``--json-schema``, ``--json-object``, ``--regex``, ``--grammar`` and ``--choice`` become
the settings of the same names (docs/structured.md) in the call layer, beside the other
flags and before ``--set``: layers, precedence and validation are the ones every setting
goes through. Files are read here, once, so a setting holds the schema or grammar itself
and an unreadable file is an error naming the flag. The constraint is compiled without
the model (``constraint_check``), so a broken regex is named before the model loads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import OrtgenError
from ..structured.check import check_constraint
from ..structured.response_format import parse_json_output

__all__ = [
    "add_structured_flags",
    "structured_settings",
    "warn_if_not_json",
]


def add_structured_flags(parser: argparse.ArgumentParser) -> None:
    """The five constraint flags, mutually exclusive (a request follows one constraint)."""
    group = parser.add_argument_group("structured output (docs/structured.md)")
    one = group.add_mutually_exclusive_group()
    one.add_argument(
        "--json-schema",
        metavar="FILE",
        help="answer as JSON valid against this JSON Schema: a .json file, or inline JSON "
        "text starting with {",
    )
    one.add_argument(
        "--json-object", action="store_true", default=None, help="answer as any JSON object"
    )
    one.add_argument("--regex", metavar="REGEX", help="answer with text this regex matches whole")
    one.add_argument(
        "--grammar", metavar="FILE.lark", help="answer in this Lark grammar (llguidance's dialect)"
    )
    one.add_argument(
        "--choice",
        action="append",
        metavar="TEXT",
        help="answer with exactly one of these texts; repeat: --choice yes --choice no",
    )


def structured_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags ask for (none for a command without them), each compiled."""
    settings: dict[str, Any] = {}
    schema = getattr(args, "json_schema", None)
    if schema is not None:
        settings["json_schema"] = _schema(schema)
    if getattr(args, "json_object", None):
        settings["json_object"] = True
    if getattr(args, "regex", None) is not None:
        settings["regex"] = args.regex
    grammar = getattr(args, "grammar", None)
    if grammar is not None:
        settings["grammar"] = _read(grammar, "--grammar", "a Lark grammar file")
    if getattr(args, "choice", None):
        settings["choice"] = list(args.choice)
    for key, value in settings.items():
        _check_value(key, value)
    return settings


def _schema(value: str) -> Any:
    """Inline JSON text as it is (the setting parses it and names what is wrong), or a
    file's JSON, read here: a path would otherwise mean another file in another folder
    (a Ray worker's) and its problems would not name the flag."""
    if value.lstrip().startswith("{"):
        return value
    text = _read(value, "--json-schema", "a JSON Schema file")
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise OrtgenError(f"--json-schema {value}: the file is not JSON: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise OrtgenError(
            f"--json-schema {value}: the file holds a JSON {type(schema).__name__}; a JSON "
            "Schema is an object"
        )
    return schema


def _read(path: str, flag: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OrtgenError(f"{flag} {path}: no such file (it takes {what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OrtgenError(f"{flag} {path}: cannot read it: {exc}") from None


def _check_value(key: str, value: Any) -> None:
    """The value as the config reads it, then compiled: every problem before the model."""
    from ..config import resolve

    check_constraint(key, getattr(resolve([("call", {key: value})]).config, key))


def warn_if_not_json(config: Any, text: str, finish_reason: str | None) -> None:
    """Under a JSON constraint, say on stderr when the answer printed is not whole JSON
    (cut by ``max_new_tokens``, say): the text alone does not show it, a parser downstream
    would only fail."""
    if config.json_schema is None and not config.json_object:
        return
    _, why = parse_json_output(text, finish_reason)
    if why is not None:
        hint = " (raise --max-new-tokens)" if finish_reason == "length" else ""
        sys.stdout.flush()  # after the answer, wherever the two streams meet
        print(f"ortgen: warning: {why}{hint}", file=sys.stderr)
