"""Writing ``ortgen_manifest.json`` (what made a model folder, written last so it marks it
complete) and telling whether a folder is stale; reading it is ``ortgen.model.manifest``.

It records the manifest format, the ortgen version, the export variant, the source and
its sha256, and the export tools' versions. ``stale_reason`` compares a folder with what
this ortgen would build now, which is how the default model knows to rebuild itself.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from ..model.manifest import MANIFEST_FORMAT, MANIFEST_NAME, is_complete_model_folder, read_manifest
from ..plugin_host.installed import ortgen_version, tool_versions

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "TASK",
    "is_complete_model_folder",
    "read_manifest",
    "stale_reason",
    "write_manifest",
]

TASK = "text-generation-with-past"


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
