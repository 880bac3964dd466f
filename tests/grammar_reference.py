"""llguidance on its own: the reference the grammar tests hold ortgen's processor to.

Not a test module. The grammar text and llguidance's tokenizer are built here from the
constraint and the tokenizer's own vocabulary, not through ``ortgen.plugins.grammar`` or
``grammar_compile``, so a mistake there (a mask that lets the end of sequence through,
a token the sparse path drops, a wrong byte for a token) shows as a difference instead
of being shared by the processor and the check. ``Reference.walk`` says how far a
token sequence stays inside the grammar, so a test can check any answer, whole or cut
by the length limit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

#: compact JSON, as docs/structured.md promises (no whitespace between tokens)
JSON_OPTIONS = {"whitespace_flexible": False}


def reference_grammar(setting: str, value: Any) -> str:
    """llguidance's grammar for one structured-output setting, as the docs define it."""
    import llguidance

    make = llguidance.LLMatcher
    if setting == "json_schema":
        return make.grammar_from_json_schema(value, defaults=JSON_OPTIONS)
    if setting == "json_object":
        return make.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if setting == "regex":
        return make.grammar_from_regex(value)
    if setting == "grammar":
        return make.grammar_from_lark(value)
    if setting == "choice":
        return make.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
    raise ValueError(setting)


class _Vocabulary:
    """Each token's bytes, as ``llguidance.TokenizerWrapper`` reads them, straight from
    the vocabulary (special tokens named after a 0xFF byte, so they never match text)."""

    def __init__(self, tokenizer: Any, vocab: int, eos: Sequence[int]) -> None:
        backend = tokenizer.backend
        special = {i for i in tokenizer.special_ids if i is not None and i < vocab}
        self.eos_token_id, self.bos_token_id = eos[0], None
        self.special_token_ids = sorted(special)
        self.tokens = [
            (b"\xff" if i in special else b"") + backend.id_to_token(i).encode()
            for i in range(vocab)
        ]
        self._backend = backend

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._backend.encode(text, add_special_tokens=False).ids


def reference_tokenizer(tokenizer: Any, vocab: int, eos: Sequence[int]) -> Any:
    """llguidance's tokenizer for ``tokenizer``: from ``tokenizer.json`` where llguidance
    reads its decoder (byte-level BPE), else from the vocabulary itself (the tiny models'
    character vocabulary)."""
    import llguidance

    try:
        return llguidance.LLTokenizer(
            tokenizer.backend.to_str(), n_vocab=vocab, eos_token=list(eos)
        )
    except ValueError:
        vocabulary = _Vocabulary(tokenizer, vocab, eos)
        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(vocabulary), n_vocab=vocab, eos_token=list(eos)
        )


class Reference:
    """A fresh llguidance matcher for one constraint over one vocabulary."""

    def __init__(
        self, tokenizer: Any, setting: str, value: Any, vocab: int, eos: Sequence[int]
    ) -> None:
        import llguidance

        self.vocab, self.eos = vocab, tuple(eos)
        self.start = llguidance.LLMatcher(tokenizer, reference_grammar(setting, value))
        assert not self.start.is_error(), self.start.get_error()

    def walk(self, tokens: Sequence[int]) -> tuple[Any, int]:
        """A matcher after ``tokens`` and how many of them it consumed: fewer than all
        means the one after them leaves the grammar (the matcher is then in error)."""
        matcher = self.start.deep_copy()
        for done, token in enumerate(tokens):
            if not matcher.consume_token(int(token)):
                return matcher, done
        return matcher, len(tokens)

    def allowed(self, matcher: Any, among: np.ndarray | None = None) -> np.ndarray:
        """The tokens llguidance allows next, (vocab,) bool: its bitmask, less the tokens
        in it the matcher would then refuse (llguidance lets an unknown token stand for
        text the vocabulary cannot spell, and refuses it when it comes). Refusals are
        looked for among ``among`` (bool, default every allowed token: ~1 us each, a few
        ms for a large vocabulary's free text)."""
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.vocab].astype(bool)
        doubtful = allowed if among is None else allowed & among
        for token in np.flatnonzero(doubtful).tolist():
            if token not in self.eos and matcher.validate_tokens([token]) != 1:
                allowed[token] = False
        return allowed

    def check_answer(self, tokens: Sequence[int], reason: str | None, max_new_tokens: int) -> bool:
        """Check that an answer's tokens stay inside the grammar and that its finish
        reason fits them; return whether it is a whole sentence of the grammar.

        ``eos``: every token, the end of sequence last, is consumed (the text before it
        is complete). ``length``: exactly ``max_new_tokens`` tokens, no end of sequence,
        all consumed (a valid prefix, which can still be completed: some token is
        allowed after it)."""
        tokens = [int(t) for t in tokens]
        matcher, done = self.walk(tokens)
        assert done == len(tokens), (
            f"token {done} of {len(tokens)} ({tokens[done]}) leaves the grammar: "
            f"{matcher.get_error().strip().splitlines()[:1]}"
        )
        if reason == "eos":
            assert tokens and tokens[-1] in self.eos, tokens
            return True
        assert reason == "length", reason
        assert len(tokens) == max_new_tokens and not set(tokens) & set(self.eos), tokens
        assert self.allowed(matcher).any(), "a cut answer no token can continue"
        return False
