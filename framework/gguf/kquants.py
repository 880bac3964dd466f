"""GGUF blocks as integers: every quantised type unpacked to ``w = scale * q + minimum``.

``quant_layout`` turns a GGUF weight into MatMulNBits' layout without ever going through
floats, so that the graph holds the file's own numbers. This module is the first half: it
reads one type's raw blocks and returns small integer codes ``q``, one float32 ``scale`` per
block of codes and, for the types with an additive term, one float32 ``minimum`` per block,
such that ``scale * q + minimum`` (exact real arithmetic) rounds to what
``gguf.quants.dequantize`` returns. Each decoder mirrors gguf-py's ``dequantize_blocks``
step for step (same float32 products, which are all exact here: an fp16 mantissa of 11
bits times a code or sub-scale of at most 8 bits), so the tests' bit-for-bit comparison with
gguf-py checks the bit unpacking, not a re-derivation of the formats.

The i-quant grids, sign table and non-linear value tables are taken from ``gguf.quants`` so
that they cannot drift from the reference. Little-endian hosts only (as gguf-py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import (
    IQ1_S,
    IQ2_S,
    IQ2_XS,
    IQ2_XXS,
    IQ3_S,
    IQ3_XXS,
    IQ4_NL,
    MXFP4,
    NVFP4,
    Q4_K,
)

T = GGMLQuantizationType


@dataclass(frozen=True)
class Decoded:
    """One tensor's GGUF blocks as integers; ``n`` GGUF blocks of ``QK`` weights each.

    ``q`` is (n, QK) int16, ``scale`` and ``minimum`` are (n, QK // block) float32 (``minimum``
    None when the type has no additive term): weight = scale * q + minimum per block of
    ``block`` consecutive weights.
    """

    q: np.ndarray
    scale: np.ndarray
    minimum: np.ndarray | None
    block: int


def _f16(field: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 holding fp16 values -> (n, 1) float32, as gguf-py reads them."""
    return np.ascontiguousarray(field).view(np.float16).astype(np.float32)


