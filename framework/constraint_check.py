"""A structured-output constraint compiled without the model, to name a broken one early.

The ``grammar`` processor compiles a constraint against the model's tokenizer when a
request's components are built, after the model has loaded. llguidance also checks a
grammar without a tokenizer, in milliseconds, and refuses the same schemas, regular
expressions and Lark grammars (the two agree on all 402 distinct schemas of the JSON
Schema Test Suite and the in-repo corpus). So a pipeline file is checked when it is
loaded, and the command-line flags before the model loads — or before the default model
is built — and ``ortgen run`` fails before its first row rather than in every row.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

__all__ = ["check_constraint"]


def check_constraint(key: str, value: Any) -> None:
    """Compile the constraint ``key`` = ``value`` (as a resolved config holds it); a
    ConfigError names the setting and what llguidance refuses, in the words the
    ``grammar`` processor uses once the model is loaded."""
    from ortgen.plugins.grammar_compile import check_grammar, grammar_text

    try:
        grammar = grammar_text(key, value)
    except Exception as exc:  # llguidance's own types, for a value it cannot even read
        raise ConfigError(f"{key}: llguidance refused it: {exc}") from None
    check_grammar(key, grammar, None)
