"""Reading a tokenizer from a model folder the way transformers' AutoTokenizer does.

``transformers.AutoTokenizer.from_pretrained(folder)`` changes the backend tokenizer of
``tokenizer.json`` before using it: special tokens from ``tokenizer_config.json`` /
``special_tokens_map.json`` (with per-class defaults), the BOS/EOS post-processor of the
Llama-family classes, ``add_prefix_space``, ``split_special_tokens``. This module does
the same to a ``tokenizers.Tokenizer``, so encoding gives the same ids without
transformers, and finds the folder's chat template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from ..errors import ModelLoadError
from ..jsonfile import read_json_object

__all__ = ["TOKENIZER_FILE", "TokenizerFolder", "read_tokenizer_folder", "token_id"]

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES, in its order.
_SPECIAL_ATTRS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
)

# Defaults of the transformers fast tokenizer classes that ``tokenizer_config.json`` names
# in "tokenizer_class" (used only for keys the config leaves out). "post" marks the classes
# whose __init__ rebuilds the post-processor from add_bos_token / add_eos_token
# (LlamaTokenizerFast.update_post_processor and its copies).
_LLAMA_DEFAULTS: dict[str, Any] = {
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "post": (True, False),
}
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "GPT2Tokenizer": {
        "unk_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
    },
    "Qwen2Tokenizer": {
        "unk_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    },
    "LlamaTokenizer": _LLAMA_DEFAULTS,
    "CodeLlamaTokenizer": _LLAMA_DEFAULTS,
    "GemmaTokenizer": {
        "unk_token": "<unk>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "post": (True, False),
    },
    "GPTNeoXTokenizer": {
        "unk_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "post": (False, False),
    },
    "CohereTokenizer": {
        "unk_token": "<UNK>",
        "bos_token": "<BOS_TOKEN>",
        "eos_token": "<|END_OF_TURN_TOKEN|>",
        "post": (True, False),
    },
}

_ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


@dataclass
class TokenizerFolder:
    """What a folder gives a :class:`~ortgen.tokenizer.Tokenizer`."""

    backend: tokenizers.Tokenizer
    special_tokens: dict[str, str | list[str]]
    chat_template: str | None
    chat_template_problem: str | None  # why there is no usable chat template, if known
    clean_up_tokenization_spaces: bool


def read_tokenizer_folder(folder: Path) -> TokenizerFolder:
    """Load ``tokenizer.json`` (+ ``tokenizer_config.json``, ``special_tokens_map.json``,
    ``chat_template.jinja``) from ``folder`` the way transformers does."""
    if not folder.is_dir():
        raise ModelLoadError(f"tokenizer folder {folder} does not exist or is not a folder")
    tok_file = folder / TOKENIZER_FILE
    if not tok_file.is_file():
        raise ModelLoadError(
            f"{folder} has no {TOKENIZER_FILE}; a tokenizer needs one "
            "(save it with transformers' tokenizer.save_pretrained(folder))"
        )
    try:
        backend = tokenizers.Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # the Rust side raises plain Exception
        raise ModelLoadError(f"cannot load {tok_file} with the tokenizers library: {exc}") from exc

    cfg_file = folder / TOKENIZER_CONFIG_FILE
    cfg = read_json_object(cfg_file, error=ModelLoadError) if cfg_file.is_file() else {}
    stm_file = folder / SPECIAL_TOKENS_MAP_FILE
    if "added_tokens_decoder" not in cfg and stm_file.is_file():
        # transformers' legacy path: special_tokens_map.json overrides the config.
        for key, value in read_json_object(stm_file, error=ModelLoadError).items():
            if key == "additional_special_tokens" and isinstance(value, list):
                merged = list(cfg.get("additional_special_tokens") or [])
                for item in value:
                    if item not in merged:
                        merged.append(item)
                value = merged
            cfg[key] = value

    class_name = str(cfg.get("tokenizer_class") or "").removesuffix("Fast")
    defaults = _CLASS_DEFAULTS.get(class_name, {})

    special_map = _special_tokens_from_config(cfg, defaults)
    _prepare_backend(backend, cfg, special_map)
    flat = _special_map_to_str(special_map)
    if "post" in defaults:
        _update_post_processor(backend, cfg, defaults["post"], flat, source=str(cfg_file))

    template, problem = _read_chat_template(folder, cfg)
    return TokenizerFolder(
        backend=backend,
        special_tokens=flat,
        chat_template=template,
        chat_template_problem=problem,
        clean_up_tokenization_spaces=bool(cfg.get("clean_up_tokenization_spaces", False)),
    )


def token_id(backend: tokenizers.Tokenizer, token: str, unk_token: str | None) -> int | None:
    """transformers' ``convert_tokens_to_ids``: unknown strings map to the unk id."""
    found = backend.token_to_id(token)
    return backend.token_to_id(unk_token) if found is None and unk_token else found


