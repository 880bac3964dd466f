"""Export a Hugging Face model folder or a GGUF file to an ONNX folder ortgen can load.

A GGUF file is first converted to a transformers folder (``ortgen.export.gguf``: the
weights dequantised by transformers, the tokenizer ortgen's GGUF builder's); the graph is
then built by the variant's family (``fused``: onnxruntime-genai's model builder;
``optimum``: optimum's exporter, optionally quantised). The export stack is heavy and
optional, so it is imported only inside the functions that need it.

Output folder layout (written by ``export_model``)::

    model.onnx            one graph; prefill feeds zero-length (or preallocated) past
    model.onnx.data       the weights, when written as external data
    genai_config.json     fused graphs: onnxruntime-genai's config (past/present shared)
    config.json, generation_config.json
    tokenizer.json, tokenizer_config.json, special_tokens_map.json   if the source has one
    chat_template.jinja   if the tokenizer has a chat template
    ortgen_tokenizer.json the tokenizer as transformers resolved it (with tokenizer.json:
                          all ortgen reads, without transformers, at run time)
    ortgen_manifest.json  written last: its presence marks a finished export

The folder is built in a hidden sibling and renamed into place at the very end, so an
interrupted or failed export never leaves a folder that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

from ..errors import ExportError
from .gguf import gguf_to_hf_folder, looks_like_gguf
from .manifest import TASK, is_complete_model_folder, write_manifest
from .quiet import quiet
from .variant import DEFAULT_VARIANT, Variant

__all__ = ["Progress", "export_model", "print_progress", "save_tokenizer"]

_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
_EXPECTED_SOURCE = "expected a Hugging Face model folder (config.json + weights) or a .gguf file"

Progress = Callable[[str], None]


def print_progress(message: str) -> None:
    """The command line's progress output: one ``[ortgen]`` line per stage, on stderr."""
    print(f"[ortgen] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- public API


def export_model(
    source: str | Path,
    out: str | Path,
    *,
    variant: Variant = DEFAULT_VARIANT,
    progress: Progress = print,
    overwrite: bool = False,
) -> Path:
    """Export ``source`` (an HF model folder or a ``.gguf`` file) to the ONNX folder ``out``.

    The model is exported as ``variant`` (default: the fused int4 graph), one graph
    with past-key-value inputs and outputs (and, with ``variant.embeddings``, the
    ``hidden_states`` output ``gen.embed()`` pools). A ``.gguf`` source goes through a dequantised
    transformers folder, so its weights are the variant's (fp32, or re-quantised to
    int8/int4); ortgen's GGUF builder (``ortgen export FILE.gguf OUT``,
    ``ortgen.load("FILE.gguf")``) keeps the file's own. Its tokenizer is the builder's
    either way (:mod:`ortgen.export.gguf`). ``out`` is only ever replaced as
    a whole, at the end, so a failure leaves it as it was. An existing finished export is
    replaced only with ``overwrite=True``; an existing non-empty folder that is not an
    export is never touched without ``overwrite=True``.
    Returns ``out``.

    Raises ExportError naming the source and what is wrong; failures inside
    transformers/optimum are chained as ``__cause__``.
    """
    source = Path(source).expanduser().absolute()
    out = Path(out).expanduser().absolute()
    kind = _classify_source(source, variant)
    if source == out or source.is_relative_to(out):
        raise ExportError(f"export destination {out} would replace its own source {source}")
    _check_destination(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as exc:
        raise ExportError(f"cannot create a build folder next to {out}: {exc}") from exc
    try:
        source_sha256 = None
        if kind == "gguf":
            progress(f"converting GGUF to transformers… ({source.name})")
            hf_dir = staging / "hf"
            gguf_to_hf_folder(source, hf_dir)
            _check_hf_folder(hf_dir, source, variant)
            source_sha256 = _sha256(source)
        else:
            hf_dir = source
        progress(f"exporting to ONNX ({variant.name})…")
        built = staging / "onnx"
        if variant.graph == "fused":
            from .fused import build_fused

            build_fused(hf_dir, built, variant, source=source)
            _copy_model_files(hf_dir, built)
        else:
            _run_optimum_export(hf_dir, built, source)
            if variant.quantized:
                from .quantize import quantize_matmuls

                quantize_matmuls(built / "model.onnx", variant, source=source)
        if variant.embeddings:  # one edit for both families, after their own
            from ..gguf.decoder import HIDDEN_OUTPUT
            from .graph_editor import add_hidden_output

            add_hidden_output(built / "model.onnx", HIDDEN_OUTPUT)
        # After optimum, which saves the tokenizer its own way: ours replaces it.
        save_tokenizer(hf_dir, built, source=source, progress=progress)
        _check_loads(built, source)
        write_manifest(built, source=source, source_sha256=source_sha256, variant=variant.to_dict())
        _move_into_place(built, out, overwrite, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size_mb = sum(p.stat().st_size for p in out.iterdir() if p.is_file()) / 1e6
    progress(f"done: {out} ({size_mb:.0f} MB)")
    return out


# --------------------------------------------------------------------------- input checks


def _classify_source(source: Path, variant: Variant) -> str:
    """Return "gguf" or "folder", or raise ExportError saying what the source lacks."""
    if not source.exists():
        raise ExportError(f"export source {source} does not exist; {_EXPECTED_SOURCE}")
    if source.is_file():
        if source.suffix.lower() != ".gguf":
            raise ExportError(
                f"export source {source} is a file but not a .gguf file; {_EXPECTED_SOURCE}"
            )
        if not looks_like_gguf(source):
            raise ExportError(f"export source {source} does not start with the GGUF magic bytes")
        return "gguf"
    _check_hf_folder(source, source, variant)
    return "folder"


def _check_hf_folder(folder: Path, source: Path, variant: Variant = DEFAULT_VARIANT) -> None:
    """Fail early, with a clear message, on a folder optimum could not export.

    Cheaper and clearer than letting optimum load weights and fail deep inside.
    """
    config_path = folder / "config.json"
    if not config_path.is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = f"; it holds {ggufs[0]}: pass that .gguf file instead" if ggufs else ""
        raise ExportError(f"export source {source} is a folder without config.json{hint}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"export source {source}: config.json is not valid JSON") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not model_type:
        raise ExportError(f"export source {source}: config.json has no model_type")
    supported = _supported_tasks(model_type) if variant.graph == "optimum" else [TASK]
    if TASK not in supported:
        known = ", ".join(supported) if supported else "none"
        raise ExportError(
            f"export source {source}: optimum cannot export model_type {model_type!r} for "
            f"{TASK} (tasks it supports for {model_type!r}: {known})"
        )
    if not any(any(folder.glob(pattern)) for pattern in _WEIGHT_GLOBS):
        raise ExportError(
            f"export source {source} has no weights (*.safetensors or pytorch_model*.bin)"
        )


def _supported_tasks(model_type: str) -> list[str]:
    """Tasks optimum's ONNX exporter supports for ``model_type`` (empty if unknown)."""
    with quiet():
        from optimum.exporters.onnx import main_export  # noqa: F401  (registers the configs)
        from optimum.exporters.tasks import TasksManager

        try:
            tasks = TasksManager.get_supported_tasks_for_model_type(
                model_type, exporter="onnx", library_name="transformers"
            )
        except KeyError:
            return []
    return list(tasks)


def _check_destination(out: Path, overwrite: bool) -> None:
    """Refuse to clobber a finished export or a foreign folder unless told to."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ExportError(f"export destination {out} exists and is not a folder")
    if overwrite:
        return
    if is_complete_model_folder(out):
        raise ExportError(
            f"export destination {out} already holds a complete exported model; "
            "pass overwrite=True to replace it"
        )
    if any(out.iterdir()):
        raise ExportError(
            f"export destination {out} exists, is not empty and is not an ortgen model "
            "folder; refusing to replace it (pass overwrite=True to do so)"
        )


def _sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (GGUF files are large)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# --------------------------------------------------------------------------- optimum


def _run_optimum_export(hf_dir: Path, dest: Path, source: Path) -> None:
    """Run optimum's exporter into ``dest``, quietly; wrap its failures in ExportError."""
    try:
        with quiet():
            from optimum.exporters.onnx import main_export

            main_export(
                str(hf_dir),
                output=dest,
                task=TASK,
                framework="pt",
                library_name="transformers",
                device="cpu",
                do_validation=False,
                local_files_only=True,
            )
    except Exception as exc:
        raise ExportError(
            f"export of {source} to ONNX failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not (dest / "model.onnx").is_file():
        found = sorted(p.name for p in dest.glob("*")) if dest.exists() else []
        raise ExportError(f"export of {source} produced no model.onnx (files: {found})")


def _check_loads(built: Path, source: Path) -> None:
    """Load the new folder as ortgen will (onnxruntime session + graph signature), so a
    graph onnxruntime rejects never gets a manifest, i.e. never looks finished."""
    from ..errors import ModelLoadError
    from ..model.session import ExportedModel

    try:
        ExportedModel(built, threads=1)
    except ModelLoadError as exc:
        raise ExportError(f"export of {source} produced a graph ortgen cannot load: {exc}") from exc


def _copy_model_files(hf_dir: Path, built: Path) -> None:
    """config.json and generation_config.json next to the graph, as optimum writes them."""
    for name in ("config.json", "generation_config.json"):
        if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, built / name)


def save_tokenizer(
    hf_dir: Path, built: Path, *, source: Path | None = None, progress: Progress = print
) -> bool:
    """Save the tokenizer of ``hf_dir`` into ``built`` exactly as transformers resolves it.

    AutoTokenizer loads it (tokenizer class, special tokens, post-processor,
    ``add_prefix_space``: transformers' own rules, applied once, here) and
    :func:`~ortgen.text.resolved_tokenizer.save_resolved_tokenizer` writes transformers'
    files plus ``ortgen_tokenizer.json`` and checks that ortgen reads them back with the
    same results, so the run time needs neither transformers nor a copy of its rules.
    A source without tokenizer files gives no tokenizer (the model generates from ids).
    One transformers cannot load, or can load only as a slow tokenizer, gets a clear
    warning and no tokenizer files at all (none that would give different ids); a saved
    tokenizer that ortgen would read differently fails the export. Returns whether a
    tokenizer was saved.
    """
    from .tokenizer_export import save_resolved_tokenizer

    source = source or hf_dir
    if not any((hf_dir / name).is_file() for name in _TOKENIZER_MARKERS):
        return False
    try:
        with quiet():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    except Exception as exc:
        problem = f"transformers cannot load it ({type(exc).__name__}: {exc})"
        _no_tokenizer(built, source, problem, progress)
        return False
    if not getattr(tokenizer, "is_fast", False):
        problem = (
            f"transformers loads it only as a slow {type(tokenizer).__name__} (no fast "
            "conversion: is sentencepiece or tiktoken missing?)"
        )
        _no_tokenizer(built, source, problem, progress)
        return False
    try:
        with quiet():
            save_resolved_tokenizer(tokenizer, built)
    except ExportError as exc:
        raise ExportError(f"export of {source}: {exc}") from exc
    return True


def _no_tokenizer(built: Path, source: Path, problem: str, progress: Progress) -> None:
    """Say loudly that the export has no tokenizer, and remove any tokenizer.json (optimum
    may have written one) so nothing reads a tokenizer transformers would not build."""
    (built / "tokenizer.json").unlink(missing_ok=True)
    message = (
        f"{source} has tokenizer files but {problem}; the export has no tokenizer.json, "
        "so the model will only generate from token ids"
    )
    progress(f"warning: {message}")
    warnings.warn(message, stacklevel=3)


def _move_into_place(built: Path, out: Path, overwrite: bool, staging: Path) -> None:
    """Rename the finished folder to ``out``; an old ``out`` moves into ``staging`` first.

    Both renames stay on one filesystem (``staging`` is a sibling of ``out``), so each is
    atomic; if the second fails the old folder is put back.
    """
    _check_destination(out, overwrite)  # the destination may have appeared meanwhile
    old = None
    if out.exists():
        old = staging / f"old-{uuid.uuid4().hex}"
        out.rename(old)
    try:
        built.rename(out)
    except OSError as exc:
        if old is not None:
            old.rename(out)
        raise ExportError(f"cannot move the finished export into {out}: {exc}") from exc
