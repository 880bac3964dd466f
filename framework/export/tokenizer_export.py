"""Saving a model's tokenizer at export as ortgen reads it back, and checking that it does.

The export-time half of ``ortgen.text.resolved_tokenizer`` (which reads the folder at run
time, without transformers): here a transformers tokenizer object is saved with
:data:`~ortgen.text.resolved_tokenizer.RESOLVED_FILE`, then read back the way ortgen will
and compared with transformers on probe texts and a probe chat.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..text.resolved_tokenizer import (
    RESOLVED_FILE,
    RESOLVED_FORMAT,
    TokenizerFolder,
    chat_templates_of,
    read_resolved_folder,
    special_tokens_of,
)
from ..text.tokenizer import Tokenizer

__all__ = ["check_same_results", "describe_tokenizer", "save_resolved_tokenizer"]

# Texts the export encodes and decodes with both transformers and the saved folder: a
# difference means the class does something in Python that tokenizer.json cannot carry.
PROBE_TEXTS = (
    "Hello, world! The quick brown fox.",
    "  leading spaces,\ttabs\tand\n\nnew lines  \r\n",
    "Über naïve crème — 東京 日本語のテキスト 中文 한국어",
    "مرحبا بالعالم नमस्ते दुनिया",
    "emoji 🙂🚀 👍🏽 👨‍👩‍👧 ❤️",
    "don't , isn't ? x=1 a+b 3.14",
)
PROBE_MESSAGES = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there 🙂"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Über 東京?"},
)


def describe_tokenizer(tok: Any) -> dict[str, Any]:
    """The contents of :data:`RESOLVED_FILE` for the transformers fast tokenizer ``tok``."""
    import transformers  # the caller already has it: ``tok`` is one of its objects

    add_bos, add_eos = _specials_added(tok)
    return {
        "format": RESOLVED_FORMAT,
        "tokenizer_class": type(tok).__name__,
        "transformers_version": transformers.__version__,
        "special_tokens": special_tokens_of(tok),
        # Informational: tokenizer.json's post-processor inserts them.
        "add_bos": add_bos,
        "add_eos": add_eos,
        "clean_up_tokenization_spaces": bool(tok.clean_up_tokenization_spaces),
        "split_special_tokens": bool(getattr(tok, "split_special_tokens", False)),
        "chat_template": chat_templates_of(tok),
    }


def save_resolved_tokenizer(tok: Any, dest: str | Path) -> None:
    """Save ``tok`` (a transformers tokenizer) to ``dest`` as ortgen reads it back exactly.

    Writes transformers' own files (``save_pretrained``: tokenizer.json from the fast
    backend, tokenizer_config.json, ...; transformers can still load the folder) and
    :data:`RESOLVED_FILE`, then reads the folder back the way ortgen will and checks it
    against ``tok`` on probe texts. Raises ExportError when ``tok`` is a slow tokenizer
    (there is no backend to save; writing anything else would give different ids) or
    when the check finds a difference.
    """
    dest = Path(dest)
    if not getattr(tok, "is_fast", False):
        raise ExportError(
            f"the tokenizer is a slow {type(tok).__name__} (transformers could not build a "
            "fast tokenizer for it, e.g. sentencepiece or tiktoken is missing), so there is "
            "no tokenizer.json ortgen could read with the same results"
        )
    tok.save_pretrained(str(dest))
    content = describe_tokenizer(tok)
    text = json.dumps(content, indent=2, ensure_ascii=False) + "\n"
    (dest / RESOLVED_FILE).write_text(text, encoding="utf-8")
    check_same_results(tok, read_resolved_folder(dest), what=str(dest))


def check_same_results(tok: Any, found: TokenizerFolder, *, what: str) -> None:
    """Raise ExportError unless ``found`` encodes, decodes and renders chats like ``tok``."""
    mine = Tokenizer.from_found(found, source=what)
    for text in PROBE_TEXTS:
        for add in (True, False):
            want = tok(text, add_special_tokens=add)["input_ids"]
            got = mine.encode(text, add_special_tokens=add)
            _same(want, got, f"encode({text!r}, add_special_tokens={add})", tok, what)
        ids = tok(text)["input_ids"]
        for skip in (True, False):
            want_text = tok.decode(ids, skip_special_tokens=skip)
            got_text = mine.decode(ids, skip_special_tokens=skip)
            _same(want_text, got_text, f"decode(ids of {text!r}, skip={skip})", tok, what)
    if not mine.has_chat_template:
        return
    try:
        messages = [dict(m) for m in PROBE_MESSAGES]
        want_chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # the template rejects these messages: nothing to compare
        return
    try:
        got_chat = mine.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as exc:  # transformers rendered it: ortgen must too
        got_chat = f"<error: {exc}>"
    _same(want_chat, got_chat, "apply_chat_template(probe messages)", tok, what)


def _same(want: Any, got: Any, call: str, tok: Any, what: str) -> None:
    if want != got:
        raise ExportError(
            f"the tokenizer saved to {what} gives different results from transformers' "
            f"{type(tok).__name__} for {call}: transformers {want!r}, ortgen {got!r} "
            "(the class changes results in Python code tokenizer.json cannot carry)"
        )


def _specials_added(tok: Any) -> tuple[bool, bool]:
    """Whether ``tok(text)`` prepends BOS / appends EOS (what its post-processor does)."""
    with_specials = tok("a b")["input_ids"]
    plain = tok("a b", add_special_tokens=False)["input_ids"]
    extra = len(with_specials) > len(plain)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    add_bos = extra and bos is not None and with_specials[0] == bos
    add_eos = extra and eos is not None and with_specials[-1] == eos
    return bool(add_bos), bool(add_eos)
