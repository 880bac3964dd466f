"""What the ``grammar`` processor runs on: a constraint compiled by llguidance, and the
model's tokenizer as llguidance needs it.

llguidance (MIT, no dependencies, numpy only) compiles JSON Schema, regular expressions
and Lark grammars into a matcher that gives, for each position, the set of tokens that
keep the text inside the grammar. Two things are built once and shared:

- the tokenizer (``LLTokenizer``): 0.3 s for a 49k vocabulary, so once per loaded model
  and end-of-sequence ids, kept in ``ctx.model_state`` under a lock. It is made straight
  from ``tokenizer.json`` (no transformers: ``llguidance.hf`` would import it); a
  tokenizer whose decoder llguidance cannot read (a word-level or character vocabulary)
  goes through a table of each token's bytes instead.
- the grammar text for a setting, checked against that tokenizer when the request's
  components are built, so an unsupported schema keyword or a broken regex is a
  ``ConfigError`` naming it before any forward.

JSON is compact by default (``{"a":1}``: no whitespace between tokens): with flexible
whitespace a small model drifts into endless spaces and newlines. A schema may still ask
for other options through llguidance's ``x-guidance`` key.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ortgen import check_grammar, grammar_text

__all__ = ["check_grammar", "grammar_text", "shared_tokenizer"]

_STATE_KEY = "grammar.tokenizers"
_LOCK_KEY = "grammar.lock"


def shared_tokenizer(
    model_state: dict[str, Any], tokenizer: Any, vocab_size: int, eos: Sequence[int]
) -> Any:
    """The model's ``LLTokenizer`` for these end-of-sequence ids, built once per model."""
    lock = model_state.setdefault(_LOCK_KEY, threading.Lock())
    key = (vocab_size, tuple(eos))
    with lock:
        built = model_state.setdefault(_STATE_KEY, {})
        if key not in built:
            built[key] = _build_tokenizer(tokenizer, vocab_size, list(eos))
        return built[key]


def _build_tokenizer(tokenizer: Any, vocab_size: int, eos: list[int]) -> Any:
    import llguidance

    backend = tokenizer.backend
    try:
        return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos)
    except Exception:  # a decoder llguidance cannot read: give it each token's bytes
        wrapper = llguidance.TokenizerWrapper(_TokenTable(tokenizer, vocab_size, eos))
        return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)


class _TokenTable:
    """Each token's bytes and an encoder, the shape ``llguidance.TokenizerWrapper`` reads.

    Special tokens are named the way llguidance names them (a 0xFF byte, then the
    name), so they never match text.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos: list[int]) -> None:
        backend = tokenizer.backend
        special = set(tokenizer.special_ids)
        size = min(vocab_size, backend.get_vocab_size(with_added_tokens=True))
        self.eos_token_id = eos[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(i for i in special if i < size)
        self.tokens = [
            b"\xff" + (backend.id_to_token(i) or "").encode()
            if i in special
            else backend.decode([i], skip_special_tokens=False).encode()
            for i in range(size)
        ]
        self._backend = backend

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._backend.encode(text, add_special_tokens=False).ids
