"""``POST /v1/responses`` out: one row's answer as OpenAI's Response object, whole or as
its typed stream events.

The answer is read by the one chat reader (``ortgen.chat_formats.reply``): whole with
``read_reply``, streamed from ``ReplyStream``'s deltas, so it splits into thought, text
and calls exactly as a chat completion's does. Here the split becomes output items, in
the order the model wrote them: a ``reasoning`` item (the thought, whole, as
``reasoning_text`` content: it is the model's own text, not a summary, so ``summary``
stays empty), a ``message`` item with
one ``output_text`` part, and one ``function_call`` item per call.

A stream announces each item when its first text is certain (``output_item.added``,
``content_part.added``), sends its text as deltas, and closes it (``*.done``) when the
next item starts or the answer ends; every event carries the next ``sequence_number``.
A stream cannot take back what it sent, so a call cut by ``max_output_tokens`` is
closed with status ``incomplete`` (the whole response leaves it out, as a chat
completion does), and the response itself is ``incomplete`` with
``incomplete_details.reason: "max_output_tokens"``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..chat_formats.reasoning import split_reasoning
from ..chat_formats.reply import ReplyPlan, ReplyStream, read_reply
from ..request.outputs import StreamPiece
from .responses import Choice, finish_reason
from .responses_api import ResponsesRequest

__all__ = ["ResponseBuilder", "ResponseEvents"]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


class ResponseBuilder:
    """The fixed fields of one response (id, times, model, the request's echo) and the
    whole Response object."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.request = request
        self.plan: ReplyPlan | None = request.chat.reply_plan
        self.model = model
        self.id = _id("resp")
        self.created_at = int(time.time())

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The Response object (OpenAI's shape; the fields the SDK's ``Response`` model
        requires, and the request's settings echoed)."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        done = status in ("completed", "incomplete")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "usage": usage if done else None,
            **self.request.echo,
        }

    def usage(self, choice: Choice) -> dict[str, Any]:
        """Tokens in and out (every token the row produced, its EOS too, as chat's
        ``completion_tokens``); ``reasoning_tokens`` those up to the thought's end.
        Cached prompt tokens are not counted per request: 0."""
        prompt = self.request.chat.prompt_tokens
        output = len(choice.pieces)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": self._reasoning_tokens(choice)},
            "total_tokens": prompt + output,
        }

    def _reasoning_tokens(self, choice: Choice) -> int:
        """Pieces up to the one whose text closes the thought (all of them when it never
        closed; 0 when the model did not think)."""
        if self.plan is None or self.plan.tags is None:
            return 0
        text = "".join(choice.text)
        if split_reasoning(text, self.plan.tags, opened=self.plan.opened)[0] is None:
            return 0
        close, seen = self.plan.tags[1], ""
        for count, piece in enumerate(choice.pieces, 1):
            seen += piece.text
            if close in seen:
                return count
        return len(choice.pieces)

    def full(self, choice: Choice) -> dict[str, Any]:
        """The whole response of a finished row."""
        text = "".join(choice.text)
        reason = choice.finish_reason or "stop"
        reasoning: str | None
        content: str | None
        calls: list[dict[str, Any]]
        if self.plan is None:
            reasoning, content, calls = None, text, []
        else:
            reply = read_reply(text, self.plan, reason)
            reasoning, content, calls = reply.reasoning_content, reply.content, reply.tool_calls
            reason = reply.finish_reason
        cut = finish_reason(reason) == "length"
        # what the limit cut: the text being written (a thought never closed leaves the
        # message empty); a cut call is left out, so the calls kept are whole
        message_cut = cut and not calls
        output: list[dict[str, Any]] = []
        if reasoning:
            thought_cut = message_cut and not content
            output.append(self._reasoning_item(reasoning, thought_cut))
        if content is not None:
            output.append(self._message_item(content, message_cut))
        for call in calls:
            function = call["function"]
            output.append(
                {
                    "id": _id("fc"),
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                    "status": "completed",
                }
            )
        status = "incomplete" if cut else "completed"
        return self.response(status, output, self.usage(choice))

    def _reasoning_item(self, text: str, cut: bool) -> dict[str, Any]:
        return {
            "id": _id("rs"),
            "type": "reasoning",
            "summary": [],
            "content": [_reasoning_text(text)],
            "status": "incomplete" if cut else "completed",
        }

    def _message_item(self, text: str, cut: bool) -> dict[str, Any]:
        return {
            "id": _id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "incomplete" if cut else "completed",
            "content": [_output_text(text)],
        }


