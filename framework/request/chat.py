"""A conversation and its options (tools, ``response_format``, template variables) as
one prompt, the settings that constrain its answer, and the plan for tool calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..structured.response_format import response_format_settings
from ..structured.settings import CONSTRAINT_FIELDS
from ..structured.tool_calls import ToolPlan, plan_tools
from ..text.chat_template import check_messages

if TYPE_CHECKING:
    from ..api import TextGenerator


@dataclass
class ChatRequest:
    """A conversation ready to generate from."""

    prompt: list[int]
    #: the caller's settings plus what ``response_format`` and the tools constrain
    settings: dict[str, Any]
    #: with tools: how the answer holds calls (``ortgen.structured.tool_calls``)
    plan: ToolPlan | None = None
    #: a setting added here -> the input that asked for it ("response_format", "tools")
    sources: dict[str, str] = field(default_factory=dict)


def build_chat(
    gen: TextGenerator,
    messages: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    response_format: Any = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatRequest:
    """The one path from a conversation to a prompt, for ``gen.chat()``, the server's
    chat completions and a job's ``messages`` rows. ``developer`` (OpenAI's new name for
    ``system``) is rendered as ``system``; ``response_format`` becomes a constraint and
    may not be given with one (say one thing once); tools constrain the answer to calls
    unless ``tool_choice`` is ``"none"`` and clash with any other constraint."""
    conversation = [_renamed(m) for m in check_messages(messages)]
    wanted = dict(settings)
    sources: dict[str, str] = {}
    for key, value in response_format_settings(response_format).items():
        if key in wanted:
            raise InputError(f"give response_format or {key}, not both", field=key)
        wanted[key] = value
        sources[key] = "response_format"
    plan = None
    template_tools = tools
    if tools is not None or tool_choice is not None:
        template = gen.tokenizer.chat_template if gen.tokenizer is not None else None
        plan = plan_tools(conversation, tools, tool_choice, parallel_tool_calls, template)
        constrained = [k for k in CONSTRAINT_FIELDS if wanted.get(k) not in (None, False)]
        if plan.settings and constrained:
            raise InputError(
                f"tools (tool_choice {tool_choice or 'auto'!r}) constrain the answer to tool "
                f"calls, and {constrained[0]} constrains it too: give one of them",
                field=constrained[0],
            )
        conversation, template_tools = plan.messages, plan.template_tools
        wanted.update(plan.settings)
        sources.update({key: "tools" for key in plan.settings})
    kwargs = dict(template_kwargs or {})
    if "tools" in kwargs:
        raise InputError(
            "template variables may not hold tools (give them as tools)",
            field="chat_template_kwargs",
        )
    prompt = gen.chat_prompt(conversation, tools=template_tools, **kwargs)
    return ChatRequest(prompt, wanted, plan, sources)


def _renamed(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("role") == "developer":
        return {**message, "role": "system"}
    return message
