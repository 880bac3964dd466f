"""Streaming detokenization: generated token ids to text as they arrive."""

from __future__ import annotations

from ..errors import InputError
from .clean_up import StreamingCleanUp
from .tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer"]

# A pending (not yet shown) stretch longer than this many tokens only happens with invalid
# byte sequences; the detokenizer then releases text at a token boundary where decoding
# restarts cleanly: the text decoded in two parts there equals the text decoded in one,
# with _SYNC_TAIL tokens of look-ahead (lossy UTF-8 decoding settles a boundary from the
# next byte already; the margin is for decoders that work on runs of byte tokens). So the
# window stays bounded and the text exact.
_MAX_PENDING = 8
_SYNC_TAIL = 4
# Last resort for decoders where no such boundary shows up (a byte-fallback run longer
# than this, which no real text produces): release the text as it decodes now.
_HARD_LIMIT = 64

# Why not tokenizers.decoders.DecodeStream (tokenizers 0.22.2, measured): it runs the same
# prefix-offset method in Rust, but
# - byte-fallback decoders (Llama-2 style): a later byte token can turn text it already
#   gave into U+FFFD; it then gives wrong text ("\x00\ufffd" for decode()'s
#   "\ufffd\ufffd") or raises "Invalid prefix encountered" (tests/test_detokenizer.py,
#   test_detokenizer_random_ids_byte_fallback, fails both ways with it underneath);
# - a run of invalid UTF-8 never ends its window: 2,000 repeated lead bytes on SmolLM2's
#   tokenizer cost 406 us a token with a 2,000-token window, against 9 us and 13 here;
# - it has no flush() (text held at the end is lost) and exposes no window to flush from.
# On SmolLM2's byte-level tokenizer and ordinary text it gives the same text (3,000
# random-id and byte-token sequences, every prefix) at half the cost: over 4,500 sampled
# tokens (three 1,500-token generations), both alternated in each run, medians of three
# runs of 30-40 rounds: 1.6-2.7 us a token against 3.4-5.3 us (ratio 0.50-0.51, on 2 busy
# cores; a fourth run under heavier load: 5.1 against 11.0). 1-3 us a token is noise next to
# the model's forward on a CPU (8-20 ms a token for SmolLM2-135M, docs/benchmarks.md), so
# one exact path for every tokenizer wins over a faster one that would need this one as
# its fallback.


class IncrementalDetokenizer:
    """Turns generated token ids into text as they arrive, for streaming.

    ``push(id)`` returns the new text that is safe to show; ``flush()`` returns what was
    held back. Joined, they equal ``tokenizer.decode(all_ids, skip_special_tokens=...)``.

    It decodes a small window (the tokens of the previous emission plus the new ones) and
    emits the difference, the prefix-offset method of vLLM / TGI, so word-boundary spaces
    come out right and the work per token is bounded. Text ending in an incomplete UTF-8
    character (U+FFFD) is held back until the character completes.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._backend = tokenizer.backend
        self._skip = skip_special_tokens
        self._special = tokenizer.special_ids if skip_special_tokens else frozenset()
        # Byte-fallback decoders decode a run of <0xNN> tokens as one unit (all U+FFFD if the
        # run is not valid UTF-8), so text is shown only once such a run has ended.
        self._byte_ids = tokenizer.byte_fallback_ids
        self._ids: list[int] = []  # the window; starts at the prefix offset
        self._read = 0  # tokens before this index (in the window) are shown
        self._prefix_text = ""  # decode(self._ids[: self._read])
        self._clean = StreamingCleanUp() if tokenizer.clean_up_tokenization_spaces else None

    @property
    def window_size(self) -> int:
        """Tokens currently kept for decoding (bounded; for tests and diagnostics)."""
        return len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=self._skip)

    def _release(self, new: str, upto: int) -> str:
        """Show ``new``, the text of the window's first ``upto`` tokens not shown yet."""
        # The new window starts where the previous emission's new tokens started.
        del self._ids[: self._read]
        self._read = upto - self._read
        self._prefix_text = self._decode(self._ids[: self._read])
        return self._clean.feed(new) if self._clean is not None else new

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that can be shown now (may be "")."""
        try:
            tid = int(token_id)
        except (TypeError, ValueError):
            raise InputError(f"push() needs an int token id, got {token_id!r}") from None
        if tid < 0:
            raise InputError(f"token ids must be non-negative, got {tid}")
        if tid in self._special:
            return ""  # decode() drops it too; keeping it out keeps the window text-only
        ids = self._ids
        ids.append(tid)
        text = self._decode(ids)
        prefix = self._prefix_text
        if len(text) > len(prefix) and not text.endswith("\ufffd") and tid not in self._byte_ids:
            return self._release(text[len(prefix) :], len(ids))
        pending = len(ids) - self._read
        if pending > _MAX_PENDING:
            cut = len(ids) - _SYNC_TAIL
            head = self._decode(ids[:cut])
            context = self._decode(ids[cut - 1 : cut])
            rest = self._decode(ids[cut - 1 :])
            if (
                len(head) >= len(prefix)
                and not (ids[cut - 1] in self._byte_ids and ids[cut] in self._byte_ids)
                and rest.startswith(context)
                and head + rest[len(context) :] == text
            ):
                return self._release(head[len(prefix) :], cut)
            if pending > _HARD_LIMIT:
                return self._release(text[len(prefix) :], len(ids))
        return ""

    def flush(self) -> str:
        """Return everything held back (call once, at the end of the sequence)."""
        out = ""
        if len(self._ids) > self._read:
            out = self._release(self._decode(self._ids)[len(self._prefix_text) :], len(self._ids))
        if self._clean is not None:
            out += self._clean.flush()
        return out
