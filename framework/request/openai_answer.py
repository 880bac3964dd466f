"""The parts of an OpenAI answer: its id, finish reason, assistant message, choice, usage
and the ``chat.completion`` / ``text_completion`` object around them.

Built here for both applications that answer OpenAI requests: the server's responses
(``ortgen.serve.responses``, which adds streaming and logprobs) and an OpenAI batch job's
output lines (``ortgen.jobs.openai_batch``), so a body reads the same from either.
"""

from __future__ import annotations

import uuid
from typing import Any

__all__ = [
    "assistant_message",
    "completion_choice",
    "completion_id",
    "completion_object",
    "finish_reason",
    "object_name",
    "usage",
]


def finish_reason(reason: str) -> str:
    """ortgen's end reason as OpenAI's: the token limit (and ``max_time``) is "length",
    an answer that ended with whole tool calls "tool_calls", everything else that ended
    the text on purpose (EOS, a stop string, a plugin's stopping criterion) "stop"."""
    if reason == "tool_calls":
        return reason
    return "length" if reason in ("length", "time") else "stop"


def completion_id(chat: bool) -> str:
    """A new answer's id: ``chatcmpl-...`` for a chat, ``cmpl-...`` for a completion."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def object_name(chat: bool, *, chunk: bool = False) -> str:
    """The ``object`` of a whole answer or of a stream chunk."""
    if chat:
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def assistant_message(
    content: str | None,
    *,
    reasoning_content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    thought: bool = False,
) -> dict[str, Any]:
    """A chat answer's message: its content, its thought (``reasoning_content``, there
    whenever the model could think: ``thought``) and its tool calls (when it made some)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thought or reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def completion_choice(
    index: int,
    answer: str | dict[str, Any],
    reason: str,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One choice of a whole answer: ``answer`` is a chat's message, or a completion's
    text; ``reason`` is OpenAI's finish reason."""
    item: dict[str, Any] = {"index": index}
    item["message" if isinstance(answer, dict) else "text"] = answer
    item["logprobs"] = logprobs
    item["finish_reason"] = reason
    return item


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_object(
    chat: bool,
    answer_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    counted: dict[str, int],
) -> dict[str, Any]:
    """The whole (non-streamed) answer: a ``chat.completion`` or ``text_completion``."""
    head = {"id": answer_id, "object": object_name(chat), "created": created, "model": model}
    return {**head, "choices": choices, "usage": counted}
