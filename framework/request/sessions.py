"""Conversations that keep their KV caches between turns: one (``ChatSession``), or
several answered together as a batch (``ChatBatch``).

Each turn goes through the one request builder (``ortgen.request.build_chat``, as
``gen.chat()``): the chat template renders the whole history (the template, not ortgen,
decides the text), with the tools and the turn's settings, and the answer is read back
by the request's plan (``ortgen.chat_formats.reply``): a thinking model's thought goes
to the assistant message's ``reasoning_content``, its calls to ``tool_calls``, and only
the answer after them is ``content``. When the tokens already held are a prefix of the
new prompt, only the new tokens are fed, so earlier turns are not prefilled again; when
they are not (a template that rewrites history, such as one that drops earlier thoughts,
or an answer that re-tokenizes differently), the turn starts afresh and the answer is
the same either way.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..chat_formats.reply import ReplyPlan, ReplyStream, read_reply
from ..errors import InputError
from ..structured.settings import CONSTRAINT_FIELDS
from .chat import ChatRequest, build_chat

if TYPE_CHECKING:
    from ..api import TextGenerator
    from ..loop.generate import Generation

#: what a session or a turn takes besides settings: ``gen.chat()``'s chat options
CHAT_OPTIONS = (
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "template_kwargs",
    "reasoning_effort",
)


def split_options(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``settings`` as (generation settings, chat options)."""
    options = {k: v for k, v in settings.items() if k in CHAT_OPTIONS}
    return {k: v for k, v in settings.items() if k not in CHAT_OPTIONS}, options


def chat_request(
    generator: TextGenerator,
    messages: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]] | None,
    options: Mapping[str, Any],
) -> ChatRequest:
    """One turn's request; its chat format is the one the settings resolve to (call,
    pipeline or model layer), else the template's."""
    chat_format = generator.resolve_config(settings).config.chat_format
    return build_chat(
        generator, messages, settings, tools=tools, chat_format=chat_format, **options
    )


def assistant_message(
    text: str, plan: ReplyPlan | None, finish_reason: str, call_ids: Sequence[str] = ()
) -> tuple[dict[str, Any], str]:
    """The history's assistant message for an answer's ``text`` and its finish reason:
    ``content``, plus ``reasoning_content`` when the model thought and ``tool_calls``
    when it called (their ids the ones already streamed, ``call_ids``)."""
    if plan is None:
        return {"role": "assistant", "content": text}, finish_reason
    reply = read_reply(text, plan, finish_reason)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning_content is not None:
        message["reasoning_content"] = reply.reasoning_content
    if reply.tool_calls:
        for call, identifier in zip(reply.tool_calls, call_ids, strict=False):
            call["id"] = identifier
        message["tool_calls"] = reply.tool_calls
    return message, reply.finish_reason


class ChatSession:
    """``messages`` so far, and the step object that holds their keys and values.

    ``tools`` and the chat options of ``gen.chat()`` (``tool_choice``,
    ``parallel_tool_calls``, ``response_format``, ``template_kwargs``,
    ``reasoning_effort``) may be given with the settings, for every turn or for one."""

    def __init__(
        self,
        generator: TextGenerator,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **settings: Any,
    ) -> None:
        settings, self.options = split_options(settings)
        generator.resolve_config(settings)  # a bad setting fails now, not at the first answer
        self.generator = generator
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.tools = tools
        self.settings = settings
        self.state: Generation | None = None
        self.reused_tokens = 0  # tokens of the last turn's prompt that were not fed again
        #: the last turn's finish reason as read back ("tool_calls" when it ended with
        #: whole calls); None while a turn runs and after one the caller stopped early
        self.finish_reason: str | None = None

    def send(self, content: str, **settings: Any) -> Generator[str, None, None]:
        """Add a user message and stream the answer's content (the text after a thought,
        without calls); the answer joins the history even when the caller stops early
        (the partial text is kept, read as far as it got)."""
        deltas = self.send_deltas(content, **settings)
        try:
            for delta in deltas:
                piece = delta.get("content")
                if piece:
                    yield piece
        finally:
            deltas.close()

    def send_deltas(self, content: str, **settings: Any) -> Generator[dict[str, Any], None, None]:
        """Add a user message and stream the answer as OpenAI delta dicts:
        ``{"reasoning_content": ...}``, ``{"content": ...}`` and ``{"tool_calls": [...]}``
        as ``ortgen.chat_formats.reply.ReplyStream`` reads them (``{"content": piece}``
        for an answer that is plain text). The assistant message joins the history at
        the end, or when the caller stops early."""
        turn, options = split_options(settings)
        messages = [*self.messages, {"role": "user", "content": content}]
        request = chat_request(
            self.generator,
            messages,
            {**self.settings, **turn},
            self.tools,
            {**self.options, **options},
        )
        previous = self.state
        held = previous.length if previous is not None else 0
        state = self.generator.next_turn(previous, request.prompt, **request.settings)
        self.state = state
        self.messages.append(messages[-1])
        self.reused_tokens = held if state is previous else 0
        self.finish_reason = None
        plan = request.plan
        reader = ReplyStream(plan) if plan is not None else None
        text = ""
        call_ids: list[str] = []
        try:
            for piece in self.generator.stream_state(state):
                text += piece
                deltas = reader.feed(piece) if reader is not None else [{"content": piece}]
                call_ids.extend(_new_call_ids(deltas))
                yield from deltas
            reason = state.finish_reasons[0] or "stop"
            if reader is not None:
                deltas, reason = reader.finish(reason)
                call_ids.extend(_new_call_ids(deltas))
                yield from deltas
            self.finish_reason = reason
        finally:
            # an answer stopped early is read as one cut short: whole calls only
            message, _ = assistant_message(
                text, plan, state.finish_reasons[0] or "length", call_ids
            )
            self.messages.append(message)


