"""A GGUF weight as its own Q4_1 / Q8_0 blocks: read, reorder, concatenate, pack, dequantise.

The exact GGUF rewrite (``gguf_exact``) never dequantises a weight to put it in the graph:
it moves the GGUF's integer codes, scales and minimums into MatMulNBits as they are. This
module is that block arithmetic, apart from any ONNX graph: splitting a tensor's raw bytes
into codes / scales / minimums, undoing llama.cpp's q/k row permutation, stacking weights
the way the builder fuses them, packing codes into MatMulNBits' layout, and dequantising
(only to verify). numpy is a core dependency; the ``gguf`` package is not imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ExportError

# Weights per GGUF block (Q4_1 and Q8_0 alike), and so MatMulNBits' block_size.
BLOCK = 32


@dataclass
class Blocks:
    """One weight in GGUF block form, rows in the graph's (transformers') order.

    ``q`` is (N, K) integer codes (0..15 for Q4_1, -128..127 for Q8_0), ``d`` and ``m`` are
    (N, K/32) float32 (``m`` is None for Q8_0, whose blocks have no minimum).
    """

    kind: str
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None

    @property
    def bits(self) -> int:
        return 4 if self.kind == "Q4_1" else 8


def read_blocks(tensor: Any) -> Blocks:
    """Split a GGUF tensor's raw blocks into codes, scales and minimums (no dequantisation)."""
    kind = tensor.tensor_type.name
    raw = np.asarray(tensor.data)
    if kind not in ("Q4_1", "Q8_0"):
        raise ExportError(
            f"GGUF rewrite: {tensor.name} is {kind}; a matmul weight must be Q4_1 or Q8_0 to be "
            "run exactly by MatMulNBits"
        )
    rows = raw.shape[0]
    if kind == "Q4_1":  # block: fp16 d, fp16 m, 16 bytes: low nibbles = 0..15, high = 16..31
        blk = raw.reshape(rows, -1, 20)
        d = blk[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = blk[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blk[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, -1)
        return Blocks(kind, q, d, m)
    blk = raw.reshape(rows, -1, 34)  # Q8_0 block: fp16 d, 32 x int8
    d = blk[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blk[..., 2:].copy().view(np.int8).reshape(rows, -1)
    return Blocks(kind, q, d, None)


def unpermute_index(rows: int, n_head: int) -> np.ndarray:
    """Row order transformers' ``_reverse_permute_weights`` gives: new[i] = old[index[i]]."""
    dim = rows // n_head // 2
    return np.arange(rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(rows)


def unpermute(blocks: Blocks, n_head: int) -> Blocks:
    """Undo llama.cpp's q/k row permutation; rows are whole, so blocks move intact."""
    idx = unpermute_index(blocks.q.shape[0], n_head)
    m = None if blocks.m is None else blocks.m[idx]
    return Blocks(blocks.kind, blocks.q[idx], blocks.d[idx], m)


def concat(parts: list[Blocks], node_name: str) -> Blocks:
    """Stack weights along N (rows) as the builder fuses q/k/v; they must share one type."""
    kinds = {p.kind for p in parts}
    if len(kinds) != 1:
        raise ExportError(
            f"GGUF rewrite: {node_name} fuses GGUF tensors of different types {sorted(kinds)}; "
            "build the graph with disable_qkv_fusion=true"
        )
    if len(parts) == 1:
        return parts[0]
    m = None if parts[0].m is None else np.concatenate([p.m for p in parts])
    return Blocks(
        parts[0].kind,
        np.concatenate([p.q for p in parts]),
        np.concatenate([p.d for p in parts]),
        m,
    )


#: the zero point of a 4-bit MatMulNBits that has no zero-point input
DEFAULT_ZERO_POINT_4BIT = 8


def shifted_minimum(blocks: Blocks) -> np.ndarray:
    """The Q4_1 minimum for a MatMulNBits under its default zero point 8, which computes
    d*(q - 8): m + 8d, so that d*(q - 8) + (m + 8d) = d*q + m. The codes stay as they
    are. m and d are float16 values, so the float32 sum is exact (checked: a GGUF whose
    sum rounds is refused)."""
    assert blocks.m is not None
    shifted = blocks.m + np.float32(DEFAULT_ZERO_POINT_4BIT) * blocks.d
    if not np.array_equal(shifted - np.float32(DEFAULT_ZERO_POINT_4BIT) * blocks.d, blocks.m):
        raise ValueError("m + 8d is not exact in float32 for some block")
    return shifted


def with_blocksum_rows(blocks: Blocks, zero_point: int = 0) -> Blocks:
    """``blocks`` plus K/32 rows of codes ``zero_point + 1`` and scale 1, row j covering
    block j only (each of its codes then counts 1: ``zero_point`` is the one the
    MatMulNBits subtracts, 8 when it has no zero-point input).

    A MatMulNBits over these returns, after its N outputs, the K/32 block sums of its
    input A: the sums the Q4_1 minimum term needs (``blocksum(A) @ M^T``), computed by the
    same kernel call instead of a separate MatMul with a 0/1 (K, K/32) matrix. At accuracy
    level 4 the kernel quantises A to int8 per block of 32, so the sums are of the same
    quantised A the d*q part multiplies, as llama.cpp's q8_1 block sums are
    (``ggml_vec_dot_q4_1_q8_1``): the two parts of w = d*q + m see one A, where a float
    block sum paired with an int8 d*q part adds the activations' rounding error times m.
    """
    nb = blocks.q.shape[1] // BLOCK
    eye = np.eye(nb, dtype=np.float32)
    q = (np.repeat(eye, BLOCK, axis=1) * (zero_point + 1)).astype(blocks.q.dtype)
    m = None if blocks.m is None else np.concatenate([blocks.m, np.zeros_like(eye)])
    return Blocks(blocks.kind, np.concatenate([blocks.q, q]), np.concatenate([blocks.d, eye]), m)


def dequant(blocks: Blocks) -> np.ndarray:
    """(N, K) float32 weights of ``blocks``: d*q (+ m)."""
    rows = blocks.q.shape[0]
    w = blocks.q.reshape(rows, -1, BLOCK).astype(np.float32) * blocks.d[..., None]
    if blocks.m is not None:
        w += blocks.m[..., None]
    return w.reshape(rows, -1)


def pack(blocks: Blocks) -> np.ndarray:
    """MatMulNBits' B: (N, K/32, 32*bits/8) uint8; 4-bit: element 2j low nibble, 2j+1 high."""
    rows = blocks.q.shape[0]
    if blocks.bits == 8:
        return (blocks.q.astype(np.int16) + 128).astype(np.uint8).reshape(rows, -1, BLOCK)
    q = blocks.q.astype(np.uint8).reshape(rows, -1, BLOCK)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def same_blocks(a: Blocks, b: Blocks) -> bool:
    """True if two weights hold identical blocks (a tied LM head and embedding)."""
    return (
        a.kind == b.kind
        and a.q.shape == b.q.shape
        and (np.array_equal(a.q, b.q) and np.array_equal(a.d, b.d))
    )
