"""Stop strings: finding them in generated text, and holding back what may start one."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InputError

__all__ = ["StopStringMatcher"]


class StopStringMatcher:
    """Finds stop strings in generated text, for generate() and for streaming.

    ``find(text)`` gives where the earliest stop string starts; ``safe_length(text)``
    how much of ``text`` can be shown while streaming without showing the start of a
    stop string that may complete with the next tokens.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        if isinstance(stop_strings, str):
            raise InputError(
                f"stop strings must be a list of strings, got the single string {stop_strings!r}; "
                f"write [{stop_strings!r}]"
            )
        try:
            items = list(stop_strings)
        except TypeError:
            raise InputError(
                f"stop strings must be a list of strings, got {type(stop_strings).__name__}"
            ) from None
        for i, s in enumerate(items):
            if not isinstance(s, str):
                raise InputError(
                    f"stop strings must be strings, but item {i} is a {type(s).__name__}: {s!r}"
                )
            if not s:
                raise InputError(
                    f"stop string {i} is empty; an empty stop string would stop at once, "
                    "give non-empty strings"
                )
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(items))
        self._max_len = max((len(s) for s in self._stops), default=0)
        # Proper prefixes of the stop strings: a text ending in one may go on to a stop.
        self._prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self._stops

    @property
    def max_length(self) -> int:
        """Length of the longest stop string (0 when there are none)."""
        return self._max_len

    def __bool__(self) -> bool:
        return bool(self._stops)

    def find(self, text: str, start: int = 0) -> int | None:
        """Index in ``text`` where the earliest stop string starts, or None.

        ``start``: only matches that end after ``start`` are new (a streaming caller
        passes the length of the text it already searched; the search reaches back
        ``max_length - 1`` characters so a stop string spanning the boundary is found).
        """
        begin = max(0, start - self._max_len + 1)
        hits = [i for s in self._stops if (i := text.find(s, begin)) >= 0]
        return min(hits, default=None)

    def completed_at(self, text: str, start: int) -> bool:
        """True when a stop string in ``text`` ends after index ``start``: the text from
        ``start`` on (a newest token's) completed it. Beam search asks this of every
        candidate; stop strings that ended earlier do not count."""
        return any(text.find(s, max(0, start - len(s) + 1)) >= 0 for s in self._stops)

    def match(self, text: str, start: int = 0) -> tuple[int, str] | None:
        """Like :meth:`find`, with the stop string that matched (the longest at that index)."""
        at = self.find(text, start)
        if at is None:
            return None
        found = max((s for s in self._stops if text.startswith(s, at)), key=len)
        return at, found

    def safe_length(self, text: str) -> int:
        """Characters of ``text`` that can be shown now.

        If a stop string occurs, that is the text before it. Otherwise the longest suffix
        of ``text`` that is a prefix of a stop string is held back.
        """
        at = self.find(text)
        if at is not None:
            return at
        for k in range(min(self._max_len - 1, len(text)), 0, -1):
            if text[-k:] in self._prefixes:
                return len(text) - k
        return len(text)
