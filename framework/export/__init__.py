"""Export: Hugging Face folders and GGUF files to ONNX folders ortgen can load.

This subpackage is the ``export`` extra's boundary: it alone imports torch,
transformers, optimum, onnx and onnxruntime-genai's model builder, and only inside
the functions that need them, so ``import ortgen`` stays light.
"""

from __future__ import annotations

from .exporter import Progress, export_model, print_progress
from .manifest import MANIFEST_NAME, is_complete_model_folder
from .variant import DEFAULT_VARIANT, Variant

__all__ = [
    "DEFAULT_VARIANT",
    "MANIFEST_NAME",
    "Progress",
    "Variant",
    "export_model",
    "is_complete_model_folder",
    "print_progress",
]
