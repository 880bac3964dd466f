"""An OpenAI chat or completions body read into ortgen's terms, without the model.

Every field is checked here, each error a :class:`RequestError` naming the field the
client sent; the sampling fields become ortgen settings (``openai_fields.settings_of``,
which also keeps any other key as an ortgen setting); a chat's options (``tools``,
``response_format``, ...) are set apart for the request builder (``build_chat``). What
needs the model (rendering, encoding, the default length) comes after, with it: the
server does that per request (``ortgen.serve.openai_api``), a batch job per line
(``ortgen.jobs.openai_batch``), so both read a body the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .openai_errors import RequestError
from .openai_fields import (
    COMPLETION_LOGPROBS,
    INTEGERS,
    REASONING_EFFORTS,
    VERBOSITIES,
    boolean,
    integer,
    one_of,
    settings_of,
)

__all__ = [
    "BodyFields",
    "ChatFields",
    "CompletionFields",
    "chat_fields",
    "completion_fields",
    "completion_prompts",
    "prediction_text",
]

#: the options of a chat body handed to ``build_chat`` as they are (it checks them)
CHAT_OPTIONS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")


@dataclass
class BodyFields:
    """What every body has: its ortgen settings and the fields still to place."""

    #: the sampling fields as ortgen settings, plus any other key as given
    settings: dict[str, Any]
    #: ortgen setting -> the body field it came from (for ``param`` in errors)
    names: dict[str, str]
    n: int = 1
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False


@dataclass
class ChatFields(BodyFields):
    """A chat body, checked."""

    messages: list[Any] = field(default_factory=list)
    #: ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format`` (None: not given)
    options: dict[str, Any] = field(default_factory=dict)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    logprobs: bool = False
    top_logprobs: int = 0
    reasoning_effort: str | None = None
    verbosity: str | None = None
    #: vLLM's ``prompt_logprobs``: alternatives per prompt token (None: not asked)
    prompt_logprobs: int | None = None


@dataclass
class CompletionFields(BodyFields):
    """A completions body, checked: ``prompts`` are texts or token-id lists, unencoded."""

    prompts: list[str | list[int]] = field(default_factory=list)
    #: the number of alternatives asked for (0-5), or None: no logprobs
    logprobs: int | None = None
    #: the prompt comes first in the answer (``echo``); ``max_tokens: 0``: the prompt is
    #: only scored, nothing generated
    echo: bool = False
    score_only: bool = False
    #: vLLM's ``prompt_logprobs``: alternatives per prompt token (None: not asked)
    prompt_logprobs: int | None = None


def chat_fields(body: Mapping[str, Any]) -> ChatFields:
    """``POST /v1/chat/completions``'s body: ``messages`` (checked as a list here; each
    message by the request builder), ``logprobs``/``top_logprobs``, ``reasoning_effort``,
    ``verbosity``, ``chat_template_kwargs`` and the sampling fields."""
    if "messages" not in body:
        raise RequestError("messages is required", param="messages")
    logprobs = boolean(body, "logprobs")
    top = integer(body, "top_logprobs", *INTEGERS["top_logprobs"])
    if top and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    effort = one_of(body, "reasoning_effort", REASONING_EFFORTS)
    verbosity = one_of(body, "verbosity", VERBOSITIES)
    prompt_logprobs = _prompt_logprobs(body)
    settings, names, rest = settings_of(body, chat=True)
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise RequestError(
            "chat_template_kwargs must be an object of template variables",
            param="chat_template_kwargs",
        )
    return ChatFields(
        settings,
        names,
        **rest,
        messages=messages,
        options={key: body.get(key) for key in CHAT_OPTIONS},
        template_kwargs=dict(kwargs),
        logprobs=bool(logprobs),
        top_logprobs=top or 0,
        reasoning_effort=effort,
        verbosity=verbosity,
        prompt_logprobs=prompt_logprobs,
    )


def completion_fields(body: Mapping[str, Any]) -> CompletionFields:
    """``POST /v1/completions``'s body: ``prompt`` is text, a list of texts, token ids or
    a list of token-id lists; ``logprobs`` is the number of alternatives (0-5); ``echo``;
    ``max_tokens: 0`` (with ``echo`` or ``prompt_logprobs``: score the prompt only)."""
    if "prompt" not in body:
        raise RequestError("prompt is required", param="prompt")
    prompts = completion_prompts(body["prompt"])
    logprobs = integer(body, "logprobs", *COMPLETION_LOGPROBS)
    echo = bool(boolean(body, "echo"))
    prompt_logprobs = _prompt_logprobs(body)
    score_only = body.get("max_tokens") == 0 and not isinstance(body.get("max_tokens"), bool)
    if score_only and not echo and prompt_logprobs is None:
        raise RequestError(
            "max_tokens=0 generates nothing: it scores the prompt, with echo=true or "
            "prompt_logprobs; otherwise max_tokens must be >= 1",
            param="max_tokens",
        )
    settings, names, rest = settings_of(
        {**body, "max_tokens": 1} if score_only else body, chat=False
    )
    return CompletionFields(
        settings,
        names,
        **rest,
        prompts=prompts,
        logprobs=logprobs,
        echo=echo,
        score_only=score_only,
        prompt_logprobs=prompt_logprobs,
    )


def _prompt_logprobs(body: Mapping[str, Any]) -> int | None:
    """vLLM's ``prompt_logprobs``: 0-20 alternatives per prompt token, with the whole
    answer only (as vLLM, not in a stream)."""
    value = integer(body, "prompt_logprobs", *INTEGERS["prompt_logprobs"])
    if value is not None and body.get("stream"):
        raise RequestError(
            "prompt_logprobs come with the whole answer only: not with stream=true",
            param="prompt_logprobs",
        )
    return value


def completion_prompts(prompt: Any) -> list[str | list[int]]:
    """Every completions prompt shape as a list of prompts (texts or token-id lists; an
    empty one is refused where it is encoded, as any empty prompt)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt:
        for i, item in enumerate(prompt):
            if not (isinstance(item, str) or (isinstance(item, list) and all(map(_is_id, item)))):
                raise RequestError(
                    f"prompt {i} must be a string or a list of token ids", param="prompt"
                )
        return list(prompt)
    raise RequestError(
        "prompt must be a non-empty string, list of strings, list of token ids or list "
        f"of token-id lists, got {prompt!r:.80}",
        param="prompt",
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_PREDICTION_SHAPE = (
    'prediction must be {"type": "content", "content": a string or a list of '
    '{"type": "text", "text": ...} parts}'
)


def prediction_text(value: Any) -> str | None:
    """The predicted text of a chat body's ``prediction`` field (None when there is
    none), or a 400 naming ``prediction``."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("type") != "content":
        raise RequestError(f"{_PREDICTION_SHAPE}, got {value!r:.80}", param="prediction")
    content = value.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else None
    if parts is None or not all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in parts
    ):
        raise RequestError(f"{_PREDICTION_SHAPE}, got content {content!r:.80}", param="prediction")
    return "".join(p["text"] for p in parts)
