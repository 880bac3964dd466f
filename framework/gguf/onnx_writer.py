"""Write an ONNX graph with its weights streamed to one external-data file.

``onnx.save_model(..., save_as_external_data=True)`` first holds every weight twice in
memory (the numpy array and the TensorProto's bytes) and then copies them out; a builder
that writes each initializer's bytes to ``model.onnx.data`` the moment it is made, and puts
only a reference (location, offset, length) in the graph, keeps the peak near the largest
single tensor and writes each byte once. Large tensors start at 64 KiB boundaries, as
onnx's own writer aligns them, so onnxruntime can map them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = ["GraphWriter"]

_ALIGN = 65536
_ALIGN_FROM = 1 << 20  # bytes: smaller tensors are packed without padding
_INLINE_BELOW = 1024  # bytes: tiny constants stay in the graph file
_OPSETS = (("", 21), ("com.microsoft", 1))


class GraphWriter:
    """Nodes, inputs, outputs and initializers of one graph; weights go to ``data_path``
    as they are added."""

    def __init__(self, data_path: Path) -> None:
        self.data_path = Path(data_path)
        self._data: BinaryIO = open(self.data_path, "wb")  # noqa: SIM115 (closed in save)
        self._offset = 0
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._constants: dict[tuple[Any, ...], str] = {}

    # -- values -----------------------------------------------------------------------------

    def weight(self, name: str, array: np.ndarray) -> str:
        """An initializer holding ``array`` (written to the data file now); its name."""
        array = np.ascontiguousarray(array)
        self._claim(name)
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        if array.nbytes < _INLINE_BELOW:
            tensor.raw_data = array.tobytes()
        else:
            if array.nbytes >= _ALIGN_FROM and self._offset % _ALIGN:
                pad = _ALIGN - self._offset % _ALIGN
                self._data.write(b"\0" * pad)
                self._offset += pad
            self._data.write(array.reshape(-1).view(np.uint8).data)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", self.data_path.name),
                ("offset", str(self._offset)),
                ("length", str(array.nbytes)),
            ):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            self._offset += array.nbytes
        self.initializers.append(tensor)
        return name

    def const(self, values: Any, dtype: Any = np.int64) -> str:
        """A small constant initializer, shared by every node that asks for the same one."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            label = "_".join(str(v) for v in array.reshape(-1)[:4].tolist())
            self._constants[key] = self.weight(
                self.fresh(f"const/{array.dtype.name}/{label}"), array
            )
        return self._constants[key]

    def fresh(self, name: str) -> str:
        """``name``, or ``name.N`` if it is taken."""
        candidate, n = name, 1
        while candidate in self._names:
            candidate, n = f"{name}.{n}", n + 1
        return candidate

    def _claim(self, name: str) -> None:
        if name in self._names:
            raise ValueError(f"graph value {name!r} defined twice")
        self._names.add(name)

    # -- nodes and signature ----------------------------------------------------------------

    def node(
        self,
        op: str,
        inputs: list[str],
        name: str,
        *,
        outputs: int | list[str] = 1,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        """Add a node; its output names (``name/output_i`` unless given)."""
        if isinstance(outputs, int):
            outs = [self.fresh(f"{name}/output_{i}") for i in range(outputs)]
        else:
            outs = outputs
        for out in outs:
            if out:
                self._claim(out)
        self.nodes.append(
            helper.make_node(op, inputs, outs, name=self.fresh(name), domain=domain, **attrs)
        )
        return outs

    def rename(self, old: str, new: str) -> None:
        """Give the value ``old`` (a node's output nobody reads yet) the name ``new``: the
        graph's outputs are named by the model's contract, not by their producers."""
        for node in self.nodes:
            for i, name in enumerate(node.output):
                if name == old:
                    node.output[i] = new
                    self._claim(new)
                    return
        raise ValueError(f"no node produces {old!r}")

    def input(self, name: str, dtype: int, shape: list[int | str]) -> str:
        self._claim(name)
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    def output(self, name: str, dtype: int, shape: list[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, dtype, shape))

    def save(self, path: Path, *, producer: str) -> None:
        """Write the graph to ``path`` (the weights are already in the data file)."""
        self._data.close()
        graph = helper.make_graph(
            self.nodes, "ortgen_decoder", self.inputs, self.outputs, self.initializers
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid(domain, version) for domain, version in _OPSETS],
            producer_name=producer,
        )
        model.ir_version = 10
        with open(path, "wb") as f:
            f.write(model.SerializeToString())

    def close(self) -> None:
        """Close the data file (after a failed build)."""
        self._data.close()
