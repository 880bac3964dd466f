"""Where models live when no path is given."""

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


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME
