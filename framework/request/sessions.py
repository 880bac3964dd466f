"""Conversations that keep their KV caches between turns: one (``ChatSession``), or
several answered together as a batch (``ChatBatch``).

Each turn renders the whole history with the model's chat template (the template, not
ortgen, decides the text). When the tokens already held are a prefix of the new prompt,
only the new tokens are fed, so earlier turns are not prefilled again; when they are not
(a template that rewrites history, an answer that re-tokenizes differently), the turn
starts afresh and the answer is the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    from ..api import TextGenerator
    from ..loop.generate import Generation


class ChatSession:
    """``messages`` so far, and the step object that holds their keys and values."""

    def __init__(
        self,
        generator: TextGenerator,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **settings: Any,
    ) -> None:
        generator.resolve_config(settings)  # a bad setting fails now, not at the first answer
        self.generator = generator
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.tools = tools
        self.settings = settings
        self.state: Generation | None = None
        self.reused_tokens = 0  # tokens of the last turn's prompt that were not fed again

    def send(self, content: str, **settings: Any) -> Iterator[str]:
        """Add a user message and stream the answer; the answer joins the history even
        when the caller stops early (the partial text is kept)."""
        self.messages.append({"role": "user", "content": content})
        prompt = self.generator.chat_prompt(self.messages, tools=self.tools)
        previous = self.state
        held = previous.length if previous is not None else 0
        self.state = self.generator.next_turn(previous, prompt, **{**self.settings, **settings})
        self.reused_tokens = held if self.state is previous else 0
        reply = ""
        try:
            for piece in self.generator.stream_state(self.state):
                reply += piece
                yield piece
        finally:
            self.messages.append({"role": "assistant", "content": reply})


class ChatBatch:
    """Several conversations that go on together, one row each.

    Every turn answers all of them in one batched request, and no conversation's earlier
    turns are fed again: the ``prefix`` cache (the default here) keeps each row's keys and
    values when a turn ends, in the loaded model's store, and the next turn's rows start
    where their own history ends. A turn that fails adds nothing to the conversations, so
    it can be sent again.
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
        settings.setdefault("cache", "prefix")
        generator.resolve_config(settings)  # a bad setting fails now, not at the first answer
        self.generator = generator
        self.conversations: list[list[dict[str, Any]]] = [
            [dict(m) for m in messages] for messages in conversations
        ]
        self.tools = tools
        self.settings = settings
        self.reused_tokens = 0  # prompt tokens of the last turn that were not fed again

    def send(self, contents: Sequence[str], **settings: Any) -> list[str]:
        """Add one user message per conversation and return the answers, in order."""
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
        merged = {**self.settings, **settings}
        if self.generator.resolve_config(merged).config.num_return_sequences != 1:
            raise InputError(
                "a chat batch answers each conversation once; num_return_sequences must be 1"
            )
        prompts = [self.generator.chat_prompt(messages, tools=self.tools) for messages in turns]
        out = self.generator.generate(prompts, **merged)
        self.reused_tokens = sum(map(len, prompts)) - int(out.stats["prefill_tokens"])
        texts = out.text
        assert isinstance(texts, list)  # a list of prompts: one text each
        for messages, text in zip(turns, texts, strict=True):
            messages.append({"role": "assistant", "content": text})
        self.conversations = turns
        return texts
