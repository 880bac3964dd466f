"""transformers' reading of a GGUF's tokenizer, corrected by the header: the reference
``tests/test_gguf_tokenizer.py`` compares ortgen's GGUF tokenizer with.

Not a test module. ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` guesses the special
tokens (for SmolLM2: eos=<|im_start|>, no pad, a BOS prepended) and cleans up decoded text;
the GGUF header states the truth. ortgen's export once applied these corrections to
transformers' tokenizer before saving it (``ortgen.export.gguf`` up to the commit that
made it write ortgen's own GGUF tokenizer instead); they stay here as the independent
reading the builder's tokenizer must equal wherever transformers reads the vocabulary
rightly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest

__all__ = ["transformers_tokenizer"]

_ROLES = ("bos", "eos", "pad")
# What to read from the GGUF header: our name -> GGUF key.
_META_KEYS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
    "add_bos_token": "tokenizer.ggml.add_bos_token",
    "add_eos_token": "tokenizer.ggml.add_eos_token",
    "model": "tokenizer.ggml.model",
}


def transformers_tokenizer(path: Path, reader: gguf.GGUFReader | None = None) -> Any:
    """transformers' GGUF tokenizer of ``path`` with the header's corrections.

    ``reader``: the file's header, already read, handed to transformers instead of reading
    it twice more (the SmolLM2 header takes seconds to parse)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    reader = reader or gguf.GGUFReader(path)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gguf, "GGUFReader", lambda *_args, **_kw: reader)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    finally:
        hf_logging.set_verbosity(verbosity)
    meta = {
        name: field.contents() if (field := reader.fields.get(key)) is not None else None
        for name, key in _META_KEYS.items()
    }
    _correct(tok, meta)
    return tok


def _correct(tok: Any, meta: dict[str, Any]) -> None:
    """Special tokens, BOS/EOS insertion and decoding as the header says."""
    for role in _ROLES:
        token_id = meta[f"{role}_token_id"]
        if token_id is not None and 0 <= int(token_id) < len(tok):
            setattr(tok, f"{role}_token", tok.convert_ids_to_tokens(int(token_id)))
    _set_insertion(tok, meta["add_bos_token"], meta["add_eos_token"])
    # GGUF runtimes decode tokens verbatim; transformers' default "clean up" would turn
    # "a , b" into "a, b".
    tok.clean_up_tokenization_spaces = False
    if meta["model"] == "gpt2":
        # Byte-level BPE decodes with ByteLevel alone; the converter's SentencePiece-style
        # ByteFallback/Fuse/Replace(▁) steps do not belong to this kind of vocabulary.
        from tokenizers import decoders

        tok.backend_tokenizer.decoder = decoders.ByteLevel()


def _set_insertion(tok: Any, add_bos: bool | None, add_eos: bool | None) -> None:
    """Make ``tok(text)`` add BOS/EOS exactly as the file says (None: leave as is)."""
    if add_bos is None and add_eos is None:
        return
    if isinstance(getattr(type(tok), "add_bos_token", None), property):
        # LlamaTokenizerFast & co.: the setters rebuild the post-processor
        if add_bos is not None:
            tok.add_bos_token = bool(add_bos)
        if add_eos is not None:
            tok.add_eos_token = bool(add_eos)
    added = _specials_added(tok)
    wanted = (
        added[0] if add_bos is None else bool(add_bos),
        added[1] if add_eos is None else bool(add_eos),
    )
    if added != wanted:  # a class without the setters: write the template
        from tokenizers.processors import TemplateProcessing

        bos = [tok.bos_token] if wanted[0] and tok.bos_token else []
        eos = [tok.eos_token] if wanted[1] and tok.eos_token else []
        single = [*bos, "$A:0", *eos]
        pair = [*single, *(f"{t}:1" for t in bos), "$B:1", *(f"{t}:1" for t in eos)]
        specials = [(t, tok.convert_tokens_to_ids(t)) for t in dict.fromkeys(bos + eos)]
        tok.backend_tokenizer.post_processor = TemplateProcessing(
            single=single, pair=pair, special_tokens=specials
        )


def _specials_added(tok: Any) -> tuple[bool, bool]:
    """Whether encoding a probe text prepends BOS / appends EOS right now."""
    ids = tok("Hi")["input_ids"]
    plain = tok("Hi", add_special_tokens=False)["input_ids"]
    longer = len(ids) > len(plain)
    return longer and ids[0] == tok.bos_token_id, longer and ids[-1] == tok.eos_token_id
