"""Weight bytes a decode step reads, per graph, by the operator that reads them.

At batch 1 a decode step multiplies one token's activations by every weight matrix, so
its cost on a CPU follows the bytes of weights it streams through the caches. This
prints those bytes for ONNX decoder graphs side by side (ortgen's folders, the peers'
in ``benchmarks/.models``), so that a speed ratio between two graphs can be read
against their byte ratio:

    python benchmarks/graph_bytes.py exported_models/smollm2-135m-instruct \\
        benchmarks/.models/genai-int4 [--tok-s 76.0 100.6]

An embedding lookup reads one row of its table, so lookup tables (a Gather's or
GatherBlockQuantized's data and scales) are counted apart; so are rotary cos/sin
caches, of which a step reads one row. ``--tok-s`` (one figure per graph, measured
elsewhere, e.g. by ``compare.py``) adds the bytes per second each graph was run at.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import onnx

_LOOKUPS = {"Gather": (0,), "GatherBlockQuantized": (0, 2)}
_GQA_CACHES = (7, 8)  # GroupQueryAttention's cos_cache and sin_cache inputs


def graph_bytes(model: Path) -> dict[str, float]:
    """MB per decode step by reader ('MatMulNBits[1]': the first input of MatMulNBits
    nodes, the packed weights) plus 'total', 'lookup tables' and 'rotary caches'."""
    path = model / "model.onnx" if model.is_dir() else model
    graph = onnx.load(str(path), load_external_data=False).graph
    sizes = {}
    for tensor in graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= dim
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        sizes[tensor.name] = count * itemsize / 1e6
    # each initializer counts once, under its first reader that streams it: a tied
    # table read by the lookup and by the LM head (through a Reshape) counts as read
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name not in sizes:
                continue
            if index in _LOOKUPS.get(node.op_type, ()):
                kind = "lookup tables"
            elif node.op_type == "GroupQueryAttention" and index in _GQA_CACHES:
                kind = "rotary caches"
            else:
                kind = f"{node.op_type}[{index}]"
            readers.setdefault(name, []).append(kind)
    read: collections.Counter[str] = collections.Counter()
    for name, kinds in readers.items():
        streamed = [kind for kind in kinds if kind not in ("lookup tables", "rotary caches")]
        read[streamed[0] if streamed else kinds[0]] += sizes[name]
        if streamed:
            read["total"] += sizes[name]
    return dict(read)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="model folders or .onnx files")
    parser.add_argument("--tok-s", nargs="+", type=float, help="decode tok/s, one per model")
    args = parser.parse_args()
    if args.tok_s and len(args.tok_s) != len(args.models):
        parser.error(f"--tok-s needs {len(args.models)} figures, one per model")
    reports = [graph_bytes(model) for model in args.models]
    first = reports[0]["total"]
    for index, (model, report) in enumerate(zip(args.models, reports, strict=True)):
        total = report["total"]
        line = f"{model}: {total:.1f} MB per decode step ({total / first:.2f}x)"
        if args.tok_s:
            tok_s = args.tok_s[index]
            line += f", at {tok_s:.1f} tok/s {total * tok_s / 1e3:.1f} GB/s"
        print(line)
        parts = sorted(((k, v) for k, v in report.items() if k != "total"), key=lambda kv: -kv[1])
        print("    " + ", ".join(f"{name} {mb:.1f}" for name, mb in parts if mb >= 0.05))


if __name__ == "__main__":
    main()
