"""The fused graph family: onnxruntime-genai's model builder, then ortgen's graph edits.

The builder writes one graph with GroupQueryAttention (rotary inside, lengths from the
attention mask, past and present sharable as one buffer), fused RMSNorms, MatMulNBits
weights and, at int4, an embedding that shares the LM head's 4-bit weights
(GatherBlockQuantized). ortgen then lays out the embedding lookup and LM head for a
smaller load (``head_layout``) and prunes the LM head to the last position (prefill
computes 1 row of logits instead of T).

Version trap (measured, see pyproject.toml): the 0.18 builder imports transformers 5.x
classes, while optimum-onnx needs transformers < 4.58; the 0.11.4 builder works with the
same stack and its int4 graph runs as fast. ortgen pins it in the ``export`` extra.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from unittest import mock

from ..errors import ExportError
from ..model.session import KEEP_INPUT
from ..util.jsonfile import read_json_object
from .graph_editor import LAST_POSITIONS, lm_head
from .quiet import quiet
from .variant import Variant

__all__ = ["build_fused", "prune_lm_head"]

_BUILDER_PRECISION = {"fp32": "fp32", "int8": "fp32", "int4": "int4"}


def build_fused(hf_dir: Path, dest: Path, variant: Variant, *, source: Path) -> None:
    """Build ``variant``'s fused graph from the transformers folder ``hf_dir`` into ``dest``.

    Writes model.onnx, model.onnx.data and genai_config.json (which tells loaders that
    past and present share a buffer). Raises ExportError naming ``source`` on failure.
    """
    _run_builder(hf_dir, dest, variant, source)
    if variant.precision == "int8":
        from .quantize import quantize_matmuls

        quantize_matmuls(dest / "model.onnx", variant, source=source)
    from .head_layout import lay_out_head

    lay_out_head(dest)
    prune_lm_head(dest / "model.onnx")


def _run_builder(hf_dir: Path, dest: Path, variant: Variant, source: Path) -> None:
    """Run the builder in-process, quietly, without its tokenizer step (ortgen saves the
    tokenizer itself, and the builder fails on folders that have none)."""
    options = {"int4_accuracy_level": str(variant.accuracy_level)}
    if _BUILDER_PRECISION[variant.precision] == "int4":
        block = variant.block_size
        options |= {
            "int4_block_size": str(block),
            # asymmetric (uint4 + zero points): the 0.11.4 builder's symmetric int4 with
            # shared embeddings references a zero-point tensor it never writes
            "int4_is_symmetric": "false",
        }
        if _tied_embeddings(hf_dir) and _hidden_size(hf_dir) % block == 0:
            # the embedding shares the LM head's 4-bit weights (GatherBlockQuantized); the
            # builder's RTN path behind it fails when the hidden size is not a whole number
            # of blocks, and then the embedding stays fp32. Only for a model whose head *is*
            # its embedding: the builder shares whatever it is told to, so an untied model
            # would look its tokens up in the LM head's weights.
            options |= {"int4_algo_config": "rtn", "shared_embeddings": "true"}
    cache = dest.parent / f"{dest.name}-builder-cache"
    try:
        with quiet(), contextlib.redirect_stdout(io.StringIO()):
            import onnxruntime_genai.models.builder as builder

            builder.check_extra_options(options, "cpu")  # its own parsing: "false" -> False
            base = sys.modules["builders.base"]  # imported by the builder as "builders"
            with mock.patch.object(base.Model, "save_processing", _no_processing):
                builder.create_model(
                    None,
                    str(hf_dir),
                    str(dest),
                    _BUILDER_PRECISION[variant.precision],
                    "cpu",
                    str(cache),
                    **options,
                )
    except ImportError as exc:
        raise ExportError(
            f"the fused graph needs onnxruntime-genai's model builder: pip install "
            f"'ortgen[export]' ({exc})"
        ) from exc
    except Exception as exc:
        raise ExportError(
            f"onnxruntime-genai's model builder cannot build {source}: "
            f"{type(exc).__name__}: {exc}. Try --graph optimum."
        ) from exc
    finally:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
    if not (dest / "model.onnx").is_file():
        raise ExportError(f"onnxruntime-genai's model builder wrote no model.onnx for {source}")


def _hidden_size(hf_dir: Path) -> int:
    """The transformers folder's hidden size (0 if config.json names none)."""
    config = read_json_object(hf_dir / "config.json", error=ExportError)
    return int(config.get("hidden_size") or config.get("n_embd") or 0)


def _tied_embeddings(hf_dir: Path) -> bool:
    """Whether the transformers model ties its LM head to its embedding (each model class
    has its own default, so transformers' config class decides, not config.json alone)."""
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(hf_dir), "tie_word_embeddings", False))


def _no_processing(*_args, **_kwargs) -> None:
    """Stands in for the builder's tokenizer/processor copy."""


def prune_lm_head(graph: Path) -> None:
    """Feed the LM head only the last ``logits_to_keep`` positions: (B, keep, V) logits.

    Prefill then computes one row of logits instead of one per prompt token (the LM head
    of a small model is a large share of its weights), and a decode step one; verifying
    K drafted tokens asks for K + 1 (speculative decoding), in the same forward. The
    input is a (1,) int64 tensor; the weights file is untouched.
    """
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph), load_external_data=False)
    hidden, matmul_heads = lm_head(model.graph, graph)
    producers = {out: node for node in model.graph.node for out in node.output}
    if producers.get(hidden) is not None and producers[hidden].op_type == "Slice":
        return  # already pruned
    last = f"{hidden}{LAST_POSITIONS}"
    model.graph.input.append(helper.make_tensor_value_info(KEEP_INPUT, TensorProto.INT64, [1]))
    names = []
    for key, value in (("ends", 2**62), ("axes", 1)):
        name = f"{last}/{key}"
        model.graph.initializer.append(helper.make_tensor(name, TensorProto.INT64, [1], [value]))
        names.append(name)
    starts = f"{last}/starts"
    nodes = [
        helper.make_node("Neg", [KEEP_INPUT], [starts], name=f"{last}/Neg"),
        helper.make_node("Slice", [hidden, starts, *names], [last], name=f"{last}/Slice"),
    ]
    for part in matmul_heads:
        part.input[0] = last
    index = min(list(model.graph.node).index(part) for part in matmul_heads)
    for offset, node in enumerate(nodes):
        model.graph.node.insert(index + offset, node)
    onnx.save(model, str(graph))
