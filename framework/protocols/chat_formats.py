"""The chat-format contract: how one model family writes tool calls, and how to read them.

A chat format is the part of a conversation's shape that the chat template does not say
on its own: where the tools go when the template does not render them, the grammar an
answer holding calls must follow (so a small model cannot write a call that does not
parse), and how to read the model's text back into ``content`` and ``tool_calls``, whole
or as it streams. Thinking (``<think>...</think>``) is split off before a format sees
the text: a format parses the answer only.

Formats are plugins (``register_chat_formats``); the request builder picks one per
request: the one named by the ``chat_format`` setting, else the first whose
:meth:`ChatFormat.recognizes` accepts what the model's template renders
(:class:`TemplateProbe`), else ``generic``. See docs/chat-formats.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "PROBE_ARGUMENTS",
    "PROBE_TOOL",
    "CallDraft",
    "ChatFormat",
    "MarksReasoning",
    "ParsedAnswer",
    "ShapesText",
    "TemplateProbe",
    "ToolSpec",
]

#: the tool a template is rendered with to see how it writes tools and calls
PROBE_TOOL = "ortgen_probe_tool"
#: the arguments of the probe call
PROBE_ARGUMENTS = {"probe_argument": "probe value"}


@dataclass(frozen=True)
class TemplateProbe:
    """What a model's chat template renders, for a format to recognise itself by.

    ``source`` is the template's Jinja text ('' when the model has none).
    ``with_tools`` is a user turn rendered with one tool (:data:`PROBE_TOOL`) given as
    ``tools``; ``with_call`` adds an assistant turn calling it with
    :data:`PROBE_ARGUMENTS` and the tool's result. Either is None when the template
    fails on it or renders nothing of the tool (it knows no tools).
    """

    source: str
    with_tools: str | None = None
    with_call: str | None = None


@dataclass(frozen=True)
class ToolSpec:
    """The calls an answer may make: one request's checked ``tools`` and choice.

    ``tools`` are OpenAI's function tools as given; ``functions`` maps each callable
    name to its ``parameters`` schema with every object closed to keys it does not list
    (OpenAI's strict mode), which is what a format's grammar should use. A named
    ``tool_choice`` leaves one function. ``calls_only``: the answer must be calls
    (``required`` or a named function), else text or calls (``auto``). ``max_calls``:
    how many calls one answer may hold (1 for a named function, one tool with
    ``parallel_tool_calls`` unset, or ``parallel_tool_calls=false``).
    ``text_schema``: under ``auto``, the JSON Schema an answer that makes no call must
    follow (the request's ``response_format``), or None for free text; only a format
    that :class:`ShapesText` is ever given one.
    """

    tools: Sequence[Mapping[str, Any]]
    functions: Mapping[str, Mapping[str, Any]]
    calls_only: bool
    max_calls: int
    named: str | None = None
    text_schema: Mapping[str, Any] | None = None


@dataclass
class CallDraft:
    """One tool call as far as the model has written it.

    ``name`` is None until the name is whole. ``arguments`` is the arguments' JSON text
    so far; while the text is not final it must only ever grow (what a stream sent is
    never taken back), and once ``complete`` it is the whole JSON object.
    """

    name: str | None
    arguments: str = ""
    complete: bool = False


@dataclass
class ParsedAnswer:
    """An answer (the text after any thought) split into text and calls.

    Parsing text that is not final must hold back whatever may still turn out to be the
    start of a call (``<tool_`` before ``<tool_call>``): ``content`` only grows as more
    text comes. ``calls`` are in the order written.
    """

    content: str = ""
    calls: list[CallDraft] = field(default_factory=list)


@runtime_checkable
class ChatFormat(Protocol):
    """A model family's way of writing tool calls (see module doc)."""

    def recognizes(self, probe: TemplateProbe) -> bool:
        """Whether a template that renders ``probe`` teaches this format."""
        ...

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        spec: ToolSpec | None,
        *,
        template_renders_tools: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The conversation as the template should see it and the ``tools`` to pass it
        (None: pass none). ``spec`` is None when the request offers no tools (or
        ``tool_choice`` is ``"none"``); earlier calls and results in ``messages`` must
        still render. When the template does not render tools itself, the format
        describes them (a system message, say)."""
        ...

    def answer_grammar(self, spec: ToolSpec) -> str:
        """A Lark grammar (llguidance's dialect) that every answer allowed by ``spec``
        follows: text or calls for ``auto``, calls only otherwise, at most
        ``spec.max_calls`` of them, each call's arguments valid for its function."""
        ...

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        """The answer ``text`` as content and calls; ``final`` is False while the model
        is still writing (see :class:`ParsedAnswer` for what a partial parse promises).
        A final text that does not hold a whole call is content."""
        ...


@runtime_checkable
class MarksReasoning(Protocol):
    """Optional capability of a :class:`ChatFormat` whose family thinks between other
    tags than ``<think>`` and ``</think>`` (the default for every template that mentions
    ``<think>``): the tags, or None when a template rendering ``probe`` never thinks."""

    def reasoning_tags(self, probe: TemplateProbe) -> tuple[str, str] | None: ...


@runtime_checkable
class ShapesText(Protocol):
    """Optional capability of a :class:`ChatFormat` whose ``answer_grammar`` shapes the
    text answer by :attr:`ToolSpec.text_schema` (a ``response_format`` beside tools under
    ``auto``: an agent's output type) and whose ``parse`` reads that answer back as
    ``content`` holding the JSON value, never as a call. A format sets the class
    attribute ``shapes_text = True``; a request asking one that does not for both is
    refused, naming the format, rather than given an answer the schema does not hold."""

    shapes_text: bool