def _new_call_ids(deltas: list[dict[str, Any]]) -> list[str]:
    """The ids of the calls ``deltas`` start (a call's first delta carries its id)."""
    return [c["id"] for d in deltas for c in d.get("tool_calls", ()) if "id" in c]


class ChatBatch:
    """Several conversations that go on together, one row each.

    Every turn answers all of them in one batched request, and no conversation's earlier
    turns are fed again: the ``prefix`` cache (the default here) keeps each row's keys and
    values when a turn ends, in the loaded model's store, and the next turn's rows start
    where their own history ends. A turn that fails adds nothing to the conversations, so
    it can be sent again. Each conversation's answer is read as ``gen.chat()`` reads it:
    ``send`` returns the contents, and the history keeps each thought and call too.
    """

    def __init__(
        self,
        generator: TextGenerator,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **settings: Any,
    ) -> None:
        shape_ok = isinstance(conversations, Sequence) and not isinstance(
            conversations, str | Mapping
        )
        if shape_ok and not conversations:
            raise InputError("a chat batch needs at least one conversation")
        if not shape_ok or not all(
            isinstance(c, Sequence)
            and not isinstance(c, str | Mapping)
            and all(isinstance(m, Mapping) for m in c)
            for c in conversations
        ):
            raise InputError(
                "chat_batch() takes a list of conversations, each a list of messages "
                "({'role': ..., 'content': ...}); for one conversation use chat_session()"
            )
        settings, self.options = split_options(settings)
        settings.setdefault("cache", "prefix")
        generator.resolve_config(settings)  # a bad setting fails now, not at the first answer
        self.generator = generator
        self.conversations: list[list[dict[str, Any]]] = [
            [dict(m) for m in messages] for messages in conversations
        ]
        self.tools = tools
        self.settings = settings
        self.reused_tokens = 0  # prompt tokens of the last turn that were not fed again
        self.finish_reasons: list[str] = []  # the last turn's, as read back

    def send(self, contents: Sequence[str], **settings: Any) -> list[str]:
        """Add one user message per conversation and return the answers' contents, in
        order (an answer that is only calls is "")."""
        if (
            not isinstance(contents, Sequence)
            or isinstance(contents, str)
            or len(contents) != len(self.conversations)
        ):
            raise InputError(
                f"send() needs one message per conversation ({len(self.conversations)})"
            )
        turns = [
            [*messages, {"role": "user", "content": content}]
            for messages, content in zip(self.conversations, contents, strict=True)
        ]
        turn, options = split_options(settings)
        merged = {**self.settings, **turn}
        if self.generator.resolve_config(merged).config.num_return_sequences != 1:
            raise InputError(
                "a chat batch answers each conversation once; num_return_sequences must be 1"
            )
        options = {**self.options, **options}
        requests = [
            chat_request(self.generator, messages, merged, self.tools, options)
            for messages in turns
        ]
        rows = [_row(request, merged) for request in requests]
        out = self.generator.generate(rows, **merged)
        self.reused_tokens = sum(len(r.prompt) for r in requests) - int(out.stats["prefill_tokens"])
        texts = out.text
        assert isinstance(texts, list)  # a list of prompts: one text each
        answers, reasons = [], []
        for messages, request, text, reason in zip(
            turns, requests, texts, out.finish_reasons, strict=True
        ):
            message, reason = assistant_message(text, request.plan, reason)
            messages.append(message)
            answers.append(message["content"] or "")
            reasons.append(reason)
        self.conversations = turns
        self.finish_reasons = reasons
        return answers


def _row(request: ChatRequest, call: Mapping[str, Any]) -> dict[str, Any]:
    """One conversation's row of the batch: its prompt, and its own settings."""
    return {"prompt": request.prompt, **changed_settings(request.settings, call)}


def changed_settings(settings: Mapping[str, Any], call: Mapping[str, Any]) -> dict[str, Any]:
    """What a chat request changed in the ``call``'s settings (the constraint its tools,
    ``response_format`` or thought make), as a row's own settings: a row of a batched
    ``generate(rows, **call)`` then resolves to ``settings``
    (``ortgen.request.rows.row_settings``: a row's own constraint replaces the call's)."""
    own = {k: v for k, v in settings.items() if k not in call or call[k] != v}
    moved = [k for k in call if k not in settings]
    if moved and not any(k in own for k in CONSTRAINT_FIELDS):  # else it replaces them
        own.update({k: False if k == "json_object" else None for k in moved})
    return own
