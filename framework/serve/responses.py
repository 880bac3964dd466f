"""Engine pieces out, OpenAI responses and stream chunks in: the answer side of the server.

A :class:`Choice` gathers one row's pieces (text, tokens, logprobs, finish reason); the
builders here turn choices into OpenAI's shapes. Kept apart from the request side
(``openai_api``) because both directions are long enough on their own.

Token strings for logprobs come from :class:`TokenText`: the token decoded alone, and its
exact bytes when the tokenizer is byte-level BPE (a token that is part of a UTF-8
character decodes to U+FFFD, but its ``bytes`` are still the real ones).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from ..chat_formats.reply import ReplyPlan, ReplyStream, read_reply
from ..request.openai_answer import (
    assistant_message,
    completion_choice,
    completion_id,
    completion_object,
    finish_reason,
    object_name,
    usage,
)
from ..request.outputs import StreamPiece
from ..text import Tokenizer
from .openai_api import ParsedRequest

#: what a non-finite logprob becomes: JSON has no -inf (vLLM does the same)
FLOOR = -9999.0


def _logprob(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


class TokenText:
    """Token strings and bytes for logprobs, cached per id."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        decoder = tokenizer.backend.decoder
        self._byte_level = decoder is not None and '"ByteLevel"' in decoder.__getstate__().decode()
        self._unbyte = {c: b for b, c in _bytes_to_unicode().items()}
        self._tokens: dict[int, str] = {}  # one per server; at most the vocabulary

    def token(self, token_id: int) -> str:
        text = self._tokens.get(token_id)
        if text is None:
            text = self._tokens[token_id] = self.tokenizer.decode(
                [token_id], skip_special_tokens=False
            )
        return text

    def bytes(self, token_id: int) -> list[int]:
        if self._byte_level and token_id not in self.tokenizer.special_ids:
            piece = self.tokenizer.id_to_token(token_id) or ""
            if piece and all(c in self._unbyte for c in piece):
                return [self._unbyte[c] for c in piece]
        return list(self.token(token_id).encode("utf-8"))


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-character table, which byte-level BPE vocabularies use."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Choice:
    """One row's pieces as they arrive."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.text: list[str] = []
        self.pieces: list[StreamPiece] = []
        self.finish_reason: str | None = None  # ortgen's reason; "error" when the row failed
        self.offset = 0  # completions' text_offset of the next token
        self.reply: ReplyStream | None = None  # a streamed chat answer read as it comes

    def add(self, piece: StreamPiece) -> None:
        if piece.finish_reason == "error":
            self.finish_reason = "error"
            return
        self.pieces.append(piece)
        self.text.append(piece.text)
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None


# -- logprobs --------------------------------------------------------------------------


def chat_logprobs(pieces: list[StreamPiece], words: TokenText) -> dict[str, Any]:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        return {
            "token": words.token(token),
            "logprob": _logprob(logprob),
            "bytes": words.bytes(token),
        }

    content = []
    for piece in pieces:
        item = entry(piece.token, piece.logprob if piece.logprob is not None else 0.0)
        item["top_logprobs"] = [entry(t, lp) for t, lp in piece.top_logprobs or ()]
        content.append(item)
    return {"content": content}


def completion_logprobs(
    pieces: list[StreamPiece], words: TokenText, choice: Choice
) -> dict[str, Any]:
    """The legacy shape: ``tokens``, ``token_logprobs``, ``top_logprobs`` (the top N plus
    the chosen token, as OpenAI) and ``text_offset`` (each token's offset in the text,
    from the tokens' own strings, continuing across stream chunks via ``choice``)."""
    out: dict[str, Any] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for piece in pieces:
        token = words.token(piece.token)
        logprob = _logprob(piece.logprob if piece.logprob is not None else 0.0)
        top = {words.token(t): _logprob(lp) for t, lp in piece.top_logprobs or ()}
        top.setdefault(token, logprob)
        out["tokens"].append(token)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(choice.offset)
        choice.offset += len(token)
    return out


# -- whole responses -------------------------------------------------------------------


class Answer:
    """The fixed fields of one response and its chunks: id, object, created, model."""

    def __init__(self, request: ParsedRequest, model: str, words: TokenText) -> None:
        self.request = request
        self.model = model
        self.words = words
        self.created = int(time.time())
        self.id = completion_id(request.chat)

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, choices: list[Choice]) -> dict[str, int]:
        """Generated tokens count every token a row produced, the EOS that ended it too
        (as ``GenerationOutput.tokens``); each prompt counts once, whatever ``n`` is."""
        return usage(self.request.prompt_tokens, sum(len(c.pieces) for c in choices))

    def _logprobs(self, pieces: list[StreamPiece], choice: Choice) -> dict[str, Any] | None:
        if not self.request.logprobs:
            return None
        if self.request.chat:
            return chat_logprobs(pieces, self.words)
        return completion_logprobs(pieces, self.words, choice)

    def _message(self, choice: Choice) -> tuple[dict[str, Any], str]:
        """A chat choice's message (content, the thought and tool calls when there are)
        and its OpenAI finish reason."""
        text = "".join(choice.text)
        plan = self.request.reply_plan
        if plan is None:
            return assistant_message(text), finish_reason(choice.finish_reason or "stop")
        reply = read_reply(text, plan, choice.finish_reason or "stop")
        message = assistant_message(
            reply.content,
            reasoning_content=reply.reasoning_content,
            tool_calls=reply.tool_calls,
            thought=plan.tags is not None,
        )
        return message, finish_reason(reply.finish_reason)

    def full(self, choices: list[Choice]) -> dict[str, Any]:
        """The non-streaming response."""
        out = []
        for choice in sorted(choices, key=lambda c: c.index):
            answer: str | dict[str, Any] = "".join(choice.text)
            reason = finish_reason(choice.finish_reason or "stop")
            if self.request.chat:
                answer, reason = self._message(choice)
            logprobs = self._logprobs(choice.pieces, choice)
            out.append(completion_choice(choice.index, answer, reason, logprobs))
        chat = self.request.chat
        return completion_object(chat, self.id, self.created, self.model, out, self.usage(choices))

    # -- streaming ---------------------------------------------------------------------

    def _chunk(self, item: dict[str, Any]) -> dict[str, Any]:
        return {**self._head(object_name(self.request.chat, chunk=True)), "choices": [item]}

    def opening(self, choice: Choice) -> dict[str, Any] | None:
        """Chat streams start each choice with its role (as OpenAI)."""
        if not self.request.chat:
            return None
        delta = {"role": "assistant", "content": ""}
        return self._chunk(
            {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}
        )

    def chunks(self, choice: Choice, piece: StreamPiece) -> list[dict[str, Any]]:
        """The chunks one piece adds to the stream. A chat answer that is read back
        (thought, calls: ``ReplyPlan``) streams as ``ortgen.chat_formats.reply`` reads it:
        ``reasoning_content``, ``content`` and ``tool_calls`` deltas as each is certain;
        the logprobs of a piece ride on its first chunk, or on a chunk of their own."""
        plan = self.request.reply_plan
        if plan is None:
            chunk = self.piece(choice, piece)
            return [chunk] if chunk is not None else []
        return self._read_chunks(choice, piece, plan)

    def _read_chunks(
        self, choice: Choice, piece: StreamPiece, plan: ReplyPlan
    ) -> list[dict[str, Any]]:
        if choice.reply is None:
            choice.reply = ReplyStream(plan)
        deltas = choice.reply.feed(piece.text) if piece.text else []
        reason = None
        if piece.finish_reason is not None:
            more, ended = choice.reply.finish(choice.finish_reason or piece.finish_reason)
            deltas.extend(more)
            reason = finish_reason(ended)
        logprobs = self._logprobs([piece], choice)
        if not deltas and (logprobs is not None or reason is not None):
            deltas.append({})
        out = []
        for delta in deltas:
            item = {"index": choice.index, "delta": delta, "logprobs": logprobs}
            item["finish_reason"] = None
            logprobs = None
            out.append(item)
        if out:
            out[-1]["finish_reason"] = reason
        return [self._chunk(item) for item in out]

    def piece(self, choice: Choice, piece: StreamPiece) -> dict[str, Any] | None:
        """The chunk for one piece (None when it adds nothing: text held back and no
        logprobs asked for); the last piece carries the finish reason."""
        done = piece.finish_reason is not None
        if not piece.text and not self.request.logprobs and not done:
            return None
        item: dict[str, Any] = {"index": choice.index}
        if self.request.chat:
            item["delta"] = {"content": piece.text} if piece.text or not done else {}
        else:
            item["text"] = piece.text
        item["logprobs"] = self._logprobs([piece], choice)
        reason = piece.finish_reason
        item["finish_reason"] = finish_reason(reason) if reason is not None else None
        return self._chunk(item)

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        """``stream_options.include_usage``: the last chunk, usage and no choices."""
        obj = object_name(self.request.chat, chunk=True)
        return {**self._head(obj), "choices": [], "usage": self.usage(choices)}
