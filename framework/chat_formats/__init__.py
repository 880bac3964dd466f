"""The chat-format author's kit: what every format needs to write a grammar for tool
calls and to read calls back, whole or while the model is still writing.

A public module (docs/chat-formats.md): the built-in formats in ``ortgen.plugins.chat_formats``
use only this, ``ortgen`` and ``ortgen.protocols``, as a third-party format would. The
contract itself (:class:`~ortgen.protocols.chat_formats.ChatFormat`) lives in
``ortgen.protocols``.
"""

from __future__ import annotations

from .kit import (
    MAX_PARALLEL_CALLS,
    PythonCallRules,
    call_id,
    call_schema,
    closed,
    held_back,
    json_grammar,
    json_value_end,
    partial_json_text,
    python_arguments,
    python_literal,
)

__all__ = [
    "MAX_PARALLEL_CALLS",
    "PythonCallRules",
    "call_id",
    "call_schema",
    "closed",
    "held_back",
    "json_grammar",
    "json_value_end",
    "partial_json_text",
    "python_arguments",
    "python_literal",
]
