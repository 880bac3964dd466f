"""One GGUF weight tensor -> MatMulNBits' layout, exactly (pure numpy).

The builder puts every GGUF weight into the graph as the file's own integers and scales, so
that the graph computes with the weights llama.cpp computes with, not a re-quantisation. A
MatMulNBits weight is ``scale * (code - zero_point)`` per block; GGUF types add, per block,
a minimum (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) or a fixed delta (IQ1_S). This module maps each
type to that form plus, where needed, a ``minimum`` c per block (weight = scale * (code - zp)
+ c), which the graph adds as ``blocksum(A) @ minimum^T``.

Exactness, checked per tensor: ``reconstruct`` computes scale * (code - zp) + c in float64
(the product is exact there, and the one float64 rounding of the sum cannot change the
float32 rounding that follows) and rounds to float32; the result must equal
``gguf.quants.dequantize`` bit for bit (``np.array_equal``: -0.0 and 0.0 count as equal; a
sign of zero changes no product or sum the graph computes). Else ``NotExact``. Where gguf's
float32 formula itself rounds (a minimum far larger than scale * code), the graph's real
weight is the unrounded value, as in llama.cpp's integer dot products.

Codes are chosen so that onnxruntime's default zero point (2 ** (bits - 1): 2, 8, 128, probed)
applies: a MatMulNBits without a zero-point input has the faster kernel. Codes that fit
[-zp, zp) are stored as code + zp with the minimum unchanged; codes from 0 (Q4_1, Q4_K) are
stored as they are and the minimum becomes c + zp * scale, exact if it rounds right, else
(``zero_point="auto"``) explicit zero points are written instead. Packing (probed on
onnxruntime 1.32): element j of a block is in byte j // (8 / bits) at bit (j % (8 / bits)) *
bits, low bits first; packed zero points the same along the blocks of a row.

Per type (defaults of ``to_layout``; every row checked exact on random valid blocks; zero
point "dflt" = no zero-point input; D = d * sub-scale, dl = the IQ1 block scale):

    type      bits block codes q        zero point  minimum          scales fp16-exact
    Q4_0      4    32    -8..7          dflt 8      -                yes (d)
    Q4_1      4    32    0..15          dflt 8      m + 8d           yes
    Q5_0      8    32    -16..15        dflt 128    -                yes
    Q5_1      8    32    0..31          dflt 128    m                yes
    Q8_0      8    32    -128..127      dflt 128    -                yes
    Q2_K      4    16    0..3           dflt 8      -dmin * m_j      no (d * 4-bit)
    Q3_K      4    16    -4..3          dflt 8      -                no
    Q4_K      4    32    0..15          dflt 8      8D - dmin * m_j  no
    Q5_K      8    32    0..31          dflt 128    -dmin * m_j      no
    Q6_K      8    16    -32..31        dflt 128    -                no
    IQ4_NL    8    32    kvalues        dflt 128    -                yes
    IQ4_XS    8    32    kvalues        dflt 128    -                no
    IQ2_XXS   8    32    ±grid, <= 43   dflt 128    -                no
    IQ2_XS/S  8    16    ±grid, <= 43   dflt 128    -                no
    IQ3_XXS   8    32    ±grid, <= 62   dflt 128    -                no
    IQ3_S     8    32    ±grid, <= 15   dflt 128    -                no
    IQ1_S     2    32    grid -1..1     dflt 2      ±dl / 8          no
    IQ1_M     8    16    8 * grid ± 1   dflt 128    -                no
    TQ1_0     2    128   -1..1          dflt 2      -                yes
    TQ2_0     2    128   -1..1          dflt 2      -                yes
    MXFP4     8    32    e2m1 * 2       dflt 128    -                if 2**e fits fp16
    NVFP4     8    16    e2m1 * 2       dflt 128    -                yes

- Q4_1 / Q4_K: where the shifted minimum does not round right, "auto" writes explicit zero
  points 0 and keeps m / -dmin * m_j as the minimum. Measured on random blocks: Q4_K stays
  on the default for dmin / d in 2**-3 .. 2**9, Q4_1 for |m| / d up to ~2**15 (llama.cpp
  writes both near 1; SmolLM2-135M's Q4_1 GGUF: all 210 tensors on the default).
- IQ1_S with ``bits=8``: its ±1/8 delta folds into the codes (8 * grid ± 1, scale dl / 8),
  no minimum. IQ1_M has only that form: its delta sign changes every 8 weights, below
  MatMulNBits' smallest block (16), so a per-block minimum cannot hold it.
- TQ1_0 / TQ2_0: blocks of 256 split to 128 (2-bit kernel, below). A TQ2_0 code of 3 (never
  written by llama.cpp) makes q span -1..2: codes shift by one and the minimum becomes d.
- F32, F16, BF16: ``FloatWeight`` (float32 values). Refused: Q8_1, Q8_K (activation types,
  never weights), Q1_0 (gguf 0.19 cannot dequantise it: nothing to check against), F64 and
  integer types (not weights).

2-bit MatMulNBits is fast only for blocks 32..128 (16 and 256 fall back to a ~50x slower
kernel), so Q2_K stays 4-bit at its block 16 and the ternary types split their 256 to 128.

MatMulNBits, one call, M = 1, accuracy_level 4, 1 thread, AMD EPYC Zen 3 (AVX2, no VNNI),
onnxruntime 1.32, a busy 2-core machine; µs, best of 7 rounds of 200 calls, two runs (±5%).
"zp": with a zero-point input; "+min": plus the minimum term as two float MatMuls
(A @ 0/1 blocksum matrix, @ minimum^T) and an Add:

    N x K       2b/32 2b/32zp 4b/16 4b/16zp 4b/32 4b/32zp 4b/32+min 8b/16 8b/16zp 8b/32 8b/32zp
    1536 x 576   48    48      60    60      46    57      54        53    55      50    50
    576 x 1536   43    42      63    63      45    54      57        53    53      49    49

2b/128 at 576 x 1536: 32. Fallbacks: 2b/16 ~2,500, 2b/256 ~2,800. These weights (0.2-0.9 MB)
sit in L2, so the timings show the kernels' arithmetic, not the bytes a full model streams:
block 16 costs ~1.3x block 32 at 4 bits; a zero-point input ~1.2x at 4b/32, nothing at 8 bits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from .kquants import DECODABLE, decode

T = GGMLQuantizationType

#: (bits, block) ``to_layout`` chooses by default, for docs and the builder's planning
TYPE_BITS: dict[T, tuple[int, int]] = {
    T.Q4_0: (4, 32),
    T.Q4_1: (4, 32),
    T.Q5_0: (8, 32),
    T.Q5_1: (8, 32),
    T.Q8_0: (8, 32),
    T.Q2_K: (4, 16),
    T.Q3_K: (4, 16),
    T.Q4_K: (4, 32),
    T.Q5_K: (8, 32),
    T.Q6_K: (8, 16),
    T.IQ4_NL: (8, 32),
    T.IQ4_XS: (8, 32),
    T.IQ2_XXS: (8, 32),
    T.IQ2_XS: (8, 16),
    T.IQ2_S: (8, 16),
    T.IQ3_XXS: (8, 32),
    T.IQ3_S: (8, 32),
    T.IQ1_S: (2, 32),
    T.IQ1_M: (8, 16),
    T.TQ1_0: (2, 128),
    T.TQ2_0: (2, 128),
    T.MXFP4: (8, 32),
    T.NVFP4: (8, 16),
}
FLOAT_TYPES: frozenset[T] = frozenset({T.F32, T.F16, T.BF16})
_FAST_2BIT_BLOCKS = (32, 64, 128)  # measured: other 2-bit block sizes run a fallback kernel
_ROWS_PER_CHECK = 2048  # rows verified at a time: bounds the float64 copy of an embedding

ZeroPointMode = Literal["auto", "default", "explicit"]


class NotExact(ValueError):
    """A tensor's layout would not reproduce ``gguf.quants.dequantize`` bit for bit."""


