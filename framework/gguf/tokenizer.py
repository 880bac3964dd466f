"""A GGUF's tokenizer and chat template as a model folder ortgen loads, without transformers.

A GGUF carries its tokenizer in its metadata (``tokenizer.ggml.*``: the pieces, their
types, merges or scores, the special ids and the BOS/EOS flags) and its chat template
(``tokenizer.chat_template``). :func:`build_tokenizer` turns that into a ``tokenizers``
library tokenizer plus the special-token map; :func:`write_tokenizer_files` saves both the
way ortgen's export does (``tokenizer.json`` + ``ortgen_tokenizer.json``, read back by
``ortgen.text`` with the tokenizers library alone), so a folder built from a GGUF needs
neither transformers nor torch, at build time or at run time.

What the result follows, and why:

* The metadata, as llama.cpp reads it: ``tokenizer.ggml.model`` picks byte-level BPE
  ("gpt2", :mod:`.tokenizer_gpt2`) or SentencePiece BPE ("llama", :mod:`.tokenizer_spm`);
  ``tokenizer.ggml.pre`` picks the byte-level split and the decode clean-up. Other models
  ("t5", "bert", "rwkv", "plamo2", none) are refused with an
  :class:`~ortgen.errors.ExportError` naming them.
* Special tokens: the pieces typed CONTROL (3) or UNKNOWN (2) and the pieces at the
  header's bos/eos/eot/eom/unk/pad ids are special added tokens (matched whole in text,
  dropped by ``decode(skip_special_tokens=True)``); USER_DEFINED (4) pieces are plain added
  tokens, matched whole as llama.cpp does. BOS/EOS are added as
  ``tokenizer.ggml.add_bos_token``/``add_eos_token`` say (llama.cpp's default when a flag
  is missing), and the special-token strings are the pieces at the header's ids (where
  transformers guesses: for SmolLM2 it takes <|im_start|> for EOS and prepends a BOS).
* Otherwise the result equals transformers' GGUF tokenizer (``AutoTokenizer.from_pretrained(
  dir, gguf_file=...)``) with those corrections, in ids, decoded text and special tokens,
  for the architecture that normally carries the vocabulary. Where transformers reads the
  metadata wrongly (it picks its converter by architecture and ignores
  ``tokenizer.ggml.pre`` and most token types, builds a Unigram model for Gemma, drops
  Phi-3's spaces) ortgen follows the file instead; :mod:`.tokenizer_gpt2` and
  :mod:`.tokenizer_spm` say where, and the tests pin each difference.

This is the one reading of a GGUF's tokenizer in ortgen: the builder (:mod:`.build`) and
the ``export`` extra's GGUF path (``ortgen.export.gguf``, which takes only the weights
from transformers) both write the folder with :func:`write_tokenizer_files`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, processors

from ..errors import ExportError
from ..text.resolved_tokenizer import RESOLVED_FILE, RESOLVED_FORMAT, TOKENIZER_FILE
from .tokenizer_gpt2 import bpe_tokenizer, pre_style
from .tokenizer_spm import spm_tokenizer

__all__ = [
    "SUPPORTED_MODELS",
    "TokenizerInfo",
    "build_tokenizer",
    "tokenizer_from_gguf",
    "tokenizer_info",
    "write_tokenizer_files",
]

#: ``tokenizer.ggml.model`` values ortgen can build a tokenizer for.
SUPPORTED_MODELS = ("gpt2", "llama")

# llama.cpp's token types (gguf.TokenType), as stored in tokenizer.ggml.token_type.
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4
# The special roles, in transformers' special_tokens_map order, and their GGUF id keys.
_ROLE_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
}
_MAPPED_ROLES = ("bos", "eos", "unk", "pad")  # the ones transformers' special_tokens_map has
# llama.cpp's special ids for a SentencePiece vocabulary whose header names none.
_SPM_DEFAULT_IDS = {"bos": 1, "eos": 2, "unk": 0}
_TEMPLATE_KEY = "tokenizer.chat_template"
_TEMPLATE_PREFIX = _TEMPLATE_KEY + "."  # named templates: tokenizer.chat_template.<name>

ChatTemplates = str | dict[str, str] | None
GGUFSource = Any  # a GGUF path, a gguf.GGUFReader, its fields, or keys to plain values


@dataclass(frozen=True)
class TokenizerInfo:
    """What a model folder needs besides ``tokenizer.json``, read from the GGUF header.

    ``special_tokens`` is transformers' ``special_tokens_map`` (what chat templates see);
    the ids are the header's (``eot``/``eom``: the end-of-turn and end-of-message tokens
    chat models stop on besides EOS, e.g. Llama 3's ``<|eot_id|>`` and ``<|eom_id|>``).
    ``warnings`` lists where the tokenizer is a guess.
    """

    model: str  # tokenizer.ggml.model
    pre: str | None  # tokenizer.ggml.pre as the file spells it
    split: str  # the split built: "gpt2", "digits", "qwen2", "llama3" or "sentencepiece"
    special_tokens: dict[str, str]
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None
    eom_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos: bool
    add_eos: bool
    clean_up_tokenization_spaces: bool
    chat_template: ChatTemplates
    warnings: tuple[str, ...] = field(default=())

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The ids generation stops on, as llama.cpp's end-of-generation set: EOS, then the
        end-of-turn and end-of-message tokens when the header names other ones."""
        ids = (self.eos_token_id, self.eot_token_id, self.eom_token_id)
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    def generation_ids(self) -> dict[str, int | list[int]]:
        """``bos_token_id``/``eos_token_id``/``pad_token_id`` for generation_config.json
        (``eos_token_id`` a list when :attr:`eos_token_ids` has more than one)."""
        out: dict[str, int | list[int]] = {}
        if self.bos_token_id is not None:
            out["bos_token_id"] = self.bos_token_id
        eos = list(self.eos_token_ids)
        if eos:
            out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
        if self.pad_token_id is not None:
            out["pad_token_id"] = self.pad_token_id
        return out


