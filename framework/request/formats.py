"""Which chat format a request speaks, and how its answer will be read.

The format is the one the ``chat_format`` setting names, else the first registered
format that recognises what the model's chat template renders (third-party formats
before the built-ins, each in registration order), else ``generic``. What a template
renders is found once per tokenizer (:func:`probe`): a user turn with one tool, and
with a call of it and its result.

Thinking: a template that mentions ``<think>`` (or a format that names other tags,
``MarksReasoning``) may think. Whether this prompt leaves the model inside a thought
(DeepSeek-R1 opens it in the prompt), free to think (Qwen3), or past it (Qwen3 with
``enable_thinking=False`` renders an empty thought) is read from the prompt's tail.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..chat_formats.reasoning import THINK_TAGS
from ..errors import ConfigError
from ..protocols.chat_formats import (
    PROBE_ARGUMENTS,
    PROBE_TOOL,
    ChatFormat,
    MarksReasoning,
    TemplateProbe,
)

if TYPE_CHECKING:
    from ..plugin_host.registry import Registry
    from ..text import Tokenizer

#: the format of a template no format recognises
FALLBACK = "generic"
_BUILTIN_PREFIX = "ortgen.plugins"
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": PROBE_TOOL,
            "description": "A probe",
            "parameters": {
                "type": "object",
                "properties": {"probe_argument": {"type": "string"}},
                "required": ["probe_argument"],
            },
        },
    }
]
_PROBE_CALL: list[dict[str, Any]] = [
    {"role": "user", "content": "probe question"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_probe",
                "type": "function",
                "function": {"name": PROBE_TOOL, "arguments": PROBE_ARGUMENTS},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_probe", "name": PROBE_TOOL, "content": "probe result"},
]
_probes: weakref.WeakKeyDictionary[Any, TemplateProbe] = weakref.WeakKeyDictionary()
_formats: weakref.WeakKeyDictionary[Any, dict[str | None, tuple[str, ChatFormat]]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def probe(tokenizer: Tokenizer | None) -> TemplateProbe:
    """What ``tokenizer``'s chat template renders (see module doc), found once."""
    if tokenizer is None or not tokenizer.has_chat_template:
        return TemplateProbe("")
    with _lock:
        known = _probes.get(tokenizer)
    if known is not None:
        return known
    source = tokenizer.chat_template or ""
    with_tools = _render(tokenizer, [_PROBE_CALL[0]])
    with_call = _render(tokenizer, _PROBE_CALL)
    found = TemplateProbe(
        source,
        with_tools if with_tools is not None and PROBE_TOOL in with_tools else None,
        with_call if with_call is not None and PROBE_TOOL in with_call else None,
    )
    with _lock:
        _probes[tokenizer] = found
    return found


def _render(tokenizer: Tokenizer, messages: list[dict[str, Any]]) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, tools=_PROBE_TOOLS)
    except Exception:  # a template that cannot render tools or calls: it knows none
        return None


def pick_format(
    registry: Registry, tokenizer: Tokenizer | None, name: str | None
) -> tuple[str, ChatFormat]:
    """The request's chat format and its name (see module doc). An unknown name is a
    ConfigError naming ``chat_format`` and the registered formats."""
    if name is not None and not isinstance(name, str):  # a request's value, unchecked so far
        message = f"chat_format must be a format's name, got {name!r:.60}"
        raise ConfigError(message, problems=[("chat_format", message)])
    cache_key = registry
    with _lock:
        known = _formats.get(cache_key, {}).get(name if name else _key(tokenizer))
    if known is not None:
        return known
    if name:
        try:
            registry.get("chat_format", name)
        except ConfigError as exc:
            raise ConfigError(f"chat_format: {exc}", problems=[("chat_format", str(exc))]) from None
        chosen = (name, _create(registry, name))
    else:
        chosen = _detect(registry, probe(tokenizer))
    with _lock:
        _formats.setdefault(cache_key, {})[name if name else _key(tokenizer)] = chosen
    return chosen


def _key(tokenizer: Tokenizer | None) -> str:
    return f"template:{id(tokenizer)}"


def _detect(registry: Registry, found: TemplateProbe) -> tuple[str, ChatFormat]:
    entries = registry.in_order("chat_format")
    ordered = [e for e in entries if not e.plugin.startswith(_BUILTIN_PREFIX)] + [
        e for e in entries if e.plugin.startswith(_BUILTIN_PREFIX)
    ]
    for entry in ordered:
        if entry.name == FALLBACK:
            continue
        fmt = _create(registry, entry.name)
        if fmt.recognizes(found):
            return entry.name, fmt
    return FALLBACK, _create(registry, FALLBACK)


def _create(registry: Registry, name: str) -> ChatFormat:
    fmt = registry.create("chat_format", name, {}, None)
    if not isinstance(fmt, ChatFormat):
        raise ConfigError(
            f"chat_format {name!r}: its factory made a {type(fmt).__name__}, which lacks the "
            "ChatFormat methods (recognizes, prompt_messages, answer_grammar, parse)"
        )
    return fmt


def reasoning_tags(fmt: ChatFormat, found: TemplateProbe) -> tuple[str, str] | None:
    """The thought's tags for a model speaking ``fmt`` with this template, or None."""
    if isinstance(fmt, MarksReasoning):
        return fmt.reasoning_tags(found)
    return THINK_TAGS if THINK_TAGS[0] in found.source else None


def thought_state(prompt_tail: str, tags: tuple[str, str]) -> str:
    """``"open"``: the prompt ends inside a thought; ``"closed"``: it ends after one (the
    model answers); ``"free"``: the model may think first or not."""
    opening, closing = prompt_tail.rfind(tags[0]), prompt_tail.rfind(tags[1])
    if opening > closing:
        return "open"
    if closing >= 0 and not prompt_tail[closing + len(tags[1]) :].strip():
        return "closed"
    return "free"
