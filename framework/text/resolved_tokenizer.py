"""The tokenizer as transformers resolved it, written at export and read back without it.

transformers' ``AutoTokenizer.from_pretrained`` changes a folder's ``tokenizer.json``
before using it (per-class special-token defaults, the Llama-family BOS/EOS
post-processor, the ``add_prefix_space`` rewrite, added tokens from the config), and
re-implementing that outside transformers drifts. So the export saves the result instead
(``ortgen.export.tokenizer_export``; this module is the reading side):
``tokenizer.json`` is the fast tokenizer's backend exactly as transformers built it
(``save_pretrained`` writes ``backend_tokenizer``), and :data:`RESOLVED_FILE` holds the
little the backend cannot carry (special-token strings, chat templates, the decode
clean-up flag, ``split_special_tokens``). Reading a folder with that file then needs only
``tokenizers`` and this file: no per-class tables, no rewriting.

transformers is never imported here; the functions that take a transformers tokenizer
receive the object from the caller (the exporter, or the loader's fallback).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers

from ..errors import ModelLoadError
from ..util.jsonfile import read_json_object

__all__ = [
    "RESOLVED_FILE",
    "RESOLVED_FORMAT",
    "TokenizerFolder",
    "chat_templates_of",
    "folder_from_transformers",
    "read_resolved_folder",
    "special_tokens_of",
]

RESOLVED_FILE = "ortgen_tokenizer.json"
#: 1: first version (special tokens, add_bos/add_eos, clean-up, chat template(s), split).
RESOLVED_FORMAT = 1
TOKENIZER_FILE = "tokenizer.json"

ChatTemplates = str | dict[str, str] | None


@dataclass
class TokenizerFolder:
    """What a folder gives a :class:`~ortgen.text.Tokenizer`, however it was read."""

    backend: tokenizers.Tokenizer
    special_tokens: dict[str, str | list[str]]
    chat_template: ChatTemplates  # one template, or transformers' dict of named ones
    chat_template_problem: str | None  # why there is no usable chat template, if known
    clean_up_tokenization_spaces: bool
    how: str = "ortgen"  # "ortgen" (this file), "transformers" or "best-effort"


def special_tokens_of(tok: Any) -> dict[str, str | list[str]]:
    """``tok.special_tokens_map`` as plain strings: what chat templates see."""
    out: dict[str, str | list[str]] = {}
    for key, value in tok.special_tokens_map.items():
        out[key] = [str(v) for v in value] if isinstance(value, list | tuple) else str(value)
    return out


def chat_templates_of(tok: Any) -> ChatTemplates:
    value = getattr(tok, "chat_template", None)
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    return None if value is None else str(value)


def folder_from_transformers(tok: Any) -> TokenizerFolder:
    """What a transformers fast tokenizer object gives the runtime Tokenizer: a copy of
    its backend, its special tokens, chat template(s) and flags (no file involved)."""
    backend = tokenizers.Tokenizer.from_str(tok.backend_tokenizer.to_str())
    _prepare(backend, bool(getattr(tok, "split_special_tokens", False)))
    templates = chat_templates_of(tok)
    return TokenizerFolder(
        backend=backend,
        special_tokens=special_tokens_of(tok),
        chat_template=templates,
        chat_template_problem=_template_problem(templates, "the tokenizer"),
        clean_up_tokenization_spaces=bool(tok.clean_up_tokenization_spaces),
        how="transformers",
    )


def read_resolved_folder(folder: Path) -> TokenizerFolder:
    """Read a folder ortgen's export wrote: tokenizer.json as is, plus :data:`RESOLVED_FILE`."""
    path = folder / RESOLVED_FILE
    data = read_json_object(path, error=ModelLoadError)
    if data.get("format") != RESOLVED_FORMAT:
        raise ModelLoadError(
            f"{path} has format {data.get('format')!r}; this ortgen reads format "
            f"{RESOLVED_FORMAT} (re-export the model with this ortgen)"
        )
    backend = load_backend(folder)
    _prepare(backend, _typed(data, "split_special_tokens", bool, path, default=False))
    special = _typed(data, "special_tokens", dict, path, default={})
    for key, value in special.items():
        if not (isinstance(value, str) or _is_str_list(value)):
            raise ModelLoadError(f"{path}: special_tokens[{key!r}] must be a string or strings")
    templates = data.get("chat_template")
    if not (templates is None or isinstance(templates, str) or _is_str_dict(templates)):
        raise ModelLoadError(
            f"{path}: chat_template must be null, a string or an object of named strings"
        )
    return TokenizerFolder(
        backend=backend,
        special_tokens=special,
        chat_template=templates,
        chat_template_problem=_template_problem(templates, str(path)),
        clean_up_tokenization_spaces=_typed(
            data, "clean_up_tokenization_spaces", bool, path, default=False
        ),
        how="ortgen",
    )


def load_backend(folder: Path) -> tokenizers.Tokenizer:
    """``folder/tokenizer.json`` with the tokenizers library, or ModelLoadError saying why."""
    tok_file = folder / TOKENIZER_FILE
    if not tok_file.is_file():
        raise ModelLoadError(
            f"{folder} has no {TOKENIZER_FILE}; a tokenizer needs one "
            "(save it with transformers' tokenizer.save_pretrained(folder))"
        )
    try:
        return tokenizers.Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # the Rust side raises plain Exception
        raise ModelLoadError(f"cannot load {tok_file} with the tokenizers library: {exc}") from exc


def _prepare(backend: tokenizers.Tokenizer, split_special_tokens: bool) -> None:
    """What transformers does around every plain ``tok(text)`` call: no truncation or
    padding (tokenizer.json may carry them), and its ``split_special_tokens`` flag (a
    runtime switch of the backend that tokenizer.json does not store)."""
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = split_special_tokens


def _template_problem(templates: ChatTemplates, where: str) -> str | None:
    if isinstance(templates, dict) and "default" not in templates:
        return f"{where} lists chat templates {sorted(templates)} but none named 'default'"
    return None


def _typed(data: Mapping[str, Any], key: str, kind: type, path: Path, *, default: Any) -> Any:
    value = data.get(key, default)
    if not isinstance(value, kind):
        raise ModelLoadError(f"{path}: {key} must be a {kind.__name__}, got {value!r}")
    return value


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_str_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
