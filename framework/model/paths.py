"""Where models live when no path is given.

The default model is built on first use by ``ortgen.gguf.default_model``.
"""

from __future__ import annotations

import os
from pathlib import Path

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
