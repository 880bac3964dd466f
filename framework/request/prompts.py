"""Prompts in every shape a caller may give, turned into checked token-id rows.

Text, token ids (a list, a 2-D array, a batch of either), or a dict per row: ``{"prompt":
text or ids}`` or ``{"messages": [...]}`` plus that row's own settings. Each row is
checked against the vocabulary and the model's context here, so a bad prompt fails with
its index before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..text import Tokenizer

Prompt = str | Sequence[int] | np.ndarray | Mapping[str, Any]
Prompts = Prompt | Sequence[str] | Sequence[Sequence[int]] | Sequence[Mapping[str, Any]]

#: The keys of a dict prompt that hold the prompt itself; every other key is a setting.
ROW_PROMPT_KEYS = ("prompt", "messages")
#: Settings that shape the whole batch (its cache, its width, what comes back per step):
#: a row cannot set them.
BATCH_WIDE_SETTINGS = frozenset(
    {
        "cache",
        "num_beams",
        "num_return_sequences",
        "output_scores",
        "output_logits",
        "logprobs",
        "top_logprobs",
        "prompt_logprobs",
        "sampler",
    }
)


def row_settings(item: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a dict row (every key but its prompt), after checking its shape:
    exactly one of ``prompt`` and ``messages``, and no setting that shapes the whole
    batch. The API's per-row prompts and ``ortgen run``'s input lines share this rule."""
    given = [key for key in ROW_PROMPT_KEYS if key in item]
    if len(given) != 1:
        raise InputError(
            'a row needs exactly one of "prompt" (text or token ids) or "messages" '
            f"(a chat), got keys {sorted(map(str, item)) or 'none'}",
            field="prompt",
        )
    own = {k: v for k, v in item.items() if k not in ROW_PROMPT_KEYS}
    batch_wide = sorted(set(own) & BATCH_WIDE_SETTINGS)
    if batch_wide:
        raise InputError(
            f"a row cannot set {', '.join(batch_wide)}: it applies to the whole batch "
            "(set it for the whole request: a call argument or the pipeline's [generation])",
            field=batch_wide[0],
        )
    return own


class PromptEncoder:
    """Turns prompts into token-id rows for one model (its tokenizer, vocabulary, context).

    ``need_tokenizer(what)`` returns the model's tokenizer or raises the error that says
    ``what`` needs one; ``chat_prompt(messages)`` renders a chat row. Both come from the
    generator, so a prompt fails exactly as the generator's other entry points do.
    """

    def __init__(
        self,
        need_tokenizer: Callable[[str], Tokenizer],
        vocab_size: int,
        max_context: int | None,
        chat_prompt: Callable[[Sequence[Mapping[str, Any]]], list[int]],
    ) -> None:
        self._need_tokenizer = need_tokenizer
        self.vocab_size = vocab_size
        self.max_context = max_context
        self._chat_prompt = chat_prompt

    def encode(self, prompts: Prompts) -> tuple[list[list[int]], bool, list[dict[str, Any]]]:
        """Token-id rows, whether a single prompt was given, and each row's own settings."""
        if isinstance(prompts, bytes | bytearray):
            raise InputError(
                "a prompt is text or token ids, not bytes: decode them first "
                "(b'...'.decode('utf-8')), or give the ids as a list of ints",
                field="prompt",
            )
        if isinstance(prompts, str):
            return [self.encode_text(prompts, 0)], True, [{}]
        if isinstance(prompts, Mapping):
            row, own = self.encode_row(prompts, 0)
            return [row], True, [own]
        if isinstance(prompts, np.ndarray):
            if prompts.dtype.kind not in "iu":
                raise InputError(
                    f"token ids must be integers, got an array of {prompts.dtype}", field="prompt"
                )
            if prompts.ndim == 1:
                return [self.check_ids(prompts.tolist(), 0)], True, [{}]
            if prompts.ndim == 2:
                rows = [self.check_ids(r, i) for i, r in enumerate(prompts.tolist())]
                return rows, False, [{} for _ in rows]
            raise InputError(
                f"token-id prompts must be 1-D or 2-D, got shape {prompts.shape}", field="prompt"
            )
        items: list[Any] = list(prompts)
        if not items:
            raise InputError("no prompt given (an empty list)", field="prompt")
        if all(isinstance(x, int | np.integer) for x in items):
            return [self.check_ids(token_ids(items, 0), 0)], True, [{}]
        rows, settings = [], []
        for i, item in enumerate(items):
            own = {}
            if isinstance(item, str):
                row = self.encode_text(item, i)
            elif isinstance(item, Mapping):
                row, own = self.encode_row(item, i)
            elif isinstance(item, Sequence | np.ndarray):
                row = self.check_ids(token_ids(item, i), i)
            else:
                raise InputError(
                    f"prompt {i} is a {type(item).__name__}; give text, token ids or a dict "
                    'with "prompt" or "messages"',
                    field="prompt",
                )
            rows.append(row)
            settings.append(own)
        return rows, False, settings

    def encode_row(self, item: Mapping[str, Any], index: int) -> tuple[list[int], dict[str, Any]]:
        """A dict prompt: ``prompt`` (text or ids) or ``messages``, plus the row's settings."""
        try:
            own = row_settings(item)
        except InputError as exc:
            raise InputError(f"prompt {index}: {exc}", field="prompt") from None
        if "messages" in item:
            return self.check_ids(self._chat_prompt(item["messages"]), index), own
        value = item["prompt"]
        if isinstance(value, str):
            return self.encode_text(value, index), own
        if isinstance(value, Sequence | np.ndarray) and not isinstance(value, bytes):
            return self.check_ids(token_ids(value, index), index), own
        raise InputError(f'prompt {index}: "prompt" must be text or token ids', field="prompt")

    def encode_text(self, text: str, index: int) -> list[int]:
        if not text:
            raise InputError(f"prompt {index} is empty", field="prompt")
        ids = self._need_tokenizer("a text prompt").encode(text)
        return self.check_ids(ids, index)

    def check_ids(self, ids: list[int], index: int) -> list[int]:
        if not ids:
            raise InputError(f"prompt {index} is empty (no tokens)", field="prompt")
        vocab = self.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InputError(
                f"prompt {index} has token ids outside [0, {vocab}): {bad[:5]}", field="prompt"
            )
        context = self.max_context
        if context is not None and len(ids) >= context:
            raise InputError(
                f"prompt {index} has {len(ids)} tokens; the model's context is {context} tokens, "
                "which leaves no room to generate. Shorten the prompt.",
                field="prompt",
            )
        return ids


def token_ids(values: Any, index: int) -> list[int]:
    """``values`` as token ids: integers only. Bytes, floats (1.5 would be cut to 1),
    bools and anything else are refused, naming the prompt and the first bad value."""
    if isinstance(values, bytes | bytearray | str):
        raise InputError(
            f"prompt {index}: token ids must be a list of ints, got {type(values).__name__}",
            field="prompt",
        )
    ids = []
    for value in values:
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
            raise InputError(
                f"prompt {index}: token ids must be integers, got {value!r} "
                f"({type(value).__name__})",
                field="prompt",
            )
        ids.append(int(value))
    return ids
