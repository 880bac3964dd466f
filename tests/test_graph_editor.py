"""The graph edits behind ``head_layout`` change memory, not numbers: splitting a large
MatMulNBits along N (so that packing it at load holds less of it twice) must give exactly the
node's own output."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortgen.errors import ExportError
from ortgen.export.graph_editor import GraphEditor

N, K, BLOCK = 200, 64, 32


def one_matmul(bits: int) -> tuple[object, object]:
    """A graph with one MatMulNBits (an LM head: N rows of packed ``bits``-bit codes in
    blocks of 32, one scale a block, 4-bit with packed zero points) and that node."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(bits)
    d = rng.uniform(0.01, 0.1, (N, K // BLOCK)).astype(np.float32)
    codes = rng.integers(0, 256, (N, K // BLOCK, BLOCK * bits // 8), dtype=np.uint8)
    if bits == 8:
        extra, names = [], ["A", "B", "scales"]
    else:
        zp = rng.integers(0, 256, (N, (K // BLOCK + 1) // 2), dtype=np.uint8)
        extra, names = [numpy_helper.from_array(zp.reshape(-1), "zp")], ["A", "B", "scales", "zp"]
    inits = [
        numpy_helper.from_array(codes, "B"),
        numpy_helper.from_array(d.reshape(-1), "scales"),
        *extra,
    ]
    node = helper.make_node(
        "MatMulNBits", names, ["logits"], "/lm_head/MatMul", domain="com.microsoft",
        K=K, N=N, bits=bits, block_size=BLOCK, accuracy_level=0,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, None, K])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, None, N])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    return model, model.graph.node[0]


def editor(model) -> GraphEditor:  # type: ignore[no-untyped-def]
    return GraphEditor(onnx, model.graph)


def run(model, a: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"A": a})[0]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(("max_rows", "parts"), [(64, 4), (100, 2), (150, 2)])
def test_split_rows_gives_the_node_own_output(bits: int, max_rows: int, parts: int) -> None:
    model, node = one_matmul(bits)
    a = np.random.default_rng(0).standard_normal((2, 3, K)).astype(np.float32)
    whole = run(model, a)
    edit = editor(model)
    assert edit.split_rows(node, max_bytes=max_rows * K * bits // 8) == parts
    edit.finish()

    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    rows = [next(a.i for a in n.attribute if a.name == "N") for n in nodes]
    assert len(nodes) == parts and sum(rows) == N
    assert all(r % 64 == 0 for r in rows[:-1])  # whole kernel tiles: bit-identical sums
    assert {t.name for t in model.graph.initializer}.isdisjoint({"B", "scales", "zp"})
    assert model.graph.node[-1].op_type == "Concat"
    assert model.graph.node[-1].output[0] == "logits"
    np.testing.assert_array_equal(run(model, a), whole)


def test_split_rows_leaves_a_small_weight_alone() -> None:
    model, node = one_matmul(8)
    edit = editor(model)
    assert edit.split_rows(node, max_bytes=N * K) == 1
    edit.finish()
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits"]


def test_split_rows_refuses_a_node_whose_output_is_edited() -> None:
    model, node = one_matmul(8)
    edit = editor(model)
    edit.after[node.name] = [onnx.helper.make_node("Identity", ["logits"], ["y"])]
    with pytest.raises(ExportError, match="cannot split"):
        edit.split_rows(node, max_bytes=K)


def test_split_rows_refuses_a_node_with_a_g_idx() -> None:
    """g_idx maps K, not N, so it cannot be cut into parts along with the rows."""
    model, node = one_matmul(8)
    node.input.extend(["", "g_idx"])
    with pytest.raises(ExportError, match="g_idx"):
        editor(model).split_rows(node, max_bytes=K)


def test_split_rows_refuses_a_weight_another_node_reads() -> None:
    """The head's initializers are dropped for its parts' own: only when nothing else reads
    them (a lookup given its own copies by ``own_lookup_inputs`` no longer does)."""
    from onnx import helper

    model, node = one_matmul(8)
    ids = helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [None])
    model.graph.input.append(ids)
    model.graph.node.append(helper.make_node("Gather", ["B", "ids"], ["rows"], "/lookup"))
    with pytest.raises(ExportError, match="also read by /lookup"):
        editor(model).split_rows(node, max_bytes=K)
