"""How a GGUF is built (``BuildOptions``) and what a build records of it (``variant_of``).

A leaf of ``ortgen.gguf`` that imports neither onnx nor gguf: every ``ortgen.load()`` of the
default model checks its folder against these, and must stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .spec import ModelSpec

__all__ = ["BUILD_FORMAT", "DEFAULT_MAX_CONTEXT", "BuildOptions", "variant_of"]

#: What the builder writes: bump it when a graph it builds would differ, so cached builds
#: of older formats are rebuilt (saying why).
BUILD_FORMAT = 1

#: positions of the rotary tables when the file's context is longer (64 MB of tables for
#: a 131,072-token Llama 3; ``max_context`` raises it)
DEFAULT_MAX_CONTEXT = 32768

Precision = Literal["exact", "fp32"]


@dataclass(frozen=True)
class BuildOptions:
    """How to build: ``exact`` keeps the file's own integers and scales (MatMulNBits);
    ``fp32`` dequantises every weight to float32 (a reference graph: ~4 bytes a weight).
    ``accuracy_level`` is MatMulNBits' (4: int8 activations, fast; 0: float32, exact).
    ``max_context``: positions the graph serves (default: the file's, up to 32,768).
    ``embeddings``: the graph also outputs ``hidden_states`` (B, T, hidden), the last
    layer's state after the final norm, before the LM head (``gen.embed()`` pools it)."""

    precision: Precision = "exact"
    accuracy_level: int = 4
    max_context: int | None = None
    verify: bool = False
    embeddings: bool = False

    def context(self, spec: ModelSpec) -> int:
        if self.max_context:
            return int(self.max_context)
        return min(spec.context, DEFAULT_MAX_CONTEXT)


def variant_of(options: BuildOptions) -> dict[str, Any]:
    """The manifest's ``variant``: what decides the graph, besides the file.
    ``embeddings`` appears only when set, so folders built without it (the default model's
    among them) match the variant they were built as."""
    variant: dict[str, Any] = {
        "graph": "fused",
        "precision": "gguf-exact" if options.precision == "exact" else options.precision,
        "accuracy_level": options.accuracy_level,
        "max_context": options.max_context,
        "builder": "ortgen.gguf",
        "build_format": BUILD_FORMAT,
    }
    if options.embeddings:
        variant["embeddings"] = True
    return variant
