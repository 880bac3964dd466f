"""A draft model for speculative decoding: a smaller model of the target's tokenizer.

A public helper (exported as ``ortgen.load_draft_model``) for drafter plugins that decode
with a second model, as the built-in ``draft_model`` drafter does: a plugin gets the
loaded model through the public API instead of loading, sharing and vetting it itself.
It sits above the facade (it calls ``ortgen.load``), so the framework below never
imports it; ``ortgen`` exports it lazily.
"""

from __future__ import annotations

from pathlib import Path

from .api import TextGenerator, load
from .errors import ConfigError
from .protocols import GenerationContext

__all__ = ["load_draft_model"]


def load_draft_model(
    ctx: GenerationContext, folder: str, *, threads: int = 1, drafter: str = "draft_model"
) -> TextGenerator:
    """The model in ``folder``, loaded once per target model and shared by its requests.

    Kept in ``ctx.model_state`` (one onnxruntime session of ``threads`` threads; each
    request binds its own buffers), so a drafter factory may call this per request.
    Drafts are token ids: a model whose vocabulary is not the target's (``ctx``'s) is a
    :class:`~ortgen.ConfigError`, as is a folder that does not load; ``drafter`` (the
    name the calling drafter is registered under) names the component in the message.
    """
    loaded_models: dict[tuple[str, int], TextGenerator]
    loaded_models = ctx.model_state.setdefault("draft_model", {})  # one per folder, threads
    key = (str(Path(folder).resolve()), threads)
    loaded = loaded_models.get(key)
    if loaded is None:
        try:
            loaded = load(folder, threads=threads)
        except Exception as exc:
            raise ConfigError(
                f"drafter {drafter!r} could not load {folder!r}: {type(exc).__name__}: {exc}"
            ) from exc
        _check_same_tokenizer(ctx, loaded, folder, drafter)
        # two requests loading at once keep one of them: every request shares that one
        loaded = loaded_models.setdefault(key, loaded)
    return loaded


def _check_same_tokenizer(
    ctx: GenerationContext, draft: TextGenerator, folder: str, drafter: str
) -> None:
    """Drafts are token ids: they mean the same text only with the same vocabulary."""
    width = draft.model.signature.vocab_size
    if width != ctx.vocab_size:
        raise ConfigError(
            f"drafter {drafter!r}: {folder!r} scores {width} tokens, the target "
            f"{ctx.vocab_size}; a draft model needs the target's tokenizer"
        )
    ours, theirs = ctx.tokenizer, draft.tokenizer
    if (
        ours is not None
        and theirs is not None
        and ours.backend.get_vocab() != theirs.backend.get_vocab()
    ):
        raise ConfigError(
            f"drafter {drafter!r}: the tokenizer of {folder!r} is not the target's "
            "(its vocabulary differs); a draft model needs the target's tokenizer"
        )
