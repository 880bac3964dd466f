"""The prompt in an answer: ``echo`` (completions) and vLLM's ``prompt_logprobs``.

A row that asked for its prompt's logprobs gets them on its first piece
(``StreamPiece.prompt_logprobs``: per prompt token a ``TokenLogprob``, None for the
first); this module shapes them:

- ``echo`` with ``logprobs=N`` (completions): the legacy shape, prompt tokens first:
  ``tokens``, ``token_logprobs`` (the first null), ``top_logprobs`` (the first null, then
  the N best plus the token itself) and ``text_offset``, which the answer's own tokens
  continue (what lm-evaluation-harness reads for a loglikelihood).
- ``prompt_logprobs=N`` (vLLM's extension): a list with null for the first token and, for
  each later one, ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` holding the
  token itself and its N best alternatives (the token first), as vLLM returns it: per
  choice on completions, once at the top of a chat answer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..request.outputs import TokenLogprob

if TYPE_CHECKING:
    from .responses import Choice, TokenText

#: what a non-finite logprob becomes: JSON has no -inf (vLLM does the same)
FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else FLOOR


def legacy_prompt_logprobs(
    scored: list[TokenLogprob | None],
    tokens: list[int],
    words: TokenText,
    top: int,
    choice: Choice,
) -> dict[str, list[Any]]:
    """The prompt's part of an echoed answer's legacy logprobs (see module doc);
    ``choice.offset`` (``text_offset``) advances over the prompt's token strings."""
    out: dict[str, list[Any]] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for token, entry in zip(tokens, scored, strict=True):
        text = words.token(token)
        out["tokens"].append(text)
        out["text_offset"].append(choice.offset)
        choice.offset += len(text)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        logprob = _finite(entry.logprob)
        best = {words.token(t): _finite(v) for t, v in entry.top_logprobs[:top]}
        best.setdefault(text, logprob)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(best)
    return out


def vllm_prompt_logprobs(
    scored: list[TokenLogprob | None], words: TokenText, top: int
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs`` (see module doc)."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for entry in scored:
        if entry is None:
            out.append(None)
            continue
        item = {
            str(entry.token): {
                "logprob": _finite(entry.logprob),
                "rank": entry.rank,
                "decoded_token": words.token(entry.token),
            }
        }
        for rank, (token, value) in enumerate(entry.top_logprobs[:top], start=1):
            item.setdefault(
                str(token),
                {"logprob": _finite(value), "rank": rank, "decoded_token": words.token(token)},
            )
        out.append(item)
    return out


def joined(first: dict[str, list[Any]], second: dict[str, list[Any]] | None) -> dict[str, Any]:
    """Two legacy logprobs objects, one after the other (the prompt's, then the answer's)."""
    if second is None:
        return first
    return {key: [*first[key], *second[key]] for key in first}