class ResponseEvents:
    """One streamed response: ``opening()``, then ``feed(choice, piece)`` per piece (the
    last piece finishes the response), each returning the events (payload dicts, each
    with its ``type`` and ``sequence_number``) it adds; see the module doc."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        self.reply = ReplyStream(builder.plan) if builder.plan is not None else None
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items closed so far
        self.item: dict[str, Any] | None = None  # the item being written
        self.text = ""  # its text (or a call's arguments) so far
        self.events: list[dict[str, Any]] = []

    def _emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1

    def _take(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def opening(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress`` (no output yet)."""
        for kind in ("response.created", "response.in_progress"):
            self._emit(kind, response=self.builder.response("in_progress", []))
        return self._take()

    def error(self, message: str, code: str | None, param: str | None) -> dict[str, Any]:
        """The ``error`` event that ends a stream whose row failed (or the drain cut it)."""
        self._emit("error", message=message, code=code, param=param)
        return self._take()[0]

    def feed(self, choice: Choice, piece: StreamPiece) -> list[dict[str, Any]]:
        if self.reply is None:
            deltas = [{"content": piece.text}] if piece.text else []
        else:
            deltas = self.reply.feed(piece.text) if piece.text else []
        reason = None
        if piece.finish_reason is not None:
            reason = choice.finish_reason or piece.finish_reason
            if self.reply is not None:
                more, reason = self.reply.finish(reason)
                deltas.extend(more)
        for delta in deltas:
            self._delta(delta)
        if reason is not None:
            self._finish(choice, finish_reason(reason) == "length")
        return self._take()

    def _delta(self, delta: dict[str, Any]) -> None:
        if "reasoning_content" in delta:
            self._write("reasoning", delta["reasoning_content"])
        if "content" in delta:
            self._write("message", delta["content"])
        for fragment in delta.get("tool_calls", ()):
            function = fragment.get("function", {})
            if fragment.get("id"):  # a new call: its id and name, arguments to come
                self._open_call(fragment["id"], function.get("name", ""))
            if function.get("arguments"):
                self._write("function_call", function["arguments"])

    def _write(self, kind: str, text: str) -> None:
        if not text:
            return
        if self.item is None or self.item["type"] != kind:
            self._open(kind)
        assert self.item is not None
        self.text += text
        at = {"item_id": self.item["id"], "output_index": len(self.output)}
        if kind == "reasoning":
            self._emit("response.reasoning_text.delta", **at, content_index=0, delta=text)
        elif kind == "message":
            self._emit("response.output_text.delta", **at, content_index=0, delta=text, logprobs=[])
        else:
            self._emit("response.function_call_arguments.delta", **at, delta=text)

    def _open(self, kind: str) -> None:
        self._close("completed")
        if kind == "reasoning":
            item = self.builder._reasoning_item("", False)
            part = _reasoning_text("")
        else:
            item = self.builder._message_item("", False)
            part = _output_text("")
        item.update(status="in_progress", content=[])
        self._added(item)
        self._emit(
            "response.content_part.added",
            item_id=item["id"],
            output_index=len(self.output),
            content_index=0,
            part=part,
        )

    def _open_call(self, call_id: str, name: str) -> None:
        self._close("completed")
        self._added(
            {
                "id": _id("fc"),
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
        )

    def _added(self, item: dict[str, Any]) -> None:
        self.item, self.text = item, ""
        self._emit("response.output_item.added", output_index=len(self.output), item=dict(item))

    def _close(self, status: str) -> None:
        """The ``*.done`` events of the item being written, which joins the output."""
        item = self.item
        if item is None:
            return
        at = {"item_id": item["id"], "output_index": len(self.output)}
        text = self.text
        if item["type"] == "function_call":
            self._emit("response.function_call_arguments.done", **at, arguments=text)
            item = {**item, "arguments": text, "status": status}
        else:
            if item["type"] == "reasoning":
                part = _reasoning_text(text)
                self._emit("response.reasoning_text.done", **at, content_index=0, text=text)
            else:
                part = _output_text(text)
                self._emit(
                    "response.output_text.done", **at, content_index=0, text=text, logprobs=[]
                )
            self._emit("response.content_part.done", **at, content_index=0, part=part)
            item = {**item, "content": [part], "status": status}
        self._emit("response.output_item.done", output_index=len(self.output), item=item)
        self.output.append(item)
        self.item, self.text = None, ""

    def _finish(self, choice: Choice, cut: bool) -> None:
        """Close the last item (cut: ``incomplete``), give an answer that wrote nothing
        but a thought its empty message (as the whole response has), and end with
        ``response.completed`` or ``response.incomplete``."""
        status = "incomplete" if cut else "completed"
        self._close(status)
        if not any(item["type"] in ("message", "function_call") for item in self.output):
            self._open("message")
            self._close(status)
        response = self.builder.response(status, self.output, self.builder.usage(choice))
        self._emit(f"response.{status}", response=response)
