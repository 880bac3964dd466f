"""Best-effort reading of a tokenizer folder ortgen did not export, without transformers.

Used only when a folder has no ``ortgen_tokenizer.json`` (it was written by optimum,
onnxruntime-genai or by hand) and transformers cannot be used to resolve it. transformers'
``AutoTokenizer.from_pretrained(folder)`` changes the backend of ``tokenizer.json``
before using it: special tokens from ``tokenizer_config.json`` / ``special_tokens_map.json``
(with per-class defaults), the BOS/EOS post-processor of the Llama-family classes,
``add_prefix_space``, ``split_special_tokens``. This module copies what it knows of that
(transformers 4.57) onto a ``tokenizers.Tokenizer``; it cannot follow other tokenizer
classes, Python-level overrides or a reconversion from a slow (sentencepiece) tokenizer,
so loading warns, naming what may differ.

A folder written by transformers 5 with its generic class (``TokenizersBackend``, what
onnxruntime-genai 0.18's builder writes) follows 5.x's rules where they differ from
4.57's, each checked against transformers 5.24: ``add_prefix_space`` in the config does not
rewrite the pre-tokenizer, special tokens already in ``tokenizer.json`` are recognised by
their text (not re-added), and ``extra_special_tokens`` may be a list.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken

from ..errors import ModelLoadError
from ..util.jsonfile import read_json_object
from .resolved_tokenizer import RESOLVED_FILE, TokenizerFolder, load_backend

__all__ = ["TOKENIZER_CONFIG_FILE", "V5_GENERIC_CLASS", "read_best_effort", "token_id"]

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"

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

#: the generic class transformers 5 writes into tokenizer_config.json (4.x has no such class)
V5_GENERIC_CLASS = "TokenizersBackend"

_ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def read_best_effort(folder: Path, *, why: str) -> TokenizerFolder:
    """Load ``tokenizer.json`` (+ ``tokenizer_config.json``, ``special_tokens_map.json``,
    ``chat_template.jinja``) from ``folder`` as close to transformers as ortgen knows how,
    warning that ids may differ. ``why`` says why transformers was not used."""
    backend = load_backend(folder)
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
    v5 = class_name == V5_GENERIC_CLASS
    warnings.warn(_caveats(folder, cfg, class_name, why), stacklevel=4)

    special_map = _special_tokens_from_config(cfg, defaults, v5=v5)
    _prepare_backend(backend, cfg, special_map, source=str(cfg_file), v5=v5)
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
        how="best-effort",
    )


def _caveats(folder: Path, cfg: Mapping[str, Any], class_name: str, why: str) -> str:
    """The warning of a best-effort load: what it cannot reproduce for this folder."""
    v5 = class_name == V5_GENERIC_CLASS
    if not class_name:
        cannot = ["the defaults of the tokenizer class transformers would pick from config.json"]
    elif class_name == "PreTrainedTokenizer":  # the generic class: no defaults to miss
        cannot = []
    elif v5:  # transformers 5's generic class: none either
        cannot = ["transformers 5's rules beyond those for special tokens and add_prefix_space"]
    elif class_name in _CLASS_DEFAULTS:
        cannot = [
            f"tokenizer class {class_name}'s defaults beyond its special tokens and BOS/EOS "
            "post-processor (as of transformers 4.57)"
        ]
    else:
        cannot = [f"tokenizer class {class_name}'s defaults (ortgen has no table for it)"]
    cannot.append("Python-level changes the class makes to encode/decode")
    needed = "transformers >= 5" if v5 else "transformers"
    if cfg.get("add_prefix_space") is not None and not v5:
        cannot.append(
            "the add_prefix_space rewrite (only pre-tokenizers with an add_prefix_space "
            "field are rewritten; a reconversion from a slow tokenizer is not possible)"
        )
    return (
        f"the tokenizer in {folder} was not written by ortgen's export ({RESOLVED_FILE} is "
        f"missing) and {why}; it is read best-effort, which cannot reproduce: "
        f"{'; '.join(cannot)}. Token ids may differ from transformers'. Re-export the "
        f"model with ortgen (or install {needed}) to get transformers' exact tokenizer."
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


def _token_str(value: Any) -> str:
    """A special token's text (an AddedToken's content); callers skip empty values."""
    return value.content if isinstance(value, AddedToken) else str(value)


def _config_added_tokens(cfg: Mapping[str, Any]) -> list[tuple[int, AddedToken]]:
    """The config's ``added_tokens_decoder`` as (id, new AddedToken) pairs, in file order."""
    entries = (cfg.get("added_tokens_decoder") or {}).items()
    pairs = ((idx, _as_added_token(entry)) for idx, entry in entries)
    return [(int(idx), tok) for idx, tok in pairs if isinstance(tok, AddedToken)]


