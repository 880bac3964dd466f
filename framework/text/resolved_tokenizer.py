"""The tokenizer as transformers resolved it, written at export and read back without it.

transformers' ``AutoTokenizer.from_pretrained`` changes a folder's ``tokenizer.json``
before using it (per-class special-token defaults, the Llama-family BOS/EOS
post-processor, the ``add_prefix_space`` rewrite, added tokens from the config), and
re-implementing that outside transformers drifts. So the export saves the result instead:
``tokenizer.json`` is the fast tokenizer's backend exactly as transformers built it
(``save_pretrained`` writes ``backend_tokenizer``), and :data:`RESOLVED_FILE` holds the
little the backend cannot carry (special-token strings, chat templates, the decode
clean-up flag, ``split_special_tokens``). Reading a folder with that file then needs only
``tokenizers`` and this file: no per-class tables, no rewriting.

transformers is never imported here; the functions that take a transformers tokenizer
receive the object from the caller (the exporter, or the loader's fallback).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers

from ..errors import ExportError, ModelLoadError
from ..jsonfile import read_json_object

__all__ = [
    "RESOLVED_FILE",
    "RESOLVED_FORMAT",
    "TokenizerFolder",
    "describe_tokenizer",
    "folder_from_transformers",
    "read_resolved_folder",
    "save_resolved_tokenizer",
]

RESOLVED_FILE = "ortgen_tokenizer.json"
#: 1: first version (special tokens, add_bos/add_eos, clean-up, chat template(s), split).
RESOLVED_FORMAT = 1
TOKENIZER_FILE = "tokenizer.json"

ChatTemplates = str | dict[str, str] | None

# Texts the export encodes and decodes with both transformers and the saved folder: a
# difference means the class does something in Python that tokenizer.json cannot carry.
PROBE_TEXTS = (
    "Hello, world! The quick brown fox.",
    "  leading spaces,\ttabs\tand\n\nnew lines  \r\n",
    "Über naïve crème — 東京 日本語のテキスト 中文 한국어",
    "مرحبا بالعالم नमस्ते दुनिया",
    "emoji 🙂🚀 👍🏽 👨‍👩‍👧 ❤️",
    "don't , isn't ? x=1 a+b 3.14",
)
PROBE_MESSAGES = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there 🙂"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Über 東京?"},
)


@dataclass
class TokenizerFolder:
    """What a folder gives a :class:`~ortgen.text.Tokenizer`, however it was read."""

    backend: tokenizers.Tokenizer
    special_tokens: dict[str, str | list[str]]
    chat_template: ChatTemplates  # one template, or transformers' dict of named ones
    chat_template_problem: str | None  # why there is no usable chat template, if known
    clean_up_tokenization_spaces: bool
    how: str = "ortgen"  # "ortgen" (this file), "transformers" or "best-effort"


# --------------------------------------------------------------------------- export side


def describe_tokenizer(tok: Any) -> dict[str, Any]:
    """The contents of :data:`RESOLVED_FILE` for the transformers fast tokenizer ``tok``."""
    import transformers  # the caller already has it: ``tok`` is one of its objects

    add_bos, add_eos = _specials_added(tok)
    return {
        "format": RESOLVED_FORMAT,
        "tokenizer_class": type(tok).__name__,
        "transformers_version": transformers.__version__,
        "special_tokens": _special_tokens_of(tok),
        # Informational: tokenizer.json's post-processor inserts them.
        "add_bos": add_bos,
        "add_eos": add_eos,
        "clean_up_tokenization_spaces": bool(tok.clean_up_tokenization_spaces),
        "split_special_tokens": bool(getattr(tok, "split_special_tokens", False)),
        "chat_template": _chat_templates_of(tok),
    }


def save_resolved_tokenizer(tok: Any, dest: str | Path) -> None:
    """Save ``tok`` (a transformers tokenizer) to ``dest`` as ortgen reads it back exactly.

    Writes transformers' own files (``save_pretrained``: tokenizer.json from the fast
    backend, tokenizer_config.json, ...; transformers can still load the folder) and
    :data:`RESOLVED_FILE`, then reads the folder back the way ortgen will and checks it
    against ``tok`` on probe texts. Raises ExportError when ``tok`` is a slow tokenizer
    (there is no backend to save; writing anything else would give different ids) or
    when the check finds a difference.
    """
    dest = Path(dest)
    if not getattr(tok, "is_fast", False):
        raise ExportError(
            f"the tokenizer is a slow {type(tok).__name__} (transformers could not build a "
            "fast tokenizer for it, e.g. sentencepiece or tiktoken is missing), so there is "
            "no tokenizer.json ortgen could read with the same results"
        )
    tok.save_pretrained(str(dest))
    content = describe_tokenizer(tok)
    text = json.dumps(content, indent=2, ensure_ascii=False) + "\n"
    (dest / RESOLVED_FILE).write_text(text, encoding="utf-8")
    check_same_results(tok, read_resolved_folder(dest), what=str(dest))


def check_same_results(tok: Any, found: TokenizerFolder, *, what: str) -> None:
    """Raise ExportError unless ``found`` encodes, decodes and renders chats like ``tok``."""
    from .tokenizer import Tokenizer  # here: tokenizer imports this module

    mine = Tokenizer.from_found(found, source=what)
    for text in PROBE_TEXTS:
        for add in (True, False):
            want = tok(text, add_special_tokens=add)["input_ids"]
            got = mine.encode(text, add_special_tokens=add)
            _same(want, got, f"encode({text!r}, add_special_tokens={add})", tok, what)
        ids = tok(text)["input_ids"]
        for skip in (True, False):
            want_text = tok.decode(ids, skip_special_tokens=skip)
            got_text = mine.decode(ids, skip_special_tokens=skip)
            _same(want_text, got_text, f"decode(ids of {text!r}, skip={skip})", tok, what)
    if not mine.has_chat_template:
        return
    try:
        messages = [dict(m) for m in PROBE_MESSAGES]
        want_chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # the template rejects these messages: nothing to compare
        return
    try:
        got_chat = mine.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as exc:  # transformers rendered it: ortgen must too
        got_chat = f"<error: {exc}>"
    _same(want_chat, got_chat, "apply_chat_template(probe messages)", tok, what)


def _same(want: Any, got: Any, call: str, tok: Any, what: str) -> None:
    if want != got:
        raise ExportError(
            f"the tokenizer saved to {what} gives different results from transformers' "
            f"{type(tok).__name__} for {call}: transformers {want!r}, ortgen {got!r} "
            "(the class changes results in Python code tokenizer.json cannot carry)"
        )


def _specials_added(tok: Any) -> tuple[bool, bool]:
    """Whether ``tok(text)`` prepends BOS / appends EOS (what its post-processor does)."""
    with_specials = tok("a b")["input_ids"]
    plain = tok("a b", add_special_tokens=False)["input_ids"]
    extra = len(with_specials) > len(plain)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    add_bos = extra and bos is not None and with_specials[0] == bos
    add_eos = extra and eos is not None and with_specials[-1] == eos
    return bool(add_bos), bool(add_eos)


def _special_tokens_of(tok: Any) -> dict[str, str | list[str]]:
    """``tok.special_tokens_map`` as plain strings: what chat templates see."""
    out: dict[str, str | list[str]] = {}
    for key, value in tok.special_tokens_map.items():
        out[key] = [str(v) for v in value] if isinstance(value, list | tuple) else str(value)
    return out


def _chat_templates_of(tok: Any) -> ChatTemplates:
    value = getattr(tok, "chat_template", None)
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    return None if value is None else str(value)


# --------------------------------------------------------------------------- run-time side


def folder_from_transformers(tok: Any) -> TokenizerFolder:
    """What a transformers fast tokenizer object gives the runtime Tokenizer: a copy of
    its backend, its special tokens, chat template(s) and flags (no file involved)."""
    backend = tokenizers.Tokenizer.from_str(tok.backend_tokenizer.to_str())
    _prepare(backend, bool(getattr(tok, "split_special_tokens", False)))
    templates = _chat_templates_of(tok)
    return TokenizerFolder(
        backend=backend,
        special_tokens=_special_tokens_of(tok),
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
