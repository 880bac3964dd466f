"""Helpers the chat-format tests share (not a test module): whether a format's grammar
lets a tiny family model write an answer and stop."""

from __future__ import annotations

from pathlib import Path

import llguidance

import ortgen
from ortgen.plugins.grammar_compile import shared_tokenizer
from ortgen.text import Tokenizer


def accepts(folder: Path, grammar: str, text: str, eos: str) -> bool:
    """Whether ``grammar`` lets a model with the tokenizer in ``folder`` write ``text``
    and stop there (``eos``: its end-of-sequence token)."""
    tok = Tokenizer.from_folder(folder)
    end = tok.encode(eos, add_special_tokens=False)
    matcher = llguidance.LLMatcher(
        shared_tokenizer({}, tok, 256, end), ortgen.grammar_text("grammar", grammar)
    )
    return all(matcher.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) and (
        matcher.is_accepting()
    )