class Unsupported(ValueError):
    """A GGUF tensor type with no exact MatMulNBits form (the message says why)."""


@dataclass(frozen=True)
class NBitsWeight:
    """A GGUF weight as MatMulNBits' inputs: weight = scales * (code - zp) + minimum.

    ``codes`` is B, (N, K/block, block*bits/8) uint8; ``scales`` (N, K/block) float32;
    ``zero_point`` None for onnxruntime's default (2 ** (bits - 1)) or packed uint8
    (N, ceil(K/block * bits/8)); ``minimum`` None or (N, K/block) float32, added by the graph
    as blocksum(A) @ minimum^T (blocks of ``block_size`` along K). ``shape`` is the logical
    (..., K) shape, rows flattened into N. The ``*_fp16_exact`` flags say whether an fp16
    graph could hold the scales / minimum without rounding.
    """

    qtype: T
    shape: tuple[int, ...]
    bits: int
    block_size: int
    codes: np.ndarray
    scales: np.ndarray
    zero_point: np.ndarray | None
    minimum: np.ndarray | None
    scales_fp16_exact: bool
    minimum_fp16_exact: bool | None

    @property
    def default_zero_point(self) -> int:
        """The zero point onnxruntime applies when the node has no zero-point input."""
        return 1 << (self.bits - 1)

    @property
    def nbytes(self) -> int:
        """Bytes of all initializers this layout needs (float32 scales / minimum)."""
        extra = (self.zero_point, self.minimum)
        return (
            self.codes.nbytes + self.scales.nbytes + sum(x.nbytes for x in extra if x is not None)
        )


