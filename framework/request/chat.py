"""A conversation and its options (tools, ``response_format``, template variables,
thinking) as one prompt, the settings that constrain its answer, and the plan that
reads the answer back (``ortgen.chat_formats.reply``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..chat_formats.reasoning import after_thought
from ..chat_formats.reply import ReplyPlan
from ..chat_formats.tools import tool_spec
from ..errors import InputError
from ..protocols.chat_formats import ChatFormat, ShapesText, ToolSpec
from ..structured.response_format import response_format_settings
from ..structured.settings import CONSTRAINT_FIELDS, normalise
from ..text.chat_template import check_messages
from .formats import pick_format, probe, reasoning_tags, thought_state

if TYPE_CHECKING:
    from ..api import TextGenerator

#: OpenAI's ``reasoning_effort`` values that ask for no thought at all
_NO_THOUGHT = ("none", "minimal")
#: how many characters of a prompt's end say whether it leaves the model in a thought
_TAIL = 200


@dataclass
class ChatRequest:
    """A conversation ready to generate from."""

    prompt: list[int]
    #: the caller's settings plus what ``response_format``, the tools and thinking constrain
    settings: dict[str, Any]
    #: how the answer is read back (thought, content, calls); None: plain text
    plan: ReplyPlan | None = None
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
    reasoning_effort: str | None = None,
    chat_format: str | None = None,
) -> ChatRequest:
    """The one path from a conversation to a prompt, for ``gen.chat()``, ``ortgen chat``,
    the server's chat completions and a job's ``messages`` rows.

    ``developer`` (OpenAI's new name for ``system``) is rendered as ``system``;
    ``response_format`` becomes a constraint and may not be given with one (say one thing
    once); tools constrain the answer to the chat format's calls unless ``tool_choice``
    is ``"none"``. Beside them JSON (``response_format``, ``json_schema``,
    ``json_object``) shapes the text answer under ``auto`` (for a format that
    :class:`ShapesText`) and is left out for a forced call (``required``, a named
    function: there is no text for it); any other constraint clashes with tools.
    When the model may think, a constraint applies to the answer after the thought,
    never to the thought.
    ``chat_format`` (else the ``chat_format`` setting, else the template's) names the
    format; ``reasoning_effort`` reaches a template that reads it, and ``"none"`` or
    ``"minimal"`` turn thinking off in a template with ``enable_thinking``."""
    conversation = [_renamed(m) for m in check_messages(messages)]
    wanted = dict(settings)
    sources: dict[str, str] = {}
    for key, value in response_format_settings(response_format).items():
        if key in wanted:
            raise InputError(f"give response_format or {key}, not both", field=key)
        wanted[key] = value
        sources[key] = "response_format"
    tokenizer = gen.tokenizer
    found = probe(tokenizer)
    name = chat_format or wanted.get("chat_format") or _pipeline_format(gen)
    format_name, fmt = pick_format(gen.registry, tokenizer, name)
    spec = tool_spec(tools, tool_choice, parallel_tool_calls) if tools or tool_choice else None
    if tools is None and tool_choice not in (None, "none"):
        tool_spec([], tool_choice)  # raises: a choice with no tools
    if spec is not None and spec.calls_only:
        # a forced call has no content for response_format to shape (OpenAI's rule): it
        # shapes the text answer of a later turn, as agents send it with every turn
        for key in [k for k, source in sources.items() if source == "response_format"]:
            del wanted[key], sources[key]
    elif spec is not None:
        spec = _with_text_schema(spec, wanted, sources, format_name, fmt)
    constrained = [k for k in CONSTRAINT_FIELDS if wanted.get(k) not in (None, False)]
    if spec is not None and constrained:
        raise InputError(
            f"tools (tool_choice {tool_choice or 'auto'!r}) constrain the answer to tool "
            f"calls, and {constrained[0]} constrains it too: give one of them",
            field=constrained[0],
        )
    conversation, template_tools = fmt.prompt_messages(
        conversation, spec, template_renders_tools=found.with_tools is not None
    )
    kwargs = _template_kwargs(template_kwargs, reasoning_effort, found.source)
    prompt = gen.chat_prompt(conversation, tools=template_tools, **kwargs)
    tags = reasoning_tags(fmt, found)
    state = "closed"
    if tags is not None and tokenizer is not None:
        tail = tokenizer.decode(prompt[-_TAIL:], skip_special_tokens=False)[-_TAIL:]
        state = thought_state(tail, tags)
    thinks = tags is not None and state != "closed"
    if spec is not None:
        wanted["grammar"] = fmt.answer_grammar(spec)
        sources["grammar"] = "tools"
        constrained = ["grammar"]
    json_answer = any(k in ("json_schema", "json_object") for k in constrained)
    if thinks and constrained:
        assert tags is not None
        key = constrained[0]
        wanted["grammar"] = after_thought(key, wanted.pop(key), tags, opened=state == "open")
        sources["grammar"] = sources.pop(key, key)
    if spec is None and not thinks and not json_answer:
        return ChatRequest(prompt, wanted, None, sources)
    plan = ReplyPlan(
        format_name,
        fmt,
        spec,
        tags if thinks else None,
        opened=state == "open",
        json_answer=json_answer and thinks,
    )
    return ChatRequest(prompt, wanted, plan, sources)


def _with_text_schema(
    spec: ToolSpec,
    wanted: dict[str, Any],
    sources: dict[str, str],
    format_name: str,
    fmt: ChatFormat,
) -> ToolSpec:
    """``spec`` (``auto``) with the JSON a text answer must be (``json_schema``,
    ``json_object``: the request's ``response_format``, an agent's output type) moved
    out of ``wanted`` into its ``text_schema``, for the format's grammar to shape the
    answer that makes no call; ``spec`` as it is when no JSON is asked for. A format
    that cannot shape its text (not :class:`ShapesText`) is named in the refusal."""
    keys = [key for key in ("json_schema", "json_object") if wanted.get(key) not in (None, False)]
    if not keys:
        return spec
    if not (isinstance(fmt, ShapesText) and fmt.shapes_text is True):
        field_name = "response_format" if sources.get(keys[0]) else keys[0]
        raise InputError(
            f"the {format_name!r} chat format cannot shape a text answer beside tool calls, "
            f"so tools (tool_choice 'auto') and {field_name} cannot both apply: force a "
            "call (tool_choice 'required' or a named function) or leave out one of them",
            field=field_name,
        )
    value = wanted.pop(keys[0])
    sources.pop(keys[0], None)
    if keys[0] == "json_object":
        return replace(spec, text_schema={"type": "object"})
    try:
        return replace(spec, text_schema=normalise("json_schema", value))
    except TypeError as exc:
        raise InputError(f"json_schema must be {exc}", field="json_schema") from None


def _pipeline_format(gen: TextGenerator) -> str | None:
    """The ``chat_format`` of the generator's own pipeline file (``load(pipeline=...)``,
    ``ortgen serve --pipeline``), if it names one."""
    pipeline = getattr(gen, "pipeline", None)
    value = pipeline.settings.get("chat_format") if pipeline is not None else None
    return value if isinstance(value, str) else None


def _template_kwargs(
    given: Mapping[str, Any] | None, reasoning_effort: str | None, source: str
) -> dict[str, Any]:
    kwargs = dict(given or {})
    if "tools" in kwargs:
        raise InputError(
            "template variables may not hold tools (give them as tools)",
            field="chat_template_kwargs",
        )
    if reasoning_effort is not None:
        if "reasoning_effort" in source:
            kwargs.setdefault("reasoning_effort", reasoning_effort)
        elif "enable_thinking" in source and reasoning_effort in _NO_THOUGHT:
            kwargs.setdefault("enable_thinking", False)
    return kwargs


def _renamed(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("role") == "developer":
        return {**message, "role": "system"}
    return message
