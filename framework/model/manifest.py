"""Reading a model folder's ``ortgen_manifest.json``: whether an export finished, and its facts.

The read side of the manifest is a leaf that loading, text and benchmarks use; writing it
and comparing it with what this ortgen would build are the exporter's
(``ortgen.export.manifest``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .paths import has_model_config

MANIFEST_NAME = "ortgen_manifest.json"
#: 1: first release (no ortgen version, no variant); 2: ortgen version and variant;
#: 3: the tokenizer resolved at export (ortgen_tokenizer.json), so older folders rebuild;
#: 4: precision ``gguf`` takes its Q4_1 block sums from MatMulNBits rows, and its tied
#: embedding gathers from the LM head's weight without a Reshape (changed graphs);
#: 5: fused graphs give the embedding lookup its own table and split a MatMulNBits LM head
#: in parts (``head_layout``); 6: so do fused fp32 graphs (a float MatMul head, cut along N);
#: 7: fused graphs take ``logits_to_keep`` (the last positions the LM head computes);
#: 8: precision ``gguf``'s 4-bit MatMulNBits have no zero-point input (default 8, the
#: minimum shifted by 8d): a faster kernel.
MANIFEST_FORMAT = 8


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The folder's manifest, or None if it has none or it is not a JSON object."""
    path = Path(folder) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete_model_folder(path: str | Path) -> bool:
    """True if ``path`` holds a finished export: a graph, a config and a readable manifest.

    The manifest is written last, so its presence tells a finished export from a folder
    someone else put there, or one an interrupted export left.
    """
    path = Path(path)
    return (
        (path / "model.onnx").is_file()
        and has_model_config(path)
        and read_manifest(path) is not None
    )
