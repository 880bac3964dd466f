"""A built graph's weights, read back from its initializers (for ``test_gguf_builder.py``).

Not a test module. :func:`source_matrices` reads a GGUF with gguf-py's own reader and
dequantiser (not the builder's), in Hugging Face's row order (llama's q/k rows
un-permuted). :func:`graph_weights` rebuilds every weight of a built ``model.onnx``: each
MatMulNBits (codes, scales, zero points, and the minimum the builder adds as
``blocksum(x) @ minimum^T`` from the extra rows it appends), each GatherBlockQuantized
(plus its gathered minimum) and each float MatMul or Gather. The block-sum rows are checked
here (row j must weigh block j of K by 1 and everything else by 0) and dropped. The graph is
followed through its edges (the Split of those rows, the MatMul by the minimum, the Add),
so a minimum that is stored but not wired in is not counted as the weight's.
:func:`int8_bound_ratio` runs each MatMulNBits alone at its accuracy level and compares it
with the exact product.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from ortgen.gguf.quant_layout import NBitsWeight, reconstruct
from tests.gguf_models import TinySpec

__all__ = ["GraphWeight", "Source", "graph_weights", "int8_bound_ratio", "source_matrices"]


@dataclass(frozen=True)
class Source:
    """One GGUF matrix (N, K) float32 as gguf-py dequantises it, and its bias if any."""

    matrix: np.ndarray
    bias: np.ndarray | None

    @property
    def bias_or_zeros(self) -> np.ndarray:
        rows = self.matrix.shape[0]
        return self.bias if self.bias is not None else np.zeros(rows, np.float32)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation (interleaved pairs -> halves, per head)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def source_matrices(path: Path, spec: TinySpec) -> dict[str, Source]:
    """The GGUF's 2-D tensors by name, dequantised by gguf-py, q/k un-permuted for llama."""
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def values(name: str) -> np.ndarray:
        t = tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)

    out = {}
    for name, t in tensors.items():
        if len(t.shape) != 2:
            continue
        matrix = values(name)
        bias_name = name.removesuffix(".weight") + ".bias"
        bias = values(bias_name).reshape(-1) if bias_name in tensors else None
        if spec.permuted and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = spec.heads if ".attn_q." in name else spec.kv_heads
            matrix = _unpermute(matrix, heads)
            bias = None if bias is None else _unpermute(bias[:, None], heads).reshape(-1)
        out[name] = Source(matrix, bias)
    return out


_LAYER = re.compile(r"^/model/layers\.(\d+)/(?:attn|mlp)/(\w+)/")
_PARTS = {
    "qkv_proj": ("attn_q", "attn_k", "attn_v", "attn_qkv"),
    "o_proj": ("attn_output",),
    "gate_up_proj": ("ffn_gate", "ffn_up"),
    "down_proj": ("ffn_down",),
}


@dataclass
class GraphWeight:
    """One weight-bearing node: its (N, K) weight as the graph computes with it."""

    node: str
    op: str
    matrix: np.ndarray
    bias: np.ndarray | None
    proto: onnx.NodeProto
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    minimum_t: np.ndarray | None = None  # (blocks, N): the block sums' weights

    def candidates(self) -> list[str]:
        """The GGUF tensors this node may hold, in the builder's order (from its name)."""
        if self.node.startswith("/model/embed_tokens/"):
            return ["token_embd.weight"]
        if self.node.startswith("/lm_head/"):
            return ["output.weight", "token_embd.weight"]
        match = _LAYER.match(self.node)
        assert match, f"unexpected weight node {self.node}"
        layer, proj = match.groups()
        return [f"blk.{layer}.{part}.weight" for part in _PARTS[proj]]

    def parts(self, sources: dict[str, Source]) -> list[str]:
        """The candidates found at consecutive row offsets (the caller checks they tile)."""
        found, offset = [], 0
        for name in self.candidates():
            if name not in sources:
                continue
            want = sources[name].matrix
            got = self.matrix[offset : offset + want.shape[0]]
            if got.shape == want.shape and np.array_equal(got, want):
                found.append(name)
                offset += want.shape[0]
        return found


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _attr(node: onnx.NodeProto, name: str) -> int:
    return int(next(helper.get_attribute_value(a) for a in node.attribute if a.name == name))


