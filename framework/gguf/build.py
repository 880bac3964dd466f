"""A GGUF file -> a model folder ortgen loads: graph, configs, tokenizer, manifest.

Everything comes from the file: the network from its metadata (``spec``), the weights
exactly (``quant_layout``), the tokenizer and chat template from ``tokenizer.ggml.*``
(``tokenizer``). Only numpy, onnx, gguf and tokenizers are imported: no torch,
transformers, optimum or onnxruntime-genai. The folder is built beside its destination and
moved into place whole, with the manifest written last, so a folder that exists is one that
finished.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ExportError, ModelLoadError
from ..model.manifest import MANIFEST_FORMAT, MANIFEST_NAME
from ..plugin_host.installed import ortgen_version
from .decoder import build_decoder
from .options import BUILD_FORMAT, BuildOptions, variant_of
from .reader import GGUFError, GGUFFile
from .spec import ModelSpec, read_spec

__all__ = ["BUILD_FORMAT", "Progress", "build_folder", "variant_of"]

Progress = Callable[[str], None]


def build_folder(
    gguf: str | Path,
    dest: str | Path,
    *,
    options: BuildOptions | None = None,
    sha256: str | None = None,
    progress: Progress = lambda _msg: None,
) -> Path:
    """Build ``dest`` from the GGUF file ``gguf`` (replacing what is there)."""
    options = options or BuildOptions()
    dest = Path(dest)
    g = GGUFFile(gguf)
    spec = read_spec(g)
    if not g.has("tokenizer.ggml.model"):
        # checked before any work: the tokenizer module's own message advises adding a
        # tokenizer.json to a model folder, which a GGUF built into the cache cannot take
        raise GGUFError(
            f"{g.path} has no tokenizer (no tokenizer.ggml.* metadata): ortgen builds the "
            "tokenizer from the GGUF itself, so it cannot build this file. Convert the model "
            "again with its tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)"
        )
    progress(
        f"building {g.path.name}: {spec.architecture}, {spec.layers} layers, "
        f"hidden {spec.hidden}, vocab {spec.vocab} ({options.precision})"
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = dest.parent / f".{dest.name}.building-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        from .tokenizer import write_tokenizer_files

        try:
            info = write_tokenizer_files(g.fields, work)
        except ExportError as exc:  # a tokenizer ortgen cannot build: name the file
            raise GGUFError(f"{g.path}: {exc}") from exc
        build_decoder(g, spec, options, work)
        ids = info.generation_ids()
        _write_json(work / "config.json", _hf_config(spec, options, ids, g))
        _write_json(work / "generation_config.json", ids)
        _write_json(work / "genai_config.json", _genai_config(spec, options, ids))
        _write_manifest(work, g.path, sha256, variant_of(options))
        _replace(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return dest


def _hf_config(
    spec: ModelSpec, options: BuildOptions, ids: dict[str, Any], g: GGUFFile
) -> dict[str, Any]:
    """A transformers-style config.json: what ortgen's layers read (context, ids) and what a
    reader wants to know about the network."""
    config: dict[str, Any] = {
        "model_type": spec.hf_model_type,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab,
        "max_position_embeddings": options.context(spec),
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope.base,
        "tie_word_embeddings": spec.tied_head,
        "sliding_window": spec.sliding_window or None,
        "gguf": {
            "file": g.path.name,
            "architecture": spec.architecture,
            "name": g.get("general.name"),
            "context_length": spec.context,
        },
    }
    config.update(ids)
    return config


def _genai_config(spec: ModelSpec, options: BuildOptions, ids: dict[str, Any]) -> dict[str, Any]:
    """onnxruntime-genai's config: it tells ortgen (and genai) that past and present share
    one buffer (``past_present_share_buffer``)."""
    context = options.context(spec)
    return {
        "model": {
            **ids,
            "context_length": context,
            "decoder": {
                "filename": "model.onnx",
                "head_size": spec.head_dim,
                "hidden_size": spec.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": spec.heads,
                "num_hidden_layers": spec.layers,
                "num_key_value_heads": spec.kv_heads,
            },
            "type": spec.hf_model_type,
            "vocab_size": spec.vocab,
        },
        "search": {"max_length": context, "past_present_share_buffer": True},
    }


def _write_manifest(
    folder: Path, source: Path, sha256: str | None, variant: dict[str, Any]
) -> None:
    """The manifest last: its presence marks the folder finished."""
    import gguf
    import numpy
    import onnx

    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    manifest = {
        "format": MANIFEST_FORMAT,
        "ortgen": ortgen_version(),
        "variant": variant,
        "source": str(source),
        "source_sha256": sha256,
        "task": "text-generation-with-past",
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tools": {
            "gguf": gguf.__version__ if hasattr(gguf, "__version__") else None,
            "onnx": onnx.__version__,
            "numpy": numpy.__version__,
        },
        "files": files,
    }
    _write_json(folder / MANIFEST_NAME, manifest)


def _replace(work: Path, dest: Path) -> None:
    """Move the finished ``work`` folder to ``dest``, replacing an older one."""
    old = None
    if dest.exists():
        if not dest.is_dir():
            raise ModelLoadError(f"{dest} exists and is not a folder")
        old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(dest, old)
    os.replace(work, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
