"""A drafter for speculative decoding: ``repeat_token``.

Inside a run of one token (indentation, a rule of dashes, padding in a table) the next
token is most likely that token again. ``RepeatTokenDrafter`` proposes it, and the loop
keeps the proposals up to the first one the model would not have picked, so the output
is exactly that of decoding without a drafter; only the number of forwards changes.

The loop calls ``draft(tokens, limit)`` before a step and ``accepted(drafted, kept)``
after the verifying forward. One instance serves one request (its factory runs per
request), so the adaptation state below never leaks into another request.
"""

from __future__ import annotations

import numpy as np

from ortgen import ConfigError

__all__ = ["RepeatTokenDrafter"]


class RepeatTokenDrafter:
    """Propose the row's newest token again, once the newest ``min_run`` tokens are equal.

    How many it proposes adapts: one more than the model kept last time, at most
    ``num_tokens``, so a run that ends soon costs little and a long run grows it again.
    """

    def __init__(self, *, num_tokens: int = 4, min_run: int = 2) -> None:
        for name, value in (("num_tokens", num_tokens), ("min_run", min_run)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"repeat_token: `{name}` has to be an integer of at least 1, but is {value!r}"
                )
        self.num_tokens = num_tokens
        self.min_run = min_run
        self.next_count = self.num_tokens

    def draft(self, tokens: np.ndarray, limit: int) -> list[int]:
        # ``tokens`` is a view of the request's buffer: read it, never write into it
        count = min(limit, self.next_count)
        tail = tokens[-self.min_run :]
        if count < 1 or len(tail) < self.min_run or (tail != tail[-1]).any():
            return []
        return [int(tail[-1])] * count

    def accepted(self, drafted: int, kept: int) -> None:
        """Told after each verification how many of the ``drafted`` tokens were kept."""
        self.next_count = max(1, min(self.num_tokens, kept + 1))
