"""Linear layers and the embedding lookup, from exact GGUF weight layouts.

A projection is one or more *parts* (q, k, v; gate, up) that read the same input. Parts
whose layouts share a kernel (bits, block, zero-point form, float or not) become one node
whose rows are the parts' rows stacked, and the node's output is split back: fewer, larger
nodes split better across threads and cost less per step than one per tensor. A Q4_K_M file,
say, keeps q and k in Q4_K and v in Q6_K: two nodes.

A layout with a ``minimum`` (weight = scale * (code - zp) + c per block) needs
``blocksum(A) @ C^T`` added. The block sums come from the MatMulNBits itself: one extra row
per block of K, all codes at zero weight but that block's at weight 1, so the sums are of
the same (at accuracy level 4, int8-rounded) activations the codes multiply, as in
llama.cpp's integer dot products; then one float MatMul of (K/block) x N and an Add. A
large weight (the LM head) is cut along N into parts of about ``part_bytes``: onnxruntime
packs each MatMulNBits weight at load while its initializer is mapped, so smaller parts
lower the load's peak (``export/head_layout.py`` measured it: 247 vs 271 MB).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .onnx_writer import GraphWriter
from .quant_layout import FloatWeight, NBitsWeight, _pack

__all__ = ["Part", "concat_rows", "embedding", "kernel_key", "linear", "merge_parts", "take_rows"]

Weight = NBitsWeight | FloatWeight


@dataclass(frozen=True)
class Part:
    """One output slice of a projection: its (N, K) weight and optional bias (N,)."""

    name: str
    weight: Weight
    bias: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return (
            int(self.weight.shape[0])
            if isinstance(self.weight, NBitsWeight)
            else int(self.weight.values.shape[0])
        )


def take_rows(weight: Weight, index: np.ndarray) -> Weight:
    """The weight with its rows reordered (or selected) by ``index``."""
    if isinstance(weight, FloatWeight):
        return replace(weight, values=weight.values[index])
    pick = lambda a: None if a is None else a[index]  # noqa: E731
    return replace(
        weight,
        shape=(len(index), weight.shape[-1]),
        codes=weight.codes[index],
        scales=weight.scales[index],
        zero_point=pick(weight.zero_point),
        minimum=pick(weight.minimum),
    )


def concat_rows(weights: list[Weight]) -> Weight:
    """Weights of one kernel key stacked along N (a missing minimum counts as zeros)."""
    first = weights[0]
    if len(weights) == 1:
        return first
    if isinstance(first, FloatWeight):
        values = np.concatenate([w.values for w in weights if isinstance(w, FloatWeight)])
        return replace(first, values=values)
    nbits = [w for w in weights if isinstance(w, NBitsWeight)]
    minimum = None
    if any(w.minimum is not None for w in nbits):
        minimum = np.concatenate(
            [w.minimum if w.minimum is not None else np.zeros_like(w.scales) for w in nbits]
        )
    zero_point = None
    if first.zero_point is not None:
        zero_point = np.concatenate([w.zero_point for w in nbits if w.zero_point is not None])
    return replace(
        first,
        shape=(sum(w.shape[0] for w in nbits), first.shape[-1]),
        codes=np.concatenate([w.codes for w in nbits]),
        scales=np.concatenate([w.scales for w in nbits]),
        zero_point=zero_point,
        minimum=minimum,
    )


def merge_parts(parts: list[Part], name: str) -> Part:
    """Parts as one: their rows stacked, and their biases (zeros for a part without one)."""
    bias = None
    if any(part.bias is not None for part in parts):
        bias = np.concatenate(
            [part.bias if part.bias is not None else np.zeros(part.rows, np.float32)
             for part in parts]
        ).astype(np.float32)  # fmt: skip
    return Part(name, concat_rows([part.weight for part in parts]), bias)


def kernel_key(weight: Weight) -> tuple[object, ...]:
    if isinstance(weight, FloatWeight):
        return ("float",)
    return ("nbits", weight.bits, weight.block_size, weight.zero_point is not None)


def linear(
    w: GraphWriter,
    x: str,
    parts: list[Part],
    prefix: str,
    *,
    accuracy_level: int,
    part_bytes: int | None = None,
) -> list[str]:
    """``x @ part.weight^T (+ bias)`` for every part, in order: one output name each."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, part in enumerate(parts):
        groups.setdefault(kernel_key(part.weight), []).append(i)
    out: list[str] = [""] * len(parts)
    for n, members in enumerate(groups.values()):
        name = prefix if len(groups) == 1 else f"{prefix}/group{n}"
        merged = merge_parts([parts[i] for i in members], name)
        y = _one_weight(w, x, merged.weight, merged.bias, name, accuracy_level, part_bytes)
        if len(members) == 1:
            out[members[0]] = y
            continue
        sizes = [parts[i].rows for i in members]
        pieces = w.node("Split", [y, w.const(sizes)], f"{name}/Split", outputs=len(sizes), axis=-1)
        for i, piece in zip(members, pieces, strict=True):
            out[i] = piece
    return out


