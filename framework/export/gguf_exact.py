"""Put a GGUF's own quantised weights into onnxruntime-genai's fused int4 graph, losslessly.

onnxruntime-genai's model builder cannot read a Q4_1 GGUF, so ortgen goes GGUF -> transformers
folder (dequantised) -> builder, which *re-quantises* every weight with its own RTN int4 and
loses accuracy on weights that were 4-bit already. This module swaps the builder's weights for
the GGUF's exact blocks after the fact, keeping the builder's fast graph (GroupQueryAttention,
fused norms, MatMulNBits):

- Q4_1 (per block of 32: w = d*q + m). MatMulNBits with packed uint8 zero points 0 and
  scales d computes A @ (d*q)^T exactly at full kernel speed; the minimum adds
  ``blocksum(A) @ M^T`` (M is (N, K/32)), a float MatMul 32x smaller than the weights.
  Float zero points (zp = -m/d) would also be exact but run a ~15x slower fallback kernel.
  In decode these tiny extra ops cost per node, not per byte, so the graph keeps them few:
  the blocksum is one MatMul with a 0/1 (K, K/32) matrix, shared by every MatMulNBits
  reading the same activation (q/k/v are fused already), and gate/up are fused into one
  MatMulNBits + one minimum term + Split. Per layer: blocksum + MatMul + Add for q/k/v, o and
  down, the same + Split for gate/up, i.e. 13 nodes added and 1 removed.
- Q8_0 (w = d*q, q int8): an 8-bit MatMulNBits without zero points (onnxruntime's default
  8-bit zero point is 128, so q + 128 is stored); a tied embedding becomes an 8-bit
  GatherBlockQuantized over the same initializer (onnxruntime 1.32 CPU runs it exactly).

Row order: llama.cpp's converter permutes the rows of q and k for its rotary layout and
transformers un-permutes them when it loads a GGUF; the builder saw transformers' order and
concatenates q, k, v along N. This module reproduces both. As a guard against any other
layout surprise, every new weight is compared with the builder's own RTN weight for the same
node: they must agree within the builder's quantisation step, or the rewrite refuses.

onnx, numpy and gguf are imported inside the function: ``import ortgen`` stays light.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError

__all__ = ["rewrite_with_gguf_weights"]

_BLOCK = 32
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


@dataclass
class _Blocks:
    """One weight in GGUF block form, rows in the graph's (transformers') order.

    ``q`` is (N, K) integer codes (0..15 for Q4_1, -128..127 for Q8_0), ``d`` and ``m`` are
    (N, K/32) float32 (``m`` is None for Q8_0, whose blocks have no minimum).
    """

    kind: str
    q: Any
    d: Any
    m: Any

    @property
    def bits(self) -> int:
        return 4 if self.kind == "Q4_1" else 8


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
    import numpy as np
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
    inits = {t.name: t for t in graph.initializer}
    if any(name.startswith("gguf_exact/") for name in inits):
        raise ExportError(f"GGUF rewrite: {model_path} was rewritten already; rebuild it first")
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ExportError(f"GGUF rewrite: accuracy_level must be 0..4, not {accuracy_level}")
    nodes_before = len(graph.node)
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    edit = _Editor(np, onnx, graph, inits, consumers)
    report: dict[str, Any] = {
        "tensors_rewritten": 0,
        "gguf_tensors_used": 0,
        "weight_bytes_before": sum(_nbytes(np, onnx, t) for t in graph.initializer),
        "max_abs_diff_vs_gguf": 0.0 if verify else None,
        "max_diff_vs_builder_in_steps": 0.0 if verify else None,
        "norms_checked": 0,
    }

    def load(name: str) -> _Blocks:
        tensor = tensors.get(name)
        if tensor is None:
            raise ExportError(f"GGUF rewrite: {gguf.name} has no tensor {name}")
        blocks = _read_blocks(np, tensor)
        if arch in _PERMUTED_ARCHS and (".attn_q." in name or ".attn_k." in name):
            n_head = heads if ".attn_q." in name else kv_heads
            blocks = _unpermute(np, blocks, n_head)
        if verify:
            from gguf.quants import dequantize

            ref = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            if arch in _PERMUTED_ARCHS and (".attn_q." in name or ".attn_k." in name):
                n_head = heads if ".attn_q." in name else kv_heads
                ref = ref[_unpermute_index(np, ref.shape[0], n_head)]
            diff = float(np.abs(_dequant(np, blocks) - ref).max())
            report["max_abs_diff_vs_gguf"] = max(report["max_abs_diff_vs_gguf"], diff)
            if diff != 0.0:
                raise ExportError(f"GGUF rewrite: {name} does not round-trip exactly ({diff})")
        report["gguf_tensors_used"] += 1
        return blocks

    def check(node: Any, blocks: _Blocks) -> None:
        n, k = _attr(node, "N"), _attr(node, "K")
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
        blocks = _concat(np, [load(p) for p in _gguf_parts(node.name, tensors)], node.name)
        check(node, blocks)
        report["tensors_rewritten"] += 1
        up = pairs.get(node.name)
        if up is None:
            edit.rewrite_matmul(node, blocks, accuracy_level)
            if node.name.startswith("/lm_head/"):
                lm_head = (node, blocks)
            continue
        up_blocks = _concat(np, [load(p) for p in _gguf_parts(up.name, tensors)], up.name)
        check(up, up_blocks)
        report["tensors_rewritten"] += 1
        if blocks.kind == up_blocks.kind == "Q4_1":
            # One MatMulNBits and one minimum term for both, then a Split: 3 fewer nodes per
            # layer and step than two MatMulNBits each with its own MatMul + Add.
            split = [(node.output[0], blocks.q.shape[0]), (up.output[0], up_blocks.q.shape[0])]
            edit.remove(up)
            fused = _concat(np, [blocks, up_blocks], node.name)
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

    report["norms_checked"] = _check_norms(np, onnx, inits, tensors, reader, arch)
    edit.finish()
    report["weight_bytes_after"] = sum(_nbytes(np, onnx, t) for t in graph.initializer)
    report["nodes_before"], report["nodes_after"] = nodes_before, len(graph.node)
    report["accuracy_level"] = accuracy_level
    _save_in_place(onnx, model, Path(onnx_dir))
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


def _read_blocks(np: Any, tensor: Any) -> _Blocks:
    """Split a GGUF tensor's raw blocks into codes, scales and minimums (no dequantisation)."""
    kind = tensor.tensor_type.name
    raw = np.asarray(tensor.data)
    if kind not in ("Q4_1", "Q8_0"):
        raise ExportError(
            f"GGUF rewrite: {tensor.name} is {kind}; a matmul weight must be Q4_1 or Q8_0 to be "
            "run exactly by MatMulNBits"
        )
    rows = raw.shape[0]
    if kind == "Q4_1":  # block: fp16 d, fp16 m, 16 bytes: low nibbles = 0..15, high = 16..31
        blk = raw.reshape(rows, -1, 20)
        d = blk[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = blk[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blk[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, -1)
        return _Blocks(kind, q, d, m)
    blk = raw.reshape(rows, -1, 34)  # Q8_0 block: fp16 d, 32 x int8
    d = blk[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blk[..., 2:].copy().view(np.int8).reshape(rows, -1)
    return _Blocks(kind, q, d, None)


def _unpermute_index(np: Any, rows: int, n_head: int) -> Any:
    """Row order transformers' ``_reverse_permute_weights`` gives: new[i] = old[index[i]]."""
    dim = rows // n_head // 2
    return np.arange(rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(rows)


def _unpermute(np: Any, blocks: _Blocks, n_head: int) -> _Blocks:
    """Undo llama.cpp's q/k row permutation; rows are whole, so blocks move intact."""
    idx = _unpermute_index(np, blocks.q.shape[0], n_head)
    m = None if blocks.m is None else blocks.m[idx]
    return _Blocks(blocks.kind, blocks.q[idx], blocks.d[idx], m)


def _concat(np: Any, parts: list[_Blocks], node_name: str) -> _Blocks:
    """Stack weights along N (rows) as the builder fuses q/k/v; they must share one type."""
    kinds = {p.kind for p in parts}
    if len(kinds) != 1:
        raise ExportError(
            f"GGUF rewrite: {node_name} fuses GGUF tensors of different types {sorted(kinds)}; "
            "build the graph with disable_qkv_fusion=true"
        )
    if len(parts) == 1:
        return parts[0]
    m = None if parts[0].m is None else np.concatenate([p.m for p in parts])
    return _Blocks(
        parts[0].kind,
        np.concatenate([p.q for p in parts]),
        np.concatenate([p.d for p in parts]),
        m,
    )


def _dequant(np: Any, blocks: _Blocks) -> Any:
    """(N, K) float32 weights of ``blocks``: d*q (+ m)."""
    rows = blocks.q.shape[0]
    w = blocks.q.reshape(rows, -1, _BLOCK).astype(np.float32) * blocks.d[..., None]
    if blocks.m is not None:
        w += blocks.m[..., None]
    return w.reshape(rows, -1)


def _pack(np: Any, blocks: _Blocks) -> Any:
    """MatMulNBits' B: (N, K/32, 32*bits/8) uint8; 4-bit: element 2j low nibble, 2j+1 high."""
    rows = blocks.q.shape[0]
    if blocks.bits == 8:
        return (blocks.q.astype(np.int16) + 128).astype(np.uint8).reshape(rows, -1, _BLOCK)
    q = blocks.q.astype(np.uint8).reshape(rows, -1, _BLOCK)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _same(np: Any, a: _Blocks, b: _Blocks) -> bool:
    """True if two weights hold identical blocks (a tied LM head and embedding)."""
    return (
        a.kind == b.kind
        and a.q.shape == b.q.shape
        and (np.array_equal(a.q, b.q) and np.array_equal(a.d, b.d))
    )


def _nbytes(np: Any, onnx: Any, tensor: Any) -> int:
    """Bytes of one initializer's data."""
    itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


class _Editor:
    """Edits the builder graph: replaces initializers, adds the Q4_1 minimum term.

    Changes are collected (new initializers, nodes to insert next to existing ones, nodes to
    drop) and applied by ``finish`` in one pass, so node order stays topological.
    """

    def __init__(self, np: Any, onnx: Any, graph: Any, inits: dict, consumers: dict) -> None:
        self.np, self.onnx, self.graph = np, onnx, graph
        self.inits, self.consumers = inits, consumers
        self.new_inits: dict[str, Any] = {}
        self.dropped: set[str] = set()
        # Node name -> nodes to insert before / after it (kept in topological order).
        self.before: dict[str, list[Any]] = {}
        self.after: dict[str, list[Any]] = {}
        self.blocksums: dict[str, str] = {}
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

    def compare_with_builder(self, node: Any, blocks: _Blocks) -> float:
        """Largest |w_gguf - w_builder| over the builder's block scale; raise if above 1."""
        np = self.np
        bits = _attr(node, "bits", 4)
        block = _attr(node, "block_size", 32)
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
        steps = float((np.abs(_dequant(np, blocks) - ref) / step).max())
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
        blocks: _Blocks,
        accuracy_level: int,
        split: list[tuple[str, int]] | None = None,
    ) -> None:
        """Make ``node`` compute A @ (d*q)^T [+ blocksum(A) @ M^T] with the GGUF's blocks.

        ``split`` (output name, rows) cuts the result along N into those outputs.
        """
        np, helper = self.np, self.onnx.helper
        n, k = blocks.q.shape
        if k % _BLOCK:
            raise ExportError(f"GGUF rewrite: {node.name} has K={k}, not a multiple of 32")
        inputs = list(node.input) + [""] * (4 - len(node.input))
        weight, scale, zp = inputs[1], inputs[2], inputs[3]
        self._own(node, [x for x in (weight, scale, zp) if x])
        self.put(weight, _pack(np, blocks))
        self.put(scale, blocks.d.astype(np.float32))
        if blocks.bits == 4:
            # Packed zero points 0 (not absent: absent means 8 for 4-bit).
            zp = zp or f"{weight}_zp0"
            self.put(zp, np.zeros((n, (k // _BLOCK + 1) // 2), np.uint8))
        else:
            if zp:
                self.dropped.add(zp)
            zp = ""  # 8-bit default zero point is 128: codes are stored as q + 128
        inputs[3] = zp
        while inputs and not inputs[-1]:
            inputs.pop()
        del node.input[:]
        node.input.extend(inputs)
        _set_attr(helper, node, "N", n)
        _set_attr(helper, node, "bits", blocks.bits)
        _set_attr(helper, node, "block_size", _BLOCK)
        _set_attr(helper, node, "accuracy_level", accuracy_level)
        if blocks.m is not None:
            self._add_minimum(node, blocks.m, weight, split)
        elif split:
            raise ExportError(f"GGUF rewrite: {node.name}: only Q4_1 weights are fused")

    def _add_minimum(
        self, node: Any, m: Any, weight: str, split: list[tuple[str, int]] | None
    ) -> None:
        """Y = MatMulNBits(A) + blocksum(A) @ M^T, the blocksum shared per activation A."""
        helper, np = self.onnx.helper, self.np
        act = node.input[0]
        if act not in self.blocksums:
            base = f"{node.name}/gguf_blocksum"
            k = m.shape[1] * _BLOCK
            # One MatMul with a (K, K/32) 0/1 matrix: one node, where Reshape + ReduceSum is two
            # (per-node cost dominates these tiny ops in decode).
            ones = f"gguf_exact/block_ones_{k}"
            if ones not in self.new_inits:
                self.put(ones, np.repeat(np.eye(k // _BLOCK, dtype=np.float32), _BLOCK, 0))
            added = [helper.make_node("MatMul", [act, ones], [f"{base}/output_0"], base)]
            self.before.setdefault(node.name, []).extend(added)
            self.blocksums[act] = f"{base}/output_0"
        m_name = f"{weight}_gguf_min"
        self.put(m_name, np.ascontiguousarray(m.T.astype(np.float32)))
        out = node.output[0]
        node.output[0] = f"{out}/gguf_dq"
        base = f"{node.name}/gguf_min"
        added = [
            helper.make_node(
                "MatMul", [self.blocksums[act], m_name], [f"{base}/output_0"], f"{base}/MatMul"
            ),
            helper.make_node(
                "Add",
                [node.output[0], f"{base}/output_0"],
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
        self, gather: Any, blocks: _Blocks, lm_head: tuple[Any, _Blocks] | None, verify: bool
    ) -> None:
        """Embedding = the GGUF's token_embd: shared with the tied LM head when the graph shares."""
        np, helper = self.np, self.onnx.helper
        if blocks.m is not None:
            raise ExportError(
                "GGUF rewrite: token_embd.weight is Q4_1; an exact Q4_1 embedding lookup is not "
                "implemented (only Q8_0)"
            )
        n, k = blocks.q.shape
        if gather.op_type == "Gather":
            # Plain float embedding: replace by an 8-bit GatherBlockQuantized over its own codes.
            table = gather.input[0]
            self._own(gather, [table])
            if self.array(table).shape != (n, k):
                raise ExportError(f"GGUF rewrite: embedding {table} is not {n}x{k}")
            if verify and not np.array_equal(self.array(table), _dequant(np, blocks)):
                raise ExportError(f"GGUF rewrite: embedding {table} differs from token_embd")
            ids = gather.input[1]
            self.dropped.add(table)
            if lm_head is not None and _same(np, lm_head[1], blocks):
                # Tied: gather from the LM head's codes (B reshaped to (N, K)), no second copy.
                head = lm_head[0]
                data, scale = f"{gather.name}/gguf_table", head.input[2]
                shape = f"{gather.name}/gguf_shape"
                self.put(shape, np.array([n, k], np.int64))
                reshape = helper.make_node(
                    "Reshape", [head.input[1], shape], [data], f"{gather.name}/gguf_Reshape"
                )
                self.before.setdefault(gather.name, []).append(reshape)
            else:
                data, scale = f"{table}_Q8G32", f"{table}_scale"
                self.put(data, _pack(np, blocks).reshape(n, k))
                self.put(scale, blocks.d.astype(np.float32))
            gather.op_type, gather.domain = "GatherBlockQuantized", "com.microsoft"
            del gather.input[:]
            gather.input.extend([data, ids, scale])  # default 8-bit zero point 128
            for name, value in (("bits", 8), ("block_size", _BLOCK), ("quantize_axis", 1)):
                _set_attr(helper, gather, name, value)
            _set_attr(helper, gather, "gather_axis", 0)
            for a in list(gather.attribute):
                if a.name == "axis":
                    gather.attribute.remove(a)
            return
        # GatherBlockQuantized over Reshape(lm_head B): the builder's shared_embeddings=true.
        data = gather.input[0]
        reshape = next((x for x in self.graph.node if data in x.output), None)
        shared = (
            reshape is not None
            and reshape.op_type == "Reshape"
            and lm_head is not None
            and reshape.input[0] == lm_head[0].input[1]
        )
        if not shared:
            raise ExportError(
                f"GGUF rewrite: embedding {gather.name} is a GatherBlockQuantized not over the LM "
                "head's weights; only the builder's shared_embeddings=true layout is supported"
            )
        if not _same(np, lm_head[1], blocks):
            raise ExportError(
                "GGUF rewrite: the graph shares the LM head with the embedding but the GGUF's "
                "output.weight differs from token_embd.weight"
            )
        if blocks.bits != 8:
            raise ExportError("GGUF rewrite: token_embd.weight must be Q8_0")
        shape_name = f"{reshape.name}/gguf_shape"
        self.put(shape_name, np.array([n, k], np.int64))
        reshape.input[1] = shape_name
        self.reshaped.add(reshape.output[0])
        head = lm_head[0]
        inputs = [data, gather.input[1], head.input[2]]  # same scales, default zero point 128
        del gather.input[:]
        gather.input.extend(inputs)
        _set_attr(helper, gather, "bits", 8)
        _set_attr(helper, gather, "block_size", _BLOCK)

    def finish(self) -> None:
        """Write the new initializers and insert the added nodes in topological order."""
        numpy_helper = self.onnx.numpy_helper
        used = {name for node in self.graph.node for name in node.input}
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


def _attr(node: Any, name: str, default: Any = None) -> Any:
    """An integer attribute of ``node``."""
    for a in node.attribute:
        if a.name == name:
            return a.i
    if default is None:
        raise ExportError(f"GGUF rewrite: {node.name} has no attribute {name}")
    return default


def _set_attr(helper: Any, node: Any, name: str, value: int) -> None:
    """Set an integer attribute of ``node``, replacing any old value."""
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _check_norms(np: Any, onnx: Any, inits: dict, tensors: dict, reader: Any, arch: str) -> int:
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


def _save_in_place(onnx: Any, model: Any, onnx_dir: Path) -> None:
    """Save next to the old files, then swap: a failed save leaves the old graph intact.

    onnx appends to an existing external-data file, so the new pair is written into a fresh
    folder under the final names (the graph records the data file's name) and then moved.
    """
    tmp = Path(tempfile.mkdtemp(prefix=".gguf_exact_", dir=onnx_dir))
    try:
        onnx.save_model(
            model,
            str(tmp / "model.onnx"),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
            size_threshold=1024,
        )
        for name in ("model.onnx.data", "model.onnx"):
            old = onnx_dir / name
            if old.exists():  # keep the old files' permissions (onnx writes 0600 data files)
                (tmp / name).chmod(old.stat().st_mode & 0o777)
            (tmp / name).replace(old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