def build_tokenizer(source: GGUFSource) -> tuple[Tokenizer, TokenizerInfo]:
    """The tokenizer and header facts of the GGUF ``source`` (see the module for the rules).

    ``source`` is a GGUF file's path, a ``gguf.GGUFReader`` (reading a large GGUF's header
    takes seconds, so a caller that has one passes it), its ``fields``, or a mapping of keys
    to plain values. Raises ExportError when the metadata has no tokenizer or one ortgen
    cannot build; warns (and lists in ``TokenizerInfo.warnings``) when the split is a guess.
    """
    meta = _Fields(source)
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise ExportError(
            "the GGUF has no tokenizer metadata (no tokenizer.ggml.model), so a tokenizer "
            "cannot be built from it; give the model folder a tokenizer.json instead"
        )
    if model not in SUPPORTED_MODELS:
        raise ExportError(
            f"the GGUF's tokenizer is tokenizer.ggml.model={model!r}; ortgen builds "
            f"tokenizers for {' and '.join(repr(m) for m in SUPPORTED_MODELS)} only "
            "(byte-level BPE and SentencePiece BPE)"
        )
    tokens = meta.strings("tokenizer.ggml.tokens")
    if not tokens:
        raise ExportError(f"the GGUF's {model!r} tokenizer has no tokenizer.ggml.tokens")
    ids = _special_ids(meta, model, len(tokens))
    unk = tokens[ids["unk"]] if "unk" in ids else None
    pre = meta.get("tokenizer.ggml.pre")
    notes: list[str] = []
    if model == "gpt2":
        merges = meta.strings("tokenizer.ggml.merges")
        if merges is None:
            raise ExportError("the GGUF's byte-level BPE vocabulary has no tokenizer.ggml.merges")
        style, note = pre_style(pre)
        notes += [note] if note else []
        tok = bpe_tokenizer(tokens, merges, style, unk)
        split, add_bos_default, clean = style.split, style.add_bos, style.clean_spaces
    else:
        scores = meta.get("tokenizer.ggml.scores")
        add_space_prefix = meta.get("tokenizer.ggml.add_space_prefix")
        tok = spm_tokenizer(
            tokens,
            scores,
            meta.strings("tokenizer.ggml.merges"),
            unk_token=unk,
            add_space_prefix=True if add_space_prefix is None else bool(add_space_prefix),
        )
        split, add_bos_default, clean = "sentencepiece", True, False
    _add_tokens(tok, tokens, meta.get("tokenizer.ggml.token_type"), ids)
    add_bos = _flag(meta, "tokenizer.ggml.add_bos_token", add_bos_default)
    add_eos = _flag(meta, "tokenizer.ggml.add_eos_token", False)
    tok.post_processor = _bos_eos_template(tokens, ids, add_bos, add_eos)
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    info = TokenizerInfo(
        model=model,
        pre=pre,
        split=split,
        special_tokens={f"{r}_token": tokens[ids[r]] for r in _MAPPED_ROLES if r in ids},
        bos_token_id=ids.get("bos"),
        eos_token_id=ids.get("eos"),
        eot_token_id=ids.get("eot"),
        eom_token_id=ids.get("eom"),
        unk_token_id=ids.get("unk"),
        pad_token_id=ids.get("pad"),
        add_bos=add_bos,
        add_eos=add_eos,
        clean_up_tokenization_spaces=clean,
        chat_template=_chat_templates(meta),
        warnings=tuple(notes),
    )
    return tok, info


