"""Where models live when no path is given, and the default model built on first use."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ModelLoadError

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"


def models_dir() -> Path:
    """``$ORTGEN_MODELS_DIR``, else the project's ``exported_models/`` (a source checkout),
    else ``~/.cache/ortgen/models`` (an installed wheel has no project folder)."""
    env = os.environ.get("ORTGEN_MODELS_DIR")
    if env:
        return Path(env)
    project = Path(__file__).resolve().parent.parent / "exported_models"
    if project.is_dir():
        return project
    return Path.home() / ".cache" / "ortgen" / "models"


#: A model folder's config: transformers' ``config.json``, or for a folder made by
#: onnxruntime-genai's model builder elsewhere, its ``genai_config.json``.
MODEL_CONFIGS = ("config.json", "genai_config.json")


def has_model_config(folder: str | Path) -> bool:
    """Whether ``folder`` holds a config ortgen can load a model with (see MODEL_CONFIGS)."""
    return any((Path(folder) / name).is_file() for name in MODEL_CONFIGS)


def not_a_model_folder(folder: str | Path) -> str:
    """The message for a folder without a model config."""
    return f"{folder} is not a model folder (it has no {' or '.join(MODEL_CONFIGS)})"


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def ensure_default_model() -> Path:
    """The default model folder, exported on first use and rebuilt when it is out of date.

    Out of date means its manifest does not match what this ortgen builds (format,
    ortgen version, variant, source, export tools). Without the export extra nothing
    can be rebuilt, so a finished folder is used as it is.
    """
    import importlib.util

    from .export.manifest import is_complete_model_folder

    folder = default_model_dir()
    can_export = importlib.util.find_spec("onnxruntime_genai") is not None
    if is_complete_model_folder(folder) and not can_export:
        return folder
    if not can_export:
        raise ModelLoadError(
            f"the default model is not built yet ({folder}) and building it needs the export "
            "tools: pip install 'ortgen[export]', then run `ortgen export --default`"
        )
    from .export import print_progress
    from .export.default_model import build_default_model

    return build_default_model(folder.parent, progress=print_progress)
