"""Rotary position embeddings (RoPE), enough to move cached keys to other positions.

A key cached by a rotary model is ``R(p) k``: its raw projection rotated by its position.
Rotations of one plane commute, so moving it from position ``p`` to ``p - s`` is one
more rotation, ``R(-s)``, whatever ``p`` was. The ``sliding_window`` cache needs that on
fused graphs, whose attention takes each key's position from its slot in the buffer.

The frequencies follow transformers' ``rope_init_fn`` for the types whose frequencies
do not depend on the sequence length (default, linear, llama3); the pairing is the
"rotate half" layout that transformers and onnxruntime-genai's builder use for Llama and
Qwen2 (dimension ``i`` with ``i + rotary_dim / 2``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: rope types whose frequencies are fixed (no dependence on the sequence length)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def inverse_frequencies(config: Mapping[str, Any], head_dim: int) -> np.ndarray:
    """Per rotated pair, the angle one position turns it by (float64, rotary_dim / 2)."""
    if "rope_theta" not in config and config.get("model_type") == "gpt2":
        raise ValueError("the model has no rotary embeddings to re-rotate")
    theta = float(config.get("rope_theta", 10000.0))
    rotary_dim = int(head_dim * float(config.get("partial_rotary_factor", 1.0) or 1.0))
    inv_freq = 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {kind!r} depends on the sequence length; cached keys cannot be "
            f"moved to other positions (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, scaling)
    return inv_freq


def _llama3(inv_freq: np.ndarray, scaling: Mapping[str, Any]) -> np.ndarray:
    """transformers' ``_compute_llama3_parameters``: long wavelengths slowed by ``factor``,
    short ones kept, the band between interpolated."""
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    scaled = np.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(medium, smoothed, scaled)


class KeyShifter:
    """Moves cached keys ``shift`` positions back, in place, with preallocated scratch."""

    def __init__(self, inv_freq: np.ndarray, dtype: np.dtype) -> None:
        self._inv_freq = inv_freq
        self._half = len(inv_freq)
        self._dtype = dtype
        self._angles: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def shift_back(self, keys: np.ndarray, shift: int) -> None:
        """``keys`` (..., positions, head_dim) rotated by ``-shift`` positions, in place."""
        cos, sin = self._angles.get(shift) or self._angle(shift)
        half = self._half
        x = keys[..., :half]
        y = keys[..., half : 2 * half]
        x_old = x.copy()
        # R(-s): x' = x cos + y sin, y' = y cos - x sin  (cos/sin of s * inv_freq)
        x *= cos
        x += y * sin
        y *= cos
        y -= x_old * sin

    def _angle(self, shift: int) -> tuple[np.ndarray, np.ndarray]:
        angle = shift * self._inv_freq
        pair = (np.cos(angle).astype(self._dtype), np.sin(angle).astype(self._dtype))
        if len(self._angles) < 64:
            self._angles[shift] = pair
        return pair
