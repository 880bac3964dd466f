"""``/tokenize`` and ``/detokenize``: what a client needs to count and check tokens
against the served model, in the request shapes vLLM's server uses.

- ``/tokenize``: ``{"prompt": "text", "add_special_tokens": true}``, or
  ``{"messages": [...], "add_generation_prompt": true, "continue_final_message": false,
  "tools": [...]}`` rendered through the model's chat template exactly as a chat request
  is (``TextGenerator.chat_prompt``); ``"return_token_strs": true`` adds the vocabulary
  pieces. The answer: ``{"count", "max_model_len", "tokens"}``.
- ``/detokenize``: ``{"tokens": [ids]}`` to ``{"prompt": "text"}`` (special tokens
  kept, as vLLM does).

``model`` is accepted and not checked, as on the generation routes of a one-model server.
Every bad body is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api import TextGenerator
from ..errors import OrtgenError
from .errors import RequestError

__all__ = ["detokenize_body", "tokenize_body"]

_TOKENIZE_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "add_special_tokens",
        "add_generation_prompt",
        "continue_final_message",
        "tools",
        "return_token_strs",
    }
)
_DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def tokenize_body(gen: TextGenerator, body: Mapping[str, Any]) -> list[int]:
    """The token ids ``body`` asks for (see the module doc)."""
    _known(body, _TOKENIZE_FIELDS)
    for flag in (
        "add_special_tokens",
        "add_generation_prompt",
        "continue_final_message",
        "return_token_strs",
    ):
        if flag in body and not isinstance(body[flag], bool):
            raise RequestError(f"{flag} must be true or false", param=flag)
    has_prompt, has_messages = "prompt" in body, "messages" in body
    if has_prompt == has_messages:
        raise RequestError("give either prompt (text) or messages (a conversation)")
    tokenizer = gen.tokenizer
    assert tokenizer is not None  # a server model has one (ServerState checks)
    if has_prompt:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string", param="prompt")
        for field in ("add_generation_prompt", "continue_final_message", "tools"):
            if field in body:
                raise RequestError(f"{field} goes with messages, not prompt", param=field)
        return tokenizer.encode(prompt, add_special_tokens=body.get("add_special_tokens", True))
    if body.get("add_special_tokens"):
        raise RequestError(
            "add_special_tokens goes with prompt: the chat template writes the special "
            "tokens of a conversation",
            param="add_special_tokens",
        )
    options: dict[str, Any] = {}
    for field in ("add_generation_prompt", "continue_final_message"):
        if field in body:
            options[field] = body[field]
    try:
        return gen.chat_prompt(body["messages"], tools=body.get("tools"), **options)
    except OrtgenError as exc:  # the field it names: messages[2], tools, ...
        raise RequestError(str(exc), param=getattr(exc, "field", None) or "messages") from None


def detokenize_body(gen: TextGenerator, body: Mapping[str, Any]) -> str:
    """The text of ``body["tokens"]``."""
    _known(body, _DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or any(
        isinstance(t, bool) or not isinstance(t, int) for t in tokens
    ):
        raise RequestError("tokens must be a list of token ids (integers)", param="tokens")
    vocab = gen.model.signature.vocab_size
    outside = [t for t in tokens if not 0 <= t < vocab]
    if outside:
        raise RequestError(
            f"tokens has ids outside the vocabulary [0, {vocab}): {outside[:5]}", param="tokens"
        )
    tokenizer = gen.tokenizer
    assert tokenizer is not None
    return tokenizer.decode(tokens, skip_special_tokens=False)


def _known(body: Mapping[str, Any], fields: frozenset[str]) -> None:
    unknown = sorted(set(body) - fields)
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r}; this route takes {', '.join(sorted(fields))}",
            param=unknown[0],
        )