def _special_tokens_from_config(
    cfg: dict[str, Any], defaults: Mapping[str, Any], *, v5: bool = False
) -> dict[str, Any]:
    """Special tokens (str / AddedToken) by attribute name, as transformers' __init__ sets them
    (``v5``: transformers 5's generic class, whose ``extra_special_tokens`` may be a list)."""
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
    elif v5 and isinstance(extra, list):  # 5.x: the list replaced additional_special_tokens
        listed = special["additional_special_tokens"]
        texts = {_token_str(v) for v in listed}
        extras = [_as_added_token(v) for v in extra]
        listed.extend(v for v in extras if _token_str(v) not in texts)
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
    backend: tokenizers.Tokenizer,
    cfg: dict[str, Any],
    special: Mapping[str, Any],
    *,
    source: str,
    v5: bool = False,
) -> None:
    """Apply to the backend what transformers' PreTrainedTokenizerFast.__init__ applies
    (``v5``: what transformers 5's TokenizersBackend.__init__ applies; see the module)."""
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
    # transformers 4.57 re-adds those (forcing special=True), as reproduced here; 5.x
    # compares their text.
    if v5:
        tokens_to_add += [
            t for t in extended if _token_str(t) not in encoder and t not in tokens_to_add
        ]
    else:
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

    # add_prefix_space from the config overrides the pre-tokenizer's, as transformers does.
    # transformers ignores every failure here; only "no pre-tokenizer" and "one without
    # that field" are harmless, so anything else is reported.
    # transformers 5's generic class leaves the pre-tokenizer alone; None (what 5.x writes
    # when unset) fails 4.57's rebuild, which it ignores: the pre-tokenizer stays as it is.
    add_prefix_space = cfg.get("add_prefix_space", False)
    if v5 or add_prefix_space is None or backend.pre_tokenizer is None:
        return
    state = json.loads(backend.pre_tokenizer.__getstate__())
    if state.get("add_prefix_space", add_prefix_space) == add_prefix_space:
        return
    kind = state.pop("type", None)
    try:
        pre_cls = getattr(tokenizers.pre_tokenizers, str(kind))
        state["add_prefix_space"] = add_prefix_space
        backend.pre_tokenizer = pre_cls(**state)
    except Exception as exc:  # the Rust constructors raise plain Exception
        warnings.warn(
            f"{source} sets add_prefix_space={add_prefix_space}, but the {kind} pre-tokenizer "
            f"of tokenizer.json could not be rebuilt with it ({exc}); it keeps "
            f"add_prefix_space={not add_prefix_space}, so ids of text at the start may "
            "differ from transformers'",
            stacklevel=5,
        )


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
        (token, token_id(backend, str(token), unk))
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


def _read_chat_template(
    folder: Path, cfg: Mapping[str, Any]
) -> tuple[str | dict[str, str] | None, str | None]:
    """The chat template(s), found as transformers finds them, and, when there is none
    usable, why: chat_template.jinja ("default") and additional_chat_templates/*.jinja
    first, else tokenizer_config.json's string or list of named templates. Several
    templates come back as transformers' dict of named templates."""
    named: dict[str, str] = {}
    jinja_file = folder / CHAT_TEMPLATE_FILE
    files = [("default", jinja_file)] if jinja_file.is_file() else []
    extra_dir = folder / CHAT_TEMPLATE_DIR
    if extra_dir.is_dir():
        files += [(f.name.removesuffix(".jinja"), f) for f in sorted(extra_dir.glob("*.jinja"))]
    for name, path in files:
        try:
            named[name] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not named:
        value = cfg.get("chat_template")
        if value is None or isinstance(value, str):
            return value, None
        if not isinstance(value, list):
            raise ModelLoadError(
                f"{folder / TOKENIZER_CONFIG_FILE}: chat_template is a {type(value).__name__}; "
                "it must be a string or a list of {'name': ..., 'template': ...}"
            )
        named = {
            str(t.get("name")): t["template"]
            for t in value
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
    if list(named) == ["default"]:
        return named["default"], None
    if "default" in named:
        return named, None
    return named, f"{folder} lists chat templates {sorted(named)} but none named 'default'"
