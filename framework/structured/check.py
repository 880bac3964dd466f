"""A structured-output setting as llguidance grammar text, compiled without the model to
name a broken one early.

The meaning of the settings (``structured_settings``) is the framework's, so their
grammar text is made here; the ``grammar`` plugin runs it token by token.

The ``grammar`` processor compiles a constraint against the model's tokenizer when a
request's components are built, after the model has loaded. llguidance also checks a
grammar without a tokenizer, in milliseconds, and refuses the same schemas, regular
expressions and Lark grammars (the two agree on all 402 distinct schemas of the JSON
Schema Test Suite and the in-repo corpus). So a pipeline file is checked when it is
loaded, and the command-line flags before the model loads — or before the default model
is built — and ``ortgen run`` fails before its first row rather than in every row.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ConfigError

__all__ = ["JSON_DEFAULTS", "check_constraint", "check_grammar", "grammar_text"]

#: llguidance's JSON options ortgen starts from (a schema's ``x-guidance`` overrides them)
JSON_DEFAULTS: Any = {"whitespace_flexible": False}  # llguidance's JsonCompileOptions


def grammar_text(setting: str, value: Any) -> str:
    """llguidance's grammar for one structured-output setting (see ``structured_settings``)."""
    import llguidance

    matcher = llguidance.LLMatcher
    if setting == "json_schema":
        return matcher.grammar_from_json_schema(value, defaults=JSON_DEFAULTS)
    if setting == "json_object":
        return matcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
    if setting == "regex":
        return matcher.grammar_from_regex(value)
    if setting == "grammar":  # a TopLevelGrammar (JSON text) goes to llguidance as is
        return value if value.lstrip().startswith("{") else matcher.grammar_from_lark(value)
    if setting == "choice":
        options = " | ".join(json.dumps(option, ensure_ascii=False) for option in value)
        return matcher.grammar_from_lark(f"start: {options}")
    raise ValueError(f"unknown structured-output setting {setting!r}")


def check_grammar(setting: str, grammar: str, tokenizer: Any) -> None:
    """Raise ConfigError naming what llguidance refuses in ``setting``'s grammar."""
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if failed:
        reason = messages[0].strip() if messages else "no reason given"
        what = {
            "json_schema": "this JSON Schema",
            "regex": "this regular expression",
            "grammar": "this Lark grammar",
        }.get(setting, f"this {setting}")
        raise ConfigError(f"{setting}: llguidance cannot compile {what}: {reason}")


def check_constraint(key: str, value: Any) -> None:
    """Compile the constraint ``key`` = ``value`` (as a resolved config holds it); a
    ConfigError names the setting and what llguidance refuses, in the words the
    ``grammar`` processor uses once the model is loaded."""
    try:
        grammar = grammar_text(key, value)
    except Exception as exc:  # llguidance's own types, for a value it cannot even read
        raise ConfigError(f"{key}: llguidance refused it: {exc}") from None
    check_grammar(key, grammar, None)
