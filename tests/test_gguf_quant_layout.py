"""GGUF tensors -> MatMulNBits layouts (ortgen.gguf.quant_layout): exact, and run as such.

Every type's blocks are random bytes (valid once their fp16 scale fields hold finite values,
written explicitly below) or, for the legacy types, gguf-py's own quantiser output. Each
layout must reconstruct ``gguf.quants.dequantize`` bit for bit, and onnxruntime's
MatMulNBits (accuracy level 0) / GatherBlockQuantized over it must compute with those
weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
gguf = pytest.importorskip("gguf")

from gguf.constants import GGML_QUANT_SIZES  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ortgen.gguf.quant_layout import (  # noqa: E402
    TYPE_BITS,
    FloatWeight,
    NBitsWeight,
    NotExact,
    Unsupported,
    gather_tables,
    reconstruct,
    to_layout,
)

# Byte offsets of each type's fp16 scale fields inside one block (ggml's block structs).
_FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0],
    T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0], T.TQ1_0: [52], T.TQ2_0: [64],
    T.IQ1_M: [], T.MXFP4: [], T.NVFP4: [],
}  # fmt: skip
# Types whose (d, dmin) or (d, m) pair llama.cpp writes with d > 0 (and dmin >= 0).
_POSITIVE = {T.Q4_1, T.Q5_1, T.Q2_K, T.Q4_K, T.Q5_K}
N, K, M = 16, 512, 3


def _fp16(rng: np.random.Generator, size: tuple[int, ...], exps: tuple[int, int]) -> np.ndarray:
    """Random fp16 values of magnitude 2**exps[0] .. 2**exps[1], random signs."""
    mag = rng.uniform(0.5, 1.0, size) * 2.0 ** rng.integers(exps[0], exps[1], size)
    return (mag * rng.choice([-1.0, 1.0], size)).astype(np.float16)


def random_blocks(
    qtype: T, rows: int, k: int, seed: int = 0, exps: tuple[int, int] = (-10, -6)
) -> np.ndarray:
    """(rows, bytes) uint8: random blocks of ``qtype`` with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    qk, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, k // qk, size), dtype=np.uint8)
    for off in _FP16_FIELDS[qtype]:
        v = _fp16(rng, raw.shape[:2], exps)
        v = np.abs(v) if qtype in _POSITIVE else v
        raw[..., off : off + 2] = v.view(np.uint8).reshape(*raw.shape[:2], 2)
    if qtype == T.IQ1_M:  # its fp16 scale is spread over the top nibbles of 4 uint16
        d = np.abs(_fp16(rng, raw.shape[:2], exps)).view(np.uint16)
        sc = raw[..., 48:56].copy().view(np.uint16)
        for i in range(4):
            sc[..., i] = (sc[..., i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        raw[..., 48:56] = sc.view(np.uint8)
    if qtype == T.MXFP4:  # e8m0 exponent: keep the weights finite
        raw[..., 0] = rng.integers(110, 135, raw.shape[:2])
    return raw.reshape(rows, -1)


def _session(nodes: list, inits: list, inputs: list, out: str) -> Any:
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_matmul_nbits(layout: NBitsWeight, a: np.ndarray) -> np.ndarray:
    """A @ W^T with onnxruntime's MatMulNBits (accuracy level 0) plus, in numpy,
    blocksum(A) @ minimum^T: the graph's two parts of the weight."""
    n, k = layout.codes.shape[0], a.shape[1]
    inits = [
        numpy_helper.from_array(layout.codes, "B"),
        numpy_helper.from_array(layout.scales, "S"),
    ]
    names = ["A", "B", "S"]
    if layout.zero_point is not None:
        inits.append(numpy_helper.from_array(layout.zero_point, "Z"))
        names.append("Z")
    node = helper.make_node(
        "MatMulNBits", names, ["Y"], domain="com.microsoft", K=k, N=n, bits=layout.bits,
        block_size=layout.block_size, accuracy_level=0,
    )  # fmt: skip
    a_info = helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, k])
    y = _session([node], inits, [a_info], "Y").run(None, {"A": a})[0].astype(np.float64)
    if layout.minimum is not None:
        sums = a.astype(np.float64).reshape(a.shape[0], -1, layout.block_size).sum(-1)
        y += sums @ layout.minimum.astype(np.float64).T
    return y


