"""Which way a model folder's tokenizer is read, so ids equal transformers' wherever possible.

1. A folder ortgen's export wrote has ``ortgen_tokenizer.json``: its ``tokenizer.json`` is
   already what transformers resolved, so ``tokenizers`` + that file are all it takes
   (:mod:`.resolved_tokenizer`); transformers and torch are never imported.
2. Any other folder (optimum's, onnxruntime-genai's, hand-made) is resolved by
   transformers' ``AutoTokenizer`` when it is installed: re-implementing its per-class
   rules is what made ids drift. Except a folder transformers 5 wrote with its generic
   class (``"tokenizer_class": "TokenizersBackend"``, as onnxruntime-genai 0.18's builder
   writes): a transformers 4.x cannot read that class at all, and importing it only to
   fail cost 5-7 s and ~290 MB of peak memory per load.
3. Without transformers (or with ``ORTGEN_TOKENIZER_FALLBACK=best-effort``, which keeps a
   process from importing it), :mod:`.tokenizer_best_effort` copies what it knows of
   those rules and warns that ids may differ.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

from ..errors import ModelLoadError
from .resolved_tokenizer import (
    RESOLVED_FILE,
    TOKENIZER_FILE,
    TokenizerFolder,
    folder_from_transformers,
    read_resolved_folder,
)
from .tokenizer_best_effort import (
    TOKENIZER_CONFIG_FILE,
    V5_GENERIC_CLASS,
    read_best_effort,
    token_id,
)

__all__ = [
    "FALLBACK_ENV",
    "TOKENIZER_FILE",
    "TokenizerFolder",
    "read_tokenizer_folder",
    "token_id",
]

#: Environment variable choosing how a folder without ortgen_tokenizer.json is read:
#: "transformers" (the default: AutoTokenizer when installed) or "best-effort".
FALLBACK_ENV = "ORTGEN_TOKENIZER_FALLBACK"
_FALLBACKS = ("transformers", "best-effort")


def read_tokenizer_folder(folder: Path) -> TokenizerFolder:
    """The tokenizer of ``folder``, read the most exact way available (see the module)."""
    if not folder.is_dir():
        raise ModelLoadError(f"tokenizer folder {folder} does not exist or is not a folder")
    if (folder / RESOLVED_FILE).is_file():
        return read_resolved_folder(folder)
    if not (folder / TOKENIZER_FILE).is_file():
        raise ModelLoadError(
            f"{folder} has no {TOKENIZER_FILE}; a tokenizer needs one "
            "(save it with transformers' tokenizer.save_pretrained(folder))"
        )
    _warn_if_exported_before_resolution(folder)
    fallback = os.environ.get(FALLBACK_ENV, "transformers").strip().lower() or "transformers"
    if fallback not in _FALLBACKS:
        raise ModelLoadError(
            f"{FALLBACK_ENV}={os.environ[FALLBACK_ENV]!r} is not one of {', '.join(_FALLBACKS)}"
        )
    if fallback == "best-effort":
        return read_best_effort(folder, why=f"{FALLBACK_ENV}=best-effort keeps transformers out")
    unreadable = _unreadable_by_installed_transformers(folder)
    if unreadable:
        return read_best_effort(folder, why=unreadable)
    found, why = _read_with_transformers(folder)
    return found if found is not None else read_best_effort(folder, why=why)


def _unreadable_by_installed_transformers(folder: Path) -> str:
    """Why transformers' AutoTokenizer cannot read ``folder`` here, found without importing
    transformers; "" when it may (or when the folder's config cannot tell)."""
    from ..plugin_host.installed import tool_versions

    config = folder / TOKENIZER_CONFIG_FILE
    try:
        tokenizer_class = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return ""  # no or unreadable config: transformers decides (and reports)
    if tokenizer_class != V5_GENERIC_CLASS:
        return ""
    installed = tool_versions().get("transformers")
    if installed is None:
        return "transformers is not installed"
    major = installed.split(".", 1)[0]
    if major.isdigit() and int(major) >= 5:
        return ""
    return (
        f"it was written by transformers 5 (tokenizer_class {V5_GENERIC_CLASS}), which the "
        f"installed transformers {installed} cannot read"
    )


def _warn_if_exported_before_resolution(folder: Path) -> None:
    """An ortgen export from before ``ortgen_tokenizer.json`` loads, but the slow way: say so.

    Without the file the folder takes the foreign-folder path (transformers imported at
    every load: seconds and hundreds of MB), which its owner would otherwise only notice as
    a slow, heavy load. Re-exporting writes the file.
    """
    from ..model.manifest import MANIFEST_FORMAT, read_manifest

    manifest = read_manifest(folder)
    if manifest is None:
        return  # not an ortgen export: the foreign-folder path is the right one
    warnings.warn(
        f"{folder} was exported by an older ortgen (manifest format {manifest.get('format')}, "
        f"this ortgen writes {MANIFEST_FORMAT}) without {RESOLVED_FILE}: its tokenizer is "
        "resolved again at every load, through transformers when installed (slower, more "
        "memory); re-export it with `ortgen export` to load it with tokenizers alone",
        stacklevel=4,
    )


def _read_with_transformers(folder: Path) -> tuple[TokenizerFolder | None, str]:
    """``AutoTokenizer.from_pretrained(folder)`` as a TokenizerFolder, or None and why not."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None, "transformers is not installed"
    # transformers logs notes (e.g. Llama's "legacy behaviour") the user cannot act on.
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # whatever transformers raises: report it, read best-effort
        return None, f"transformers' AutoTokenizer cannot load it ({type(exc).__name__}: {exc})"
    finally:
        logger.setLevel(level)
    if not getattr(tok, "is_fast", False):
        return None, f"transformers loads it only as a slow {type(tok).__name__}"
    return folder_from_transformers(tok), ""
