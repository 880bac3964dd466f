"""Engine pieces out, OpenAI responses and stream chunks in: the answer side of the server.

A :class:`Choice` gathers one row's pieces (text, tokens, logprobs, finish reason); the
builders here turn choices into OpenAI's shapes. Kept apart from the request side
(``openai_api``) because both directions are long enough on their own.

Token strings for logprobs come from :class:`TokenText`: the token decoded alone, and its
exact bytes when the tokenizer is byte-level BPE (a token that is part of a UTF-8
character decodes to U+FFFD, but its ``bytes`` are still the real ones). The prompt in
an answer (completions' ``echo``, ``max_tokens: 0``, vLLM's ``prompt_logprobs``) is
shaped by ``echo``.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from ..chat_formats.reply import ReplyPlan, ReplyStream, read_reply
from ..request.openai_answer import (
    assistant_message,
    completion_id,
    finish_reason,
    object_name,
    usage,
)
from ..request.outputs import StreamPiece, TokenLogprob
from ..text import Tokenizer
from .echo import FLOOR, joined, legacy_prompt_logprobs, vllm_prompt_logprobs
from .openai_api import ParsedRequest, Row


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
        #: the prompt scored (its first piece's ``prompt_logprobs``), when it was asked
        self.prompt: list[TokenLogprob | None] | None = None
        self.echoed = False  # completions' echo: the prompt went out already

    def add(self, piece: StreamPiece) -> None:
        if piece.finish_reason == "error":
            self.finish_reason = "error"
            return
        if piece.prompt_logprobs is not None:
            self.prompt = piece.prompt_logprobs
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
        self._rows: dict[int, Row] = {row.index: row for row in request.rows}

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, choices: list[Choice]) -> dict[str, int]:
        """Generated tokens count every token a row produced, the EOS that ended it too
        (as ``GenerationOutput.tokens``); each prompt counts once, whatever ``n`` is."""
        generated = 0 if self.request.score_only else sum(len(c.pieces) for c in choices)
        return usage(self.request.prompt_tokens, generated)

    def _logprobs(
        self, pieces: list[StreamPiece], choice: Choice, echoed: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The logprobs of ``pieces``; ``echoed``: the prompt's, which come first."""
        if not self.request.logprobs:
            return None
        if self.request.chat:
            return chat_logprobs(pieces, self.words)
        answer = completion_logprobs(pieces, self.words, choice)
        return joined(echoed, answer) if echoed is not None else answer

    def _echo(self, choice: Choice) -> tuple[str, dict[str, Any] | None]:
        """A completions choice's prompt, the first time it is asked for with ``echo``:
        its text and (with ``logprobs``) its logprobs; ("", None) otherwise."""
        row = self._rows.get(choice.index)
        if not self.request.echo or choice.echoed or row is None or row.echo_text is None:
            return "", None
        choice.echoed = True
        scored = None
        if self.request.logprobs and choice.prompt is not None:
            scored = legacy_prompt_logprobs(
                choice.prompt, row.prompt, self.words, self.request.top_logprobs, choice
            )
        return row.echo_text, scored

    def _answered(self, pieces: list[StreamPiece]) -> list[StreamPiece]:
        """The pieces an answer shows: none when ``max_tokens`` was 0 (the one token
        picked is dropped)."""
        return [] if self.request.score_only else pieces

    def _finish(self, reason: str | None) -> str:
        return "length" if self.request.score_only else finish_reason(reason or "stop")

    def _prompt_logprobs(self, choice: Choice) -> list[Any] | None:
        """vLLM's ``prompt_logprobs`` of ``choice``'s prompt (``echo``'s module doc)."""
        top = self.request.prompt_logprobs
        if top is None or choice.prompt is None:
            return None
        return vllm_prompt_logprobs(choice.prompt, self.words, top)

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
        ordered = sorted(choices, key=lambda c: c.index)
        for choice in ordered:
            item: dict[str, Any] = {"index": choice.index}
            if self.request.chat:
                item["message"], reason = self._message(choice)
                item["logprobs"] = self._logprobs(choice.pieces, choice)
            else:
                prompt, echoed = self._echo(choice)
                pieces = self._answered(choice.pieces)
                item["text"] = prompt + "".join(p.text for p in pieces)
                item["logprobs"] = self._logprobs(pieces, choice, echoed)
                reason = self._finish(choice.finish_reason)
                if self.request.prompt_logprobs is not None:
                    item["prompt_logprobs"] = self._prompt_logprobs(choice)
            item["finish_reason"] = reason
            out.append(item)
        obj = "chat.completion" if self.request.chat else "text_completion"
        answer = {**self._head(obj), "choices": out, "usage": self.usage(choices)}
        if self.request.chat and self.request.prompt_logprobs is not None and ordered:
            answer["prompt_logprobs"] = self._prompt_logprobs(ordered[0])  # one prompt
        return answer

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
        prompt, echoed = ("", None) if self.request.chat else self._echo(choice)
        pieces = [piece] if self.request.chat else self._answered([piece])
        text = prompt + "".join(p.text for p in pieces)
        if not text and not self.request.logprobs and not done:
            return None
        item: dict[str, Any] = {"index": choice.index}
        if self.request.chat:
            item["delta"] = {"content": text} if text or not done else {}
            ended = piece.finish_reason
            reason = finish_reason(ended) if ended is not None else None
        else:
            item["text"] = text
            reason = self._finish(piece.finish_reason) if done else None
        item["logprobs"] = self._logprobs(pieces, choice, echoed)
        item["finish_reason"] = reason
        return self._chunk(item)

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        """``stream_options.include_usage``: the last chunk, usage and no choices."""
        obj = object_name(self.request.chat, chunk=True)
        return {**self._head(obj), "choices": [], "usage": self.usage(choices)}