def _nbits_rows(
    codes: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, minimum: np.ndarray | None,
    bits: int, block: int, k: int,
) -> np.ndarray:  # fmt: skip
    """``quant_layout.reconstruct`` of MatMulNBits-layout arrays: (N, K) float32."""
    n = codes.shape[0]
    layout = NBitsWeight(
        gguf.GGMLQuantizationType.F32, (n, k), bits, block, codes.reshape(n, k // block, -1),
        scales.reshape(n, -1), zp, minimum, False, None,
    )  # fmt: skip
    return reconstruct(layout, slice(None))


def _minimum_of(
    node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]], arrays: dict[str, np.ndarray]
) -> tuple[np.ndarray, int, str] | None:
    """The minimum^T a MatMulNBits' appended rows are multiplied by, its real row count and
    the MatMul's name, found by following Split(rows, blocks) -> MatMul(sums, minimum^T) ->
    Add(rows' product, that); None for a node without appended rows."""
    splits = [  # (a Split of the product into parts, e.g. gate and up, feeds no table)
        c for c in consumers.get(node.output[0], [])
        if c.op_type == "Split" and len(c.output) == 2
        and any(m.op_type == "MatMul" and m.input[1] in arrays for m in consumers[c.output[1]])
    ]  # fmt: skip
    if not splits:
        return None
    (split,) = splits
    rows, _blocks = (int(v) for v in arrays[split.input[1]])
    (matmul,) = consumers[split.output[1]]
    assert matmul.input[0] == split.output[1], node.name
    (add,) = consumers[matmul.output[0]]
    assert add.op_type == "Add" and set(add.input) == {split.output[0], matmul.output[0]}
    return arrays[matmul.input[1]], rows, matmul.name


def _gathered_minimum(
    node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]], arrays: dict[str, np.ndarray]
) -> onnx.NodeProto | None:
    """The Gather of a GatherBlockQuantized's per-block minimum (same ids, a table), if any."""
    found = [
        c for c in consumers[node.input[1]]
        if c.op_type == "Gather" and c.input[0] in arrays and c is not node
    ]  # fmt: skip
    assert len(found) <= 1, node.name
    return found[0] if found else None


def _nbits_weight(
    node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]], arrays: dict[str, np.ndarray]
) -> GraphWeight:
    """A MatMulNBits' real rows (block-sum rows checked and dropped)."""
    k, bits, block = (_attr(node, a) for a in ("K", "bits", "block_size"))
    inputs = [*node.input, "", "", "", ""]
    codes, scales = arrays[inputs[1]], arrays[inputs[2]]
    zp = arrays[inputs[3]] if inputs[3] else None
    bias = arrays[inputs[5]] if inputs[5] else None
    found = _minimum_of(node, consumers, arrays)
    rows = codes.shape[0] if found is None else found[1]
    minimum_t = None if found is None else found[0]
    if found is not None:
        blocks = k // block
        assert codes.shape[0] == rows + blocks, node.name
        extra_zp = None if zp is None else zp[rows:]
        extra = _nbits_rows(codes[rows:], scales[rows:], extra_zp, None, bits, block, k)
        indicator = np.repeat(np.eye(blocks, dtype=np.float32), block, axis=1)
        assert np.array_equal(extra, indicator), f"{node.name}: block-sum rows"
        assert bias is None or not bias[rows:].any(), f"{node.name}: block-sum bias"
    matrix = _nbits_rows(
        codes[:rows], scales[:rows], None if zp is None else zp[:rows],
        None if minimum_t is None else np.ascontiguousarray(minimum_t.T), bits, block, k,
    )  # fmt: skip
    own = {name: arrays[name] for name in node.input if name in arrays}
    bias = None if bias is None else bias[:rows]
    return GraphWeight(node.name, node.op_type, matrix, bias, node, own, minimum_t)


