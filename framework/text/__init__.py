"""Text in and out of the loop, without transformers at run time: the tokenizer
(``tokenizers`` + the model's Jinja chat template), the incremental detokenizer, stop
strings and transformers' clean-up, and :class:`RowText`, which ties them together for one
row of a generation."""

from __future__ import annotations

from .row_text import RowText
from .tokenizer import Tokenizer, load_tokenizer

__all__ = ["RowText", "Tokenizer", "load_tokenizer"]
