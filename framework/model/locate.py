"""What a model argument names: a model folder, a GGUF file (built on first use), or
nothing ortgen can load — and then the message says what to do instead.

One place for every entry point (``ortgen.load``, the CLI's ``-m``, pipeline files'
``model``, ``ortgen serve -m``), so a GGUF path works, and a Hugging Face id fails the
same way, wherever a user writes it.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelLoadError

__all__ = ["is_gguf_path", "model_folder"]

# "org/name", as a model hub id looks (a path that exists is a path whatever it looks like)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_gguf_path(path: str | Path) -> bool:
    """Whether ``path`` is a file in GGUF format."""
    from ..gguf.reader import looks_like_gguf

    return Path(path).is_file() and looks_like_gguf(path)


def model_folder(path: str | Path) -> Path:
    """The model folder ``path`` names: itself, or a GGUF file's build (made now on first
    use, with progress on stderr). Anything else is a ModelLoadError saying what to do."""
    candidate = Path(path).expanduser()
    if candidate.is_dir():
        return candidate
    if candidate.is_file():
        if is_gguf_path(candidate):
            from ..gguf.cache import built_model

            return built_model(candidate)
        raise ModelLoadError(
            f"{candidate} is a file but not a GGUF file: ortgen loads a model folder "
            "(model.onnx and its config) or a .gguf file"
        )
    if _HUB_ID.match(str(path)) and not str(path).startswith("."):
        raise ModelLoadError(
            f"{str(path)!r} is not a local folder or file, and ortgen downloads nothing from "
            "a model hub: download the model's GGUF file (e.g. `huggingface-cli download "
            f"{path} --include '*Q4_K_M.gguf' --local-dir .`) and load that file's path"
        )
    raise ModelLoadError(
        f"{candidate}: no such model folder or GGUF file (ortgen loads a folder made by "
        "`ortgen export`, or a .gguf file)"
    )
