"""ExportedModel: an ONNX decoder graph with an LM head and past-KV I/O, ready to run.

Everything the loop needs to know about the graph (names, layer count, KV heads,
head size, dtype, whether it takes ``position_ids``) is read from the ONNX file
itself, so GPT-2-, Llama- and Qwen-style exports run through the same code and
are always fed by name.

Two graph families share this one class, told apart by their KV layout:

- ``concat`` (optimum exports): the graph takes ``position_ids`` and concatenates
  past and new keys/values into a longer present; rows are left-padded and the
  cache's sequence axis follows the padded token buffer.
- ``shared`` (fused exports from onnxruntime-genai's model builder, GroupQueryAttention):
  no ``position_ids``; the graph derives each row's length from the attention mask's
  row sums, writes the new keys/values into the past buffer itself, so past and
  present may be one preallocated buffer. Each row's keys/values start at position 0
  (rows are packed), so a padded batch is prefilled row by row.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..errors import InputError, ModelLoadError
from ..util.exclusive import Exclusive
from ..util.jsonfile import read_json_object
from .memory import shrink_options, trim_heap

MODEL_FILE = "model.onnx"
GENAI_CONFIG = "genai_config.json"
#: the input of a pruned LM head (fused exports): how many of the last fed positions get
#: logits, as Hugging Face's ``logits_to_keep``; 1 for prefill and decode, K + 1 to verify
#: K drafted tokens in one forward
KEEP_INPUT = "logits_to_keep"
_GENAI_MODEL_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "vocab_size")
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
    kv_layout: str = "concat"  # "concat" (optimum) or "shared" (fused, GroupQueryAttention)
    #: the graph takes ``logits_to_keep`` (fused exports): logits for only the last that
    #: many positions; without it a graph returns logits for every fed position
    keeps_logits: bool = False

    @property
    def shared_kv(self) -> bool:
        """Past and present may be one buffer; each row's keys/values start at 0."""
        return self.kv_layout == "shared"


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
    if not isinstance(head_dim, int) or not isinstance(heads, int):  # onnxruntime-genai 0.18
        decoder = _genai_decoder(path.parent)  # names them; its config has the numbers
        heads = heads if isinstance(heads, int) else decoder.get("num_key_value_heads")
        head_dim = head_dim if isinstance(head_dim, int) else decoder.get("head_size")
    if not all(isinstance(d, int) for d in (heads, head_dim, vocab)):
        raise ModelLoadError(
            f"{path}: KV heads, head size or vocabulary size are not fixed in the graph"
        )
    if first.type not in _ORT_DTYPES:
        raise ModelLoadError(f"{path}: past-key-value type {first.type} is not supported")
    shared = _shares_kv_buffer(path.parent)
    if shared and "position_ids" in inputs:
        raise ModelLoadError(
            f"{path}: {GENAI_CONFIG} says past and present share a buffer, but the graph takes "
            "position_ids; ortgen cannot tell how to feed it"
        )
    if shared and "attention_mask" not in inputs:
        raise ModelLoadError(f"{path}: a shared-buffer graph needs an attention_mask input")
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
        kv_layout="shared" if shared else "concat",
        keeps_logits=KEEP_INPUT in inputs,
    )


def _genai_decoder(folder: Path) -> dict[str, Any]:
    path = folder / GENAI_CONFIG
    if not path.is_file():
        return {}
    decoder = read_json_object(path, error=ModelLoadError).get("model", {}).get("decoder", {})
    return decoder if isinstance(decoder, dict) else {}


def _shares_kv_buffer(folder: Path) -> bool:
    """True for graphs whose attention (GroupQueryAttention) accepts one buffer as past and
    present: onnxruntime-genai's builder says so in ``genai_config.json``."""
    path = folder / GENAI_CONFIG
    if not path.is_file():
        return False
    search = read_json_object(path, error=ModelLoadError).get("search", {})
    return bool(isinstance(search, dict) and search.get("past_present_share_buffer"))


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


