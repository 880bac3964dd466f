"""Weight-only quantisation of a graph's MatMuls to MatMulNBits (int8 or int4), LM head included.

Used for the optimum family at int8/int4 and the fused family at int8 (the builder
itself quantises the fused int4 graph). optimum ties the LM head to the embedding as a
``Transpose`` of the embedding table, which onnxruntime's quantizer skips (its weight is
not an initializer); the head is given a real initializer first so it is quantised too:
on a small model it is a large share of the weights read per token.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ExportError
from .quiet import quiet
from .variant import Variant

__all__ = ["quantize_matmuls"]


def quantize_matmuls(graph: Path, variant: Variant, *, source: Path) -> None:
    """Quantise every MatMul with a constant weight in ``graph`` in place (one data file)."""
    bits = {"int8": 8, "int4": 4}.get(variant.precision)
    if bits is None:
        raise ExportError(f"quantize_matmuls needs precision int8 or int4, not {variant.precision}")
    try:
        with quiet():
            import onnx
            from onnxruntime.quantization.matmul_nbits_quantizer import (
                DefaultWeightOnlyQuantConfig,
                MatMulNBitsQuantizer,
            )

            model = onnx.load(str(graph))
            _untie_lm_head(model)
            config = DefaultWeightOnlyQuantConfig(
                block_size=variant.block_size,
                is_symmetric=False,
                accuracy_level=variant.accuracy_level,
                bits=bits,
            )
            quantizer = MatMulNBitsQuantizer(model, algo_config=config)
            quantizer.process()
            quantized = quantizer.model.model
    except Exception as exc:
        raise ExportError(
            f"quantising {source} to {variant.precision} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for stale in graph.parent.glob(f"{graph.name}*data"):
        stale.unlink()
    onnx.save(
        quantized,
        str(graph),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{graph.name}.data",
        size_threshold=1024,
    )


def _untie_lm_head(model) -> None:
    """Replace ``MatMul(x, Transpose(E))`` feeding ``logits`` by ``MatMul(x, E^T)`` with
    E^T a real initializer, so the quantizer sees (and quantises) the LM head."""
    from onnx import numpy_helper

    producers = {out: node for node in model.graph.node for out in node.output}
    head = producers.get("logits")
    if head is None or head.op_type != "MatMul":
        return
    transpose = producers.get(head.input[1])
    if transpose is None or transpose.op_type != "Transpose":
        return
    initializers = {init.name: init for init in model.graph.initializer}
    table = initializers.get(transpose.input[0])
    if table is None:
        return
    weight = numpy_helper.to_array(table).T.copy()
    name = f"{head.name or 'lm_head'}/untied_weight"
    model.graph.initializer.append(numpy_helper.from_array(weight, name))
    head.input[1] = name
