"""What is installed, found where ``importlib.metadata`` finds it, without importing it.

Importing ``importlib.metadata`` costs ~0.07 s, and parsing every distribution through it
~0.05 s more in a 150-package environment: too much for checks made at every load (the
default model's export tools, whether any plugin package is installed). They read the
``*.dist-info`` / ``*.egg-info`` folders in each ``sys.path`` entry directly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

__all__ = ["metadata_folders"]


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