def run_gather(layout: NBitsWeight, ids: np.ndarray) -> np.ndarray:
    """Embedding rows ``ids`` through GatherBlockQuantized (+ a gathered minimum per block)."""
    tables = gather_tables(layout)
    k = tables.data.shape[1] * 8 // tables.bits
    inits = [numpy_helper.from_array(tables.data, "D"), numpy_helper.from_array(tables.scales, "S")]
    names = ["D", "I", "S"]
    if tables.zero_points is not None:
        inits.append(numpy_helper.from_array(tables.zero_points, "Z"))
        names.append("Z")
    out = "Y"
    nodes = [
        helper.make_node(
            "GatherBlockQuantized", names, ["G"], domain="com.microsoft", **tables.attributes
        )
    ]
    if tables.minimum is None:
        nodes[0].output[0] = out
    else:
        nb = k // tables.block_size
        inits += [
            numpy_helper.from_array(tables.minimum, "Min"),
            numpy_helper.from_array(np.array([-1, nb, tables.block_size]), "blocks"),
            numpy_helper.from_array(np.array([-1, nb, 1]), "per_block"),
            numpy_helper.from_array(np.array([-1, k]), "flat"),
        ]
        nodes += [
            helper.make_node("Reshape", ["G", "blocks"], ["Gb"]),
            helper.make_node("Gather", ["Min", "I"], ["Mg"], axis=0),
            helper.make_node("Reshape", ["Mg", "per_block"], ["Mb"]),
            helper.make_node("Add", ["Gb", "Mb"], ["Sum"]),
            helper.make_node("Reshape", ["Sum", "flat"], [out]),
        ]
    ids_info = helper.make_tensor_value_info("I", TensorProto.INT64, [None])
    return _session(nodes, inits, [ids_info], out).run(None, {"I": ids})[0]


def _check_exact_and_run(layout: NBitsWeight, raw: np.ndarray, qtype: T) -> None:
    ref = dequantize(raw, qtype)
    assert np.array_equal(reconstruct(layout), ref)
    a = np.random.default_rng(1).standard_normal((M, ref.shape[1])).astype(np.float32)
    want = a.astype(np.float64) @ ref.astype(np.float64).T
    got = run_matmul_nbits(layout, a)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), qtype.name


@pytest.mark.parametrize("qtype", list(TYPE_BITS), ids=lambda t: t.name)
def test_random_blocks_are_exact_and_run_in_matmul_nbits(qtype: T) -> None:
    raw = random_blocks(qtype, N, K)
    layout = to_layout(qtype, raw, (N, K))
    assert isinstance(layout, NBitsWeight)
    assert (layout.bits, layout.block_size) == TYPE_BITS[qtype]
    assert layout.zero_point is None  # realistic scales: the fast default zero point
    nb = K // layout.block_size
    assert layout.codes.shape == (N, nb, layout.block_size * layout.bits // 8)
    assert layout.codes.dtype == np.uint8 and layout.scales.shape == (N, nb)
    _check_exact_and_run(layout, raw, qtype)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda t: t.name)
def test_gguf_quantised_legacy_types(qtype: T) -> None:
    w = np.random.default_rng(2).standard_normal((N, K)).astype(np.float32) * 0.05
    raw = quantize(w, qtype)
    layout = to_layout(qtype, raw, (N, K))
    assert isinstance(layout, NBitsWeight) and layout.zero_point is None
    assert layout.scales_fp16_exact  # legacy scales are the file's fp16 d
    _check_exact_and_run(layout, raw, qtype)


def test_minimum_that_rounds_falls_back_to_explicit_zero_points() -> None:
    # d ~ 2**-14 with all 11 mantissa bits beside m = -77: m + 8d needs more than float32's
    # 24 bits, and d * q is large enough for the rounded minimum to show in the weights.
    raw = random_blocks(T.Q4_1, N, K)
    blocks = raw.reshape(N, -1, 20)
    mantissa = np.random.default_rng(6).integers(0, 1024, blocks.shape[:2])
    d = ((1 + mantissa / 1024) * 2.0**-14).astype(np.float16)
    blocks[..., 0:2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    blocks[..., 2:4] = np.full(d.shape, -77.0, np.float16).view(np.uint8).reshape(*d.shape, 2)
    with pytest.raises(
        NotExact, match=r"ffn_up.weight: Q4_1 tensor \(16, 512\): not exact at 4 bits: \d+ of"
    ):
        to_layout(T.Q4_1, raw, (N, K), zero_point="default", name="blk.0.ffn_up.weight")
    with pytest.raises(NotExact, match=r"\d+ of 8192 weights \(in blocks whose shifted minimum"):
        to_layout(T.Q4_1, raw, (N, K), zero_point="default", verify=False)
    for verify in (True, False):
        layout = to_layout(T.Q4_1, raw, (N, K), verify=verify)
        assert isinstance(layout, NBitsWeight) and layout.zero_point is not None
        assert layout.zero_point.shape == (N, K // 32 // 2)
        assert layout.minimum is not None and (layout.minimum == -77.0).all()  # m as it is
        _check_exact_and_run(layout, raw, T.Q4_1)


@pytest.mark.parametrize(
    ("qtype", "bits", "block", "zero_point"),
    [
        (T.Q2_K, 2, 16, "auto"),  # codes 0..3 at 2 bits: minimum 2*dl - dmin*m
        (T.Q2_K, 8, 16, "auto"),
        (T.Q4_K, 4, 16, "explicit"),  # split sub-blocks, explicit zero points 0
        (T.Q4_0, 8, 32, "explicit"),
        (T.IQ1_S, 8, 32, "auto"),  # delta folded into the codes: no minimum
        (T.IQ1_S, 2, 64, "auto"),  # a block merging two scales: refused
        (T.TQ2_0, 2, 32, "auto"),
        (T.Q6_K, 8, 16, "explicit"),
    ],
)
def test_forced_bits_blocks_and_zero_points(
    qtype: T, bits: int, block: int, zero_point: str
) -> None:
    raw = random_blocks(qtype, N, K, seed=3)
    if qtype == T.IQ1_S and block == 64:
        with pytest.raises(ValueError, match="does not split blocks of 32"):
            to_layout(qtype, raw, (N, K), bits=bits, block_size=block)
        return
    layout = to_layout(qtype, raw, (N, K), bits=bits, block_size=block, zero_point=zero_point)
    assert isinstance(layout, NBitsWeight)
    assert (layout.bits, layout.block_size) == (bits, block)
    assert (layout.zero_point is not None) == (zero_point == "explicit")
    if qtype == T.IQ1_S and bits == 8:
        assert layout.minimum is None
    _check_exact_and_run(layout, raw, qtype)


def test_codes_wider_than_forced_bits_are_refused() -> None:
    raw = random_blocks(T.Q6_K, 2, 256)
    with pytest.raises(
        NotExact, match=r"Q6_K tensor \(2, 256\): codes -32\.\.31 do not fit 4 bits"
    ):
        to_layout(T.Q6_K, raw, (2, 256), bits=4)


@pytest.mark.parametrize(
    ("qtype", "zero_point"),
    [(T.Q4_K, "auto"), (T.Q6_K, "auto"), (T.IQ1_S, "auto"), (T.Q4_1, "explicit"), (T.Q8_0, "auto")],
    ids=lambda v: getattr(v, "name", v),
)
def test_embedding_through_gather_block_quantized_is_exact(qtype: T, zero_point: str) -> None:
    raw = random_blocks(qtype, N, K, seed=4)
    layout = to_layout(qtype, raw, (N, K), zero_point=zero_point)
    assert isinstance(layout, NBitsWeight)
    ids = np.array([3, 0, 15, 3], np.int64)
    got = run_gather(layout, ids)
    assert np.array_equal(got, dequantize(raw, qtype)[ids])


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_types_pass_through(qtype: T) -> None:
    w = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    raw = (
        quantize(w, qtype)
        if qtype == T.BF16
        else w.astype(np.float32 if qtype == T.F32 else np.float16)
    )
    layout = to_layout(qtype, raw, (4, 64))
    assert isinstance(layout, FloatWeight) and layout.values.dtype == np.float32
    assert np.array_equal(reconstruct(layout), dequantize(np.asarray(raw), qtype).reshape(4, 64))
    assert layout.fp16_exact == (qtype != T.F32)  # bf16's 8-bit mantissas of N(0, 1) fit


def test_refusals_name_the_type_and_the_reason() -> None:
    with pytest.raises(Unsupported, match=r"Q8_K tensor .*activation type"):
        to_layout(T.Q8_K, bytes(292), (1, 256))
    with pytest.raises(Unsupported, match="I32 tensor"):
        to_layout(T.I32, bytes(16), (4,))
    with pytest.raises(ValueError, match="2, 4 or 8 bits"):
        to_layout(T.Q4_0, random_blocks(T.Q4_0, 1, 32), (1, 32), bits=3)
    with pytest.raises(ValueError, match="do not hold 2 rows of 64"):
        to_layout(T.Q4_0, random_blocks(T.Q4_0, 1, 32), (2, 64))
    raw = random_blocks(T.Q8_0, 1, 32)
    raw[0, 0:2] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(NotExact, match="non-finite"):
        to_layout(T.Q8_0, raw, (1, 32))


def test_gguf_reader_arrays_and_bytes_give_the_same_layout() -> None:
    raw = random_blocks(T.Q5_K, 4, 256)
    a = to_layout(T.Q5_K, raw, (4, 256))
    b = to_layout(T.Q5_K, raw.tobytes(), [4, 256])
    assert isinstance(a, NBitsWeight) and isinstance(b, NBitsWeight)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
