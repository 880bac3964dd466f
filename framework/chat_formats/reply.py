"""A chat answer read back: thought, text and tool calls, whole or as it streams.

One reader for every way an answer leaves ortgen (``gen.chat``, ``ortgen chat``, a job's
``messages`` rows, the server's replies and streams), so the same model output splits
the same way everywhere. The thought is split off first (``reasoning``), then the
request's chat format reads the answer (``ChatFormat.parse``); the calls kept are the
whole ones, up to the first that repeats an earlier call word for word (a small model
looping) and at most ``ToolSpec.max_calls``.

A stream sends what is certain as soon as it is: reasoning and content as written
(holding back what may still be a tag), each call's id and name once the name is
whole and not a repeat so far, then its arguments as they are written. A call cut by
the token limit was partly sent already: the stream's finish reason (``length``) says
so, and the whole reply leaves the cut call out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..protocols.chat_formats import CallDraft, ChatFormat, ToolSpec
from .kit import call_id
from .reasoning import ReasoningStream, split_reasoning

__all__ = ["Reply", "ReplyPlan", "ReplyStream", "read_reply"]

#: finish reasons of an answer cut short: its last call (if any) may be cut too, so the
#: reason stays (OpenAI's "length") and the whole calls before are kept
_CUT = ("length", "time")


@dataclass(frozen=True)
class ReplyPlan:
    """How to read one chat request's answers (the request builder makes it)."""

    format_name: str
    format: ChatFormat
    #: the calls the answer may make; None: the answer is text (no calls read)
    spec: ToolSpec | None = None
    #: the thought's tags when the model may think, else None
    tags: tuple[str, str] | None = None
    #: the prompt ended inside a thought (the answer starts thinking)
    opened: bool = False
    #: the answer is JSON to parse (``response_format``, ``json_schema``, ``json_object``)
    json_answer: bool = False

    @property
    def calls_allowed(self) -> bool:
        return self.spec is not None


@dataclass
class Reply:
    """One row's answer: ``content`` (None when the answer is only calls), the thought,
    the calls in OpenAI's shape and ortgen's finish reason (``"tool_calls"`` when the
    answer ended with whole calls)."""

    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"


def read_reply(text: str, plan: ReplyPlan, finish_reason: str) -> Reply:
    """``text`` (a row's whole output) as a :class:`Reply`."""
    reasoning, answer = _split(text, plan)
    if plan.spec is None:
        return Reply(answer, reasoning, [], finish_reason)
    parsed = plan.format.parse(answer, final=True)
    drafts, cut = kept_calls(parsed.calls, plan.spec)
    calls = [openai_call(call_id(), d.name or "", d.arguments) for d in drafts]
    content = parsed.content or None
    if calls and not cut and finish_reason not in _CUT:
        finish_reason = "tool_calls"
    if content is None and not calls:
        content = ""
    return Reply(content, reasoning, calls, finish_reason)


def _split(text: str, plan: ReplyPlan) -> tuple[str | None, str]:
    if plan.tags is None:
        return None, text
    return split_reasoning(text, plan.tags, opened=plan.opened)


def kept_calls(drafts: Sequence[CallDraft], spec: ToolSpec) -> tuple[list[CallDraft], bool]:
    """The whole calls an answer keeps (see module doc), and whether a call was cut
    before its end (the answer stopped inside it)."""
    kept: list[CallDraft] = []
    seen: set[tuple[str | None, str]] = set()
    for draft in drafts:
        if not draft.complete:
            return kept, True
        key = (draft.name, _canonical(draft.arguments))
        if key in seen or len(kept) == spec.max_calls:
            return kept, False
        seen.add(key)
        kept.append(draft)
    return kept, False


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments


def openai_call(identifier: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": identifier,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class ReplyStream:
    """One row's answer as OpenAI delta dicts, piece by piece (see module doc).

    ``feed(text)`` returns the deltas a piece of text adds (``{"reasoning_content": ...}``,
    ``{"content": ...}``, ``{"tool_calls": [...]}``); ``finish(reason)`` the last ones and
    the finish reason (``"tool_calls"`` when whole calls ended the answer). Each piece
    costs the format's parse of the answer so far only when calls may come.
    """

    def __init__(self, plan: ReplyPlan) -> None:
        self.plan = plan
        self._thought = (
            ReasoningStream(plan.tags, opened=plan.opened) if plan.tags is not None else None
        )
        self._answer: list[str] = []
        self._content_sent = 0
        self._calls: list[tuple[str, str, int]] = []  # (id, name, arguments sent)
        self._done_calls: list[CallDraft] = []
        self._stopped = False  # a repeat or the call limit: nothing more is sent

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self._thought is None:
            return self._answer_deltas([("answer", text)], final=False)
        return self._answer_deltas(self._thought.feed(text), final=False)

    def finish(self, finish_reason: str) -> tuple[list[dict[str, Any]], str]:
        pieces = self._thought.finish() if self._thought is not None else []
        deltas = self._answer_deltas(pieces, final=True)
        if self.plan.spec is None:
            return deltas, finish_reason
        parsed = self.plan.format.parse("".join(self._answer), final=True)
        kept, cut = kept_calls(parsed.calls, self.plan.spec)
        if kept and not cut and finish_reason not in _CUT:
            finish_reason = "tool_calls"
        return deltas, finish_reason

    def _answer_deltas(self, pieces: list[tuple[str, str]], *, final: bool) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        grew = False
        for kind, text in pieces:
            if kind == "reasoning":
                if text:
                    deltas.append({"reasoning_content": text})
            elif self.plan.spec is None:
                if text:
                    deltas.append({"content": text})
            elif text:
                self._answer.append(text)
                grew = True
        if self.plan.spec is not None and (grew or final):
            deltas.extend(self._call_deltas(final))
        return deltas

    def _call_deltas(self, final: bool) -> list[dict[str, Any]]:
        assert self.plan.spec is not None
        if self._stopped:
            return []
        parsed = self.plan.format.parse("".join(self._answer), final=final)
        deltas: list[dict[str, Any]] = []
        content = parsed.content
        if len(content) > self._content_sent and not self._calls:
            deltas.append({"content": content[self._content_sent :]})
            self._content_sent = len(content)
        for index, draft in enumerate(parsed.calls):
            if index == len(self._calls):
                if draft.name is None or not self._may_send(draft, parsed.calls[:index]):
                    break
                self._calls.append((call_id(), draft.name, 0))
                identifier = self._calls[index][0]
                head = openai_call(identifier, draft.name, "")
                deltas.append({"tool_calls": [{"index": index, **head}]})
            identifier, name, sent = self._calls[index]
            if len(draft.arguments) > sent:
                piece = {"index": index, "function": {"arguments": draft.arguments[sent:]}}
                deltas.append({"tool_calls": [piece]})
                self._calls[index] = (identifier, name, len(draft.arguments))
            if not draft.complete:
                break
        return deltas

    def _may_send(self, draft: CallDraft, before: Sequence[CallDraft]) -> bool:
        """Whether a new call may be sent: within the limit, and not (so far) a repeat
        of an earlier call; once it is whole and a repeat, the stream stops."""
        assert self.plan.spec is not None
        if len(before) >= self.plan.spec.max_calls:
            self._stopped = True
            return False
        earlier = [d for d in before if d.complete and d.name == draft.name]
        if not earlier:
            return True
        written = draft.arguments
        if draft.complete:
            repeat = any(_canonical(d.arguments) == _canonical(written) for d in earlier)
            self._stopped = repeat
            return not repeat
        return not any(d.arguments.startswith(written) for d in earlier)
