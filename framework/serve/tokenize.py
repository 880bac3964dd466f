"""``/tokenize`` and ``/detokenize``: what a client needs to count and check tokens
against the served model, in the request shapes vLLM's server uses.

- ``/tokenize``: ``{"prompt": "text", "add_special_tokens": true}``, or
  ``{"messages": [...], "add_generation_prompt": true, "continue_final_message": false,
  "tools": [...]}`` rendered through the model's chat template exactly as a chat request
  is (the one request builder, ``build_chat``: for a template that knows no tools, the
  chat format's tool prompt and earlier calls as the model wrote them);
  ``"return_token_strs": true`` adds the vocabulary pieces. The answer: ``{"count",
  "max_model_len", "tokens"}``.
- ``/detokenize``: ``{"tokens": [ids]}`` to ``{"prompt": "text"}`` (special tokens
  kept, as vLLM does).
- ``GET /tokenizer_info``: the tokenizer's configuration in vLLM's shape (vLLM answers
  with transformers' ``init_kwargs``: ``tokenizer_config.json`` less its file paths, with
  ``tokenizer_class`` and the chat template): the folder's ``tokenizer_config.json``, with
  what ortgen resolved and runs with laid over it (special tokens, chat template,
  ``clean_up_tokenization_spaces``; ``model_max_length`` the model's context when the
  file has none). lm-evaluation-harness's remote tokenizer reads ``eos_token``,
  ``bos_token``, ``pad_token`` and ``chat_template`` from it.

``model`` is accepted and not checked, as on the generation routes of a one-model server.
Every bad body is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api import TextGenerator
from ..errors import ModelLoadError, OrtgenError
from ..request import build_chat
from ..request.openai_fields import COMMON_FIELDS
from ..text.resolved_tokenizer import RESOLVED_FILE
from ..util.jsonfile import read_json_object
from .errors import RequestError

__all__ = [
    "DETOKENIZE_ANSWER",
    "DETOKENIZE_REQUEST",
    "TOKENIZER_INFO",
    "TOKENIZE_ANSWER",
    "TOKENIZE_REQUEST",
    "detokenize_body",
    "tokenize_body",
    "tokenizer_info",
]

#: tokenizer_config.json entries that name files of the folder (vLLM drops them too)
_FILE_KEYS = ("vocab_file", "merges_file", "tokenizer_file", "name_or_path")

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

# the request and answer schemas of /openapi.json
TOKENIZE_REQUEST = {
    "type": "object",
    "description": "either prompt (text) or messages (a conversation, through the chat "
    "template as a chat request sees it)",
    "properties": {
        "model": COMMON_FIELDS["model"],
        "prompt": {"type": "string"},
        "messages": {"type": "array", "items": {"type": "object"}, "minItems": 1},
        "add_special_tokens": {"type": "boolean"},
        "add_generation_prompt": {"type": "boolean"},
        "continue_final_message": {"type": "boolean"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "return_token_strs": {"type": "boolean"},
    },
    "additionalProperties": False,
}
TOKENIZE_ANSWER = {
    "type": "object",
    "required": ["count", "max_model_len", "tokens"],
    "properties": {
        "count": {"type": "integer", "minimum": 0},
        "max_model_len": {"type": ["integer", "null"]},
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "token_strs": {"type": "array", "items": {"type": ["string", "null"]}},
    },
}
DETOKENIZE_REQUEST = {
    "type": "object",
    "required": ["tokens"],
    "properties": {
        "model": COMMON_FIELDS["model"],
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    },
    "additionalProperties": False,
}
DETOKENIZE_ANSWER = {
    "type": "object",
    "required": ["prompt"],
    "properties": {"prompt": {"type": "string"}},
}
TOKENIZER_INFO = {
    "type": "object",
    "required": ["tokenizer_class"],
    "description": "vLLM's shape: the folder's tokenizer_config.json less file paths, with "
    "the special tokens, chat template and clean-up flag ortgen runs with",
    "properties": {
        "tokenizer_class": {"type": "string"},
        "bos_token": {"type": "string"},
        "eos_token": {"type": "string"},
        "pad_token": {"type": "string"},
        "unk_token": {"type": "string"},
        "chat_template": {"type": "string"},
        "model_max_length": {"type": ["integer", "null"]},
        "clean_up_tokenization_spaces": {"type": "boolean"},
    },
}


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
    try:  # the one request builder: a template that knows no tools gets the chat
        # format's tool prompt and the calls in the history as the model wrote them
        chat = build_chat(
            gen, body["messages"], {}, tools=body.get("tools"), template_kwargs=options
        )
        return chat.prompt
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


def tokenizer_info(gen: TextGenerator) -> dict[str, Any]:
    """``GET /tokenizer_info`` of ``gen`` (see the module doc)."""
    tokenizer = gen.tokenizer
    assert tokenizer is not None
    folder = gen.path
    config = read_json_object(
        folder / "tokenizer_config.json", error=ModelLoadError, missing_ok=True
    )
    resolved = read_json_object(folder / RESOLVED_FILE, error=ModelLoadError, missing_ok=True)
    info: dict[str, Any] = {k: _plain(v) for k, v in config.items() if k not in _FILE_KEYS}
    named = resolved.get("tokenizer_class") or config.get("tokenizer_class")
    info["tokenizer_class"] = str(named or "PreTrainedTokenizerFast")
    info.update(tokenizer.special_tokens_map)
    info["clean_up_tokenization_spaces"] = tokenizer.clean_up_tokenization_spaces
    if not isinstance(info.get("model_max_length"), int):
        info["model_max_length"] = gen.model.max_context
    template = tokenizer.chat_template
    if template is not None:
        info["chat_template"] = template
    return info


def _plain(value: Any) -> Any:
    """A tokenizer_config.json value as vLLM shows it: a serialised ``AddedToken``
    (``{"content": ..., ...}``) as its text, in lists and objects too."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str):
            return value["content"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _known(body: Mapping[str, Any], fields: frozenset[str]) -> None:
    unknown = sorted(set(body) - fields)
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r}; this route takes {', '.join(sorted(fields))}",
            param=unknown[0],
        )
