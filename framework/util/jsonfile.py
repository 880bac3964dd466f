"""The one reader of a model folder's JSON files (config.json, generation_config.json,
tokenizer files, the manifest): a JSON object or an error that names the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_json_object"]


def read_json_object(
    path: Path,
    *,
    error: type[Exception],
    missing_ok: bool = False,
) -> dict[str, Any]:
    """The JSON object in ``path``.

    A missing file is ``{}`` when ``missing_ok``; otherwise it, unreadable bytes, invalid
    JSON and a non-object all raise ``error`` with the path and the reason, so a bad file
    in a model folder is never mistaken for an absent one.
    """
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not valid JSON: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{path} holds a JSON {type(data).__name__}; it must hold an object")
    return data
