"""ExportedModel: an ONNX decoder graph with an LM head and past-KV I/O, ready to run.

Everything the loop needs to know about the graph (names, layer count, KV heads,
head size, dtype, whether it takes ``position_ids``) is read from the ONNX file
itself, so GPT-2-, Llama- and Qwen-style exports run through the same code and
are always fed by name.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from .errors import ModelLoadError

MODEL_FILE = "model.onnx"
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True)
class GraphSignature:
    """What the graph takes and gives, read from the ONNX file."""

    input_names: tuple[str, ...]
    past_inputs: tuple[str, ...]  # layer order, key before value
    present_outputs: tuple[str, ...]  # aligned with past_inputs
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: type
    vocab_size: int
    has_position_ids: bool
    has_attention_mask: bool


def read_signature(session: ort.InferenceSession, path: Path) -> GraphSignature:
    """Check the graph can generate and describe it; refuse backbones and cacheless graphs."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    if "logits" not in outputs:
        raise ModelLoadError(
            f"{path}: no 'logits' output, so no language-modeling head: this graph is a backbone "
            f"and cannot generate (outputs: {', '.join(outputs)}). Export it with the task "
            "'text-generation-with-past'."
        )
    if "input_ids" not in inputs:
        raise ModelLoadError(f"{path}: the graph has no 'input_ids' input")
    past = sorted((n for n in inputs if _PAST.match(n)), key=_layer_key(_PAST))
    present = sorted((n for n in outputs if _PRESENT.match(n)), key=_layer_key(_PRESENT))
    if not past or not present:
        raise ModelLoadError(
            f"{path}: the graph has no past-key-value inputs/outputs (past_key_values.N.key/value "
            "and present.N.key/value), so every step would recompute the whole sequence. Export "
            "it with the task 'text-generation-with-past'."
        )
    expected_present = [_PAST.sub(r"present.\1.\2", n) for n in past]
    if expected_present != present:
        raise ModelLoadError(f"{path}: past inputs {past} do not match present outputs {present}")
    first = inputs[past[0]]
    heads, head_dim = first.shape[1], first.shape[3]
    vocab = outputs["logits"].shape[-1]
    if not all(isinstance(d, int) for d in (heads, head_dim, vocab)):
        raise ModelLoadError(
            f"{path}: KV heads, head size or vocabulary size are not fixed in the graph"
        )
    if first.type not in _ORT_DTYPES:
        raise ModelLoadError(f"{path}: past-key-value type {first.type} is not supported")
    return GraphSignature(
        input_names=tuple(inputs),
        past_inputs=tuple(past),
        present_outputs=tuple(present),
        num_layers=len(past) // 2,
        num_kv_heads=heads,
        head_dim=head_dim,
        kv_dtype=_ORT_DTYPES[first.type],
        vocab_size=vocab,
        has_position_ids="position_ids" in inputs,
        has_attention_mask="attention_mask" in inputs,
    )


def _layer_key(pattern: re.Pattern[str]):
    def key(name: str) -> tuple[int, int]:
        match = pattern.match(name)
        assert match
        return int(match.group(1)), 0 if match.group(2) == "key" else 1

    return key


def available_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def session_options(threads: int | None = None, spinning: bool = False) -> ort.SessionOptions:
    """CPU session options: ``threads`` intra-op threads (default: all cores), spinning off.

    Spinning threads busy-wait between ops; on a busy 2-core machine that halves
    decode speed, so it is opt-in.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or available_cores()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    flag = "1" if spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", flag)
    options.add_session_config_entry("session.inter_op.allow_spinning", flag)
    options.log_severity_level = 3
    return options


class ExportedModel:
    """One exported decoder: an onnxruntime session plus what the loop needs to drive it."""

    def __init__(self, folder: str | Path, *, threads: int | None = None, spinning: bool = False):
        self.path = Path(folder)
        graph = self.path / MODEL_FILE
        if not self.path.is_dir():
            raise ModelLoadError(f"model folder {self.path} does not exist")
        if not graph.is_file():
            raise ModelLoadError(
                f"model folder {self.path} is incomplete: it has no {MODEL_FILE} "
                "(export one with `ortgen export SOURCE OUT`)"
            )
        try:
            self.session = ort.InferenceSession(
                str(graph), session_options(threads, spinning), providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelLoadError(f"{graph}: onnxruntime cannot load it: {exc}") from exc
        self.signature = read_signature(self.session, graph)
        self.config = _read_config(self.path)
        self.max_context = _max_context(self.config)
        self._output_names = ["logits", *self.signature.present_outputs]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: dict[str, Any],
    ) -> tuple[np.ndarray, list[ort.OrtValue]]:
        """Run one forward; returns logits (B, T, V) and the present KV OrtValues.

        Inputs and presents stay OrtValues so a cache can feed the presents back
        as the next past without a numpy round trip.
        """
        feeds: dict[str, Any] = {"input_ids": _ortvalue(input_ids)}
        if self.signature.has_attention_mask:
            feeds["attention_mask"] = _ortvalue(attention_mask)
        if self.signature.has_position_ids:
            feeds["position_ids"] = _ortvalue(position_ids)
        for name, value in past.items():
            feeds[name] = value if isinstance(value, ort.OrtValue) else _ortvalue(value)
        outputs = self.session.run_with_ort_values(self._output_names, feeds)
        return outputs[0].numpy(), list(outputs[1:])


def _ortvalue(array: np.ndarray) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"model folder {folder} is incomplete: it has no config.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def _max_context(config: dict[str, Any]) -> int | None:
    """The longest sequence the model was trained for, if config.json says."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return None
