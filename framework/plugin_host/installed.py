"""What is installed, found where ``importlib.metadata`` finds it, without importing it.

Importing ``importlib.metadata`` costs ~0.07 s, and parsing every distribution through it
~0.05 s more in a 150-package environment: too much for checks made at every load (the
default model's export tools, whether any plugin package is installed). They read the
``*.dist-info`` / ``*.egg-info`` folders in each ``sys.path`` entry directly.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator

__all__ = ["EXPORT_TOOLS", "metadata_folders", "ortgen_version", "tool_versions"]


def metadata_folders() -> Iterator[str | None]:
    """The path of each ``*.dist-info`` and ``*.egg-info`` folder on ``sys.path``, in
    ``sys.path`` order; None for an entry only ``importlib.metadata`` can read (an egg,
    whose metadata is in its ``EGG-INFO``, or a zip)."""
    for entry in sys.path:
        root = entry or "."
        if entry.lower().endswith(".egg") or os.path.isfile(root):
            yield None
            continue
        try:
            names = os.listdir(root)
        except OSError:  # a missing sys.path entry holds nothing
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info")):
                yield os.path.join(root, name)


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
    from ..version import __version__

    return __version__


def tool_versions() -> dict[str, str | None]:
    """Installed versions of the export stack (None: not installed).

    Read from the ``NAME-VERSION.dist-info`` folder names on ``sys.path``
    (``metadata_folders``), without importing importlib.metadata (≈0.1 s, paid by every
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


#: what the ``export`` extra adds for Hugging Face folders (import names checked)
_EXPORT_EXTRA = ("torch", "transformers", "optimum", "onnxruntime-genai")


def export_extra_missing() -> list[str]:
    """The export extra's packages that are not installed (empty: it is)."""
    versions = tool_versions()
    return [name for name in _EXPORT_EXTRA if versions.get(name) is None]


def install_command(extra: str) -> str:
    """A pip command that adds ``extra`` to this ortgen, as it was installed: ortgen is not
    on the package index, so ``pip install 'ortgen[extra]'`` would fail. The dist-info's
    ``direct_url.json`` (PEP 610) says where it came from: a folder (a clone; editable or
    not) or a git URL."""
    import json

    origin = None
    for folder in metadata_folders():
        match = _DIST_INFO.match(os.path.basename(folder)) if folder is not None else None
        if folder is not None and match and _normalise(match.group(1)) == "ortgen":
            try:
                with open(os.path.join(folder, "direct_url.json"), encoding="utf-8") as f:
                    origin = json.load(f)
            except (OSError, ValueError):
                origin = None
            break
    if isinstance(origin, dict) and isinstance(origin.get("url"), str):
        url = origin["url"]
        if url.startswith("file://"):
            path = url.removeprefix("file://")
            editable = (origin.get("dir_info") or {}).get("editable")
            return f"pip install {'-e ' if editable else ''}'{path}[{extra}]'"
        vcs = origin.get("vcs_info") or {}
        if vcs.get("vcs") == "git":
            return f"pip install 'ortgen[{extra}] @ git+{url}'"
    return f"pip install '<your ortgen clone>[{extra}]' (from the folder ortgen was cloned into)"