def _u(field: np.ndarray, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """Bytes reinterpreted as little-endian unsigned integers (uint16 / uint32)."""
    return np.ascontiguousarray(field).view(dtype)


def _fields(x: np.ndarray, shifts: list[int], group: int, mask: int) -> np.ndarray:
    """Bit fields laid out the ggml way: each group of ``group`` bytes is read once per shift,
    all of its bytes at shift 0 first, then all at the next shift. (n, -1) uint8."""
    n = x.shape[0]
    s = np.array(shifts, dtype=x.dtype).reshape(1, 1, -1, 1)
    return ((x.reshape(n, -1, 1, group) >> s) & mask).astype(np.uint8).reshape(n, -1)


def _split(blocks: np.ndarray, *sizes: int) -> list[np.ndarray]:
    """Cut each block into consecutive fields of ``sizes`` bytes (the rest is the last)."""
    return np.hsplit(blocks, np.cumsum(sizes).tolist())


def _sign_bits(bytes_: np.ndarray) -> np.ndarray:
    """One byte of 8 sign bits (bit i for element i) -> 8 values of +1 / -1, int16."""
    bits = (bytes_[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(bits == 0, 1, -1).astype(np.int16)


def _ksigns(index: np.ndarray) -> np.ndarray:
    """7-bit sign indices (ggml's ksigns_iq2xs, the 8th sign is the parity) -> +1 / -1."""
    table = np.frombuffer(IQ2_XXS.ksigns, dtype=np.uint8)
    return _sign_bits(table[index.astype(np.intp)])


def _grid(cls: type, index: np.ndarray) -> np.ndarray:
    """Grid rows of an i-quant (small integers) for ``index`` -> (..., row width) int16."""
    cls.init_grid()  # type: ignore[attr-defined]
    grid = np.rint(cls.grid[0, 0]).astype(np.int16)  # type: ignore[attr-defined]
    return grid[index.astype(np.intp)]


def _table(values: tuple[int, ...], index: np.ndarray) -> np.ndarray:
    """A non-linear 16-entry value table (IQ4_NL, MXFP4, NVFP4) looked up -> int16."""
    return np.array(values, dtype=np.int16)[index.astype(np.intp)]


# --- legacy types: 32 weights per block, one fp16 scale (and minimum) ----------------------


def _q4_0(b: np.ndarray) -> Decoded:
    d, qs = _split(b, 2)
    return Decoded(_fields(qs, [0, 4], 16, 0xF).astype(np.int16) - 8, _f16(d), None, 32)


def _q4_1(b: np.ndarray) -> Decoded:
    d, m, qs = _split(b, 2, 2)
    return Decoded(_fields(qs, [0, 4], 16, 0xF).astype(np.int16), _f16(d), _f16(m), 32)


def _q5(b: np.ndarray, with_min: bool) -> Decoded:
    d, m, qh, qs = _split(b, 2, 2 if with_min else 0, 4)
    high = (_u(qh, np.uint32) >> np.arange(32, dtype=np.uint32)) & 1
    q = (_fields(qs, [0, 4], 16, 0xF) | (high.astype(np.uint8) << 4)).astype(np.int16)
    if with_min:
        return Decoded(q, _f16(d), _f16(m), 32)
    return Decoded(q - 16, _f16(d), None, 32)


def _q8_0(b: np.ndarray) -> Decoded:
    d, qs = _split(b, 2)
    return Decoded(np.ascontiguousarray(qs).view(np.int8).astype(np.int16), _f16(d), None, 32)


# --- k-quants: super-blocks of 256 with sub-blocks of 16 or 32 -----------------------------


def _q2_k(b: np.ndarray) -> Decoded:
    scales, qs, d, dmin = _split(b, 16, 64, 2)
    dl = _f16(d) * (scales & 0xF).astype(np.float32)
    ml = _f16(dmin) * (scales >> 4).astype(np.float32)
    return Decoded(_fields(qs, [0, 2, 4, 6], 32, 3).astype(np.int16), dl, -ml, 16)


def _q3_k(b: np.ndarray) -> Decoded:
    hmask, qs, scales, d = _split(b, 32, 64, 12)
    low = _fields(scales[:, :8], [0, 4], 8, 0xF)
    high = _fields(scales[:, 8:], [0, 2, 4, 6], 4, 3)
    sc = (low | (high << 4)).astype(np.int16) - 32
    hbit = _fields(hmask, list(range(8)), 32, 1).astype(np.int16)
    q = _fields(qs, [0, 2, 4, 6], 32, 3).astype(np.int16) - 4 * (1 - hbit)
    return Decoded(q, _f16(d) * sc.astype(np.float32), None, 16)


def _q45_k(b: np.ndarray, five: bool) -> Decoded:
    d, dmin, scales, qh, qs = _split(b, 2, 2, 12, 32 if five else 0)
    sc, m = Q4_K.get_scale_min(scales)
    q = _fields(qs, [0, 4], 32, 0xF)
    if five:
        q = q | (_fields(qh, list(range(8)), 32, 1) << 4)
    dl = _f16(d) * sc.astype(np.float32)
    ml = _f16(dmin) * m.astype(np.float32)
    return Decoded(q.astype(np.int16), dl, -ml, 32)


def _q6_k(b: np.ndarray) -> Decoded:
    ql, qh, scales, d = _split(b, 128, 64, 16)
    low = _fields(ql, [0, 4], 64, 0xF)
    q = (low | (_fields(qh, [0, 2, 4, 6], 32, 3) << 4)).astype(np.int16) - 32
    sc = np.ascontiguousarray(scales).view(np.int8).astype(np.float32)
    return Decoded(q, _f16(d) * sc, None, 16)


# --- non-linear 4-bit tables ---------------------------------------------------------------


def _iq4_nl(b: np.ndarray) -> Decoded:
    d, qs = _split(b, 2)
    return Decoded(_table(IQ4_NL.kvalues, _fields(qs, [0, 4], 16, 0xF)), _f16(d), None, 32)


def _iq4_xs(b: np.ndarray) -> Decoded:
    d, scales_h, scales_l, qs = _split(b, 2, 2, 4)
    high = (_u(scales_h, np.uint16) >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
    ls = (_fields(scales_l, [0, 4], 1, 0xF) | (high.astype(np.uint8) << 4)).astype(np.int16) - 32
    q = _table(IQ4_NL.kvalues, _fields(qs, [0, 4], 16, 0xF))
    return Decoded(q, _f16(d) * ls.astype(np.float32), None, 32)


def _mxfp4(b: np.ndarray) -> Decoded:
    e, qs = _split(b, 1)
    q = _table(MXFP4.kvalues, _fields(qs, [0, 4], 16, 0xF))
    return Decoded(q, MXFP4.e8m0_to_fp32_half(e).astype(np.float32), None, 32)


def _nvfp4(b: np.ndarray) -> Decoded:
    d, qs = _split(b, 4)
    q = _table(NVFP4.kvalues, _fields(qs, [0, 4], 8, 0xF))
    return Decoded(q, NVFP4.ue4m3_to_fp32(d).astype(np.float32), None, 16)


# --- i-quants: grid rows of small integers, signs, a 4-bit sub-scale -----------------------


def _half_scale(d: np.ndarray, s: np.ndarray, factor: float) -> np.ndarray:
    """gguf-py's ``d * (0.5 + s) * factor`` (IQ2_*, IQ3_XXS), in its float32 order."""
    return d * (np.float32(0.5) + s.astype(np.float32)) * np.float32(factor)


def _iq2_xxs(b: np.ndarray) -> Decoded:
    n = b.shape[0]
    d, qs = _split(b, 2)
    aux = _u(qs, np.uint32).reshape(n, 8, 2)
    grid = _grid(IQ2_XXS, np.ascontiguousarray(aux[..., 0]).view(np.uint8)).reshape(n, 8, 4, 8)
    signs = _ksigns((aux[..., 1:] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 0x7F)
    db = _half_scale(_f16(d), aux[..., 1] >> 28, 0.25)
    return Decoded((grid * signs).reshape(n, 256), db, None, 32)


def _iq2_xs(b: np.ndarray) -> Decoded:
    n = b.shape[0]
    d, qs, scales = _split(b, 2, 64)
    qs16 = _u(qs, np.uint16)
    q = _grid(IQ2_XS, qs16 & 511) * _ksigns(qs16 >> 9)
    db = _half_scale(_f16(d), _fields(scales, [0, 4], 1, 0xF), 0.25)
    return Decoded(q.reshape(n, 256), db, None, 16)


def _iq2_s(b: np.ndarray) -> Decoded:
    n = b.shape[0]
    d, qs, signs, qh, scales = _split(b, 2, 32, 32, 8)
    index = qs.astype(np.uint16) | (_fields(qh, [0, 2, 4, 6], 1, 3).astype(np.uint16) << 8)
    q = _grid(IQ2_S, index) * _sign_bits(signs)
    db = _half_scale(_f16(d), _fields(scales, [0, 4], 1, 0xF), 0.25)
    return Decoded(q.reshape(n, 256), db, None, 16)


def _iq3_xxs(b: np.ndarray) -> Decoded:
    n = b.shape[0]
    d, qs, scales = _split(b, 2, 64)
    aux = _u(scales, np.uint32)
    grid = _grid(IQ3_XXS, qs).reshape(n, 8, 4, 8)
    signs = _ksigns((aux[..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 0x7F)
    db = _half_scale(_f16(d), aux >> 28, 0.5)
    return Decoded((grid * signs).reshape(n, 256), db, None, 32)


def _iq3_s(b: np.ndarray) -> Decoded:
    n = b.shape[0]
    d, qs, qh, signs, scales = _split(b, 2, 64, 8, 32)
    index = qs.astype(np.uint16) | (_fields(qh, list(range(8)), 1, 1).astype(np.uint16) << 8)
    q = _grid(IQ3_S, index).reshape(n, 32, 8) * _sign_bits(signs)
    db = _f16(d) * (1 + 2 * _fields(scales, [0, 4], 1, 0xF))
    return Decoded(q.reshape(n, 256), db, None, 32)


def _iq1_grid(qs: np.ndarray, high3: np.ndarray, n: int) -> np.ndarray:
    """IQ1 grid rows ({-1, 0, 1}) from 8 low and 3 high index bits -> (n, 32, 8) int16."""
    return _grid(IQ1_S, qs.astype(np.uint16) | (high3.astype(np.uint16) << 8)).reshape(n, 32, 8)


def _iq1(grid: np.ndarray, dl: np.ndarray, negative: np.ndarray, fold: bool) -> Decoded:
    """IQ1 weights dl * (grid ± 1/8) per block of ``grid.shape[1]`` (16 or 32).

    Folded, the 1/8 becomes part of the integer (q = 8 * grid ± 1 in -9..9, scale dl / 8):
    no minimum term. Unfolded (one delta sign per block), q = grid and the delta is a
    minimum ±dl / 8: 2-bit codes. Both scales are exact (dl / 8 only moves the exponent)."""
    n, nblk = dl.shape
    delta = np.where(negative, -1, 1).astype(np.int16)
    if fold:
        q = 8 * grid.reshape(n, nblk, -1, 8) + delta.reshape(n, nblk, -1, 1)
        return Decoded(q.reshape(n, -1), dl * np.float32(0.125), None, 256 // nblk)
    if delta.shape != dl.shape:
        raise ValueError("the delta sign changes within a block")
    return Decoded(grid.reshape(n, -1), dl, dl * np.float32(0.125) * delta, 256 // nblk)


def _iq1_s(b: np.ndarray, fold: bool) -> Decoded:
    n = b.shape[0]
    d, qs, qh = _split(b, 2, 32)
    qh16 = _u(qh, np.uint16)
    high = (qh16[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7
    dl = _f16(d) * (2 * ((qh16 >> 12) & 7) + 1)
    return _iq1(_iq1_grid(qs, high.reshape(n, 32), n), dl, (qh16 & 0x8000) != 0, fold)


def _iq1_m(b: np.ndarray, fold: bool) -> Decoded:
    n = b.shape[0]
    qs, qh, scales = _split(b, 32, 16)
    sc16 = _u(scales, np.uint16)
    top = (sc16 & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    d = (top[:, 0] | top[:, 1] | top[:, 2] | top[:, 3]).view(np.float16).astype(np.float32)
    sub = ((sc16[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7).reshape(n, 16)
    dl = d[:, None] * (2 * sub + 1)
    nib = _fields(qh, [0, 4], 1, 0xF)  # (n, 32): 3 index bits and a delta sign per 8 weights
    return _iq1(_iq1_grid(qs, nib & 7, n), dl, (nib & 8) != 0, fold)


# --- ternary -------------------------------------------------------------------------------


def _tq1_0(b: np.ndarray) -> Decoded:
    n = b.shape[0]
    qs, qh, d = _split(b, 48, 4)
    pow3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8).reshape(1, 1, 5, 1)
    parts = [
        (qs[:, :32].reshape(n, -1, 1, 32) * pow3).reshape(n, -1),
        (qs[:, 32:].reshape(n, -1, 1, 16) * pow3).reshape(n, -1),
        (qh.reshape(n, -1, 1, 4) * pow3[:, :, :4]).reshape(n, -1),
    ]
    trits = (np.concatenate(parts, axis=-1).astype(np.uint16) * 3) >> 8
    return Decoded(trits.astype(np.int16) - 1, _f16(d), None, 256)


def _tq2_0(b: np.ndarray) -> Decoded:
    qs, d = _split(b, 64)
    return Decoded(_fields(qs, [0, 2, 4, 6], 32, 3).astype(np.int16) - 1, _f16(d), None, 256)


_DECODERS: dict[T, Callable[[np.ndarray, bool], Decoded]] = {
    T.Q4_0: lambda b, f: _q4_0(b),
    T.Q4_1: lambda b, f: _q4_1(b),
    T.Q5_0: lambda b, f: _q5(b, with_min=False),
    T.Q5_1: lambda b, f: _q5(b, with_min=True),
    T.Q8_0: lambda b, f: _q8_0(b),
    T.Q2_K: lambda b, f: _q2_k(b),
    T.Q3_K: lambda b, f: _q3_k(b),
    T.Q4_K: lambda b, f: _q45_k(b, five=False),
    T.Q5_K: lambda b, f: _q45_k(b, five=True),
    T.Q6_K: lambda b, f: _q6_k(b),
    T.IQ4_NL: lambda b, f: _iq4_nl(b),
    T.IQ4_XS: lambda b, f: _iq4_xs(b),
    T.IQ2_XXS: lambda b, f: _iq2_xxs(b),
    T.IQ2_XS: lambda b, f: _iq2_xs(b),
    T.IQ2_S: lambda b, f: _iq2_s(b),
    T.IQ3_XXS: lambda b, f: _iq3_xxs(b),
    T.IQ3_S: lambda b, f: _iq3_s(b),
    T.IQ1_S: _iq1_s,
    T.IQ1_M: lambda b, f: _iq1_m(b, fold=True),  # its delta sign changes every 8 weights
    T.TQ1_0: lambda b, f: _tq1_0(b),
    T.TQ2_0: lambda b, f: _tq2_0(b),
    T.MXFP4: lambda b, f: _mxfp4(b),
    T.NVFP4: lambda b, f: _nvfp4(b),
}

#: the quantised types this module unpacks
DECODABLE: frozenset[T] = frozenset(_DECODERS)


def decode(qtype: T, raw: np.ndarray, *, fold_minimum: bool = False) -> Decoded:
    """Unpack ``raw`` (all of a tensor's bytes, uint8) of GGUF type ``qtype`` into integers.

    ``fold_minimum`` matters for IQ1_S only: fold its ±1/8 delta into 8-bit codes (no
    minimum term) instead of 2-bit codes plus a per-block minimum.
    """
    decoder = _DECODERS.get(qtype)
    if decoder is None:
        raise KeyError(qtype)
    qk, type_size = GGML_QUANT_SIZES[qtype]
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, type_size)
    out = decoder(blocks, fold_minimum)
    assert out.q.shape == (blocks.shape[0], qk), (qtype, out.q.shape)
    assert out.scale.shape == (blocks.shape[0], qk // out.block), (qtype, out.scale.shape)
    return out
