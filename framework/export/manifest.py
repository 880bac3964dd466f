"""``ortgen_manifest.json``: what made a model folder, written last so it marks it complete.

It records the manifest format, the ortgen version, the export variant, the source and
its sha256, and the export tools' versions. ``stale_reason`` compares a folder with what
this ortgen would build now, which is how the default model knows to rebuild itself.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path
from typing import Any

from ..installed import metadata_folders
from ..paths import has_model_config

MANIFEST_NAME = "ortgen_manifest.json"
#: 1: first release (no ortgen version, no variant); 2: ortgen version and variant;
#: 3: the tokenizer resolved at export (ortgen_tokenizer.json), so older folders rebuild;
#: 4: precision ``gguf`` takes its Q4_1 block sums from MatMulNBits rows, and its tied
#: embedding gathers from the LM head's weight without a Reshape (changed graphs);
#: 5: fused graphs give the embedding lookup its own table and split a MatMulNBits LM head
#: in parts (``head_layout``); 6: so do fused fp32 graphs (a float MatMul head, cut along N).
MANIFEST_FORMAT = 6
TASK = "text-generation-with-past"
#: The packages whose versions shape an exported graph.
EXPORT_TOOLS = (
    "torch",
    "transformers",
    "optimum",
    "optimum-onnx",
    "onnxruntime",
    "onnxruntime-genai",
    "onnx",
    "onnx-ir",
)


def ortgen_version() -> str:
    from .. import __version__

    return __version__


def tool_versions() -> dict[str, str | None]:
    """Installed versions of the export stack (None: not installed).

    Read from the ``NAME-VERSION.dist-info`` folder names on ``sys.path``
    (``ortgen.installed``), without importing importlib.metadata (≈0.1 s, paid by every
    load of the default model, which checks this).
    """
    wanted = {_normalise(name): name for name in EXPORT_TOOLS}
    versions: dict[str, str | None] = dict.fromkeys(EXPORT_TOOLS)
    for folder in metadata_folders():
        match = _DIST_INFO.match(os.path.basename(folder)) if folder is not None else None
        if match is None:
            continue
        name = wanted.get(_normalise(match.group(1)))
        if name is not None and versions[name] is None:
            versions[name] = match.group(2)
    return versions


_DIST_INFO = re.compile(r"^(.+?)-([^-]+)\.dist-info$")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def write_manifest(
    folder: Path, *, source: Path, source_sha256: str | None, variant: dict[str, Any]
) -> None:
    """Write the manifest last: its presence is what marks the folder as finished."""
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST_NAME)
    manifest = {
        "format": MANIFEST_FORMAT,
        "ortgen": ortgen_version(),
        "variant": variant,
        "source": str(source),
        "source_sha256": source_sha256,
        "task": TASK,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "tools": tool_versions(),
        "files": files,
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


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


def stale_reason(
    folder: str | Path, *, variant: dict[str, Any], source_sha256: str | None
) -> str | None:
    """Why ``folder`` is not what this ortgen would build now (None: it is).

    Compared: manifest format, ortgen version, variant, source sha256, and the export
    tools' versions (only those installed now: without the export extra nothing can be
    rebuilt, so a missing tool is no reason).
    """
    manifest = read_manifest(folder)
    if manifest is None:
        return "it has no readable manifest"
    if manifest.get("format") != MANIFEST_FORMAT:
        return (
            f"its manifest format is {manifest.get('format')}, this ortgen writes {MANIFEST_FORMAT}"
        )
    if manifest.get("ortgen") != ortgen_version():
        return f"it is from ortgen {manifest.get('ortgen')}, this is ortgen {ortgen_version()}"
    if manifest.get("variant") != variant:
        return f"it is variant {_label(manifest.get('variant'))}, the default is {_label(variant)}"
    if source_sha256 is not None and manifest.get("source_sha256") != source_sha256:
        return "its source file's sha256 differs from the expected one"
    recorded = manifest.get("tools") or {}
    for name, version in tool_versions().items():
        if version is not None and recorded.get(name) != version:
            return (
                f"it was exported with {name} {recorded.get(name)}, {name} {version} is installed"
            )
    return None


def _label(variant: Any) -> str:
    from .variant import variant_name

    return variant_name(variant) or json.dumps(variant, sort_keys=True)