#: How long (microseconds) an idle intra-op worker spins for the next parallel op
#: before it sleeps, by default. A forward's ops follow one another within
#: microseconds, so a short spin catches them without a wake-up each, while a busy
#: machine loses no more than that per op. Measured on 2 cores, default model, 2
#: threads (docs/benchmarks.md): 97-104 tok/s against 77-81 with no spin on an idle
#: machine, 75-79 against 76 with the other core busy, where unbounded spinning
#: (onnxruntime's own default) fell to 45-52.
DEFAULT_SPIN_US = 10


def spin_duration(spin_us: int | None) -> int:
    """``spin_us`` checked, None as ``DEFAULT_SPIN_US``: what a session will spin."""
    if spin_us is None:
        return DEFAULT_SPIN_US
    if isinstance(spin_us, bool) or not isinstance(spin_us, int) or spin_us < 0:
        raise InputError(f"spin_us must be a non-negative integer (microseconds), got {spin_us!r}")
    return spin_us


def session_options(
    threads: int | None = None,
    spinning: bool = False,
    spin_us: int | None = None,
    memory_arena: bool = True,
) -> ort.SessionOptions:
    """CPU session options: ``threads`` intra-op threads (default: all cores), sequential.

    Idle workers spin ``spin_us`` microseconds (None: ``DEFAULT_SPIN_US``) before they
    sleep (0: sleep at once). ``spinning=True`` is onnxruntime's unbounded spinning
    instead, which halves decode speed on a busy 2-core machine, so it is opt-in. One
    thread has no workers, and neither setting changes anything there.
    ``memory_arena=False`` turns onnxruntime's CPU arena off (``ortgen.model.memory``).
    """
    spin_us = spin_duration(spin_us)
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise InputError(
            f"threads must be a positive integer (or unset: every core), got {threads!r}"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or available_cores()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = memory_arena
    flag = "1" if spinning or spin_us else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", flag)
    options.add_session_config_entry("session.inter_op.allow_spinning", flag)
    if not spinning and spin_us:
        options.add_session_config_entry("session.intra_op.spin_duration_us", str(spin_us))
    options.log_severity_level = 3
    return options


class ExportedModel:
    """One exported decoder: an onnxruntime session plus what the loop needs to drive it.

    The model holds only what every request shares and nobody writes: the session
    (onnxruntime accepts concurrent ``run`` calls on one session), the graph's
    signature and its config. What a forward binds — the IOBinding, the decode
    ``input_ids`` and logits buffers, the record of what is bound — belongs to a
    :class:`ForwardBinding`, one per request (``binding()``), so one loaded model
    serves any number of threads without one request's forward writing into memory
    another request bound.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        threads: int | None = None,
        spinning: bool = False,
        spin_us: int | None = None,
        memory_arena: bool = True,
    ):
        self.path = Path(folder)
        graph = self.path / MODEL_FILE
        if not self.path.is_dir():
            raise ModelLoadError(f"model folder {self.path} does not exist")
        if not graph.is_file():
            raise ModelLoadError(
                f"model folder {self.path} is incomplete: it has no {MODEL_FILE} "
                "(export one with `ortgen export SOURCE OUT`)"
            )
        self.threads = threads or available_cores()
        options = session_options(threads, spinning, spin_us, memory_arena)
        #: onnxruntime's CPU arena is on (the shrink after a prefill needs one)
        self.memory_arena = memory_arena
        try:
            self.session = ort.InferenceSession(
                str(graph), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelLoadError(f"{graph}: onnxruntime cannot load it: {exc}") from exc
        self.config = read_model_config(self.path)
        self.signature = read_signature(self.session, graph)
        self.max_context = max_context(self.config)
        #: after a prefill (its last chunk), shrink onnxruntime's CPU arena and hand the
        #: C heap's free pages back to the OS (``ortgen.model.memory``), so RSS does not
        #: stay at the longest prompt run; False keeps them (``ortgen serve
        #: --keep-memory``). Decode steps never do.
        self.release_memory = True

    def binding(self) -> ForwardBinding:
        """A new binding for one request's forwards (see :class:`ForwardBinding`)."""
        return ForwardBinding(self)

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray | None,
        past: dict[str, Any],
        presents: list[ort.OrtValue] | None = None,
        *,
        keep: int = 1,
    ) -> tuple[np.ndarray, list[Any]]:
        """One forward through a binding of its own (see ``ForwardBinding.forward``).

        For one-off forwards (scoring, tests); a request that runs many forwards keeps
        one ``binding()`` so that what stays bound is not bound again each step. The
        logits are the caller's: nothing else writes into them.
        """
        binding = ForwardBinding(self)
        return binding.forward(input_ids, attention_mask, position_ids, past, presents, keep=keep)


