"""What a GGUF's metadata says about the network: one ``ModelSpec`` for every architecture.

The builder is one builder, not one per family: the families differ in a handful of
data-driven choices, read here from the file's metadata (``{arch}.*`` keys) and, where the
file is silent, from the rule llama.cpp itself applies (its ``llama-model.cpp``), so a GGUF
runs here as it runs there:

======== ==================================================================================
llama    q/k rows permuted by the converter (undone here: Hugging Face's row order, rotate
         half); Llama 3 rope scaling as a ``rope_freqs`` tensor of per-pair divisors;
         optional biases
mistral  as llama (llama.cpp writes Mistral 7B as ``llama``; ``mistral`` is accepted too)
qwen2    q/k/v biases; no permutation
qwen3    per-head q/k RMS norms before rotary; head_dim from ``attention.key_length``
gemma2   norms stored as 1 + w (used as stored); post-attention and post-feed-forward
         norms; attention soft-capping inside GroupQueryAttention and final soft-capping on
         the logits; sliding window on even layers; embeddings times sqrt(hidden); GELU
         (tanh); attention scale 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 62- and
         46-layer 27B models (llama.cpp's rule: the GGUF has no query_pre_attn_scalar)
gemma3   as gemma2 plus q/k norms, no soft-capping unless the file says, every 6th layer
         global (``attention.sliding_window_pattern`` when written), local layers on rope
         base 10000 (``rope.freq_base_swa`` when written), linear rope scaling
phi3     fused ``attn_qkv`` and ``ffn_up`` (gate rows first); partial rotary
         (``rope.dimension_count``); LongRoPE short/long factors as tensors
======== ==================================================================================

Anything else is refused by name, listing the supported architectures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from .reader import GGUFError, GGUFFile

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelSpec", "RopeSpec", "read_spec"]

Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True)
class _Traits:
    """The per-family choices that metadata does not carry."""

    permuted_qk: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    fused_qkv: bool = False  # one attn_qkv tensor (phi3)
    fused_gate_up: bool = False  # ffn_up holds gate then up (phi3)
    activation: Activation = "silu"
    scaled_embedding: bool = False
    hf_model_type: str = "llama"
    swa_period: int = 0  # every Nth layer global when the file gives no pattern (0: none)
    swa_base_default: float | None = None  # rope base of sliding layers if not in the file


_TRAITS: dict[str, _Traits] = {
    "llama": _Traits(permuted_qk=True),
    "mistral": _Traits(permuted_qk=True, hf_model_type="mistral"),
    "qwen2": _Traits(hf_model_type="qwen2"),
    "qwen3": _Traits(qk_norm=True, hf_model_type="qwen3"),
    "gemma2": _Traits(
        post_norms=True,
        activation="gelu_tanh",
        scaled_embedding=True,
        hf_model_type="gemma2",
        swa_period=2,
    ),
    "gemma3": _Traits(
        qk_norm=True,
        post_norms=True,
        activation="gelu_tanh",
        scaled_embedding=True,
        hf_model_type="gemma3_text",
        swa_period=6,
        swa_base_default=10000.0,
    ),
    "phi3": _Traits(fused_qkv=True, fused_gate_up=True, hf_model_type="phi3"),
}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_TRAITS)


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding of one kind of layer.

    ``dim``: rotated dimensions (the first ``dim`` of each head); ``base``: theta;
    ``scaling``: "none", "linear" (``factor``), "llama3" (``freq_divisors``: llama.cpp's
    ``rope_freqs`` tensor), "longrope" (``short_factors``/``long_factors`` and
    ``original_context``, cos and sin times ``attn_factor``).
    """

    dim: int
    base: float
    scaling: str = "none"
    factor: float = 1.0
    freq_divisors: tuple[float, ...] | None = None
    short_factors: tuple[float, ...] | None = None
    long_factors: tuple[float, ...] | None = None
    original_context: int = 0
    attn_factor: float = 1.0