def _as_added_token(value: Any) -> Any:
    """A tokenizer_config value as transformers sees it: a str, an AddedToken or None."""
    if isinstance(value, dict) and "content" in value:
        return AddedToken(**{k: value[k] for k in _ADDED_TOKEN_FIELDS if k in value})
    return value


def _token_str(value: Any) -> str | None:
    if value is None:
        return None
    return value.content if isinstance(value, AddedToken) else str(value)


def _config_added_tokens(cfg: Mapping[str, Any]) -> list[tuple[int, AddedToken]]:
    """The config's ``added_tokens_decoder`` as (id, new AddedToken) pairs, in file order."""
    entries = (cfg.get("added_tokens_decoder") or {}).items()
    pairs = ((idx, _as_added_token(entry)) for idx, entry in entries)
    return [(int(idx), tok) for idx, tok in pairs if isinstance(tok, AddedToken)]


def _special_tokens_from_config(cfg: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Special tokens (str / AddedToken) by attribute name, as transformers' __init__ sets them."""
    added_map = {tok.content: tok for _, tok in _config_added_tokens(cfg)}
    special: dict[str, Any] = {}
    for attr in _SPECIAL_ATTRS:
        if attr == "additional_special_tokens":
            value = [_as_added_token(v) for v in cfg.get(attr) or []]
        else:
            value = _as_added_token(cfg[attr] if attr in cfg else defaults.get(attr))
            if added_map and value is not None:
                value = added_map.get(_token_str(value), value)
        special[attr] = value
    extra = cfg.get("extra_special_tokens") or {}
    if isinstance(extra, dict):  # transformers 4.57 accepts only the dict form
        for key, value in extra.items():
            special[key] = _as_added_token(value)
    return special


def _special_map_to_str(special: Mapping[str, Any]) -> dict[str, str | list[str]]:
    out: dict[str, str | list[str]] = {}
    for key, value in special.items():
        if isinstance(value, list):
            if value:
                out[key] = [_token_str(v) for v in value]
        elif value:
            out[key] = _token_str(value)
    return out


def _prepare_backend(
    backend: tokenizers.Tokenizer, cfg: dict[str, Any], special: Mapping[str, Any]
) -> None:
    """Apply to the backend what transformers' PreTrainedTokenizerFast.__init__ applies."""
    # Calls without padding/truncation (what tok(text) does) turn both off.
    backend.no_truncation()
    backend.no_padding()

    added = backend.get_added_tokens_decoder()
    added_reprs = {repr(t) for t in added.values()}
    # Fresh AddedToken objects: the loop below may set their ``special`` flag.
    cfg_added = sorted(_config_added_tokens(cfg), key=lambda x: x[0])
    tokens_to_add: list[Any] = [t for _, t in cfg_added if repr(t) not in added_reprs]
    encoder = [t.content for t in added.values()] + [t.content for t in tokens_to_add]

    extended: list[Any] = []  # all_special_tokens_extended
    seen: set[str] = set()
    for value in special.values():
        values = value if isinstance(value, list) else ([value] if value else [])
        new = [v for v in values if _token_str(v) not in seen]
        seen.update(_token_str(v) for v in new)
        extended.extend(new)
    special_strs = [_token_str(v) for v in extended]
    # A str compares equal to the encoder's strings; an AddedToken never does, so
    # transformers re-adds those (forcing special=True), as reproduced here.
    tokens_to_add += [t for t in extended if t not in encoder and t not in tokens_to_add]

    final: list[AddedToken] = []
    for tok in tokens_to_add:
        if isinstance(tok, AddedToken):
            tok.special = bool(tok.special or tok.content in special_strs)
            final.append(tok)
        else:
            final.append(AddedToken(str(tok), special=str(tok) in special_strs))
    if final:
        backend.add_tokens(final)

    backend.encode_special_tokens = bool(cfg.get("split_special_tokens", False))

    # add_prefix_space from the config overrides the pre-tokenizer's (as transformers does,
    # silently ignoring pre-tokenizers that cannot be rebuilt that way).
    add_prefix_space = cfg.get("add_prefix_space", False)
    try:
        state = json.loads(backend.pre_tokenizer.__getstate__())
        if state.get("add_prefix_space", add_prefix_space) != add_prefix_space:
            pre_cls = getattr(tokenizers.pre_tokenizers, state.pop("type"))
            state["add_prefix_space"] = add_prefix_space
            backend.pre_tokenizer = pre_cls(**state)
    except Exception:
        pass


def _update_post_processor(
    backend: tokenizers.Tokenizer,
    cfg: dict[str, Any],
    class_defaults: tuple[bool, bool],
    special: Mapping[str, Any],
    source: str,
) -> None:
    """LlamaTokenizerFast.update_post_processor (also Gemma, GPT-NeoX, Cohere, CodeLlama)."""
    add_bos = bool(cfg.get("add_bos_token", class_defaults[0]))
    add_eos = bool(cfg.get("add_eos_token", class_defaults[1]))
    bos = special.get("bos_token")
    eos = special.get("eos_token")
    for name, token, add in (("bos", bos, add_bos), ("eos", eos, add_eos)):
        if token is None and add:
            raise ModelLoadError(
                f"{source} sets add_{name}_token = true but no {name}_token; "
                f"set {name}_token or add_{name}_token = false"
            )

    bos_a, bos_b = (f"{bos}:0 ", f" {bos}:1") if add_bos else ("", "")
    eos_a, eos_b = (f" {eos}:0", f" {eos}:1") if add_eos else ("", "")
    single = f"{bos_a}$A:0{eos_a}"
    pair = f"{single}{bos_b} $B:1{eos_b}"
    unk = special.get("unk_token")
    special_tokens = [
        (token, token_id(backend, token, unk))
        for token, add in ((bos, add_bos), (eos, add_eos))
        if add
    ]
    try:
        backend.post_processor = tokenizers.processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special_tokens
        )
    except Exception as exc:
        raise ModelLoadError(
            f"cannot build the BOS/EOS post-processor that {source} asks for: {exc}"
        ) from exc


def _read_chat_template(folder: Path, cfg: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The chat template (chat_template.jinja first, then tokenizer_config.json) and, when
    there is none usable, why."""
    jinja_file = folder / CHAT_TEMPLATE_FILE
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8"), None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read {jinja_file}: {exc}") from exc
    value = cfg.get("chat_template")
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    if isinstance(value, list):
        named = {
            t.get("name"): t.get("template")
            for t in value
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        if "default" in named:
            return named["default"], None
        return None, (
            f"{TOKENIZER_CONFIG_FILE} lists chat templates {sorted(map(str, named))} "
            "but none named 'default'"
        )
    raise ModelLoadError(
        f"{folder / TOKENIZER_CONFIG_FILE}: chat_template is a {type(value).__name__}; it must "
        "be a string or a list of {'name': ..., 'template': ...}"
    )
