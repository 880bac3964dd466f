"""transformers' ``clean_up_tokenization``, on a whole text and on a text that streams in.

Folders whose ``tokenizer_config.json`` sets ``clean_up_tokenization_spaces`` get it
applied by ``decode`` (as transformers does); the streaming form lets the detokenizer
give the same text piece by piece.
"""

from __future__ import annotations

__all__ = ["StreamingCleanUp", "clean_up_tokenization"]

# transformers' PreTrainedTokenizerBase.clean_up_tokenization, in its order.
_REPLACEMENTS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def clean_up_tokenization(text: str) -> str:
    """transformers' ``PreTrainedTokenizerBase.clean_up_tokenization``, verbatim."""
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    return text


class _StreamingReplace:
    """``str.replace(old, new)`` over a text that arrives in pieces, holding back at most
    ``len(old) - 1`` characters."""

    __slots__ = ("_buf", "_new", "_old", "_prefixes")

    def __init__(self, old: str, new: str) -> None:
        self._old, self._new, self._buf = old, new, ""
        # Proper prefixes of ``old``, longest first: the longest one the text ends with
        # may still become ``old``.
        self._prefixes = [old[:k] for k in range(len(old) - 1, 0, -1)]

    def feed(self, text: str) -> str:
        buf = self._buf + text
        out = []
        while (i := buf.find(self._old)) >= 0:
            out.append(buf[:i])
            out.append(self._new)
            buf = buf[i + len(self._old) :]
        hold = next((len(p) for p in self._prefixes if buf.endswith(p)), 0)
        cut = len(buf) - hold
        out.append(buf[:cut])
        self._buf = buf[cut:]
        return "".join(out)

    def flush(self) -> str:
        buf, self._buf = self._buf, ""
        return buf


class StreamingCleanUp:
    """:func:`clean_up_tokenization` applied to a stream (bounded look-behind).

    The pieces ``feed`` returns, followed by ``flush()``, join to
    ``clean_up_tokenization`` of the joined input.
    """

    def __init__(self) -> None:
        self._stages = [_StreamingReplace(old, new) for old, new in _REPLACEMENTS]

    def feed(self, text: str) -> str:
        for stage in self._stages:
            text = stage.feed(text)
        return text

    def flush(self) -> str:
        # Each stage's held-back text still goes through the stages after it.
        text = ""
        for stage in self._stages:
            text = stage.feed(text) + stage.flush()
        return text
