"""Graph edits behind ``head_layout``: the memory layout of a fused graph's embedding
lookup and LM head, moving bytes, never numbers.

``own_lookup_inputs`` gives an embedding lookup its own copies of initializers it shares
with the LM head (folding a Reshape or Transpose of them at export); ``split_rows`` (a
MatMulNBits) and ``split_columns`` (a float MatMul) cut the head along N into parts joined
by a Concat. Edits are collected and applied in one pass by ``GraphEditor.finish`` so node
order stays topological. onnx is passed in, not imported, so that ``import ortgen`` stays
light.

``lm_head`` finds what every exported graph's LM head reads (the last layer's state after
the final norm), for the two edits made of it: the fused graphs' ``prune_lm_head`` and
``add_hidden_output`` (``ortgen export --embeddings``, on either graph family).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ExportError

__all__ = ["GraphEditor", "add_hidden_output", "lm_head"]

# split_rows cuts N at multiples of this many rows (see there)
_SPLIT_TILE = 64
#: ``prune_lm_head``'s slice between the final norm and the LM head: ``{hidden}`` + this
LAST_POSITIONS = "/last_positions"


class GraphEditor:
    """Edits an ONNX graph in place: new initializers, added and removed nodes.

    Changes are collected (new initializers, nodes to insert after existing ones, nodes to
    drop) and applied by ``finish`` in one pass, so node order stays topological.
    """

    def __init__(self, onnx: Any, graph: Any) -> None:
        self.onnx, self.graph = onnx, graph
        self.inits: dict[str, Any] = {t.name: t for t in graph.initializer}
        # initializer or tensor name -> the nodes that read it, as the graph came
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.new_inits: dict[str, Any] = {}
        self.dropped: set[str] = set()
        # node name -> nodes to insert after it (kept in topological order)
        self.after: dict[str, list[Any]] = {}
        self.removed: set[str] = set()
        self.reshaped: set[str] = set()

    def array(self, name: str) -> Any:
        """An initializer's current value (a replaced one reads its replacement)."""
        if name in self.new_inits:
            return self.new_inits[name]
        if name not in self.inits:
            raise ExportError(f"graph edit: {name} is not an initializer of the graph")
        return self.onnx.numpy_helper.to_array(self.inits[name])

    def put(self, name: str, value: Any) -> None:
        """Set (or add) an initializer."""
        self.new_inits[name] = value
        self.dropped.discard(name)

    def _own(self, node: Any, names: list[str]) -> None:
        """Refuse to change initializers that nodes other than ``node`` still read (a node
        already removed, or one whose input was redirected, no longer does)."""
        for name in names:
            for user in self.consumers.get(name, []):
                if user is node or user.name in self.removed or name not in user.input:
                    continue
                raise ExportError(
                    f"graph edit: initializer {name} of {node.name} is also read by "
                    f"{user.name}; cannot rewrite it safely"
                )

    def own_lookup_inputs(self, gather: Any) -> bool:
        """Give an embedding lookup its own copies of the initializers it shares with the LM
        head, folding a Reshape or Transpose of one at export; True if anything changed.

        The builder's shared embedding (``shared_embeddings=true``) reads the head's
        4-bit weight through a Reshape, and its scales and zero points as they are; after
        onnxruntime's quantiser (precision int8) the float embedding is a Gather over a
        Transpose of the head's float weight. onnxruntime folds such a Reshape or
        Transpose at load into anonymous memory (a second table: 113 MB for the int8
        variant's fp32 one), and initializers the lookup shares with the head stay
        resident once packing has read them. Own copies in the model file are mapped and
        paged in only for the rows looked up.
        """
        producers = {out: node for node in self.graph.node for out in node.output}
        changed = False
        for i, name in enumerate(gather.input):
            if i == 1 or not name:  # the token ids
                continue
            view = producers.get(name)
            if view is not None:
                value = self._fold_view(view, producers)
                if value is None:
                    continue  # not a view of an initializer: nothing shared to copy
                if all(c.name == gather.name for c in self.consumers.get(name, [])):
                    self.removed.add(view.name)
                self.reshaped.add(name)
            elif name in self.inits and any(
                c.name != gather.name for c in self.consumers.get(name, [])
            ):
                value = self.array(name)
            else:
                continue
            own = f"{gather.name}/own_input_{i}"
            self.put(own, np.ascontiguousarray(value))
            gather.input[i] = own
            changed = True
        return changed

    def _fold_view(self, node: Any, producers: dict[str, Any]) -> Any:
        """The value of a Reshape or Transpose of an initializer, or None for anything else."""
        if node.op_type not in ("Reshape", "Transpose") or node.input[0] not in self.inits:
            return None
        array = self.array(node.input[0])
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            return array.transpose(perm)  # no perm: reversed axes, as numpy's default
        shape = [int(x) for x in self._constant(node.input[1], producers)]
        return array.reshape([array.shape[j] if x == 0 else x for j, x in enumerate(shape)])

    def _constant(self, name: str, producers: dict[str, Any]) -> Any:
        """The value of an initializer or a Constant node's output."""
        if name in self.inits or name in self.new_inits:
            return self.array(name)
        node = producers.get(name)
        if node is None or node.op_type != "Constant":
            raise ExportError(f"graph edit: {name} is not a constant")
        return self.onnx.numpy_helper.to_array(node.attribute[0].t)

    def split_rows(self, node: Any, max_bytes: int) -> int:
        """Cut a MatMulNBits along N into parts of about ``max_bytes`` of packed weight
        (whole tiles of 64 rows), concatenate their outputs, and return the number of parts:
        the same products in the same order, so bit for bit the same output.

        onnxruntime packs each MatMulNBits weight at load while its file-mapped initializer
        is resident, and releases the latter afterwards, so the largest weight sets the load's
        peak: the LM head (28 MB at 8 bits for the default model; 49,152 x 576). In parts of
        8 MB the peak RSS of creating the default model's session went 236 -> 213 MB, with
        identical logits and no measurable change in decode time (one Concat of the logits).
        """
        weight = node.input[1]
        n = _int_attr(node, "N")
        step = self._part_width(node, n, self.array(weight).nbytes, max_bytes)
        if step == n:
            return 1
        if len(node.input) > 4 and node.input[4]:  # g_idx runs along K, not N
            raise ExportError(f"graph edit: cannot split {node.name}, it has a g_idx input")
        activation, inputs = node.input[0], list(node.input[1:])
        arrays = {name: self.array(name) for name in inputs if name}
        self._hand_to_parts(node, list(arrays))
        out = node.output[0]
        parts: list[str] = []
        added: list[Any] = []
        for start in range(0, n, step):
            names = [f"{name}/rows_{start}" if name else "" for name in inputs]
            for name, whole in zip(names, inputs, strict=True):
                if whole:  # per-row data (weights, scales, zero points) in its own layout
                    array = arrays[whole]
                    rows = array.reshape(n, -1)[start : start + step]
                    shape = (-1,) if array.ndim == 1 else (-1, *array.shape[1:])
                    self.put(name, np.ascontiguousarray(rows.reshape(shape)))
            parts.append(f"{out}/rows_{start}")
            if start == 0:  # the node itself computes the first part
                target = node
            else:
                target = self.onnx.helper.make_node(
                    "MatMulNBits", [], [], f"{node.name}/rows_{start}", domain=node.domain
                )
                target.attribute.extend(node.attribute)
                added.append(target)
            del target.input[:], target.output[:]
            target.input.extend([activation, *names])
            target.output.append(parts[-1])
            _set_int_attr(self.onnx.helper, target, "N", min(step, n - start))
        return self._join_parts(node, out, parts, added, "rows")

    def split_columns(self, node: Any, max_bytes: int) -> int:
        """``split_rows`` for a float MatMul whose weight is a (K, N) initializer (a float
        LM head): parts along N of about ``max_bytes``, joined by a Concat; the number of
        parts. onnxruntime packs a constant MatMul weight at load too (fused fp32: the
        113 MB head held twice at the load's peak), and each output column is the same dot
        product over K in either layout (bit-identical logits on the fused fp32 graphs)."""
        weight = node.input[1]
        if weight not in self.inits and weight not in self.new_inits:
            return 1  # a computed weight: nothing to cut at export
        array = self.array(weight)
        if array.ndim != 2:
            return 1
        n = array.shape[1]
        step = self._part_width(node, n, array.nbytes, max_bytes)
        if step == n:
            return 1
        self._hand_to_parts(node, [weight])
        out = node.output[0]
        parts: list[str] = []
        added: list[Any] = []
        for start in range(0, n, step):
            name = f"{weight}/cols_{start}"
            self.put(name, np.ascontiguousarray(array[:, start : start + step]))
            parts.append(f"{out}/cols_{start}")
            if start == 0:  # the node itself computes the first part
                node.input[1], node.output[0] = name, parts[-1]
            else:
                added.append(
                    self.onnx.helper.make_node(
                        "MatMul", [node.input[0], name], [parts[-1]], f"{node.name}/cols_{start}"
                    )
                )
        return self._join_parts(node, out, parts, added, "cols")

    def _hand_to_parts(self, node: Any, names: list[str]) -> None:
        """``node``'s initializers ``names`` are about to be replaced by its parts' own:
        refuse if another node reads them, and drop them."""
        self._own(node, names)
        for name in names:
            self.new_inits.pop(name, None)
            self.dropped.add(name)

    def _join_parts(self, node: Any, out: str, parts: list[str], added: list[Any], tag: str) -> int:
        """Insert the parts' nodes after ``node`` and a Concat of their outputs into ``out``
        (along the last axis); the number of parts."""
        joined = self.onnx.helper.make_node(
            "Concat", parts, [out], f"{node.name}/{tag}_concat", axis=-1
        )
        self.after.setdefault(node.name, []).extend([*added, joined])
        return len(parts)

    def _part_width(self, node: Any, n: int, size: int, max_bytes: int) -> int:
        """Rows (or columns) per part for cutting ``node``'s ``size``-byte weight of width
        ``n`` into parts of about ``max_bytes``: as even as the bound allows, rounded up to
        whole tiles of the kernels, whose remainder paths sum in another order (1 ulp off
        on a tiny model); ``n`` when it stays whole."""
        if size <= max_bytes:
            return n
        if node.name in self.after:
            raise ExportError(f"graph edit: cannot split {node.name}, nodes read its output")
        step = -(-n // -(-size // max_bytes))
        return min(n, -(-step // _SPLIT_TILE) * _SPLIT_TILE)

    def finish(self) -> None:
        """Write the new initializers and insert the added nodes in topological order."""
        numpy_helper = self.onnx.numpy_helper
        used = {n for node in self.graph.node if node.name not in self.removed for n in node.input}
        used |= {name for nodes in self.after.values() for x in nodes for name in x.input}
        keep = [
            t
            for t in self.graph.initializer
            if t.name not in self.new_inits and t.name not in self.dropped and t.name in used
        ]
        fresh = [numpy_helper.from_array(v, name) for name, v in self.new_inits.items()]
        del self.graph.initializer[:]
        self.graph.initializer.extend(keep + fresh)
        nodes = []
        for node in self.graph.node:
            if node.name in self.removed:
                continue
            nodes.append(node)
            nodes.extend(self.after.get(node.name, []))
        # Constants nothing reads any more (a folded Reshape's shape).
        read = {name for node in nodes for name in node.input}
        nodes = [n for n in nodes if n.op_type != "Constant" or n.output[0] in read]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        # Shapes recorded by the builder for tensors whose shape changed are now wrong.
        stale = set(self.new_inits) | self.dropped | self.reshaped
        infos = [v for v in self.graph.value_info if v.name not in stale]
        del self.graph.value_info[:]
        self.graph.value_info.extend(infos)


def _int_attr(node: Any, name: str) -> int:
    """An integer attribute of ``node``."""
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    raise ExportError(f"graph edit: {node.name} has no attribute {name}")


def _set_int_attr(helper: Any, node: Any, name: str, value: int) -> None:
    """Set an integer attribute of ``node``, replacing any old value."""
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def lm_head(graph: Any, where: Any = "the graph") -> tuple[str, list[Any]]:
    """(the tensor the LM head reads, the head's MatMul or MatMulNBits nodes): the node
    that makes ``logits``, or its parts along the vocabulary joined by a Concat
    (``head_layout``), all reading one tensor. Raises ExportError for any other head (a
    soft-capped one, say), naming what makes ``logits``."""
    producers = {out: node for node in graph.node for out in node.output}
    head = producers.get("logits")
    heads = [head]
    if head is not None and head.op_type == "Concat":
        heads = [producers.get(part) for part in head.input]
    matmuls = [h for h in heads if h is not None and h.op_type in ("MatMul", "MatMulNBits")]
    if not matmuls or len(matmuls) != len(heads) or len({h.input[0] for h in matmuls}) != 1:
        found = head.op_type if head is not None else "nothing"
        raise ExportError(f"{where}: 'logits' is made by {found}, not an LM-head MatMul")
    return matmuls[0].input[0], matmuls


def add_hidden_output(graph_path: Path, name: str) -> bool:
    """Make the graph at ``graph_path`` also output ``name`` (B, T, hidden): the last
    layer's state after the final norm, every position of it, as the LM head reads it
    (before ``prune_lm_head``'s slice to the last positions, when there is one). An
    Identity node, so nothing else in the graph changes; the weights file is untouched.
    False when the graph already has the output."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph_path), load_external_data=False)
    graph = model.graph
    if any(o.name == name for o in graph.output):
        return False
    hidden, heads = lm_head(graph, graph_path)
    producers = {out: node for node in graph.node for out in node.output}
    cut = producers.get(hidden)
    if cut is not None and cut.op_type == "Slice" and cut.name.endswith(f"{LAST_POSITIONS}/Slice"):
        hidden = cut.input[0]
    graph.node.append(helper.make_node("Identity", [hidden], [name], name=f"/model/{name}"))
    shape: list[Any] = ["batch_size", "sequence_length", _head_width(heads[0], graph)]
    graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    onnx.save(model, str(graph_path))
    return True


def _head_width(head: Any, graph: Any) -> int | str:
    """The hidden size the LM head reads (K): MatMulNBits' attribute, a float head's
    (K, N) weight, or the (N, K) table it transposes (a tied head); a symbolic name when
    the graph does not say it."""
    if head.op_type == "MatMulNBits":
        return _int_attr(head, "K")
    inits = {t.name: t for t in graph.initializer}
    weight, column = inits.get(head.input[1]), 0
    if weight is None:
        view = next((n for n in graph.node if head.input[1] in n.output), None)
        if view is not None and view.op_type == "Transpose":
            weight, column = inits.get(view.input[0]), 1
    if weight is None or len(weight.dims) != 2:
        return "hidden_size"
    return int(weight.dims[column])
