"""The ``thinking_budget`` logits processor: a thought may take at most ``budget`` tokens.

Thinking models (Qwen3, SmolLM3, the DeepSeek-R1 distills) reason inside
``<think>...</think>`` before they answer, and may go on for thousands of tokens. This
processor follows each row's text (``FollowsTokens``) and, once a thought has taken
``budget`` tokens without closing, forces its close tag (``ForcesTokens``): the loop
takes those tokens instead of sampling, and the model answers from there, as
llama.cpp's ``--reasoning-budget`` and vLLM's thinking-budget processors do. Its
``__call__`` leaves the scores alone.

A row is inside a thought when its prompt ends inside one (DeepSeek-R1's template ends
the prompt with ``<think>\\n``; found once, from the prompt at the first call) or once it
writes the open tag. Tags are found in the text (each token's text, decoded once per
id), so a tag the model spells in several tokens counts as one; the count is of the
tokens the row generated inside the thought. The close tag is forced as the tokenizer
encodes it.

With a structured-output constraint, use ``ortgen.chat_formats.after_thought`` as the
``grammar``: it allows the close tag at any point of a thought, so the forced tag always
continues it (``chains.py`` puts this processor before the ``grammar`` one, and the loop
takes the first forcer's tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortgen import (
    Candidates,
    ConfigError,
    GenerationContext,
    LogitsProcessorFactory,
    Register,
    hookimpl,
)
from ortgen.chat_formats import opens_thought
from ortgen.checks import is_int

#: a row's state after a token: (inside a thought, the thought's tokens so far, the text
#: since the last tag, cut to what may still begin one)
_State = tuple[bool, int, str]


class ThinkingBudget:
    """Force the close tag once a thought has taken ``budget`` tokens (see module doc).

    Args:
        budget: most tokens a thought may take (>= 1).
        open, close: the tags a thought is written between.
    """

    def __init__(
        self,
        budget: int,
        open: str = "<think>",
        close: str = "</think>",
        *,
        ctx: GenerationContext,
    ) -> None:
        if not is_int(budget) or budget < 1:
            raise ConfigError(
                f"thinking_budget must be a whole number of tokens >= 1, got {budget!r}"
            )
        for name, tag in (("open", open), ("close", close)):
            if not isinstance(tag, str) or not tag or tag != tag.strip():
                raise ConfigError(
                    f"thinking_budget: the {name} tag must be a non-empty string without "
                    f"whitespace at its ends, got {tag!r}"
                )
        if ctx.tokenizer is None:
            raise ConfigError(
                "thinking_budget needs the model's tokenizer (to find the thought's tags in "
                "the text and to write its close tag), and this model folder has none"
            )
        self.budget = int(budget)
        self.open, self.close = open, close
        self.tokenizer = ctx.tokenizer
        self.close_ids = [int(t) for t in ctx.tokenizer.encode(close, add_special_tokens=False)]
        if not self.close_ids or max(self.close_ids) >= ctx.vocab_size:
            raise ConfigError(
                f"thinking_budget: the tokenizer writes the close tag {close!r} as "
                f"{self.close_ids}, which this model cannot emit"
            )
        #: characters of text kept after a token: enough to hold a tag's start
        self._keep = max(len(open), len(close)) - 1
        #: each token id's text, decoded once
        self._texts: dict[int, str] = {}
        #: per row, its state after the prompt, then after each token it was told
        self._rows: list[list[_State]] | None = None

    # -- the scores: unchanged ------------------------------------------------------------

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        self._start(input_ids)
        return scores

    def sparse(self, input_ids: np.ndarray, scores: np.ndarray | Candidates) -> Candidates | None:
        """Candidates pass through as they are (dense scores go to ``__call__``)."""
        self._start(input_ids)
        return scores if isinstance(scores, Candidates) else None

    def _start(self, input_ids: np.ndarray) -> None:
        """Each row's state after its prompt, read once, at the first call (the prompt
        and its left padding are all of ``input_ids`` then)."""
        if self._rows is None:
            decode = self.tokenizer.decode
            self._rows = [
                [self._prompt_state(decode(row, skip_special_tokens=False))]
                for row in np.asarray(input_ids).tolist()
            ]

    def _prompt_state(self, text: str) -> _State:
        if opens_thought(text, (self.open, self.close)):
            rest = text[text.rfind(self.open) + len(self.open) :]
            return True, 0, self._tail(rest)
        closed = text.rfind(self.close)
        return False, 0, self._tail(text[closed + len(self.close) :] if closed >= 0 else text)

    def _tail(self, text: str) -> str:
        return text[-self._keep :] if self._keep else ""

    # -- following the text ----------------------------------------------------------------

    def _text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    def _after(self, state: _State, token: int) -> _State:
        """The state once ``token`` follows ``state``: a token that opens or closes a
        thought starts the count again; one inside a thought adds one."""
        inside, count, tail = state
        text = tail + self._text(token)
        moved = False
        while True:
            tag = self.close if inside else self.open
            at = text.find(tag)
            if at < 0:
                break
            text, inside, moved = text[at + len(tag) :], not inside, True
        count = 0 if moved else count + inside
        return inside, count, self._tail(text)

    def _rows_told(self, batch: int) -> list[list[_State]]:
        """The rows' states; told tokens before any call (no prompt seen): each row
        starts outside a thought."""
        if self._rows is None:
            self._rows = [[(False, 0, "")] for _ in range(batch)]
        return self._rows

    def advance(self, tokens: Sequence[Sequence[int]]) -> None:
        rows = self._rows_told(len(tokens))
        for history, new in zip(rows, tokens, strict=True):
            for token in new:
                history.append(self._after(history[-1], int(token)))

    def rewind(self, counts: Sequence[int]) -> None:
        rows = self._rows_told(len(counts))
        for row, (history, count) in enumerate(zip(rows, counts, strict=True)):
            if count >= len(history):
                raise ValueError(
                    f"row {row}: cannot rewind {count} tokens; it was told {len(history) - 1}"
                )
            if count:
                del history[-count:]

    def reorder(self, rows: np.ndarray) -> None:
        if self._rows is None:
            return
        seen: set[int] = set()
        moved = []
        for row in np.asarray(rows).tolist():
            history = self._rows[row]
            moved.append(list(history) if row in seen else history)
            seen.add(row)
        self._rows = moved

    def fork(self) -> ThinkingBudget:
        """An independent copy at the same place (``Generation.fork``)."""
        twin = object.__new__(ThinkingBudget)
        twin.__dict__.update(self.__dict__)
        twin._rows = None if self._rows is None else [list(h) for h in self._rows]
        return twin

    # -- the forced close tag ---------------------------------------------------------------

    def forced_tokens(self, row: int) -> list[int]:
        """The close tag's tokens once ``row``'s thought has taken the budget."""
        if self._rows is None:
            return []
        inside, count, _ = self._rows[row][-1]
        return list(self.close_ids) if inside and count >= self.budget else []

    def valid_prefix(self, row: int, tokens: Sequence[int]) -> int:
        """How many drafted ``tokens`` may come before the budget forces the close tag."""
        if self._rows is None:
            return len(tokens)
        state = self._rows[row][-1]
        for index, token in enumerate(tokens):
            if state[0] and state[1] >= self.budget:
                return index
            state = self._after(state, int(token))
        return len(tokens)


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("thinking_budget", ThinkingBudget)