def tokenizer_from_gguf(source: GGUFSource) -> Tokenizer:
    """The ``tokenizers`` tokenizer of the GGUF ``source`` (see :func:`build_tokenizer`)."""
    return build_tokenizer(source)[0]


def tokenizer_info(source: GGUFSource) -> TokenizerInfo:
    """The special tokens, flags and chat template of the GGUF ``source``."""
    return build_tokenizer(source)[1]


def write_tokenizer_files(source: GGUFSource, dest: str | Path) -> TokenizerInfo:
    """Write the GGUF's tokenizer into the folder ``dest`` as ortgen's export writes one.

    ``tokenizer.json`` and ``ortgen_tokenizer.json`` are what ortgen reads (without
    transformers); ``tokenizer_config.json``, ``special_tokens_map.json`` and
    ``chat_template.jinja`` are there so transformers loads the folder to the same results.
    generation_config.json is the model's: :meth:`TokenizerInfo.generation_ids` has its ids.
    """
    tok, info = build_tokenizer(source)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / TOKENIZER_FILE))
    resolved = {
        "format": RESOLVED_FORMAT,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "source": {"gguf_tokenizer": info.model, "gguf_pre": info.pre, "split": info.split},
        "special_tokens": info.special_tokens,
        "add_bos": info.add_bos,  # informational: tokenizer.json's post-processor adds them
        "add_eos": info.add_eos,
        "clean_up_tokenization_spaces": info.clean_up_tokenization_spaces,
        "split_special_tokens": False,
        "chat_template": info.chat_template,
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **info.special_tokens,
        "clean_up_tokenization_spaces": info.clean_up_tokenization_spaces,
        "model_max_length": int(1e30),  # transformers' "no limit"; the model config has one
    }
    template, jinja = info.chat_template, dest / "chat_template.jinja"
    if isinstance(template, str):
        jinja.write_text(template, encoding="utf-8")
    else:  # transformers reads chat_template.jinja first: a stale one must not stay
        jinja.unlink(missing_ok=True)
        if template is not None:  # transformers' list form keeps the names
            config["chat_template"] = [{"name": k, "template": v} for k, v in template.items()]
    _write_json(dest / RESOLVED_FILE, resolved)
    _write_json(dest / "tokenizer_config.json", config)
    _write_json(dest / "special_tokens_map.json", info.special_tokens)
    return info


