"""Edits onnxruntime-genai's builder graphs: the GGUF rewrite's surgery, and the memory
layout of a fused graph's embedding lookup and LM head (``own_lookup_inputs`` and
``split_rows``, which ``head_layout`` applies to every fused export).

The driver (``gguf_exact``) decides which GGUF tensor goes to which node; this module does
the graph surgery: replacing a node's weight, scale and zero-point initializers, adding the
Q4_1 minimum term (block-sum rows in the MatMulNBits itself, then Split, MatMul + Add,
optionally a Split for fused gate/up), turning the embedding into an 8-bit
GatherBlockQuantized, and checking each new weight against the builder's own. Edits are
collected and applied in one pass by ``GraphEditor.finish`` so node order stays
topological. onnx is passed in, not imported, so that ``import ortgen`` stays light.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ExportError
from .gguf_blocks import (
    BLOCK,
    DEFAULT_ZERO_POINT_4BIT,
    Blocks,
    dequant,
    pack,
    same_blocks,
    shifted_minimum,
    with_blocksum_rows,
)

__all__ = ["GraphEditor", "int_attr"]

# split_rows cuts N at multiples of this many rows (see there)
_SPLIT_TILE = 64


class GraphEditor:
    """Edits the builder graph: replaces initializers, adds the Q4_1 minimum term.

    Changes are collected (new initializers, nodes to insert next to existing ones, nodes to
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
        # Node name -> nodes to insert before / after it (kept in topological order).
        self.before: dict[str, list[Any]] = {}
        self.after: dict[str, list[Any]] = {}
        self.removed: set[str] = set()
        self.reshaped: set[str] = set()

    def array(self, name: str) -> Any:
        """An initializer's current value (a replaced one reads its replacement)."""
        if name in self.new_inits:
            return self.new_inits[name]
        if name not in self.inits:
            raise ExportError(f"GGUF rewrite: {name} is not an initializer of the graph")
        return self.onnx.numpy_helper.to_array(self.inits[name])

    def put(self, name: str, value: Any) -> None:
        """Set (or add) an initializer."""
        self.new_inits[name] = value
        self.dropped.discard(name)

    def compare_with_builder(self, node: Any, blocks: Blocks) -> float:
        """Largest |w_gguf - w_builder| over the builder's block scale; raise if above 1."""
        bits = int_attr(node, "bits", 4)
        block = int_attr(node, "block_size", 32)
        n, k = blocks.q.shape
        if bits != 4:
            return 0.0  # already rewritten (shared) or not a builder int4 weight: no reference
        packed = self.array(node.input[1]).reshape(n, -1)
        q = np.empty((n, packed.shape[1] * 2), np.float32)
        q[:, 0::2], q[:, 1::2] = packed & 0x0F, packed >> 4
        scale = self.array(node.input[2]).reshape(n, -1).astype(np.float32)
        nb = scale.shape[1]  # K is padded up to whole blocks (576 -> 640 at block 128)
        q = q[:, : nb * block].reshape(n, nb, block)
        if len(node.input) > 3 and node.input[3]:
            zp_packed = self.array(node.input[3]).reshape(n, -1)
            zp = np.empty((n, zp_packed.shape[1] * 2), np.float32)
            zp[:, 0::2], zp[:, 1::2] = zp_packed & 0x0F, zp_packed >> 4
            zp = zp[:, :nb]
        else:
            zp = np.full(scale.shape, 8.0, np.float32)
        ref = ((q - zp[..., None]) * scale[..., None]).reshape(n, -1)[:, :k]
        step = np.repeat(np.abs(scale), block, axis=1)[:, :k] + 1e-12
        steps = float((np.abs(dequant(blocks) - ref) / step).max())
        if steps > 1.0 + 1e-3:
            raise ExportError(
                f"GGUF rewrite: {node.name} does not match its GGUF tensor (off by {steps:.1f} "
                "quantisation steps): was the graph built from this GGUF's transformers folder, "
                "and are rows in the order the builder expects?"
            )
        return steps

    def _own(self, node: Any, names: list[str]) -> None:
        """Refuse to change initializers that nodes other than ``node`` (and known sharers) read."""
        for name in names:
            for user in self.consumers.get(name, []):
                if user is node or user.name.startswith("/model/embed_tokens/"):
                    continue
                raise ExportError(
                    f"GGUF rewrite: initializer {name} of {node.name} is also read by "
                    f"{user.name}; cannot rewrite it safely"
                )

    def remove(self, node: Any) -> None:
        """Drop ``node`` and the initializers only it reads (its work moved to another node)."""
        self._own(node, [x for x in node.input[1:] if x])
        self.removed.add(node.name)
        self.dropped.update(x for x in node.input[1:] if x)

    def rewrite_matmul(
        self,
        node: Any,
        blocks: Blocks,
        accuracy_level: int,
        split: list[tuple[str, int]] | None = None,
    ) -> None:
        """Make ``node`` compute A @ (d*(q - 8))^T + blocksum(A) @ (M + 8D)^T with the
        GGUF's Q4_1 blocks (w = d*q + m), or A @ (d*q)^T with its Q8_0 ones. No zero-point
        input: onnxruntime's default zero points (8 for 4-bit codes, 128 for 8-bit) take
        its fastest kernel; packed zero points 0 cost ~1.4x per 4-bit node at one row.

        ``split`` (output name, rows) cuts the result along N into those outputs.
        """
        helper = self.onnx.helper
        n, k = blocks.q.shape
        if k % BLOCK:
            raise ExportError(f"GGUF rewrite: {node.name} has K={k}, not a multiple of 32")
        minimum = blocks.m
        if minimum is not None:  # under the default zero point 8 (see module doc)
            try:
                minimum = shifted_minimum(blocks)
            except ValueError as exc:
                raise ExportError(f"GGUF rewrite: {node.name}: {exc}") from exc
            blocks = with_blocksum_rows(blocks, DEFAULT_ZERO_POINT_4BIT)
        elif split:
            raise ExportError(f"GGUF rewrite: {node.name}: only Q4_1 weights are fused")
        inputs = list(node.input) + [""] * (4 - len(node.input))
        weight, scale, zp = inputs[1], inputs[2], inputs[3]
        self._own(node, [x for x in (weight, scale, zp) if x])
        self.put(weight, pack(blocks))
        self.put(scale, blocks.d.astype(np.float32))
        if zp:  # none: the default, 8 for 4-bit codes (q - 8), 128 for 8-bit (stored q + 128)
            self.dropped.add(zp)
        zp = ""
        inputs[3] = zp
        while inputs and not inputs[-1]:
            inputs.pop()
        del node.input[:]
        node.input.extend(inputs)
        set_int_attr(helper, node, "N", blocks.q.shape[0])
        set_int_attr(helper, node, "bits", blocks.bits)
        set_int_attr(helper, node, "block_size", BLOCK)
        set_int_attr(helper, node, "accuracy_level", accuracy_level)
        if minimum is not None:
            self._add_minimum(node, n, minimum, weight, split)

    def _add_minimum(
        self, node: Any, n: int, m: Any, weight: str, split: list[tuple[str, int]] | None
    ) -> None:
        """Y = Split(MatMulNBits(A)) -> A @ (d*(q - 8))^T + blocksum(A) @ M^T, where ``m``
        is the shifted minimum m + 8d.

        ``node`` already returns N + K/32 columns (``with_blocksum_rows``): its last K/32 are
        the block sums of A, of the int8-quantised A at accuracy level 4, as llama.cpp's
        q8_1 block sums are.
        """
        helper = self.onnx.helper
        m_name = f"{weight}_gguf_min"
        self.put(m_name, np.ascontiguousarray(m.T.astype(np.float32)))
        out = node.output[0]
        base = f"{node.name}/gguf_min"
        dq, sums = f"{out}/gguf_dq", f"{base}/blocksums"
        node.output[0] = f"{out}/gguf_rows"
        # Shared by nodes of one shape; its prefix also marks a graph as rewritten (gguf_exact).
        sizes = f"gguf_exact/rows_split_{n}_{m.shape[1]}"
        self.put(sizes, np.array([n, m.shape[1]], np.int64))
        added = [
            helper.make_node(
                "Split", [node.output[0], sizes], [dq, sums], f"{base}/RowsSplit", axis=-1
            ),
            helper.make_node("MatMul", [sums, m_name], [f"{base}/output_0"], f"{base}/MatMul"),
            helper.make_node(
                "Add",
                [dq, f"{base}/output_0"],
                [f"{base}/sum" if split else out],
                f"{base}/Add",
            ),
        ]
        if split:
            sizes = f"{base}/split_sizes"
            self.put(sizes, np.array([rows for _, rows in split], np.int64))
            added.append(
                helper.make_node(
                    "Split",
                    [f"{base}/sum", sizes],
                    [name for name, _ in split],
                    f"{base}/Split",
                    axis=-1,
                )
            )
        self.after.setdefault(node.name, []).extend(added)

    def rewrite_embedding(
        self, gather: Any, blocks: Blocks, lm_head: tuple[Any, Blocks] | None, verify: bool
    ) -> None:
        """Embedding = the GGUF's token_embd, an 8-bit GatherBlockQuantized over its own table.

        A tied LM head and the embedding hold the same Q8_0 blocks, yet the lookup reads a
        second copy of them in the model file rather than the head's initializer. The copy
        costs disk (28 MB for the default model), not memory: onnxruntime maps external
        initializers from the file, and a lookup touches only the rows it reads. The head's
        initializer, read whole at load to pack it for MatMulNBits, stayed resident while
        the lookup used it (28 MB of RSS); and a Reshape of it to (N, K), as the builder
        feeds its shared lookup, was constant-folded into an anonymous copy (28 MB more).
        """
        if blocks.m is not None:
            raise ExportError(
                "GGUF rewrite: token_embd.weight is Q4_1; an exact Q4_1 embedding lookup is not "
                "implemented (only Q8_0)"
            )
        n, k = blocks.q.shape
        if gather.op_type == "Gather":  # a plain float embedding
            table = gather.input[0]
            self._own(gather, [table])
            if self.array(table).shape != (n, k):
                raise ExportError(f"GGUF rewrite: embedding {table} is not {n}x{k}")
            if verify and not np.array_equal(self.array(table), dequant(blocks)):
                raise ExportError(f"GGUF rewrite: embedding {table} differs from token_embd")
            self.dropped.add(table)
        else:  # GatherBlockQuantized over Reshape(lm_head B): the builder's shared_embeddings
            reshape = next((x for x in self.graph.node if gather.input[0] in x.output), None)
            shared = (
                reshape is not None
                and reshape.op_type == "Reshape"
                and lm_head is not None
                and reshape.input[0] == lm_head[0].input[1]
            )
            if not shared:
                raise ExportError(
                    f"GGUF rewrite: embedding {gather.name} is a GatherBlockQuantized not over "
                    "the LM head's weights; only the builder's shared_embeddings=true layout is "
                    "supported"
                )
            assert lm_head is not None and reshape is not None  # ``shared`` says so
            if not same_blocks(lm_head[1], blocks):
                raise ExportError(
                    "GGUF rewrite: the graph shares the LM head with the embedding but the "
                    "GGUF's output.weight differs from token_embd.weight"
                )
            if blocks.bits != 8:
                raise ExportError("GGUF rewrite: token_embd.weight must be Q8_0")
            self.removed.add(reshape.name)
            self.reshaped.add(reshape.output[0])
        data, scale = f"{gather.name}/gguf_table", f"{gather.name}/gguf_scale"
        self.put(data, pack(blocks).reshape(n, k))
        self.put(scale, blocks.d.astype(np.float32))
        self._gather_8bit(gather, [data, gather.input[1], scale], quantize_axis=1)

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
        paged in only for the rows looked up. (The ``gguf`` rewrite gives its lookup a
        table of its own directly, in ``rewrite_embedding``.)
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
        n = int_attr(node, "N")
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
            names = [f"{name}/gguf_rows_{start}" if name else "" for name in inputs]
            for name, whole in zip(names, inputs, strict=True):
                if whole:  # per-row data (weights, scales, zero points) in its own layout
                    array = arrays[whole]
                    rows = array.reshape(n, -1)[start : start + step]
                    shape = (-1,) if array.ndim == 1 else (-1, *array.shape[1:])
                    self.put(name, np.ascontiguousarray(rows.reshape(shape)))
            parts.append(f"{out}/gguf_rows_{start}")
            if start == 0:  # the node itself computes the first part
                target = node
            else:
                target = self.onnx.helper.make_node(
                    "MatMulNBits", [], [], f"{node.name}/gguf_rows_{start}", domain=node.domain
                )
                target.attribute.extend(node.attribute)
                added.append(target)
            del target.input[:], target.output[:]
            target.input.extend([activation, *names])
            target.output.append(parts[-1])
            set_int_attr(self.onnx.helper, target, "N", min(step, n - start))
        return self._join_parts(node, out, parts, added, "gguf_rows")

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

    def _gather_8bit(self, gather: Any, inputs: list[str], quantize_axis: int) -> None:
        """Turn ``gather`` (a Gather or GatherBlockQuantized) into an 8-bit
        GatherBlockQuantized over ``inputs`` (data, ids, scales; default zero point 128),
        blocks of 32 along ``quantize_axis``."""
        gather.op_type, gather.domain = "GatherBlockQuantized", "com.microsoft"
        del gather.input[:]
        gather.input.extend(inputs)
        for a in list(gather.attribute):
            if a.name == "axis":  # Gather's; GatherBlockQuantized names it gather_axis
                gather.attribute.remove(a)
        attrs = (("bits", 8), ("block_size", BLOCK), ("quantize_axis", quantize_axis))
        for name, value in (*attrs, ("gather_axis", 0)):
            set_int_attr(self.onnx.helper, gather, name, value)

    def finish(self) -> None:
        """Write the new initializers and insert the added nodes in topological order."""
        numpy_helper = self.onnx.numpy_helper
        used = {n for node in self.graph.node if node.name not in self.removed for n in node.input}
        used |= {name for nodes in self.after.values() for x in nodes for name in x.input}
        used |= {name for nodes in self.before.values() for x in nodes for name in x.input}
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
            nodes.extend(self.before.get(node.name, []))
            nodes.append(node)
            nodes.extend(self.after.get(node.name, []))
        # Constants nothing reads any more (the old embedding Reshape shape).
        read = {name for node in nodes for name in node.input}
        nodes = [n for n in nodes if n.op_type != "Constant" or n.output[0] in read]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        # Shapes recorded by the builder for tensors whose shape changed are now wrong.
        stale = set(self.new_inits) | self.dropped | self.reshaped
        infos = [v for v in self.graph.value_info if v.name not in stale]
        del self.graph.value_info[:]
        self.graph.value_info.extend(infos)


def int_attr(node: Any, name: str, default: Any = None) -> Any:
    """An integer attribute of ``node``."""
    for a in node.attribute:
        if a.name == name:
            return a.i
    if default is None:
        raise ExportError(f"GGUF rewrite: {node.name} has no attribute {name}")
    return default


def set_int_attr(helper: Any, node: Any, name: str, value: int) -> None:
    """Set an integer attribute of ``node``, replacing any old value."""
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))
