"""Built-in drafter for speculative decoding: a smaller model of the same tokenizer.

``draft_model`` (Hugging Face's ``assistant_model``, vLLM's and llama.cpp's draft
models) loads any ortgen model folder whose tokenizer is the target's and lets it decode
greedily ahead of the target: its tokens are the drafts, and the target keeps them up to
the first one it would not have picked. It pays when the draft model is much cheaper
than the target per token and often agrees with it: a family's small sibling (SmolLM2
135M for 360M or 1.7B, Qwen2.5 0.5B for 1.5B and up), never a same-size model.

The draft model keeps a request of its own (a ``Generation`` with its own KV cache, from
the public API). Before each draft it is brought to the target's tokens: it forgets
what the target rejected (``rewind``) and is fed what the target kept that it had not
proposed (``append``), in one forward with its first draft token. The loaded draft model
is shared by every request of the target (one session; each request binds its own
buffers), kept in ``ctx.model_state`` by ``ortgen.load_draft_model``, which also refuses a
draft model whose tokenizer is not the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ortgen import ConfigError, DrafterFactory, GenerationContext, Register, hookimpl
from ortgen.checks import is_int

#: the draft model's own request: greedy, no end but its length, nothing recorded
_GREEDY: dict[str, Any] = {"do_sample": False, "eos_token_id": None, "repetition_penalty": 1.0}


class DraftModelDrafter:
    """Drafts with a smaller model of the same tokenizer (see module doc).

    Args:
        model: the draft model's folder (an exported ortgen model).
        num_tokens: most tokens drafted per step; how many adapts to what the target
            kept (two more after a draft kept whole, one more than was kept otherwise).
        threads: onnxruntime threads of the draft model's session.
    """

    def __init__(
        self, *, ctx: GenerationContext, model: str, num_tokens: int = 5, threads: int = 1
    ) -> None:
        for name, value in (("num_tokens", num_tokens), ("threads", threads)):
            if not is_int(value) or value < 1:
                raise ConfigError(
                    f"drafter 'draft_model': {name} must be an integer >= 1, got {value!r}"
                )
        if not isinstance(model, str) or not model:
            raise ConfigError("drafter 'draft_model' needs model: the draft model's folder")
        from ortgen import load_draft_model  # the runtime half: loaded when first used

        self.gen = load_draft_model(ctx, model, threads=threads)
        self.num_tokens = int(num_tokens)
        self.next_count = self.num_tokens
        self._max_length = ctx.max_length + self.num_tokens
        self._state: Any = None  # the draft model's request, made at the first draft
        self._held = np.zeros(0, dtype=np.int64)  # the tokens its buffer holds

    def draft(self, tokens: np.ndarray, limit: int) -> Sequence[int]:
        count = min(limit, self.next_count)
        if count < 1:
            return []
        self._catch_up(np.asarray(tokens, dtype=np.int64))
        state, drafts = self._state, []
        for _ in range(count):
            if state.is_done:  # its length: no more drafts
                break
            drafts.append(int(state.step().ids[0]))
        self._held = np.concatenate([tokens, np.asarray(drafts, dtype=np.int64)])
        return drafts

    def accepted(self, drafted: int, kept: int) -> None:
        """Two more after a draft kept whole (at most ``num_tokens``), else one more
        than was kept (Hugging Face's "heuristic" schedule, bounded)."""
        grown = self.next_count + 2 if kept == drafted else kept + 1
        self.next_count = max(1, min(self.num_tokens, grown))

    def _catch_up(self, tokens: np.ndarray) -> None:
        """Make the draft model's request hold ``tokens``, its newest one not yet fed."""
        held = self._held
        if self._state is None or not len(held):
            self._state = self.gen.start(
                [tokens.tolist()], max_new_tokens=None, max_length=self._max_length, **_GREEDY
            )
            return
        size = min(len(held), len(tokens))
        differ = np.flatnonzero(held[:size] != tokens[:size])
        common = int(differ[0]) if differ.size else size
        if common == 0:  # nothing in common (never within one request): start afresh
            self._state = None
            self._catch_up(tokens)
            return
        state = self._state
        if common < len(held):  # the drafts the target did not keep
            state.rewind(len(held) - common)
        if common < len(tokens):  # what the target kept that this model did not propose
            state.append([tokens[common:].tolist()])


@hookimpl
def register_drafters(register: Register[DrafterFactory]) -> None:
    register("draft_model", DraftModelDrafter)
