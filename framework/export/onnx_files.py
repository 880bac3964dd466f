"""Write an ONNX model with external data over the one in a folder, safely."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["save_in_place"]


def save_in_place(onnx: Any, model: Any, onnx_dir: Path) -> None:
    """Save next to the old files, then swap: a failed save leaves the old graph intact.

    onnx appends to an existing external-data file, so the new pair is written into a fresh
    folder under the final names (the graph records the data file's name) and then moved.
    """
    tmp = Path(tempfile.mkdtemp(prefix=".ortgen_save_", dir=onnx_dir))
    try:
        onnx.save_model(
            model,
            str(tmp / "model.onnx"),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
            size_threshold=1024,
        )
        for name in ("model.onnx.data", "model.onnx"):
            old = onnx_dir / name
            if old.exists():  # keep the old files' permissions (onnx writes 0600 data files)
                (tmp / name).chmod(old.stat().st_mode & 0o777)
            (tmp / name).replace(old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