def graph_weights(model_path: Path) -> list[GraphWeight]:
    """Every weight of the built graph, rebuilt from its initializers (see the module)."""
    graph = onnx.load(model_path).graph
    arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:  # small constants may be Constant nodes
        if node.op_type == "Constant":
            arrays[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    consumers = _consumers(graph)
    helpers: set[str] = set()  # minimum MatMuls and Gathers: parts of another node's weight
    for node in graph.node:
        if node.op_type == "MatMulNBits" and (found := _minimum_of(node, consumers, arrays)):
            helpers.add(found[2])
        if node.op_type == "GatherBlockQuantized" and (
            gather := _gathered_minimum(node, consumers, arrays)
        ):
            helpers.add(gather.name)
    out = []
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            out.append(_nbits_weight(node, consumers, arrays))
        elif node.op_type == "GatherBlockQuantized":
            bits, block = _attr(node, "bits"), _attr(node, "block_size")
            data, scales = arrays[node.input[0]], arrays[node.input[2]]
            zp = arrays[node.input[3]] if len(node.input) > 3 and node.input[3] else None
            gather = _gathered_minimum(node, consumers, arrays)
            minimum = None if gather is None else arrays[gather.input[0]]
            k = data.shape[1] * 8 // bits
            matrix = _nbits_rows(data, scales, zp, minimum, bits, block, k)
            out.append(GraphWeight(node.name, node.op_type, matrix, None, node))
        elif node.op_type in ("MatMul", "Gather") and node.name not in helpers:
            table = node.input[1] if node.op_type == "MatMul" else node.input[0]
            if table not in arrays or arrays[table].ndim != 2:
                continue  # activations times activations, or the mask's shape lookup
            values = arrays[table].T if node.op_type == "MatMul" else arrays[table]
            matrix = np.ascontiguousarray(values)
            out.append(GraphWeight(node.name, node.op_type, matrix, None, node))
    return out


def int8_bound_ratio(model_path: Path, *, rows: int = 16, seed: int = 0) -> float:
    """The largest ratio, over every MatMulNBits of the graph and every output, of its error
    against the exact product (float64, the same weights) to the int8 rounding bound
    ``sum_blocks s_b / 2 * sum_{k in b} |W_nk|`` with s_b = max_{k in b} |a_k| / 127 (plus
    1e-5 of |a| @ |W|^T for float32 rounding). Each node runs alone, as in the graph (its
    attributes, initializers and accuracy level), its block sums times the minimum added as
    the graph adds them."""
    rng = np.random.default_rng(seed)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    worst = 0.0
    for weight in graph_weights(model_path):
        if weight.op != "MatMulNBits":
            continue
        node = weight.proto
        k = _attr(node, "K")
        block = _attr(node, "block_size")
        x = rng.standard_normal((1, rows, k)).astype(np.float32)
        x[..., ::7] *= 5  # outlier columns: blocks with a large int8 step
        alone = helper.make_node(
            node.op_type, ["x", *node.input[1:]], ["y"], domain=node.domain,
        )  # fmt: skip
        alone.attribute.extend(node.attribute)
        inits = [numpy_helper.from_array(a, n) for n, a in weight.arrays.items()]
        graph = helper.make_graph(
            [alone], "one", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits,
        )  # fmt: skip
        one = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(node.domain, 1)]
        )
        session = ort.InferenceSession(one.SerializeToString(), options)
        y = session.run(None, {"x": x})[0][0].astype(np.float64)
        n = weight.matrix.shape[0]
        got = y[:, :n]
        if weight.minimum_t is not None:
            got = got + y[:, n:] @ weight.minimum_t.astype(np.float64)
        a, w = x[0].astype(np.float64), weight.matrix.astype(np.float64)
        exact = a @ w.T + (0 if weight.bias is None else weight.bias)
        step = np.abs(a).reshape(rows, k // block, block).max(-1) / 127
        w_abs = np.abs(w).reshape(n, k // block, block).sum(-1)
        bound = step / 2 @ w_abs.T + 1e-5 * (np.abs(a) @ np.abs(w).T)
        worst = max(worst, float((np.abs(got - exact) / bound).max()))
    return worst