class _Fields:
    """GGUF metadata values by key, from a reader, its fields or plain values."""

    def __init__(self, source: GGUFSource) -> None:
        if isinstance(source, str | Path):
            source = _read_header(Path(source))
        fields = getattr(source, "fields", source)
        if not isinstance(fields, Mapping):
            raise TypeError(
                f"expected a GGUF path, a gguf.GGUFReader or a mapping of GGUF keys, got "
                f"{type(source).__name__}"
            )
        self._fields: Mapping[str, Any] = fields

    def names(self) -> Iterable[str]:
        return self._fields.keys()

    def get(self, key: str) -> Any:
        value = self._fields.get(key)
        contents = getattr(value, "contents", None)
        return contents() if callable(contents) else value

    def strings(self, key: str) -> list[str] | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise ExportError(f"the GGUF's {key} is not a list of strings")
        return list(value)


def _read_header(path: Path) -> Any:
    from gguf import GGUFReader  # imported here: reading values needs none of it

    try:
        return GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError, OSError, struct errors...
        raise ExportError(f"cannot read the GGUF header of {path}: {exc}") from exc


def _special_ids(meta: _Fields, model: str, n_tokens: int) -> dict[str, int]:
    """The header's special ids by role (llama.cpp's defaults for a SentencePiece vocabulary
    whose header has none; transformers cannot load such a file at all)."""
    ids: dict[str, int] = {}
    for role, key in _ROLE_KEYS.items():
        value = meta.get(key)
        if value is None and model == "llama":
            value = _SPM_DEFAULT_IDS.get(role)
        if value is None:
            continue
        if not 0 <= int(value) < n_tokens:
            raise ExportError(f"the GGUF's {key} is {value}, outside its {n_tokens} tokens")
        ids[role] = int(value)
    return ids


def _add_tokens(
    tok: Tokenizer, tokens: list[str], types: list[int] | None, ids: dict[str, int]
) -> None:
    """Register the special and user-defined pieces as added tokens (see the module)."""
    types = list(types) if types is not None else []
    if types and len(types) != len(tokens):
        raise ExportError(
            f"the GGUF has {len(tokens)} tokens but {len(types)} tokenizer.ggml.token_type"
        )
    special = {i for i, t in enumerate(types) if t in (_UNKNOWN, _CONTROL)} | set(ids.values())
    user = [i for i, t in enumerate(types) if t == _USER_DEFINED and i not in special]
    tok.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special)]
    )
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])


def _flag(meta: _Fields, key: str, default: bool) -> bool:
    value = meta.get(key)
    return default if value is None else bool(value)


def _bos_eos_template(
    tokens: list[str], ids: dict[str, int], add_bos: bool, add_eos: bool
) -> processors.TemplateProcessing:
    """The post-processor adding BOS/EOS, as transformers' LlamaTokenizerFast writes it."""
    for role, wanted in (("bos", add_bos), ("eos", add_eos)):
        if wanted and role not in ids:
            raise ExportError(
                f"the GGUF asks for a {role.upper()} token at the start/end of every text "
                f"(tokenizer.ggml.add_{role}_token) but names no {role} token id"
            )
    bos = [tokens[ids["bos"]]] if add_bos else []
    eos = [tokens[ids["eos"]]] if add_eos else []
    single = [*(f"{t}:0" for t in bos), "$A:0", *(f"{t}:0" for t in eos)]
    pair = [*single, *(f"{t}:1" for t in bos), "$B:1", *(f"{t}:1" for t in eos)]
    specials = [(tokens[ids[r]], ids[r]) for r, on in (("bos", add_bos), ("eos", add_eos)) if on]
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(dict.fromkeys(specials))
    )


def _chat_templates(meta: _Fields) -> ChatTemplates:
    """``tokenizer.chat_template``, or all templates by name when the GGUF has named ones
    (``tokenizer.chat_template.<name>``, as llama.cpp's converter stores a list)."""
    default = meta.get(_TEMPLATE_KEY)
    named = {
        key[len(_TEMPLATE_PREFIX) :]: meta.get(key)
        for key in meta.names()
        if key.startswith(_TEMPLATE_PREFIX)
    }
    for key, value in [(_TEMPLATE_KEY, default), *named.items()]:
        if value is not None and not isinstance(value, str):
            raise ExportError(f"the GGUF's chat template {key!r} is not a string")
    if not named:
        return default
    return {**({"default": default} if default is not None else {}), **named}


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
