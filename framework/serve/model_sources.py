"""Which models ``ortgen serve`` serves, from its flags: ``-m [NAME=]FOLDER|FILE.gguf``
(repeatable) and ``--models-dir DIR`` (every model folder and GGUF file in it).

A model's id (what requests put in ``model``) is the NAME given, or else its folder's name
(a GGUF file's stem). Every source is checked here, before anything loads, so a typo is an
error at startup and not a 500 at a model's first request; a GGUF file is built here too
(on first use; from the cache after), so no request waits for a build.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import OrtgenError
from ..model.locate import is_gguf_path, model_folder
from ..model.session import MODEL_FILE
from .model_pool import ModelSource


def model_sources(models: list[str], models_dir: str | None) -> list[ModelSource]:
    """The sources the flags name, in order (the first is the default model); empty when
    neither flag is given (the server then serves the pipeline's or the built-in model)."""
    sources = [_from_flag(spec) for spec in models]
    if models_dir is not None:
        sources += _from_dir(Path(models_dir))
    seen: dict[str, Path] = {}
    for source in sources:
        if source.id in seen:
            raise OrtgenError(
                f"two models are called {source.id!r}: {seen[source.id]} and {source.path}; "
                "name one with -m NAME=FOLDER"
            )
        seen[source.id] = source.path
    return sources


def _from_flag(spec: str) -> ModelSource:
    """``NAME=FOLDER`` or ``FOLDER`` (a whole spec that exists, or one with a ``/``
    before its ``=``, is a folder whose path holds an ``=``)."""
    name, sep, folder = spec.partition("=")
    if not sep or "/" in name or Path(spec).exists():
        name, folder = "", spec
    elif not name.strip():
        raise OrtgenError(f"-m {spec}: the model's name before '=' is empty")
    given = Path(folder)
    path = _check_folder(given, f"-m {spec}")
    return ModelSource(name.strip() or (given.stem if given.is_file() else path.name), path)


def _from_dir(folder: Path) -> list[ModelSource]:
    """Every model folder (one holding ``model.onnx``) directly inside ``folder``, by name."""
    if not folder.is_dir():
        raise OrtgenError(f"--models-dir {folder}: no such folder")
    found = sorted(p for p in folder.iterdir() if (p / MODEL_FILE).is_file() or is_gguf_path(p))
    if not found:
        raise OrtgenError(
            f"--models-dir {folder}: no model folder in it (a folder holding {MODEL_FILE}, "
            "as `ortgen export` writes, or a .gguf file)"
        )
    return [
        ModelSource(path.stem if path.is_file() else path.name, _check_folder(path, "--models-dir"))
        for path in found
    ]


def _check_folder(path: Path, flag: str) -> Path:
    if is_gguf_path(path):
        return model_folder(path).resolve()  # built now, or from the cache
    if not path.is_dir():
        raise OrtgenError(f"{flag}: no such model folder or GGUF file {path}")
    if not (path / MODEL_FILE).is_file():
        raise OrtgenError(
            f"{flag}: {path} is not a model folder (it has no {MODEL_FILE}; export one "
            "with `ortgen export SOURCE OUT`)"
        )
    return path.resolve()
