"""ortgen: text generation on ONNX Runtime for the CPU.

The public API lives here and only here; plugin authors import nothing else.
The runtime half (``load`` and what it returns) is imported on first use, so a
plugin module that only needs ``hookimpl`` and the protocols imports quickly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .candidates import Candidates
from .config import GenerationConfig
from .errors import (
    ComponentError,
    ConfigError,
    ExportError,
    InputError,
    ModelLoadError,
    NoTokenLeft,
    OrtgenError,
    OutputError,
    PluginError,
)
from .hookspecs import Register, hookimpl
from .protocols import (
    ChecksDrafts,
    Drafter,
    FeedsMask,
    FollowsTokens,
    ForcesTokens,
    ForksCache,
    GenerationContext,
    KVCache,
    LiftsContext,
    LogitsProcessor,
    OwnsPresents,
    Reseedable,
    ReusesPrefixes,
    RowSlots,
    Sampler,
    SearchStrategy,
    SelectsRow,
    StoppingCriterion,
    WorksOnCandidates,
)
from .version import __version__

if TYPE_CHECKING:
    from .api import TextGenerator, load
    from .chain_specs import logits_processors
    from .loop.generate import Generation
    from .outputs import GenerationOutput, StreamPiece


_LAZY = {
    "GenerationOutput": "outputs",
    "StreamPiece": "outputs",
    "TextGenerator": "api",
    "load": "api",
    "Generation": "loop.generate",
    "logits_processors": "chain_specs",
}
_default: TextGenerator | None = None
_default_lock = threading.Lock()  # two threads asking first load the default model once


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'ortgen' has no attribute {name!r}")


def _default_generator() -> TextGenerator:
    global _default
    with _default_lock:
        if _default is None:
            from .api import load

            _default = load()
    return _default


def generate(prompts: Any, **settings: Any) -> GenerationOutput:
    """``load().generate(...)`` on the default model, loaded once per process."""
    return _default_generator().generate(prompts, **settings)


def stream(prompt: Any, **settings: Any) -> Iterator[str]:
    """``load().stream(...)`` on the default model, loaded once per process."""
    return _default_generator().stream(prompt, **settings)


__all__ = [
    "Candidates",
    "ChecksDrafts",
    "ComponentError",
    "ConfigError",
    "Drafter",
    "ExportError",
    "FeedsMask",
    "FollowsTokens",
    "ForcesTokens",
    "ForksCache",
    "Generation",
    "GenerationConfig",
    "GenerationContext",
    "GenerationOutput",
    "InputError",
    "KVCache",
    "LiftsContext",
    "LogitsProcessor",
    "ModelLoadError",
    "NoTokenLeft",
    "OrtgenError",
    "OutputError",
    "OwnsPresents",
    "PluginError",
    "Register",
    "Reseedable",
    "ReusesPrefixes",
    "RowSlots",
    "Sampler",
    "SearchStrategy",
    "SelectsRow",
    "StoppingCriterion",
    "StreamPiece",
    "TextGenerator",
    "WorksOnCandidates",
    "__version__",
    "generate",
    "hookimpl",
    "load",
    "logits_processors",
    "stream",
]