@dataclass(frozen=True)
class FloatWeight:
    """An F32 / F16 / BF16 tensor: float32 ``values`` in the logical shape (exact: every
    fp16 and bf16 value is a float32 value); ``fp16_exact`` if fp16 could hold them all."""

    qtype: T
    values: np.ndarray
    fp16_exact: bool


@dataclass(frozen=True)
class GatherTables:
    """An embedding (V rows, K) for onnxruntime's GatherBlockQuantized (com.microsoft).

    Probed on onnxruntime 1.32 CPU: ``data`` uint8 (V, K*bits/8) packed as MatMulNBits' B,
    attributes ``attributes``, ``scales`` (V, K/block) float32, optional ``zero_points``
    packed like MatMulNBits' (uint8 only: float zero points are rejected), default zero point
    2 ** (bits - 1); 2, 4 and 8 bits, blocks from 16. The op has no additive term, so a
    ``minimum`` (V, K/block) is gathered beside it with a plain Gather and added per block:
    ``Reshape(Reshape(GBQ(ids), [..., K/block, block]) + Unsqueeze(Gather(minimum, ids), -1),
    [..., K])``. The alternatives cost more bytes: 8-bit codes cannot absorb a minimum either,
    and a float table is 4 bytes per weight. Store ``minimum`` as fp16 (and Cast) when
    ``minimum_fp16_exact``.
    """

    data: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    minimum: np.ndarray | None
    minimum_fp16_exact: bool | None
    bits: int
    block_size: int

    @property
    def attributes(self) -> dict[str, int]:
        """GatherBlockQuantized's attributes for a row lookup of this table."""
        return {
            "gather_axis": 0,
            "quantize_axis": 1,
            "block_size": self.block_size,
            "bits": self.bits,
        }


