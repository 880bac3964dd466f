"""Lay out a fused graph's LM head and embedding lookup so that loading holds fewer bytes.

onnxruntime packs each MatMulNBits weight at session creation while the weight's own
initializer is mapped from the model file, and releases the latter afterwards unless
another node reads it. Two things then cost resident memory without changing any number:

- an embedding lookup that reads the LM head's initializers (the builder's shared
  embedding) keeps them resident for good, and a Reshape or Transpose in front of it is
  folded by onnxruntime into an anonymous copy of the table (113 MB for the int8 variant's
  float embedding);
- the LM head, the largest weight and the last one packed, is held twice at the load's
  peak.

So the lookup gets its own copies in the file (paged in only for the rows it reads) and the
head is computed in parts of about ``PART_BYTES`` (whole tiles of rows) joined by a Concat.
On the default model: peak RSS 271 -> 247 MB in ``benchmarks/compare.py``, logits
bit-identical; on the fused int4 and int8 graphs see docs/benchmarks.md. The cost is disk:
the table twice in the folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .graph_editor import GraphEditor
from .onnx_files import save_in_place

__all__ = ["PART_BYTES", "lay_out_head"]

#: An LM-head part's size, in bytes of packed weight (the default model's 28 MB Q8_0 head
#: becomes four parts: peak RSS of its session 236 -> 213 MB).
PART_BYTES = 8 * 2**20


def lay_out_head(onnx_dir: Path, part_bytes: int = PART_BYTES) -> dict[str, Any]:
    """Rewrite ``onnx_dir``'s model.onnx in place when its head or lookup needs it.

    Returns what was done: ``{"head_parts": n, "lookup_copied": bool}`` (one part and
    nothing copied: the graph was left alone). A float head (a MatMul, fused fp32) is cut
    along N the same way, and its lookup, a Gather over a Transpose of the head's weight
    when tied, gets its own table: on SmolLM2 at fp32, session peak 806 -> 593 MB, the same
    logits.
    """
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    # the graph alone first: a head this pass does not know needs no weights loaded
    model = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    graph = model.graph
    head = next((node for node in graph.node if "logits" in node.output), None)
    if head is None or head.op_type not in ("MatMulNBits", "MatMul"):
        return {"head_parts": 1, "lookup_copied": False}
    load_external_data_for_model(model, str(onnx_dir))
    edit = GraphEditor(onnx, graph)
    copied = False
    lookups = [
        n
        for n in graph.node
        if n.op_type in ("Gather", "GatherBlockQuantized") and n.input[1] == "input_ids"
    ]
    for lookup in lookups:
        copied = edit.own_lookup_inputs(lookup) or copied
    if head.op_type == "MatMulNBits":
        parts = edit.split_rows(head, part_bytes)
    else:  # a float head (fused fp32)
        parts = edit.split_columns(head, part_bytes)
    if parts > 1 or copied:
        edit.finish()
        save_in_place(onnx, model, onnx_dir)
    return {"head_parts": parts, "lookup_copied": copied}
