"""The decoder graph, from a GGUF's tensors and its ``ModelSpec``.

The graph is the fused family ortgen's loop already drives (onnxruntime-genai's builder
makes the same): inputs ``input_ids``, ``attention_mask``, ``past_key_values.N.key/value``
and ``logits_to_keep``; outputs ``logits`` and ``present.N.key/value`` (one buffer with the
past when bound so: GroupQueryAttention writes each row's new positions at its length).
Per layer::

    norm (SimplifiedLayerNormalization, or SkipSimplified... adding the last block's output)
    -> q, k, v projections (one node where the layouts allow) [-> q/k RMS norms per head]
    -> GroupQueryAttention (rotary inside; window, soft-cap, scale per the spec)
    -> o projection [-> post-attention norm] -> norm adding it to the residual stream
    -> gate, up -> SiLU or GELU(tanh) -> multiply -> down [-> post-feed-forward norm]

then the final norm (with ``BuildOptions.embeddings``, also the ``hidden_states`` output),
the last ``logits_to_keep`` positions, the LM head (cut into parts)
and, for Gemma 2, the final soft-cap. The architectures' differences are the spec's fields;
nothing here branches on a family's name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize
from onnx import TensorProto, helper

from .onnx_writer import GraphWriter
from .options import BuildOptions
from .projections import Part, Weight, embedding, kernel_key, linear, merge_parts, take_rows
from .quant_layout import FloatWeight, to_layout
from .reader import GGUFError, GGUFFile
from .rope import rope_caches
from .spec import ModelSpec, RopeSpec

__all__ = ["HIDDEN_OUTPUT", "build_decoder"]

#: the extra output of a build with ``embeddings`` (onnxruntime-genai's builder names its
#: ``include_hidden_states`` output so too)
HIDDEN_OUTPUT = "hidden_states"

#: An LM-head part's bytes (``projections``: a lower peak while onnxruntime packs it).
HEAD_PART_BYTES = 8 * 2**20


def build_decoder(g: GGUFFile, spec: ModelSpec, options: BuildOptions, out_dir: Path) -> None:
    """Write ``out_dir/model.onnx`` and ``model.onnx.data`` for the GGUF ``g``."""
    w = GraphWriter(out_dir / "model.onnx.data")
    try:
        _Decoder(g, spec, options, w).build()
        w.save(out_dir / "model.onnx", producer="ortgen.gguf")
    except BaseException:
        w.close()
        raise


class _Decoder:
    def __init__(self, g: GGUFFile, spec: ModelSpec, options: BuildOptions, w: GraphWriter):
        self.g, self.spec, self.options, self.w = g, spec, options, w
        self.length = options.context(spec)

    # -- weights ------------------------------------------------------------------------

    def weight(self, name: str) -> Weight:
        t = self.g.tensor(name)
        if len(t.shape) != 2:
            raise GGUFError(f"{self.g.path}: {name} has shape {t.shape}, expected a matrix")
        if self.options.precision == "fp32":
            values = np.asarray(
                dequantize(t.data, GGMLQuantizationType(t.qtype)), np.float32
            ).reshape(t.shape)
            return FloatWeight(t.qtype, values, False)  # type: ignore[arg-type]
        try:
            return to_layout(t.qtype, t.data, t.shape, verify=self.options.verify, name=name)
        except ValueError as exc:
            raise GGUFError(f"{self.g.path}: {exc}") from exc

    def vector(self, name: str) -> np.ndarray:
        t = self.g.tensor(name)
        return np.asarray(dequantize(t.data, GGMLQuantizationType(t.qtype)), np.float32).reshape(-1)

    def maybe_vector(self, name: str) -> np.ndarray | None:
        return self.vector(name) if name in self.g.tensors else None

    def unpermute(
        self, weight: Weight, bias: np.ndarray | None, heads: int
    ) -> tuple[Weight, np.ndarray | None]:
        """Undo llama.cpp's q/k row permutation (``LlamaModel.permute``): Hugging Face's
        row order, so GroupQueryAttention rotates halves as transformers does."""
        if not self.spec.permuted_qk:
            return weight, bias
        rows = heads * self.spec.head_dim
        index = (
            np.arange(rows).reshape(heads, self.spec.head_dim // 2, 2).swapaxes(1, 2).reshape(-1)
        )
        return take_rows(weight, index), None if bias is None else bias[index]

    # -- graph --------------------------------------------------------------------------

    def build(self) -> None:
        w, spec = self.w, self.spec
        ids = w.input("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        mask = w.input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
        kv_shape: list[int | str] = [
            "batch_size",
            spec.kv_heads,
            "past_sequence_length",
            spec.head_dim,
        ]
        for i in range(spec.layers):
            for kind in ("key", "value"):
                w.input(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, kv_shape)
        keep = w.input("logits_to_keep", TensorProto.INT64, [1])
        w.output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", spec.vocab])
        present: list[int | str] = [
            "batch_size",
            spec.kv_heads,
            "total_sequence_length",
            spec.head_dim,
        ]
        for i in range(spec.layers):
            for kind in ("key", "value"):
                w.output(f"present.{i}.{kind}", TensorProto.FLOAT, present)

        seqlens, total = self.mask_lengths(mask)
        caches = self.rope_inputs(spec.rope, "", total)
        local = self.rope_inputs(spec.rope_local, "_local", total) if spec.rope_local else caches
        x = embedding(w, ids, self.weight("token_embd.weight"), "/model/embed_tokens")
        if spec.embedding_scale != 1.0:
            scale = w.const(spec.embedding_scale, np.float32)
            x = w.node("Mul", [x, scale], "/model/embed_tokens/Scale")[0]
        residual, block_out = x, None
        for i in range(spec.layers):
            rope = local if spec.sliding_layers[i] and spec.rope_local else caches
            residual, block_out = self.layer(i, residual, block_out, seqlens, total, rope)
        normed = self.norm("output_norm.weight", residual, block_out, "/model/norm", last=True)[0]
        if self.options.embeddings:  # every position's state, before logits_to_keep's slice
            shape: list[int | str] = ["batch_size", "sequence_length", spec.hidden]
            w.output(HIDDEN_OUTPUT, TensorProto.FLOAT, shape)
            w.node("Identity", [normed], "/model/hidden_states", outputs=[HIDDEN_OUTPUT])
        starts = w.node("Neg", [keep], "/model/last_positions/Neg")[0]
        ends, axes = w.const([np.iinfo(np.int64).max]), w.const([1])
        normed = w.node("Slice", [normed, starts, ends, axes], "/model/last_positions/Slice")[0]
        head = self.weight("output.weight" if not spec.tied_head else "token_embd.weight")
        logits = linear(
            w, normed, [Part("lm_head", head)], "/lm_head",
            accuracy_level=self.options.accuracy_level, part_bytes=HEAD_PART_BYTES,
        )[0]  # fmt: skip
        if spec.final_softcap:
            cap = w.const(spec.final_softcap, np.float32)
            logits = w.node("Div", [logits, cap], "/lm_head/softcap/Div")[0]
            logits = w.node("Tanh", [logits], "/lm_head/softcap/Tanh")[0]
            logits = w.node("Mul", [logits, cap], "/lm_head/softcap/Mul")[0]
        w.rename(logits, "logits")

    def mask_lengths(self, mask: str) -> tuple[str, str]:
        """seqlens_k (rows' lengths - 1, int32) and the total length (int32), from the mask,
        as onnxruntime-genai's graph derives them."""
        w = self.w
        one = w.const([1])
        summed = w.node("ReduceSum", [mask, one], "/model/mask/ReduceSum", keepdims=0)[0]
        lengths = w.node("Sub", [summed, one], "/model/mask/Sub")[0]
        seqlens = w.node("Cast", [lengths], "/model/mask/SeqlensK", to=TensorProto.INT32)[0]
        shape = w.node("Shape", [mask], "/model/mask/Shape")[0]
        total = w.node("Gather", [shape, w.const(1)], "/model/mask/Gather", axis=0)[0]
        total = w.node("Cast", [total], "/model/mask/Total", to=TensorProto.INT32)[0]
        return seqlens, total

    def rope_inputs(self, rope: RopeSpec | None, suffix: str, total: str) -> tuple[str, str]:
        """cos and sin tables; LongRoPE's long ones replace the short ones (an If) once the
        sequence is longer than the original context, as transformers switches them."""
        assert rope is not None
        w = self.w
        cos, sin = rope_caches(rope, self.length)
        names = (w.weight(f"cos_cache{suffix}", cos), w.weight(f"sin_cache{suffix}", sin))
        if rope.scaling != "longrope" or self.length <= rope.original_context:
            return names
        cos_l, sin_l = rope_caches(rope, self.length, long=True)
        long = (
            w.weight(f"cos_cache_long{suffix}", cos_l),
            w.weight(f"sin_cache_long{suffix}", sin_l),
        )
        limit = w.const(rope.original_context, np.int32)
        cond = w.node("Greater", [total, limit], f"/model/rope{suffix}/IsLong")[0]

        def branch(pair: tuple[str, str], label: str) -> object:
            outs = [f"{n}/{label}" for n in pair]
            nodes = [
                helper.make_node("Identity", [src], [dst])
                for src, dst in zip(pair, outs, strict=True)
            ]
            values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs]
            return helper.make_graph(nodes, f"rope{suffix}_{label}", [], values)

        got = w.node(
            "If", [cond], f"/model/rope{suffix}/If", outputs=2,
            then_branch=branch(long, "long"), else_branch=branch(names, "short"),
        )  # fmt: skip
        return got[0], got[1]

    def norm(
        self, weight: str, residual: str, block_out: str | None, name: str, *, last: bool = False
    ) -> tuple[str, str]:
        """RMS norm of residual (+ block_out, which joins the residual stream): (normed,
        new residual)."""
        w, eps = self.w, self.spec.rms_eps
        gamma = w.weight(f"{weight}", self.vector(weight))
        if block_out is None:
            normed = w.node(
                "SimplifiedLayerNormalization", [residual, gamma], f"{name}/LayerNorm",
                axis=-1, epsilon=eps, stash_type=1,
            )[0]  # fmt: skip
            return normed, residual
        outs = 1 if last else [w.fresh(f"{name}/output_0"), "", "", w.fresh(f"{name}/output_3")]
        got = w.node(
            "SkipSimplifiedLayerNormalization", [residual, block_out, gamma],
            f"{name}/SkipLayerNorm", outputs=outs, domain="com.microsoft", epsilon=eps,
        )  # fmt: skip
        return got[0], (got[-1] if not last else residual)

    def plain_norm(self, weight: str, x: str, name: str, heads: int | None = None) -> str:
        """An RMS norm of ``x`` alone (Gemma's post-norms; per head for q/k norms)."""
        w = self.w
        gamma = w.weight(weight, self.vector(weight))
        if heads is not None:
            x = w.node("Reshape", [x, w.const([0, -1, self.spec.head_dim])], f"{name}/Heads")[0]
        y = w.node(
            "SimplifiedLayerNormalization", [x, gamma], f"{name}/LayerNorm",
            axis=-1, epsilon=self.spec.rms_eps, stash_type=1,
        )[0]  # fmt: skip
        if heads is not None:
            width = heads * self.spec.head_dim
            y = w.node("Reshape", [y, w.const([0, -1, width])], f"{name}/Rows")[0]
        return y

    def layer(
        self, i: int, residual: str, block_out: str | None, seqlens: str, total: str,
        rope: tuple[str, str],
    ) -> tuple[str, str]:  # fmt: skip
        spec, w, acc = self.spec, self.w, self.options.accuracy_level
        p, blk = f"/model/layers.{i}", f"blk.{i}"
        h, residual = self.norm(
            f"{blk}.attn_norm.weight", residual, block_out, f"{p}/input_layernorm"
        )
        q, k, v = self.qkv(i, h)
        attn = w.node(
            "GroupQueryAttention",
            [q, k, v, f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total,
             rope[0], rope[1]],
            f"{p}/attn/GroupQueryAttention", domain="com.microsoft",
            outputs=[w.fresh(f"{p}/attn/output_0"), f"present.{i}.key", f"present.{i}.value"],
            num_heads=spec.heads, kv_num_heads=spec.kv_heads, scale=spec.attention_scale,
            local_window_size=spec.window(i), softcap=spec.attn_softcap, do_rotary=1,
            rotary_interleaved=0,
        )[0]  # fmt: skip
        o = linear(
            w,
            attn,
            [Part("o", self.weight(f"{blk}.attn_output.weight"))],
            f"{p}/attn/o_proj",
            accuracy_level=acc,
        )[0]
        if spec.post_norms:
            o = self.plain_norm(f"{blk}.post_attention_norm.weight", o, f"{p}/post_attention_norm")
        h, residual = self.norm(
            f"{blk}.ffn_norm.weight", residual, o, f"{p}/pre_feedforward_layernorm"
        )
        if spec.fused_gate_up:
            gate_up = linear(
                w,
                h,
                [Part("gate_up", self.weight(f"{blk}.ffn_up.weight"))],
                f"{p}/mlp/gate_up_proj",
                accuracy_level=acc,
            )[0]
            gate, up = w.node(
                "Split",
                [gate_up, w.const([spec.intermediate] * 2)],
                f"{p}/mlp/Split",
                outputs=2,
                axis=-1,
            )
        else:
            parts = [
                Part("gate", self.weight(f"{blk}.ffn_gate.weight")),
                Part("up", self.weight(f"{blk}.ffn_up.weight")),
            ]
            gate, up = linear(w, h, parts, f"{p}/mlp/gate_up_proj", accuracy_level=acc)
        if spec.activation == "silu":
            sig = w.node("Sigmoid", [gate], f"{p}/mlp/act/Sigmoid")[0]
            act = w.node("Mul", [gate, sig], f"{p}/mlp/act/Mul")[0]
        else:
            act = w.node("Gelu", [gate], f"{p}/mlp/act/Gelu", approximate="tanh")[0]
        hidden = w.node("Mul", [act, up], f"{p}/mlp/Mul")[0]
        down = linear(
            w,
            hidden,
            [Part("down", self.weight(f"{blk}.ffn_down.weight"))],
            f"{p}/mlp/down_proj",
            accuracy_level=acc,
        )[0]
        if spec.post_norms:
            down = self.plain_norm(
                f"{blk}.post_ffw_norm.weight", down, f"{p}/post_feedforward_norm"
            )
        return residual, down

    def qkv(self, i: int, h: str) -> tuple[str, str, str]:
        """q, k, v for GroupQueryAttention: one packed tensor (k and v "") when one node
        makes all three and no q/k norm comes between; else three."""
        spec, w, blk = self.spec, self.w, f"blk.{i}"
        name, acc = f"/model/layers.{i}/attn/qkv_proj", self.options.accuracy_level
        if spec.fused_qkv:
            parts = [
                Part(
                    "qkv",
                    self.weight(f"{blk}.attn_qkv.weight"),
                    self.maybe_vector(f"{blk}.attn_qkv.bias"),
                )
            ]
        else:
            parts = []
            for part, heads in (("q", spec.heads), ("k", spec.kv_heads), ("v", spec.kv_heads)):
                weight = self.weight(f"{blk}.attn_{part}.weight")
                bias = self.maybe_vector(f"{blk}.attn_{part}.bias")
                if part != "v":
                    weight, bias = self.unpermute(weight, bias, heads)
                parts.append(Part(part, weight, bias))
            if len({kernel_key(part.weight) for part in parts}) == 1:
                parts = [merge_parts(parts, "qkv")]
        outs = linear(w, h, parts, name, accuracy_level=acc)
        if len(outs) == 1 and not spec.qk_norm:
            return outs[0], "", ""
        if len(outs) == 1:
            q_rows, kv_rows = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
            outs = w.node(
                "Split",
                [outs[0], w.const([q_rows, kv_rows, kv_rows])],
                f"{name}/Split",
                outputs=3,
                axis=-1,
            )
        q, k, v = outs
        if spec.qk_norm:
            q = self.plain_norm(
                f"{blk}.attn_q_norm.weight", q, f"/model/layers.{i}/attn/q_norm", spec.heads
            )
            k = self.plain_norm(
                f"{blk}.attn_k_norm.weight", k, f"/model/layers.{i}/attn/k_norm", spec.kv_heads
            )
        return q, k, v