def _one_weight(
    w: GraphWriter,
    x: str,
    weight: Weight,
    bias: np.ndarray | None,
    name: str,
    accuracy_level: int,
    part_bytes: int | None,
) -> str:
    """One weight's product, cut along N into parts when it is large."""
    rows = weight.values.shape[0] if isinstance(weight, FloatWeight) else weight.shape[0]
    per_row = _row_bytes(weight)
    step = rows
    if part_bytes and rows * per_row > part_bytes:
        step = max(64, int(part_bytes // per_row) // 64 * 64)
    starts = list(range(0, rows, step))
    if isinstance(weight, FloatWeight):
        ys = [
            _float_matmul(w, x, weight.values[s : s + step], name, s, len(starts)) for s in starts
        ]
        y = ys[0] if len(ys) == 1 else w.node("Concat", ys, f"{name}/Concat", axis=-1)[0]
        if bias is not None:
            y = w.node("Add", [y, w.weight(f"{name}.bias", bias)], f"{name}/Add")[0]
        return y
    index = np.arange(rows)
    ys, blocksums = [], None
    for s in starts:
        chunk = take_rows(weight, index[s : s + step]) if len(starts) > 1 else weight
        assert isinstance(chunk, NBitsWeight)
        chunk_bias = None if bias is None else bias[s : s + step]
        with_sums = weight.minimum is not None and s == 0
        label = name if len(starts) == 1 else f"{name}/rows_{s}"
        y, sums = _nbits(w, x, chunk, chunk_bias, label, accuracy_level, with_sums)
        ys.append(y)
        blocksums = blocksums or sums
    y = ys[0] if len(ys) == 1 else w.node("Concat", ys, f"{name}/Concat", axis=-1)[0]
    if weight.minimum is not None:
        assert blocksums is not None
        table = w.weight(f"{name}.minimum_T", np.ascontiguousarray(weight.minimum.T))
        extra = w.node("MatMul", [blocksums, table], f"{name}/minimum/MatMul")[0]
        y = w.node("Add", [y, extra], f"{name}/minimum/Add")[0]
    return y


def _row_bytes(weight: Weight) -> int:
    if isinstance(weight, FloatWeight):
        return int(weight.values.shape[1]) * 4
    return int(weight.codes[0].nbytes + weight.scales[0].nbytes)


def _float_matmul(
    w: GraphWriter, x: str, values: np.ndarray, name: str, start: int, parts: int
) -> str:
    label = name if parts == 1 else f"{name}/cols_{start}"
    table = w.weight(f"{label}.weight", np.ascontiguousarray(values.T))
    return w.node("MatMul", [x, table], f"{label}/MatMul")[0]


def _nbits(
    w: GraphWriter,
    x: str,
    weight: NBitsWeight,
    bias: np.ndarray | None,
    name: str,
    accuracy_level: int,
    with_sums: bool,
) -> tuple[str, str | None]:
    """One MatMulNBits; with ``with_sums``, also the block sums of ``x`` (extra rows)."""
    codes, scales, zp = weight.codes, weight.scales, weight.zero_point
    rows = weight.shape[0]
    blocks = scales.shape[1]
    if with_sums:
        extra_codes, extra_scales, extra_zp = _blocksum_rows(weight, blocks)
        codes = np.concatenate([codes, extra_codes])
        scales = np.concatenate([scales, extra_scales])
        zp = None if zp is None else np.concatenate([zp, extra_zp])
        if bias is not None:
            bias = np.concatenate([bias, np.zeros(blocks, np.float32)])
    tag = f"Q{weight.bits}G{weight.block_size}"
    inputs = [x, w.weight(f"{name}.weight_{tag}", codes), w.weight(f"{name}.scales", scales)]
    inputs.append("" if zp is None else w.weight(f"{name}.zero_points", zp))
    if bias is not None:
        inputs += ["", w.weight(f"{name}.bias", bias)]
    while inputs[-1] == "":
        inputs.pop()
    y = w.node(
        "MatMulNBits", inputs, f"{name}/MatMulNBits", domain="com.microsoft",
        K=int(weight.shape[-1]), N=int(codes.shape[0]), bits=weight.bits,
        block_size=weight.block_size, accuracy_level=accuracy_level,
    )[0]  # fmt: skip
    if not with_sums:
        return y, None
    part, sums = w.node(
        "Split", [y, w.const([rows, blocks])], f"{name}/RowsSplit", outputs=2, axis=-1
    )
    return part, sums


def _blocksum_rows(weight: NBitsWeight, blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows whose weights are 1 over one block of K and 0 elsewhere: row j sums block j
    (codes, scales, and zero points 0 for a layout with explicit ones: unused otherwise).

    The other blocks have scale 0 (and code 0), not code zp at scale 1: onnxruntime's int8
    kernel subtracts zero points as scale * zp * sum(a) beside the integer products, which
    leaves ~1e-6 where the weight is 0 unless the scale is (measured on the default model:
    the same logits as onnxruntime-genai's graph this way, 0.9 apart otherwise)."""
    block = weight.block_size
    one = 1 if weight.zero_point is not None else (1 << (weight.bits - 1)) + 1
    codes = np.zeros((blocks, blocks, block), np.uint8)
    codes[np.arange(blocks), np.arange(blocks), :] = one
    packed = _pack(codes, weight.bits)
    scales = np.eye(blocks, dtype=np.float32)
    width = weight.zero_point.shape[1] if weight.zero_point is not None else 0
    return packed, scales, np.zeros((blocks, width), np.uint8)


def embedding(w: GraphWriter, ids: str, weight: Weight, name: str) -> str:
    """The rows of ``weight`` (V, K) for ``ids``: a GatherBlockQuantized over its own copy
    of the codes (paged in only where read), plus the gathered minimum per block; a float
    table through a Gather."""
    if isinstance(weight, FloatWeight):
        table = w.weight(f"{name}.weight", weight.values)
        return w.node("Gather", [table, ids], f"{name}/Gather", axis=0)[0]
    vocab, k = weight.shape
    inputs = [
        w.weight(
            f"{name}.weight_Q{weight.bits}G{weight.block_size}", weight.codes.reshape(vocab, -1)
        ),
        ids,
        w.weight(f"{name}.scales", weight.scales),
    ]
    if weight.zero_point is not None:
        inputs.append(w.weight(f"{name}.zero_points", weight.zero_point))
    y = w.node(
        "GatherBlockQuantized", inputs, f"{name}/GatherBlockQuantized", domain="com.microsoft",
        gather_axis=0, quantize_axis=1, block_size=weight.block_size, bits=weight.bits,
    )[0]  # fmt: skip
    if weight.minimum is None:
        return y
    blocks = weight.scales.shape[1]
    table = w.weight(f"{name}.minimum", weight.minimum)
    mins = w.node("Gather", [table, ids], f"{name}/minimum/Gather", axis=0)[0]
    mins = w.node("Unsqueeze", [mins, w.const([-1])], f"{name}/minimum/Unsqueeze")[0]
    split = w.node("Reshape", [y, w.const([0, 0, blocks, weight.block_size])], f"{name}/Blocks")[0]
    summed = w.node("Add", [split, mins], f"{name}/minimum/Add")[0]
    return w.node("Reshape", [summed, w.const([0, 0, k])], f"{name}/Rows")[0]
