"""Export variants: which graph family, which weight precision, which quantisation block.

A variant is recorded in the model folder's manifest, so a folder knows what made it
and the default model is rebuilt when ortgen would now build a different one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ExportError

GRAPHS = ("fused", "optimum")
PRECISIONS = ("fp32", "int8", "int4")
BLOCK_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Variant:
    """How a model is exported.

    Attributes:
        graph: ``fused`` (onnxruntime-genai's model builder: GroupQueryAttention with
            rotary inside, fused norms, shared past/present buffers, LM head pruned to
            the last position) or ``optimum`` (optimum's export: one node per PyTorch op,
            Concat-based KV cache).
        precision: ``fp32``; ``int8``/``int4`` weight-only quantisation to MatMulNBits
            (LM head included). A GGUF file's own weights are kept by ortgen's GGUF
            builder (``ortgen.gguf``), not by an export variant.
        block_size: weights per quantisation block (int8/int4).
        accuracy_level: MatMulNBits' activation precision: 4 = int8 activations (fastest
            on CPUs with int8 dot products), 0 = as the input (fp32).
        embeddings: the graph also outputs ``hidden_states`` (B, T, hidden), the last
            layer's state after the final norm, as the LM head reads it (``gen.embed()``,
            ``POST /v1/embeddings``); recorded only when set, so other exports' manifests
            are as before.
    """

    graph: str = "fused"
    precision: str = "int4"
    block_size: int = 32
    accuracy_level: int = 4
    embeddings: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.graph not in GRAPHS:
            problems.append(f"graph {self.graph!r} is not one of {', '.join(GRAPHS)}")
        if self.precision == "gguf":  # removed: ortgen.gguf builds that model now
            problems.append(
                "precision 'gguf' is no longer an export variant: to keep a GGUF file's own "
                "weights, build it with ortgen's GGUF builder, `ortgen export FILE.gguf OUT` "
                "or `ortgen.load('FILE.gguf')` (no export extra needed)"
            )
        elif self.precision not in PRECISIONS:
            problems.append(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.block_size not in BLOCK_SIZES:
            sizes = ", ".join(map(str, BLOCK_SIZES))
            problems.append(f"block size {self.block_size} is not one of {sizes}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            problems.append(f"accuracy level {self.accuracy_level} is not in 0..4")
        if not isinstance(self.embeddings, bool):
            problems.append(f"embeddings must be true or false, got {self.embeddings!r}")
        if problems:
            raise ExportError("bad export variant: " + "; ".join(problems))

    @property
    def quantized(self) -> bool:
        return self.precision in ("int8", "int4")

    @property
    def name(self) -> str:
        """A short label, e.g. ``fused-int4-b32``."""
        label = f"{self.graph}-{self.precision}"
        if self.quantized:
            label += f"-b{self.block_size}"
        if self.precision != "fp32" and self.accuracy_level != 4:
            label += f"-a{self.accuracy_level}"
        if self.embeddings:
            label += "-embeddings"
        return label

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if not self.embeddings:
            del values["embeddings"]
        return values

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Variant:
        known = {k: data[k] for k in ("graph", "precision", "block_size", "accuracy_level")}
        known["embeddings"] = data.get("embeddings", False)
        return cls(**{k: v for k, v in known.items() if v is not None})


def variant_name(recorded: Any) -> str | None:
    """The label of a variant as a manifest records it, or None if it is not a valid one."""
    if not isinstance(recorded, dict):
        return None
    try:
        return Variant.from_dict(recorded).name
    except (ExportError, KeyError, TypeError):
        return None


#: What ``ortgen export`` builds without flags: any source, the fastest graph.
DEFAULT_VARIANT = Variant()
