"""The context rule: how long a request may run, the same for every caller."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    from ..config import GenerationConfig


def max_length(
    config: GenerationConfig, prompt_length: int, context: int | None, *, lifted: bool
) -> int:
    """The request's last position. A request may ask for more tokens than the model's
    context holds, and then ends at the context with finish reason "length" (clipped, as
    llama.cpp does; nothing already generated is lost). A prompt that alone fills the
    context is refused (``PromptEncoder.check_ids``), and so is a ``max_length`` that
    leaves no room after the prompt. ``lifted``: the cache keeps positions within a
    window, so the model's trained context does not bound the length."""
    if config.max_new_tokens is not None:
        end = prompt_length + config.max_new_tokens
    else:
        assert config.max_length is not None
        end = config.max_length
        if end <= prompt_length:
            raise InputError(
                f"max_length={end} leaves no room after the {prompt_length}-token "
                "prompt; set max_new_tokens instead",
                field="max_length",
            )
    if context and not lifted:
        return min(end, context)
    return end


def clipped_length(default: int | None, prompt_length: int, context: int | None) -> int | None:
    """``max_new_tokens`` for a request that set no length and whose default
    (``default``, from the model's layers) would run past the context: what is left of
    the context (the server sends it, so a client's usage and finish reason are exact);
    None when the default fits."""
    if default and context and prompt_length < context < prompt_length + default:
        return context - prompt_length
    return None
