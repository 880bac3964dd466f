"""The chat-format author's kit: what every format needs to write a grammar for tool
calls and to read calls back, whole or while the model is still writing.

Thinking (``<think>...</think>``) has its own part: splitting a reply into reasoning
and answer, whole or streaming, and a grammar that constrains only the answer
(``reasoning``).

A public module (docs/chat-formats.md): the built-in formats in ``ortgen.plugins.chat_formats``
use only this, ``ortgen`` and ``ortgen.protocols``, as a third-party format would. The
contract itself (:class:`~ortgen.protocols.chat_formats.ChatFormat`) lives in
``ortgen.protocols``.
"""

from __future__ import annotations

from .kit import (
    MAX_PARALLEL_CALLS,
    arguments_value,
    call_id,
    call_schema,
    calls_for_template,
    closed,
    held_back,
    json_grammar,
    json_value_end,
    partial_json_text,
    read_json_call,
    regex_literal,
    text_then,
    with_system,
)
from .python_calls import PythonCallRules, python_arguments, python_literal
from .reasoning import (
    THINK_TAGS,
    ReasoningStream,
    after_thought,
    opens_thought,
    split_reasoning,
)

__all__ = [
    "MAX_PARALLEL_CALLS",
    "THINK_TAGS",
    "PythonCallRules",
    "ReasoningStream",
    "after_thought",
    "arguments_value",
    "call_id",
    "call_schema",
    "calls_for_template",
    "closed",
    "held_back",
    "json_grammar",
    "json_value_end",
    "opens_thought",
    "partial_json_text",
    "python_arguments",
    "python_literal",
    "read_json_call",
    "regex_literal",
    "split_reasoning",
    "text_then",
    "with_system",
]
