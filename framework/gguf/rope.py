"""Rotary embedding caches (cos, sin) for GroupQueryAttention, in numpy.

GroupQueryAttention rotates q and k itself from two (positions, dim/2) tables. They are
computed as Hugging Face computes its inverse frequencies (float32, the same operation
order), then cos and sin of position x frequency in float64 rounded once to float32: a
correctly rounded table. torch's float32 cos/sin (the builder and transformers use them) are
within one ulp of it, not bit-equal (~5-15% of entries differ by one ulp, 6e-8): numpy
cannot reproduce SLEEF's rounding, and a correctly rounded table is the better of the two.
"""

from __future__ import annotations

import numpy as np

from .spec import RopeSpec

__all__ = ["inverse_frequencies", "rope_caches"]


def inverse_frequencies(rope: RopeSpec, *, long: bool = False) -> np.ndarray:
    """float32 (dim/2,) inverse frequencies, as ``transformers.modeling_rope_utils`` has
    them for the rope type (``long``: LongRoPE's long factors instead of its short ones)."""
    f32 = np.float32
    exponents = np.arange(0, rope.dim, 2, dtype=np.int64).astype(f32) / f32(rope.dim)
    powers = np.power(f32(rope.base), exponents).astype(f32)
    if rope.scaling == "longrope":
        factors = rope.long_factors if long else rope.short_factors
        ext = np.asarray(factors, f32)
        return (f32(1.0) / (ext * powers)).astype(f32)
    inv = (f32(1.0) / powers).astype(f32)
    if rope.scaling == "linear":
        return (inv / f32(rope.factor)).astype(f32)
    if rope.scaling == "llama3":
        # llama.cpp divides each pair's angle by rope_freqs[i] (ggml_rope_cache_init): the
        # same as Hugging Face's llama3 inverse frequencies to ~1e-7 relative.
        return (inv / np.asarray(rope.freq_divisors, f32)).astype(f32)
    return inv


def rope_caches(
    rope: RopeSpec, length: int, *, long: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each float32 (length, dim/2): position p's angles p * inv_freq (one
    float32 product, as torch's outer product), times LongRoPE's attention factor."""
    inv = inverse_frequencies(rope, long=long)
    angles = np.outer(np.arange(length, dtype=np.float32), inv).astype(np.float32)
    cos = np.cos(angles.astype(np.float64)).astype(np.float32)
    sin = np.sin(angles.astype(np.float64)).astype(np.float32)
    if rope.scaling == "longrope" and rope.attn_factor != 1.0:
        factor = np.float32(rope.attn_factor)
        cos, sin = (cos * factor).astype(np.float32), (sin * factor).astype(np.float32)
    return cos, sin