class ForwardBinding:
    """What one request binds to the model's session: IOBinding and decode buffers.

    Decode steps reuse what they bound before (the ``input_ids`` buffer, the logits
    buffer, a static cache's past/present buffers): after a forward has swept the
    caches, each binding call costs tens of microseconds of cold code. Those buffers
    are written by onnxruntime during the request's own ``run``, so they must belong
    to the request: a binding is not shared between requests, and a thread that
    calls ``forward`` while another thread's forward on the same binding runs gets an
    :class:`~ortgen.errors.InputError` (``Exclusive``), never memory onnxruntime writes
    under it.
    """

    def __init__(self, model: ExportedModel) -> None:
        self.model = model
        self._session = model.session
        self._signature = model.signature
        self._binding = model.session.io_binding()
        self._bound: tuple[Any, Any] = (None, None)  # the past feeds and presents bound last
        # batch -> the (B, 1, V) decode logits buffer and its numpy view (made once)
        self._decode_logits: dict[int, tuple[ort.OrtValue, np.ndarray]] = {}
        self._bound_logits: ort.OrtValue | None = None  # the logits buffer bound last
        self._bound_ids: np.ndarray | None = None  # the decode input_ids buffer, while bound
        self._running = Exclusive(f"a forward binding of {model.path}")
        self._bound_keep = 0  # the logits_to_keep bound last (0: none yet)
        self._keep_value: np.ndarray | None = None
        #: whether a forward wider than one position gives memory back after it (the
        #: arena's free regions, the heap's free pages; ``model.release_memory`` too):
        #: the loop sets it for a prefill's last chunk, so a long prompt's chunks reuse
        #: what the one before took and release it once
        self.release_after = True

    def __deepcopy__(self, memo: dict[int, Any]) -> ForwardBinding:
        """A copy of a request (``Generation.fork``) binds its own buffers."""
        return ForwardBinding(self.model)

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray | None,
        past: dict[str, Any],
        presents: list[ort.OrtValue] | None = None,
        *,
        keep: int = 1,
    ) -> tuple[np.ndarray, list[Any]]:
        """Run one forward over ``input_ids`` (B, T); returns logits and the presents.

        The logits are (B, T, V), or (B, keep, V) when the graph computes only the last
        ``keep`` positions (fused exports prune the LM head: ``logits_to_keep``). For
        decode (T = 1) they are a view of this binding's buffer, which its next decode
        forward overwrites: copy what must outlive it. ``past`` maps past input names to
        arrays or OrtValues; ``presents`` are output buffers to write into (a static
        cache's), or None to let onnxruntime allocate them. Unchanged past/present
        buffers are not bound again.
        """
        with self._running.hold("forward"):
            if self._signature.keeps_logits:
                self._bind_keep(keep)
            return self._forward(input_ids, attention_mask, position_ids, past, presents)

    def _forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray | None,
        past: dict[str, Any],
        presents: list[ort.OrtValue] | None,
    ) -> tuple[np.ndarray, list[Any]]:
        binding = self._binding
        signature = self._signature
        batch, width = input_ids.shape
        if width == 1:  # decode: the next ids go into a buffer that stays bound
            ids = self._decode_ids(batch)
            ids[:] = input_ids
        else:
            self._bound_ids = None
            binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids))
        if signature.has_attention_mask:
            binding.bind_cpu_input("attention_mask", np.ascontiguousarray(attention_mask))
        if signature.has_position_ids:
            binding.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids))
        logits_buffer, logits_view = self._decode_buffer(batch) if width == 1 else (None, None)
        if logits_buffer is None:
            binding.bind_output("logits", "cpu")
        elif logits_buffer is not self._bound_logits:  # every decode step writes the same one
            binding.bind_ortvalue_output("logits", logits_buffer)
        self._bound_logits = logits_buffer
        # a cache that hands out the very same feeds and buffers again (a static cache on
        # a shared-buffer graph, every decode step) needs no rebinding
        if presents is None or past is not self._bound[0] or presents is not self._bound[1]:
            for name, value in past.items():
                binding.bind_ortvalue_input(name, _as_ortvalue(value))
            for index, name in enumerate(signature.present_outputs):
                if presents is None:
                    binding.bind_output(name, "cpu")
                else:
                    binding.bind_ortvalue_output(name, presents[index])
            self._bound = (past, presents) if presents is not None else (None, None)
        release = width > 1 and self.release_after and self.model.release_memory
        shrink = shrink_options() if release and self.model.memory_arena else None
        self._session.run_with_iobinding(binding, shrink)
        if release:
            trim_heap()
        if logits_view is not None and presents is not None:  # nothing new to collect
            return logits_view, presents
        outputs = binding.get_outputs()  # in binding order: logits first
        logits = logits_view if logits_view is not None else outputs[0].numpy()
        return logits, (presents if presents is not None else list(outputs[1:]))

    def _bind_keep(self, keep: int) -> None:
        """``logits_to_keep``, bound again only when it changes (decode: never)."""
        if keep != self._bound_keep:
            value = np.asarray([keep], dtype=np.int64)
            self._binding.bind_ortvalue_input(KEEP_INPUT, ort.OrtValue.ortvalue_from_numpy(value))
            self._keep_value = value  # the OrtValue views it: keep it alive while bound
            self._bound_keep = keep

    def _decode_ids(self, batch: int) -> np.ndarray:
        """The (B, 1) int64 array bound as ``input_ids`` for decode steps, bound once:
        after a forward has swept the caches a binding call costs ~35 us of cold code."""
        if self._bound_ids is None or self._bound_ids.shape[0] != batch:
            ids = np.zeros((batch, 1), dtype=np.int64)
            self._binding.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(ids))
            self._bound_ids = ids
        return self._bound_ids

    def _decode_buffer(self, batch: int) -> tuple[ort.OrtValue, np.ndarray]:
        """The decode logits buffer for ``batch`` rows and a numpy view of it, made once:
        right after a forward, asking the OrtValue for a view costs ~10 us of cold code."""
        held = self._decode_logits.get(batch)
        if held is None:
            shape = (batch, 1, self._signature.vocab_size)
            buffer = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32)
            held = (buffer, buffer.numpy())  # a view: the buffer's memory, not a copy
            self._decode_logits = {batch: held}  # keep one: batch sizes rarely alternate
        return held


def _as_ortvalue(value: Any) -> ort.OrtValue:
    if isinstance(value, ort.OrtValue):
        return value
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))


def read_model_config(folder: Path) -> dict[str, Any]:
    """The model's ``config.json``; for a folder made by onnxruntime-genai's builder
    (no config.json), the facts ortgen needs taken from its ``genai_config.json``."""
    path = folder / "config.json"
    if path.is_file():
        return read_json_object(path, error=ModelLoadError)
    genai = folder / GENAI_CONFIG
    if genai.is_file():
        model = read_json_object(genai, error=ModelLoadError).get("model", {})
        derived = {k: model[k] for k in _GENAI_MODEL_KEYS if k in model}
        if "context_length" in model:
            derived["max_position_embeddings"] = model["context_length"]
        return derived
    raise ModelLoadError(
        f"model folder {folder} is incomplete: it has no config.json (nor {GENAI_CONFIG})"
    )


def max_context(config: dict[str, Any]) -> int | None:
    """The longest sequence the model was trained for, if config.json says."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return None
