"""ortgen: text generation on ONNX Runtime for the CPU.

The public API lives here. A plugin imports this package and, besides it, only the
documented public modules ``ortgen.protocols``, ``ortgen.errors``, ``ortgen.checks`` and
``ortgen.testing`` (docs/plugins.md, "What a plugin may import"; an import contract holds
the built-in plugins to it). The runtime half (``load`` and what it returns, and the
helpers that need it) is imported on first use, so a plugin module that only needs
``hookimpl`` and the protocols imports quickly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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
from .plugin_host.hookspecs import (
    ChatFormatFactory,
    DrafterFactory,
    KVCacheFactory,
    LogitsProcessorFactory,
    Register,
    SamplerFactory,
    StoppingCriterionFactory,
    hookimpl,
)
from .protocols import (
    AdaptsDrafts,
    BeamsPerPrompt,
    BelongsToGraph,
    ChecksDrafts,
    CopiesRows,
    DeclaresScoreUse,
    Drafter,
    FeedsMask,
    FollowsTokens,
    ForcesTokens,
    ForksCache,
    ForksState,
    GenerationContext,
    KeepsSequenceLogprobs,
    KVCache,
    LiftsContext,
    LimitsFeed,
    LogitsProcessor,
    NamesFinishReason,
    OwnsPresents,
    PreparesAhead,
    Reseedable,
    ReusesPrefixes,
    ReusesRowPrefixes,
    RowSlots,
    Sampler,
    SearchStrategy,
    SelectsRow,
    ShiftsColumns,
    StoppingCriterion,
    WorksOnCandidates,
)
from .protocols.candidates import Candidates, best_first
from .protocols.chat_formats import (
    CallDraft,
    ChatFormat,
    MarksReasoning,
    ParsedAnswer,
    ShapesText,
    TemplateProbe,
    ToolSpec,
)
from .structured.check import check_grammar, grammar_text
from .version import __version__

if TYPE_CHECKING:
    from .api import TextGenerator, load
    from .draft_models import load_draft_model
    from .loop.generate import Generation
    from .loop.step_report import Admitted, StepReport
    from .plugin_host.chains import logits_processors
    from .request.outputs import GenerationOutput, PromptScore, StreamPiece, TokenLogprob
    from .text.stop_strings import StopStringMatcher


_LAZY = {
    "GenerationOutput": "request.outputs",
    "StreamPiece": "request.outputs",
    "PromptScore": "request.outputs",
    "TokenLogprob": "request.outputs",
    "TextGenerator": "api",
    "load": "api",
    "Generation": "loop.generate",
    "StepReport": "loop.step_report",
    "Admitted": "loop.step_report",
    "logits_processors": "plugin_host.chains",
    "load_draft_model": "draft_models",
    "StopStringMatcher": "text.stop_strings",
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
    "AdaptsDrafts",
    "Admitted",
    "BeamsPerPrompt",
    "BelongsToGraph",
    "CallDraft",
    "Candidates",
    "ChatFormat",
    "ChatFormatFactory",
    "ChecksDrafts",
    "ComponentError",
    "ConfigError",
    "CopiesRows",
    "DeclaresScoreUse",
    "Drafter",
    "DrafterFactory",
    "ExportError",
    "FeedsMask",
    "FollowsTokens",
    "ForcesTokens",
    "ForksCache",
    "ForksState",
    "Generation",
    "GenerationConfig",
    "GenerationContext",
    "GenerationOutput",
    "InputError",
    "KVCache",
    "KVCacheFactory",
    "KeepsSequenceLogprobs",
    "LiftsContext",
    "LimitsFeed",
    "LogitsProcessor",
    "LogitsProcessorFactory",
    "MarksReasoning",
    "ModelLoadError",
    "NamesFinishReason",
    "NoTokenLeft",
    "OrtgenError",
    "OutputError",
    "OwnsPresents",
    "ParsedAnswer",
    "PluginError",
    "PreparesAhead",
    "PromptScore",
    "Register",
    "Reseedable",
    "ReusesPrefixes",
    "ReusesRowPrefixes",
    "RowSlots",
    "Sampler",
    "SamplerFactory",
    "SearchStrategy",
    "SelectsRow",
    "ShapesText",
    "ShiftsColumns",
    "StepReport",
    "StopStringMatcher",
    "StoppingCriterion",
    "StoppingCriterionFactory",
    "StreamPiece",
    "TemplateProbe",
    "TextGenerator",
    "TokenLogprob",
    "ToolSpec",
    "WorksOnCandidates",
    "__version__",
    "best_first",
    "check_grammar",
    "generate",
    "grammar_text",
    "hookimpl",
    "load",
    "load_draft_model",
    "logits_processors",
    "stream",
]
