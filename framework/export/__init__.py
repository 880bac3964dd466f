"""Export: Hugging Face folders and GGUF files to ONNX folders ortgen can load.

This subpackage is the ``export`` extra's boundary: it alone imports torch,
transformers, optimum, onnx and onnxruntime-genai's model builder, and only inside
the functions that need them. Its public names are imported on first use, so reading
a variant or a manifest (which every ``ortgen.load()`` of the default model does) costs
no more than those small modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .exporter import Progress, export_model, print_progress
    from .manifest import MANIFEST_NAME, is_complete_model_folder
    from .variant import DEFAULT_VARIANT, Variant

_LAZY = {
    "Progress": "exporter",
    "export_model": "exporter",
    "print_progress": "exporter",
    "MANIFEST_NAME": "manifest",
    "is_complete_model_folder": "manifest",
    "DEFAULT_VARIANT": "variant",
    "Variant": "variant",
}

__all__ = [  # noqa: RUF022 (grouped by module)
    "Progress",
    "export_model",
    "print_progress",
    "MANIFEST_NAME",
    "is_complete_model_folder",
    "DEFAULT_VARIANT",
    "Variant",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'ortgen.export' has no attribute {name!r}")
