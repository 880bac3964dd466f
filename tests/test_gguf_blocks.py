"""The GGUF block arithmetic the exact rewrite relies on, run through onnxruntime's own
MatMulNBits kernel: packed Q4_1 codes with zero points 0 give A @ (d*q)^T, without a
zero-point input (the default 8, as the rewrite builds them) A @ (d*(q - 8))^T, and the
extra block-sum rows give the block sums of A (of the int8-quantised A at accuracy
level 4)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ortgen.export.gguf_blocks import (
    BLOCK,
    Blocks,
    dequant,
    pack,
    shifted_minimum,
    with_blocksum_rows,
)

N, K = 24, 96


def random_q4_1(rng: np.random.Generator) -> Blocks:
    q = rng.integers(0, 16, (N, K), dtype=np.uint8)
    # float16 values, as a GGUF stores them
    d = rng.uniform(0.01, 0.1, (N, K // BLOCK)).astype(np.float16).astype(np.float32)
    m = rng.uniform(-0.5, 0.0, (N, K // BLOCK)).astype(np.float16).astype(np.float32)
    return Blocks("Q4_1", q, d, m)


def run_matmul_nbits(
    blocks: Blocks, a: np.ndarray, accuracy_level: int, zero_points: bool = True
) -> np.ndarray:
    """One MatMulNBits node over ``blocks``: with packed zero points 0, or without a
    zero-point input (the default 8, as the rewrite builds it)."""
    from onnx import TensorProto, helper, numpy_helper

    n = blocks.q.shape[0]
    inits = [
        numpy_helper.from_array(pack(blocks), "B"),
        numpy_helper.from_array(blocks.d.astype(np.float32), "scales"),
    ]
    if zero_points:
        zp = np.zeros((n, (K // BLOCK + 1) // 2), np.uint8)
        inits.append(numpy_helper.from_array(zp, "zp"))
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "scales", "zp"][: len(inits) + 1],
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=n,
        bits=4,
        block_size=BLOCK,
        accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"A": a})[0]


def test_blocksum_rows_give_the_products_and_the_block_sums() -> None:
    rng = np.random.default_rng(0)
    blocks = random_q4_1(rng)
    a = rng.standard_normal((3, K)).astype(np.float32)
    out = run_matmul_nbits(with_blocksum_rows(blocks), a, accuracy_level=0)
    assert out.shape == (3, N + K // BLOCK)
    no_minimum = Blocks("Q4_1", blocks.q, blocks.d, None)
    np.testing.assert_allclose(out[:, :N], a @ dequant(no_minimum).T, rtol=1e-5, atol=1e-5)
    sums = a.reshape(3, -1, BLOCK).sum(axis=-1)
    np.testing.assert_allclose(out[:, N:], sums, rtol=1e-5, atol=1e-5)
    # the minimum term completes the product with the GGUF's weights w = d*q + m
    full = out[:, :N] + out[:, N:] @ blocks.m.T
    np.testing.assert_allclose(full, a @ dequant(blocks).T, rtol=1e-4, atol=1e-4)


def test_blocksum_rows_sum_the_int8_activations_at_accuracy_level_4() -> None:
    """At level 4 both parts see the same quantised A (as llama.cpp's q8_1 block sums do),
    so the row sums are those of A rounded to int8 per block of 32, not of A itself."""
    rng = np.random.default_rng(1)
    blocks = random_q4_1(rng)
    a = rng.standard_normal((2, K)).astype(np.float32)
    out = run_matmul_nbits(with_blocksum_rows(blocks), a, accuracy_level=4)
    grouped = a.reshape(2, -1, BLOCK)
    scale = np.abs(grouped).max(axis=-1, keepdims=True) / 127
    quantised = (np.rint(grouped / scale) * scale).sum(axis=-1)
    np.testing.assert_allclose(out[:, N:], quantised, rtol=1e-4, atol=1e-5)
    assert np.abs(out[:, N:] - grouped.sum(axis=-1)).max() > 1e-4  # not the float sums


def test_blocksum_rows_are_ones_over_their_own_block() -> None:
    blocks = random_q4_1(np.random.default_rng(2))
    rows = with_blocksum_rows(blocks)
    extra = dequant(Blocks("Q4_1", rows.q[N:], rows.d[N:], None))
    np.testing.assert_array_equal(extra, np.repeat(np.eye(K // BLOCK), BLOCK, axis=1))
    np.testing.assert_array_equal(rows.m[N:], 0.0)
    np.testing.assert_array_equal(rows.q[:N], blocks.q)


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_the_default_zero_point_with_the_shifted_minimum_is_the_ggufs_weight(
    accuracy_level: int,
) -> None:
    """As the rewrite builds it: no zero-point input (codes count q - 8), block-sum rows
    of codes 9, and the minimum m + 8d: A @ (d*q + m)^T, and at level 4 the same result
    as with zero points 0 up to float rounding."""
    rng = np.random.default_rng(3)
    blocks = random_q4_1(rng)
    a = rng.standard_normal((3, K)).astype(np.float32)
    out = run_matmul_nbits(with_blocksum_rows(blocks, 8), a, accuracy_level, zero_points=False)
    full = out[:, :N] + out[:, N:] @ shifted_minimum(blocks).T
    if accuracy_level == 0:  # float activations: the GGUF's weights, to float rounding
        np.testing.assert_allclose(full, a @ dequant(blocks).T, rtol=1e-4, atol=1e-4)
    zero = run_matmul_nbits(with_blocksum_rows(blocks), a, accuracy_level)
    np.testing.assert_allclose(full, zero[:, :N] + zero[:, N:] @ blocks.m.T, rtol=1e-5, atol=1e-5)
    sums = with_blocksum_rows(blocks, 8)
    np.testing.assert_array_equal(np.unique(sums.q[N:]), [0, 9])


def test_a_minimum_whose_shift_would_round_is_refused() -> None:
    blocks = random_q4_1(np.random.default_rng(4))
    blocks.m[0, 0] = np.float32(1e-30)  # far below 8d: m + 8d rounds to 8d
    with pytest.raises(ValueError, match="not exact"):
        shifted_minimum(blocks)
