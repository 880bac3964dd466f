"""One row's text as its tokens arrive: incremental detokenizing plus stop strings.

The step object (:class:`ortgen.loop.generate.Generation`) keeps one per row, so every way of
driving it (``start()`` + ``step()``, ``generate()``, ``stream()``, chat sessions) gets
the same text, the same stop-string rule and the same cut before a stop string.

Costs stay flat however long the answer grows: text is kept as a list of finished
pieces plus a short *tail* (at most the longest stop string, less one character, plus the
newest piece), and only the tail is searched for stop strings and held back while
streaming. Nothing per token re-reads or re-joins the whole text.

Without stop strings nothing in the loop needs the text as it grows, so tokens are only
noted when pushed and decoded when the text is read (``text``, ``take``, ``close``): a
stream reads it every step and pays as before; ``generate()`` and batch jobs read it once
at the end, when decoding is warm, instead of paying ~80 us of cold code after every
forward. The text is the same: the detokenizer sees the same tokens in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .detokenizer import IncrementalDetokenizer
from .stop_strings import StopStringMatcher
from .tokenizer import Tokenizer

__all__ = ["RowText"]


class RowText:
    """Text of one generated row; ``stopped`` once a stop string completed in it.

    ``history`` is text the row already has (tokens generated before a rewind or an
    appended continuation): it is decoded, counted as shown, and never searched for stop
    strings again, but a stop string that starts in its last characters and completes
    with the next tokens is found.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop_strings: Sequence[str] | None = None,
        *,
        history: Iterable[int] = (),
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._matcher = StopStringMatcher(stop_strings) if stop_strings else None
        self._keep = self._matcher.max_length - 1 if self._matcher else 0
        self._pieces: list[str] = []  # final text: no stop string can cut into it any more
        self._length = 0  # characters in _pieces
        self._tail = ""  # text after _pieces that a stop string may still cut
        self._unshown: list[str] = []  # parts of _pieces that take() has not returned
        self._tail_shown = 0  # characters of _tail that take() has returned
        self._pending: list[int] = []  # pushed, not decoded yet (only without stop strings)
        self.stopped = False
        self.closed = False
        if history:
            self._start_from(history)

    @property
    def text(self) -> str:
        """The row's text so far (cut before a stop string once one completed)."""
        self._decode_pending()
        if len(self._pieces) > 1:  # join once; later calls find one piece
            self._pieces[:] = ["".join(self._pieces)]
        return (self._pieces[0] if self._pieces else "") + self._tail

    def __len__(self) -> int:
        self._decode_pending()
        return self._length + len(self._tail)

    def push(self, token: int) -> bool:
        """Add one token's text; True when a stop string completed (the text is cut before it).

        Only the tail and the new text are searched, so the work per token does not grow
        with the text.
        """
        if self.stopped or self.closed:
            return self.stopped
        if self._matcher is None:  # no stop string can end the row: decode when read
            self._pending.append(token)
            return False
        self._decode_pending()
        piece = self._detokenizer.push(token)
        if not piece:
            return False
        tail = self._tail + piece
        cut = self._matcher.find(tail, len(self._tail))
        if cut is not None:
            self.stopped = True
            tail = tail[:cut]
        self._settle(tail)
        return self.stopped

    def take(self) -> str:
        """Text that became safe to show since the last call (for streaming).

        While the row runs, a tail that may be the start of a stop string is held back;
        once it stopped or was closed everything left is released.
        """
        self._decode_pending()
        tail = self._tail
        if self.closed or self.stopped or self._matcher is None:
            upto = len(tail)
        else:
            upto = self._matcher.safe_length(tail)
        out = "".join(self._unshown) + tail[self._tail_shown : upto]
        self._unshown.clear()
        self._tail_shown = max(self._tail_shown, upto)
        return out

    def close(self) -> str:
        """Finish the row: release what the detokenizer held back (unless a stop string
        ended the row) and return the final text. Calling it again is harmless."""
        if not self.closed:
            self._decode_pending()
            if not self.stopped:
                rest = self._detokenizer.flush()
                if self._matcher is not None and rest:
                    tail = self._tail + rest
                    cut = self._matcher.find(tail, len(self._tail))
                    if cut is not None:
                        self.stopped = True
                        tail = tail[:cut]
                    self._tail = tail
                else:
                    self._tail += rest
            self.closed = True
        return self.text

    # -- internals ---------------------------------------------------------------

    def _settle(self, tail: str) -> None:
        """Keep the last ``max stop length - 1`` characters of ``tail`` open; the rest is final."""
        if self.stopped:
            self._tail = tail
            return
        final = len(tail) - self._keep
        if final <= 0:
            self._tail = tail
            return
        shown = self._tail_shown
        if shown < final:
            self._unshown.append(tail[shown:final])
        self._pieces.append(tail[:final])
        self._length += final
        self._tail = tail[final:]
        self._tail_shown = max(0, shown - final)

    def _start_from(self, history: Iterable[int]) -> None:
        """Decode ``history`` as already shown text; keep its end open for a stop string
        that completes with the next tokens."""
        matcher, self._matcher = self._matcher, None
        for token in history:
            self.push(token)
        self._matcher = matcher
        text = self.text
        final = max(0, len(text) - self._keep)
        self._pieces = [text[:final]] if final else []
        self._length = final
        self._tail = text[final:]
        self._unshown.clear()
        self._tail_shown = len(self._tail)

    def _decode_pending(self) -> None:
        """Decode the tokens pushed without stop strings (see the module docstring); their
        text is final, as it would have been when pushed."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for token in pending:
            piece = self._detokenizer.push(token)
            if piece:
                self._commit(piece)

    def _commit(self, piece: str) -> None:
        self._pieces.append(piece)
        self._unshown.append(piece)
        self._length += len(piece)
