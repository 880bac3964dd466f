"""Put a GGUF's own quantised weights into onnxruntime-genai's fused int4 graph, losslessly.

onnxruntime-genai's model builder cannot read a Q4_1 GGUF, so ortgen goes GGUF -> transformers
folder (dequantised) -> builder, which *re-quantises* every weight with its own RTN int4 and
loses accuracy on weights that were 4-bit already. This module swaps the builder's weights for
the GGUF's exact blocks after the fact, keeping the builder's fast graph (GroupQueryAttention,
fused norms, MatMulNBits):

- Q4_1 (per block of 32: w = d*q + m). MatMulNBits without a zero-point input (the
  default, 8) and scales d computes A @ (d*(q - 8))^T exactly at full kernel speed; the
  minimum adds ``blocksum(A) @ (M + 8D)^T`` (M, D are (N, K/32); m + 8d is exact in
  float32 for float16 m and d), a float MatMul 32x smaller than the weights. Packed zero
  points 0 (the codes as they are) were exact too, but onnxruntime's kernel takes ~1.4x
  longer per node with a zero-point input (one row, in cache), 1.09x per decode step in
  all (docs/benchmarks.md). Float zero points (zp = -m/d) would also be exact but run a
  ~15x slower fallback kernel.
  The block sums come from the MatMulNBits itself: K/32 extra rows of ones
  (``with_blocksum_rows``), split off its output. That saves a node and a (K, K/32) 0/1
  matrix read per projection and step against a separate blocksum MatMul, and at accuracy
  level 4 it sums the same int8-quantised activations the d*q part multiplies, as
  llama.cpp does (a float blocksum beside an int8 d*q part adds the activations' rounding
  error times m: measured, its projections were ~2x further from float activations').
  gate/up are fused into one MatMulNBits + one minimum term + Split. Per layer: Split +
  MatMul + Add for q/k/v, o and down, the same + a Split for gate/up, i.e. 13 nodes added
  and 1 removed.
- Q8_0 (w = d*q, q int8): an 8-bit MatMulNBits without zero points (onnxruntime's default
  8-bit zero point is 128, so q + 128 is stored); the embedding becomes an 8-bit
  GatherBlockQuantized over its own copy of the codes, even when tied to the LM head (a copy
  in the file is paged in row by row; the head's packed initializer would stay resident;
  onnxruntime 1.32 CPU runs it exactly). ``head_layout`` then splits the LM head.

Row order: llama.cpp's converter permutes the rows of q and k for its rotary layout and
transformers un-permutes them when it loads a GGUF; the builder saw transformers' order and
concatenates q, k, v along N. This module reproduces both. As a guard against any other
layout surprise, every new weight is compared with the builder's own RTN weight for the same
node: they must agree within the builder's quantisation step, or the rewrite refuses.

This module is the driver: it reads the GGUF, matches each builder node to its GGUF tensors,
verifies, and saves in place. The block arithmetic is in ``gguf_blocks``, the graph surgery
in ``gguf_graph_editor``. onnx and gguf are imported inside the function: ``import ortgen``
stays light.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ExportError
from .gguf_blocks import (
    Blocks,
    concat,
    dequant,
    read_blocks,
    unpermute,
    unpermute_index,
)
from .gguf_graph_editor import GraphEditor, int_attr
from .onnx_files import save_in_place

__all__ = ["rewrite_with_gguf_weights"]

_SUPPORTED_TYPES = ("Q4_1", "Q8_0", "F32", "F16")
# Builder MatMulNBits node name -> the GGUF tensors it holds, concatenated along N.
_LAYER_NODE = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul")
_LAYER_PARTS = {
    "qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "q_proj": ("attn_q",),
    "k_proj": ("attn_k",),
    "v_proj": ("attn_v",),
    "o_proj": ("attn_output",),
    "gate_proj": ("ffn_gate",),
    "up_proj": ("ffn_up",),
    "down_proj": ("ffn_down",),
    "gate_up_proj": ("ffn_gate", "ffn_up"),
}
# Builder norm initializer -> GGUF tensor, checked for equality: a mismatch means the graph
# was built from another model than this GGUF.
_NORMS = {
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
}
# Architectures whose q/k rows transformers un-permutes on GGUF load (its TENSOR_PROCESSORS).
_PERMUTED_ARCHS = ("llama",)


def rewrite_with_gguf_weights(
    onnx_dir: Path,
    gguf: Path,
    *,
    accuracy_level: int = 4,
    verify: bool = True,
    exact_head: bool = True,
) -> dict[str, Any]:
    """Rewrite the builder's int4 graph in ``onnx_dir`` in place to use ``gguf``'s exact weights.

    ``onnx_dir`` holds ``model.onnx`` + ``model.onnx.data`` from onnxruntime-genai's builder
    (``-p int4``, any block size, with or without ``shared_embeddings``) built from the
    transformers folder that ``gguf`` dequantises to. Every MatMulNBits (and the
    GatherBlockQuantized embedding, if any) is rewritten; ``accuracy_level`` is set on every
    MatMulNBits (0: float activations, exact; 4: int8 activations, fast).

    With ``exact_head=False`` the LM head and the embedding keep the builder's int4 weights
    (re-quantised from the GGUF's Q8_0: half the bytes read per token for the head, not
    exact); every other weight is still the GGUF's own.

    With ``verify`` the new weights are dequantised and compared with ``gguf.quants``'
    dequantisation (``max_abs_diff_vs_gguf``, expected 0.0) and with the builder's own weights
    (must agree within its quantisation step, else ``ExportError``).

    Returns a report: tensors rewritten, weight bytes before/after, the checks' results.
    Raises ``ExportError`` naming the tensor for anything that cannot be matched exactly, and
    for a GGUF holding tensor types other than Q4_1/Q8_0/F32/F16.
    """
    import onnx
    from gguf import GGUFReader

    model_path = Path(onnx_dir) / "model.onnx"
    if not model_path.is_file():
        raise ExportError(f"GGUF rewrite: no model.onnx in {onnx_dir}")
    try:
        reader = GGUFReader(gguf)
    except Exception as exc:
        raise ExportError(f"GGUF rewrite: cannot read {gguf}: {exc}") from exc
    tensors = {t.name: t for t in reader.tensors}
    bad = sorted(
        f"{t.name} ({t.tensor_type.name})"
        for t in reader.tensors
        if t.tensor_type.name not in _SUPPORTED_TYPES
    )
    if bad:
        raise ExportError(
            f"GGUF rewrite: {gguf.name} holds tensor types it cannot run exactly "
            f"(only {', '.join(_SUPPORTED_TYPES)}): {', '.join(bad[:5])}"
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        )
    arch = str(reader.fields["general.architecture"].contents())
    heads = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    kv_heads = int(kv_field.contents()) if kv_field is not None else heads

    model = onnx.load(str(model_path), load_external_data=True)
    graph = model.graph
    edit = GraphEditor(onnx, graph)
    inits = edit.inits
    if any(name.startswith("gguf_exact/") for name in inits):
        raise ExportError(f"GGUF rewrite: {model_path} was rewritten already; rebuild it first")
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ExportError(f"GGUF rewrite: accuracy_level must be 0..4, not {accuracy_level}")
    nodes_before = len(graph.node)
    report: dict[str, Any] = {
        "tensors_rewritten": 0,
        "gguf_tensors_used": 0,
        "weight_bytes_before": sum(_nbytes(onnx, t) for t in graph.initializer),
        "max_abs_diff_vs_gguf": 0.0 if verify else None,
        "max_diff_vs_builder_in_steps": 0.0 if verify else None,
        "norms_checked": 0,
    }

    def load(name: str) -> Blocks:
        tensor = tensors.get(name)
        if tensor is None:
            raise ExportError(f"GGUF rewrite: {gguf.name} has no tensor {name}")
        blocks = read_blocks(tensor)
        if arch in _PERMUTED_ARCHS and (".attn_q." in name or ".attn_k." in name):
            n_head = heads if ".attn_q." in name else kv_heads
            blocks = unpermute(blocks, n_head)
        if verify:
            from gguf.quants import dequantize

            ref = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            if arch in _PERMUTED_ARCHS and (".attn_q." in name or ".attn_k." in name):
                n_head = heads if ".attn_q." in name else kv_heads
                ref = ref[unpermute_index(ref.shape[0], n_head)]
            diff = float(np.abs(dequant(blocks) - ref).max())
            report["max_abs_diff_vs_gguf"] = max(report["max_abs_diff_vs_gguf"], diff)
            if diff != 0.0:
                raise ExportError(f"GGUF rewrite: {name} does not round-trip exactly ({diff})")
        report["gguf_tensors_used"] += 1
        return blocks

    def check(node: Any, blocks: Blocks) -> None:
        n, k = int_attr(node, "N"), int_attr(node, "K")
        if blocks.q.shape != (n, k):
            raise ExportError(
                f"GGUF rewrite: {node.name} is {n}x{k} in the graph, the GGUF's weight is "
                f"{blocks.q.shape[0]}x{blocks.q.shape[1]}"
            )
        if verify:
            steps = edit.compare_with_builder(node, blocks)
            report["max_diff_vs_builder_in_steps"] = max(
                report["max_diff_vs_builder_in_steps"], steps
            )

    lm_head = None
    matmuls = {n.name: n for n in graph.node if n.op_type == "MatMulNBits"}
    # gate_proj -> up_proj reading the same activation: candidates to fuse (see merge below).
    pairs = {
        name: up
        for name, node in matmuls.items()
        if "/gate_proj/" in name
        and (up := matmuls.get(name.replace("/gate_proj/", "/up_proj/"))) is not None
        and up.input[0] == node.input[0]
    }
    paired_ups = {up.name for up in pairs.values()}
    for node in matmuls.values():
        if node.name in paired_ups:
            continue  # handled with its gate_proj
        if node.name.startswith("/lm_head/") and not exact_head:
            continue
        blocks = concat([load(p) for p in _gguf_parts(node.name, tensors)], node.name)
        check(node, blocks)
        report["tensors_rewritten"] += 1
        up = pairs.get(node.name)
        if up is None:
            edit.rewrite_matmul(node, blocks, accuracy_level)
            if node.name.startswith("/lm_head/"):
                lm_head = (node, blocks)
            continue
        up_blocks = concat([load(p) for p in _gguf_parts(up.name, tensors)], up.name)
        check(up, up_blocks)
        report["tensors_rewritten"] += 1
        if blocks.kind == up_blocks.kind == "Q4_1":
            # One MatMulNBits and one minimum term for both, then a Split: 3 fewer nodes per
            # layer and step than two MatMulNBits each with its own MatMul + Add.
            split = [(node.output[0], blocks.q.shape[0]), (up.output[0], up_blocks.q.shape[0])]
            edit.remove(up)
            fused = concat([blocks, up_blocks], node.name)
            node.name = node.name.replace("/gate_proj/", "/gate_up_proj/")
            edit.rewrite_matmul(node, fused, accuracy_level, split=split)
        else:
            edit.rewrite_matmul(node, blocks, accuracy_level)
            edit.rewrite_matmul(up, up_blocks, accuracy_level)

    embed = [n for n in graph.node if n.name.startswith("/model/embed_tokens/")]
    gathers = [n for n in embed if n.op_type in ("GatherBlockQuantized", "Gather")]
    if len(gathers) != 1:
        raise ExportError(
            "GGUF rewrite: expected one embedding gather under /model/embed_tokens/, found "
            f"{[n.name for n in gathers]}"
        )
    if exact_head:
        emb_blocks = load("token_embd.weight")
        edit.rewrite_embedding(gathers[0], emb_blocks, lm_head, verify)
        report["tensors_rewritten"] += 1

    report["norms_checked"] = _check_norms(onnx, inits, tensors, reader, arch)
    edit.finish()
    report["weight_bytes_after"] = sum(_nbytes(onnx, t) for t in graph.initializer)
    report["nodes_before"], report["nodes_after"] = nodes_before, len(graph.node)
    report["accuracy_level"] = accuracy_level
    save_in_place(onnx, model, Path(onnx_dir))
    report["model_bytes"] = sum(
        (Path(onnx_dir) / f).stat().st_size for f in ("model.onnx", "model.onnx.data")
    )
    return report


def _gguf_parts(node_name: str, tensors: dict[str, Any]) -> list[str]:
    """The GGUF tensors a builder MatMulNBits holds, in the builder's concatenation order."""
    if node_name.startswith("/lm_head/"):
        # Tied embeddings: llama.cpp writes no output.weight and the head reuses token_embd.
        return ["output.weight" if "output.weight" in tensors else "token_embd.weight"]
    match = _LAYER_NODE.match(node_name)
    if match is None or match.group(3) not in _LAYER_PARTS:
        raise ExportError(f"GGUF rewrite: no GGUF tensor known for MatMulNBits {node_name}")
    layer, proj = match.group(1), match.group(3)
    return [f"blk.{layer}.{part}.weight" for part in _LAYER_PARTS[proj]]


def _nbytes(onnx: Any, tensor: Any) -> int:
    """Bytes of one initializer's data."""
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _check_norms(
    onnx: Any, inits: dict[str, Any], tensors: dict[str, Any], reader: Any, arch: str
) -> int:
    """Norm weights must equal the GGUF's (F32, copied as is): else the graph is another model."""
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    pairs = [
        (graph.format(i=i), gguf.format(i=i))
        for i in range(layers)
        for graph, gguf in _NORMS.items()
    ]
    pairs.append((f"model.layers.{layers}.final_norm_layernorm.weight", "output_norm.weight"))
    checked = 0
    for graph_name, gguf_name in pairs:
        if graph_name not in inits or gguf_name not in tensors:
            continue
        got = onnx.numpy_helper.to_array(inits[graph_name]).astype(np.float32)
        want = np.asarray(tensors[gguf_name].data, dtype=np.float32).reshape(got.shape)
        if not np.array_equal(got, want):
            raise ExportError(
                f"GGUF rewrite: graph norm {graph_name} differs from the GGUF's {gguf_name} "
                f"(max {float(np.abs(got - want).max())}): the graph was built from another model"
            )
        checked += 1
    return checked