@dataclass(frozen=True)
class ModelSpec:
    """Everything the graph builder needs to know about the network."""

    architecture: str
    hf_model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rms_eps: float
    attention_scale: float
    activation: Activation
    rope: RopeSpec
    rope_local: RopeSpec | None  # sliding layers' rotary, when it differs (gemma3)
    sliding_window: int  # 0: none
    sliding_layers: tuple[bool, ...]
    attn_softcap: float
    final_softcap: float
    embedding_scale: float  # 1.0: none
    permuted_qk: bool
    qk_norm: bool
    post_norms: bool
    fused_qkv: bool
    fused_gate_up: bool
    tied_head: bool
    traits: dict[str, Any] = field(default_factory=dict)

    def window(self, layer: int) -> int:
        """GroupQueryAttention's ``local_window_size`` for ``layer`` (-1: global)."""
        return self.sliding_window if self.sliding_layers[layer] else -1


def read_spec(g: GGUFFile) -> ModelSpec:
    """The ``ModelSpec`` of a GGUF file, or a GGUFError naming what is missing or unsupported."""
    arch = g.architecture
    traits = _TRAITS.get(arch)
    if traits is None:
        raise GGUFError(
            f"{g.path}: architecture {arch!r} is not supported; ortgen builds "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    layers = _int(g, "block_count")
    hidden = _int(g, "embedding_length")
    heads = _int(g, "attention.head_count")
    kv_heads = _int(g, "attention.head_count_kv", heads)
    head_dim = int(g.arch("attention.key_length") or hidden // heads)
    value_dim = int(g.arch("attention.value_length") or head_dim)
    if value_dim != head_dim:
        raise GGUFError(f"{g.path}: key length {head_dim} != value length {value_dim}")
    embd = g.tensor("token_embd.weight")
    vocab = embd.shape[0]
    intermediate = _int(g, "feed_forward_length")
    context = int(g.arch("context_length") or 4096)
    window = int(g.arch("attention.sliding_window") or 0)
    sliding = _sliding_layers(g, traits, layers, window)
    rope = _rope(g, traits, head_dim)
    rope_local = None
    if traits.swa_base_default is not None and any(sliding):
        base = float(g.arch("rope.freq_base_swa") or traits.swa_base_default)
        rope_local = RopeSpec(dim=rope.dim, base=base)
    scale = g.arch("attention.scale")
    attention_scale = (
        float(scale) if scale else _attention_scale(arch, layers, hidden, heads, head_dim)
    )
    return ModelSpec(
        architecture=arch,
        hf_model_type=traits.hf_model_type,
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        context=context,
        rms_eps=float(g.arch("attention.layer_norm_rms_epsilon") or 1e-5),
        attention_scale=attention_scale,
        activation=traits.activation,
        rope=rope,
        rope_local=rope_local,
        sliding_window=window if any(sliding) else 0,
        sliding_layers=sliding,
        attn_softcap=float(g.arch("attn_logit_softcapping") or 0.0),
        final_softcap=float(g.arch("final_logit_softcapping") or 0.0),
        embedding_scale=_embedding_scale(hidden) if traits.scaled_embedding else 1.0,
        permuted_qk=traits.permuted_qk,
        qk_norm=traits.qk_norm,
        post_norms=traits.post_norms,
        fused_qkv=traits.fused_qkv and "blk.0.attn_qkv.weight" in g.tensors,
        fused_gate_up=traits.fused_gate_up and "blk.0.ffn_gate.weight" not in g.tensors,
        tied_head="output.weight" not in g.tensors,
    )


def _int(g: GGUFFile, key: str, default: int | None = None) -> int:
    """An integer hyperparameter; a per-layer list must hold one value (no such model here
    varies it: a list of different values is refused, naming the key)."""
    value = g.arch(key, default)
    if value is None:
        raise GGUFError(f"{g.path}: metadata {g.architecture}.{key} is missing")
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise GGUFError(
                f"{g.path}: {g.architecture}.{key} differs between layers ({sorted(set(value))}); "
                "ortgen builds models whose layers share their shapes"
            )
        value = value[0]
    return int(value)


def _sliding_layers(g: GGUFFile, traits: _Traits, layers: int, window: int) -> tuple[bool, ...]:
    """Which layers attend within the sliding window: the file's pattern if it has one
    (a per-layer list of flags, or a period whose last layer is global), else the family's
    (llama.cpp's ``set_swa_pattern``); every layer for a windowed family without a pattern
    (Mistral v0.1, Phi-3 mini 4k)."""
    if window <= 0:
        return (False,) * layers
    pattern = g.arch("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise GGUFError(f"{g.path}: sliding_window_pattern has {len(pattern)} layers")
        return tuple(bool(p) for p in pattern)
    period = int(pattern) if isinstance(pattern, int) and pattern > 0 else traits.swa_period
    if period <= 1:
        return (True,) * layers
    return tuple((i + 1) % period != 0 for i in range(layers))


def _rope(g: GGUFFile, traits: _Traits, head_dim: int) -> RopeSpec:
    dim = int(g.arch("rope.dimension_count") or head_dim)
    default_base = 10000.0
    base = float(g.arch("rope.freq_base") or default_base)
    if "rope_freqs.weight" in g.tensors:
        divisors = _floats(g, "rope_freqs.weight", dim // 2)
        return RopeSpec(dim=dim, base=base, scaling="llama3", freq_divisors=divisors)
    if "rope_factors_long.weight" in g.tensors:
        original = int(g.arch("rope.scaling.original_context_length") or 0)
        context = int(g.arch("context_length") or 0)
        attn = g.arch("rope.scaling.attn_factor")
        if attn is None and original and context > original:
            scale = context / original
            attn = math.sqrt(1 + math.log(scale) / math.log(original))
        return RopeSpec(
            dim=dim, base=base, scaling="longrope",
            short_factors=_floats(g, "rope_factors_short.weight", dim // 2),
            long_factors=_floats(g, "rope_factors_long.weight", dim // 2),
            original_context=original, attn_factor=float(attn or 1.0),
        )  # fmt: skip
    kind = str(g.arch("rope.scaling.type") or "none")
    if kind in ("none", ""):
        return RopeSpec(dim=dim, base=base)
    if kind == "linear":
        factor = float(g.require("rope.scaling.factor"))
        return RopeSpec(dim=dim, base=base, scaling="linear", factor=factor)
    raise GGUFError(
        f"{g.path}: rope scaling {kind!r} is not supported (ortgen builds none, linear, "
        "llama3 frequency factors and longrope)"
    )


def _floats(g: GGUFFile, name: str, count: int) -> tuple[float, ...]:
    """An F32 vector of ``count`` values (one per rotated pair): checked here, so a file
    with another length fails naming the tensor, not deep in the rotary tables."""
    import numpy as np

    t = g.tensor(name)
    if t.qtype != 0:  # F32
        raise GGUFError(f"{g.path}: {name} is {t.type_name}, expected F32")
    # t.data is the tensor's raw bytes: reinterpret them (a conversion would give one
    # float per byte, four times too many values)
    values = np.ascontiguousarray(t.data).view("<f4").reshape(-1)
    if values.size != count:
        raise GGUFError(
            f"{g.path}: {name} has {values.size} values, expected {count} "
            "(one per pair of rotated dimensions)"
        )
    return tuple(float(x) for x in values)


def _attention_scale(arch: str, layers: int, hidden: int, heads: int, head_dim: int) -> float:
    """1/sqrt(head_dim), except Gemma 2 and 3 27B (46 and 62 layers), whose query scale is
    hidden/heads (llama.cpp hard-codes it: the GGUF has no query_pre_attn_scalar)."""
    if (arch, layers) in (("gemma2", 46), ("gemma3", 62)):
        return 1.0 / math.sqrt(hidden / heads)
    return 1.0 / math.sqrt(head_dim)


def _embedding_scale(hidden: int) -> float:
    """sqrt(hidden) as Gemma's Hugging Face code rounds it: a float32 tensor of hidden**0.5."""
    import numpy as np

    return float(np.float32(hidden**0.5))
