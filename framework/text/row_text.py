"""One row's text as its tokens arrive: incremental detokenizing plus stop strings.

``generate()`` keeps one per row when stop strings are set; ``stream()`` keeps one for its
single row. Both need the same three things: text that is safe to show, the point where a
stop string completed, and the cut before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .detokenizer import IncrementalDetokenizer
from .stop_strings import StopStringMatcher
from .tokenizer import Tokenizer


class RowText:
    """Text of one generated row; ``stopped`` once a stop string completed in it."""

    def __init__(self, tokenizer: Tokenizer, stop_strings: Sequence[str] | None) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._matcher = StopStringMatcher(stop_strings) if stop_strings else None
        self.text = ""
        self.stopped = False

    def push(self, token: int) -> bool:
        """Add one token's text; True when a stop string completed (the text is cut before it).

        Only the new text and a stop string's length before it are searched, so the
        work per token does not grow with the text.
        """
        searched = len(self.text)
        self.text += self._detokenizer.push(token)
        if self._matcher is not None:
            cut = self._matcher.find(self.text, searched)
            if cut is not None:
                self.text = self.text[:cut]
                self.stopped = True
        return self.stopped

    def showable(self) -> int:
        """How much of ``text`` can be shown without revealing the start of a stop string."""
        return self._matcher.safe_length(self.text) if self._matcher else len(self.text)

    def close(self) -> str:
        """The final text: held-back characters released unless a stop string ended it."""
        if not self.stopped:
            self.text += self._detokenizer.flush()
        return self.text