def to_layout(
    qtype: T | int,
    raw: np.ndarray | bytes,
    shape: tuple[int, ...] | list[int],
    *,
    bits: int | None = None,
    block_size: int | None = None,
    zero_point: ZeroPointMode = "auto",
    verify: bool = True,
    name: str = "",
) -> NBitsWeight | FloatWeight:
    """Map one GGUF tensor to MatMulNBits' layout (or a float array), exactly.

    ``raw`` is the tensor's data as ``GGUFReader`` gives it (any dtype, viewed as bytes) or
    bytes; ``shape`` the logical shape with K (GGUF's ne0) last, e.g. (N, K): GGUF's own
    ``tensor.shape`` is reversed. ``bits`` forces 2, 4 or 8 (default: the fewest with a fast
    kernel); ``block_size`` splits the type's blocks (a power of two from 16 dividing it).
    ``zero_point``: "default" never writes zero points, "explicit" always does (the codes'
    offset, in every block), "auto" only when the default would not be exact. ``verify``
    compares with ``gguf.quants.dequantize`` (else a sufficient check: the minimum is exact in
    float32). Raises ``NotExact`` / ``Unsupported`` naming ``name``, the type and the cause.
    """
    qtype = T(qtype)
    label = f"{name + ': ' if name else ''}{qtype.name} tensor {tuple(shape)}"
    data = np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else _bytes_of(raw)
    shape = tuple(int(s) for s in shape)
    if qtype in FLOAT_TYPES:
        values = dequantize(data, qtype) if qtype == T.BF16 else _float_values(qtype, data)
        values = np.asarray(values, np.float32).reshape(shape)
        return FloatWeight(qtype, values, _fp16_exact(values))
    if qtype not in DECODABLE:
        raise Unsupported(f"{label}: {_WHY_NOT.get(qtype, _UNKNOWN)}")
    qk, type_size = GGML_QUANT_SIZES[qtype]
    k = shape[-1]
    n = int(np.prod(shape[:-1], dtype=np.int64))
    if k % qk or data.size != n * (k // qk) * type_size:
        raise ValueError(f"{label}: {data.size} bytes do not hold {n} rows of {k} ({qk} a block)")
    if bits not in (None, 2, 4, 8):
        raise ValueError(f"{label}: MatMulNBits takes 2, 4 or 8 bits, not {bits}")
    dec = decode(qtype, data, fold_minimum=bits == 8)
    q = dec.q.reshape(n, k)
    scale = dec.scale.reshape(n, -1)
    minimum = None if dec.minimum is None else dec.minimum.reshape(n, -1)
    if not np.isfinite(scale).all() or (minimum is not None and not np.isfinite(minimum).all()):
        raise NotExact(f"{label}: non-finite scales or minimums (a damaged file?)")
    qmin, qmax = int(q.min()), int(q.max())
    bits = bits or next(b for b in (2, 4, 8) if qmax - qmin < 1 << b and _fast(b, dec.block))
    if qmax - qmin >= 1 << bits:
        raise NotExact(f"{label}: codes {qmin}..{qmax} do not fit {bits} bits")
    block = dec.block
    if block_size is None and bits == 2 and block > _FAST_2BIT_BLOCKS[-1]:
        block_size = _FAST_2BIT_BLOCKS[-1]
    if block_size is not None and block_size != block:
        if block_size < 16 or block_size & (block_size - 1) or block % block_size:
            raise ValueError(f"{label}: block_size {block_size} does not split blocks of {block}")
        scale = scale.repeat(block // block_size, axis=1)
        minimum = None if minimum is None else minimum.repeat(block // block_size, axis=1)
        block = block_size
    zp = 1 << (bits - 1)
    offset = zp if -zp <= qmin and qmax < zp else -qmin
    codes = _pack((q + offset).astype(np.uint8).reshape(n, k // block, block), bits)
    base = NBitsWeight(qtype, shape, bits, block, codes, scale, None, minimum, False, None)
    tried: list[str] = []
    if zero_point != "explicit":
        shifted, rounded = minimum, 0
        if offset != zp:
            m64 = 0.0 if minimum is None else minimum.astype(np.float64)
            exact = m64 + scale.astype(np.float64) * (zp - offset)
            shifted = exact.astype(np.float32)
            rounded = int(np.count_nonzero(shifted != exact)) * block
        layout = _finish(replace(base, minimum=shifted))
        bad = _non_exact(layout, data, qtype, verify, rounded)
        if not bad:
            return layout
        where = "" if verify else " (in blocks whose shifted minimum rounds)"
        tried.append(f"{bad} of {n * k} weights{where} with the default zero point {zp}")
    if zero_point != "default":
        zps = np.full((n, k // block), offset, np.uint8)
        layout = _finish(replace(base, zero_point=_pack(zps[:, None, :], bits)[:, 0, :]))
        bad = _non_exact(layout, data, qtype, verify, 0)
        if not bad:
            return layout
        tried.append(f"{bad} of {n * k} weights with explicit zero points {offset}")
    raise NotExact(f"{label}: not exact at {bits} bits: " + "; ".join(tried))


def reconstruct(layout: NBitsWeight | FloatWeight, rows: slice | None = None) -> np.ndarray:
    """The float32 weights a layout represents: scale * (code - zp) + minimum, in the logical
    shape (or, with ``rows``, those rows of the (N, K) matrix)."""
    if isinstance(layout, FloatWeight):
        return layout.values
    sel = slice(None) if rows is None else rows
    codes = _unpack(layout.codes[sel], layout.bits).astype(np.float64)
    if layout.zero_point is None:
        zp: np.ndarray | int = layout.default_zero_point
    else:
        nb = layout.scales.shape[1]
        zp = _unpack(layout.zero_point[sel][:, None, :], layout.bits)[:, 0, :nb, None]
    w = layout.scales[sel].astype(np.float64)[..., None] * (codes - zp)
    if layout.minimum is not None:
        w += layout.minimum[sel].astype(np.float64)[..., None]
    out = w.astype(np.float32).reshape(w.shape[0], -1)
    return out if rows is not None else out.reshape(layout.shape)


def gather_tables(layout: NBitsWeight) -> GatherTables:
    """The GatherBlockQuantized tables of an embedding whose layout is ``layout`` (V, K):
    the same bytes as its MatMulNBits form (a tied LM head can share them)."""
    rows = layout.codes.shape[0]
    return GatherTables(
        data=layout.codes.reshape(rows, -1),
        scales=layout.scales,
        zero_points=layout.zero_point,
        minimum=layout.minimum,
        minimum_fp16_exact=layout.minimum_fp16_exact,
        bits=layout.bits,
        block_size=layout.block_size,
    )


_WHY_NOT: dict[T, str] = {
    T.Q8_1: "an activation type of llama.cpp's dot products, never stored as a weight",
    T.Q8_K: "an activation type of llama.cpp's dot products, never stored as a weight",
    T.F64: "float64 weights do not fit float32 exactly (and no LLM GGUF uses them)",
}
_UNKNOWN = (
    "not a weight type (integers), or a type gguf-py has no dequantiser for (Q1_0 in gguf "
    "0.19): no exact mapping, or nothing to check exactness against"
)


def _fast(bits: int, block: int) -> bool:
    """Whether onnxruntime's kernel for ``bits`` is fast at this block (after the 2-bit
    split of blocks over 128 that ``to_layout`` applies)."""
    return bits != 2 or block >= _FAST_2BIT_BLOCKS[0]


def _finish(layout: NBitsWeight) -> NBitsWeight:
    """Fill in the fp16 flags of a candidate layout."""
    m = layout.minimum
    return replace(
        layout,
        scales_fp16_exact=_fp16_exact(layout.scales),
        minimum_fp16_exact=None if m is None else _fp16_exact(m),
    )


def _non_exact(layout: NBitsWeight, data: np.ndarray, qtype: T, verify: bool, rounded: int) -> int:
    """How many weights of ``layout`` differ from gguf's dequantisation (0: exact).

    Without ``verify``, ``rounded`` (the weights of blocks whose shifted minimum float32
    rounded) instead: the decoders reproduce gguf exactly (tested), so only a rounded minimum
    can break exactness; counting its whole block is conservative (a rounded minimum may
    still round every weight right, which only ``verify`` can tell)."""
    if not verify:
        return rounded
    n = layout.scales.shape[0]
    rows_bytes = data.reshape(n, -1)
    bad = 0
    for start in range(0, n, _ROWS_PER_CHECK):
        sel = slice(start, start + _ROWS_PER_CHECK)
        ref = dequantize(rows_bytes[sel], qtype)
        bad += int(np.count_nonzero(reconstruct(layout, sel) != ref))
    return bad


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(N, blocks, block) codes < 2**bits -> (N, blocks, block*bits/8) uint8, low bits first
    (padding a row's tail with zeros)."""
    per = 8 // bits
    n, nb, width = codes.shape
    padded = np.zeros((n, nb, -(-width // per) * per), np.uint8)
    padded[..., :width] = codes
    parts = padded.reshape(n, nb, -1, per)
    out = np.zeros(parts.shape[:-1], np.uint8)
    for i in range(per):
        out |= (parts[..., i] << (bits * i)).astype(np.uint8)
    return out


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of ``_pack``: (N, blocks, bytes) uint8 -> (N, blocks, bytes * 8/bits) uint8."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    out = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    return out.reshape(*packed.shape[:-1], -1)


def _bytes_of(raw: np.ndarray) -> np.ndarray:
    """A GGUFReader array (uint8 blocks, or float32 / float16 for float tensors) as bytes."""
    return np.ascontiguousarray(raw).reshape(-1).view(np.uint8)


def _float_values(qtype: T, data: np.ndarray) -> np.ndarray:
    """F32 / F16 bytes -> float32 values."""
    return data.view(np.float32 if qtype == T.F32 else np.float16).astype(np.float32)


def _fp16_exact(x: np.ndarray) -> bool:
    """Whether every value of ``x`` is an fp16 value (no rounding, overflow or underflow)."""
    with np.errstate(over="ignore"):
        return bool(np.array_equal(x.astype(np.float16).astype(np.float32), x))
