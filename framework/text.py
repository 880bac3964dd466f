"""Text handling at run time: tokenizer, chat template, streaming detokenizer, stop strings.

ortgen never imports ``transformers`` or ``torch`` at run time. The tokenizer is the
``tokenizers`` library (the Rust tokenizer transformers' fast tokenizers wrap) and the
chat template is rendered with ``jinja2`` exactly the way transformers renders it
(``transformers.utils.chat_template_utils``). Loading a folder reproduces what
``transformers.AutoTokenizer.from_pretrained(folder)`` does to the backend tokenizer
(special tokens from ``tokenizer_config.json`` / ``special_tokens_map.json``, the
BOS/EOS post-processor of the Llama-family classes, ``add_prefix_space``,
``split_special_tokens``, ``clean_up_tokenization_spaces``), so ``encode``, ``decode``
and ``apply_chat_template`` give the same results as transformers on the same folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import tokenizers
from tokenizers import AddedToken

from .errors import InputError, ModelLoadError

__all__ = [
    "IncrementalDetokenizer",
    "StopStringMatcher",
    "Tokenizer",
    "load_tokenizer",
]

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
    "LlamaTokenizer": {
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "post": (True, False),
    },
    "CodeLlamaTokenizer": {
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "post": (True, False),
    },
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


def clean_up_tokenization(text: str) -> str:
    """transformers' ``PreTrainedTokenizerBase.clean_up_tokenization``, verbatim."""
    for old, new in _CLEAN_UP_REPLACEMENTS:
        text = text.replace(old, new)
    return text


_CLEAN_UP_REPLACEMENTS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


# --------------------------------------------------------------------------- loading


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}; it must be a JSON object") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} holds a JSON {type(data).__name__}; it must be an object")
    return data


def _as_added_token(value: Any) -> Any:
    """A tokenizer_config value as transformers sees it: a str, an AddedToken or None."""
    if isinstance(value, dict) and "content" in value:
        return AddedToken(**{k: value[k] for k in _ADDED_TOKEN_FIELDS if k in value})
    return value


def _token_str(value: Any) -> str | None:
    if value is None:
        return None
    return value.content if isinstance(value, AddedToken) else str(value)


def load_tokenizer(path: str | Path) -> Tokenizer | None:
    """The tokenizer of the model folder ``path``, or None when it has no tokenizer.json.

    Without a tokenizer the model can still generate from token ids.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"model folder {folder} does not exist or is not a folder")
    if not (folder / TOKENIZER_FILE).is_file():
        return None
    return Tokenizer.from_folder(folder)


class Tokenizer:
    """A model's tokenizer and chat template, equal in results to transformers' AutoTokenizer.

    Build it with :meth:`from_folder` (or :func:`load_tokenizer`).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: Mapping[str, str | list[str]] | None = None,
        chat_template: str | None = None,
        clean_up_tokenization_spaces: bool = False,
        source: str = "<memory>",
    ) -> None:
        self._tok = backend
        self._source = source
        self._special_map: dict[str, str | list[str]] = {
            k: (list(v) if isinstance(v, list) else v)
            for k, v in (special_tokens or {}).items()
            if v
        }
        self._chat_template = chat_template
        self._chat_template_problem: str | None = None
        self._compiled_template: Any = None
        self._byte_ids: frozenset[int] | None = None
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self._special_ids = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        )

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` (+ ``tokenizer_config.json``, ``special_tokens_map.json``,
        ``chat_template.jinja``) from the model folder ``path`` the way transformers does."""
        folder = Path(path)
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
            raise ModelLoadError(
                f"cannot load {tok_file} with the tokenizers library: {exc}"
            ) from exc

        cfg_file = folder / TOKENIZER_CONFIG_FILE
        cfg = _read_json(cfg_file) if cfg_file.is_file() else {}
        cfg = dict(cfg)
        stm_file = folder / SPECIAL_TOKENS_MAP_FILE
        if "added_tokens_decoder" not in cfg and stm_file.is_file():
            # transformers' legacy path: special_tokens_map.json overrides the config.
            for key, value in _read_json(stm_file).items():
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
        tok = cls(
            backend,
            special_tokens=flat,
            chat_template=template,
            clean_up_tokenization_spaces=bool(cfg.get("clean_up_tokenization_spaces", False)),
            source=str(folder),
        )
        tok._chat_template_problem = problem
        return tok

    # ------------------------------------------------------------------ properties

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (transformers' ``len(tokenizer)``)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens_map(self) -> dict[str, str | list[str]]:
        """Special token names to strings, as transformers' ``special_tokens_map``."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self._special_map.items()}

    def _special(self, name: str) -> str | None:
        value = self._special_map.get(name)
        return value if isinstance(value, str) else None

    @property
    def bos_token(self) -> str | None:
        return self._special("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._special("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self._special("pad_token")

    @property
    def unk_token(self) -> str | None:
        return self._special("unk_token")

    def _id_of(self, token: str | None) -> int | None:
        # transformers' convert_tokens_to_ids: unknown strings map to the unk id.
        if token is None:
            return None
        tid = self._tok.token_to_id(token)
        if tid is None and self.unk_token is not None:
            tid = self._tok.token_to_id(self.unk_token)
        return tid

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id_of(self.pad_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id_of(self.unk_token)

    @property
    def all_special_tokens(self) -> list[str]:
        """The unique special token strings, in transformers' order."""
        out: list[str] = []
        for value in self._special_map.values():
            for tok in value if isinstance(value, list) else [value]:
                if tok not in out:
                    out.append(tok)
        return out

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of :attr:`all_special_tokens` (transformers' ``all_special_ids``)."""
        ids = (self._id_of(t) for t in self.all_special_tokens)
        return [i for i in ids if i is not None]

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids ``decode(..., skip_special_tokens=True)`` drops (added tokens marked special)."""
        return self._special_ids

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self._source!r}, vocab_size={self.vocab_size}, "
            f"eos_token={self.eos_token!r}, chat_template={self.has_chat_template})"
        )

    # ------------------------------------------------------------------ encode / decode

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, as transformers' ``tokenizer(text)["input_ids"]``."""
        if not isinstance(text, str):
            raise InputError(f"encode() needs a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(
        self, texts: Sequence[str], *, add_special_tokens: bool = True
    ) -> list[list[int]]:
        """Token ids of each text (no padding), as ``tokenizer(texts)["input_ids"]``."""
        if isinstance(texts, str):
            raise InputError("encode_batch() needs a list of str, got one str; use encode()")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"encode_batch(): texts[{i}] is a {type(text).__name__}, not str")
        encodings = self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``, as transformers' ``tokenizer.decode(ids, skip_special_tokens=...)``
        (including its ``clean_up_tokenization_spaces`` clean-up when the config asks for it)."""
        text = self._tok.decode(_check_ids(ids), skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text

    def _raw_decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def _byte_fallback_ids(self) -> frozenset[int]:
        """Ids of the <0x00>..<0xFF> tokens when the decoder has a ByteFallback step."""
        if self._byte_ids is None:
            ids: frozenset[int] = frozenset()
            decoder = self._tok.decoder
            if decoder is not None and '"ByteFallback"' in decoder.__getstate__().decode():
                found = (self._tok.token_to_id(f"<0x{b:02X}>") for b in range(256))
                ids = frozenset(i for i in found if i is not None)
            self._byte_ids = ids
        return self._byte_ids

    # ------------------------------------------------------------------ chat template

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The chat prompt for ``messages``, as transformers'
        ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``.

        ``extra`` keyword arguments are passed to the template like transformers does
        (``tools=[...]``, ``documents=[...]``, ``enable_thinking=...``, ...); they override
        the special tokens (``bos_token``, ``eos_token``, ...) the template also sees.
        """
        template = self._compiled()
        msgs = _check_messages(messages)
        context: dict[str, Any] = {"tools": None, "documents": None}
        context.update(self.special_tokens_map)
        context.update(extra)
        context["messages"] = msgs
        context["add_generation_prompt"] = add_generation_prompt
        import jinja2

        try:
            return template.render(**context)
        except jinja2.TemplateError as exc:
            raise InputError(
                f"the chat template of {self._source} rejected the messages: {exc}"
            ) from exc

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> list[int]:
        """Token ids of the chat prompt, as ``apply_chat_template(..., tokenize=True)``
        (the rendered text encoded without adding special tokens)."""
        text = self.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **extra
        )
        return self.encode(text, add_special_tokens=False)

    def _compiled(self) -> Any:
        if self._chat_template is None:
            detail = f" ({self._chat_template_problem})" if self._chat_template_problem else ""
            raise InputError(
                f"the model in {self._source} has no chat template{detail}, so chat messages "
                "cannot be turned into a prompt; use generate() with plain text instead"
            )
        if self._compiled_template is None:
            import jinja2

            try:
                self._compiled_template = _compile_jinja_template(self._chat_template)
            except jinja2.TemplateSyntaxError as exc:
                raise ModelLoadError(
                    f"the chat template of {self._source} is not valid Jinja "
                    f"(line {exc.lineno}: {exc.message}); fix chat_template.jinja"
                ) from exc
        return self._compiled_template


def _check_ids(ids: Iterable[int]) -> list[int]:
    if isinstance(ids, int | str | bytes):
        raise InputError(f"token ids must be a sequence of int, got {type(ids).__name__}")
    out: list[int] = []
    for i, tid in enumerate(ids):
        try:
            value = int(tid)
        except (TypeError, ValueError):
            raise InputError(
                f"token ids must be int, but item {i} is {tid!r} ({type(tid).__name__})"
            ) from None
        if value < 0 or value != tid:
            raise InputError(f"token ids must be non-negative integers, but item {i} is {tid!r}")
        out.append(value)
    return out


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    shape = "a list of {'role': str, 'content': str} dicts"
    if not isinstance(messages, list | tuple):
        raise InputError(f"messages must be {shape}, got {type(messages).__name__}")
    if not messages:
        raise InputError(f"messages is empty; it must be {shape} with at least one message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise InputError(
                f"messages[{i}] is a {type(msg).__name__}; each message must be a dict with "
                "'role' and 'content' strings"
            )
        for key in ("role", "content"):
            if key not in msg:
                raise InputError(
                    f"messages[{i}] has no {key!r}; each message needs 'role' and 'content' "
                    f"strings, got keys {sorted(map(str, msg))}"
                )
            if not isinstance(msg[key], str):
                raise InputError(
                    f"messages[{i}][{key!r}] is a {type(msg[key]).__name__}; it must be a str"
                )
        out.append(dict(msg))
    return out


def _special_tokens_from_config(cfg: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Special tokens (str / AddedToken) by attribute name, as transformers' __init__ sets them."""
    added_map: dict[str, AddedToken] = {}
    for entry in (cfg.get("added_tokens_decoder") or {}).values():
        tok = _as_added_token(entry)
        if isinstance(tok, AddedToken):
            added_map[tok.content] = tok
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
    cfg_added: list[tuple[int, AddedToken]] = []
    for idx, entry in (cfg.get("added_tokens_decoder") or {}).items():
        tok = _as_added_token(entry)
        if isinstance(tok, AddedToken):
            cfg_added.append((int(idx), tok))
    tokens_to_add: list[Any] = [t for _, t in sorted(cfg_added, key=lambda x: x[0])]
    tokens_to_add = [t for t in tokens_to_add if repr(t) not in added_reprs]
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
    if bos is None and add_bos:
        raise ModelLoadError(
            f"{source} sets add_bos_token = true but no bos_token; "
            "set bos_token or add_bos_token = false"
        )
    if eos is None and add_eos:
        raise ModelLoadError(
            f"{source} sets add_eos_token = true but no eos_token; "
            "set eos_token or add_eos_token = false"
        )

    def tid(token: str) -> int | None:
        found = backend.token_to_id(token)
        unk = special.get("unk_token")
        return backend.token_to_id(unk) if found is None and unk else found

    single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
    pair = (
        f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1"
        f"{(' ' + eos + ':1') if add_eos else ''}"
    )
    special_tokens = []
    if add_bos:
        special_tokens.append((bos, tid(bos)))
    if add_eos:
        special_tokens.append((eos, tid(eos)))
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


def _compile_jinja_template(source: str) -> Any:
    """Compile like transformers' ``_compile_jinja_template``: an immutable sandbox with
    trim_blocks, lstrip_blocks, loop controls, the ``{% generation %}`` tag, and the
    ``raise_exception``, ``strftime_now`` and ``tojson`` helpers."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        # transformers' AssistantTracker; only the assistant mask (unused here) differs.
        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_generation_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation_support(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


# --------------------------------------------------------------------------- streaming

# A pending (not yet shown) stretch longer than this many tokens only happens with invalid
# byte sequences; the detokenizer then releases text at a token boundary where decoding
# restarts cleanly: the text decoded in two parts there equals the text decoded in one,
# with _SYNC_TAIL tokens of look-ahead (lossy UTF-8 decoding settles a boundary from the
# next byte already; the margin is for decoders that work on runs of byte tokens). So the
# window stays bounded and the text exact.
_MAX_PENDING = 8
_SYNC_TAIL = 4
# Last resort for decoders where no such boundary shows up (a byte-fallback run longer
# than this, which no real text produces): release the text as it decodes now.
_HARD_LIMIT = 64


class _StreamingReplace:
    """``str.replace(old, new)`` over a text that arrives in pieces, holding back at most
    ``len(old) - 1`` characters."""

    __slots__ = ("_buf", "_new", "_old", "_prefixes")

    def __init__(self, old: str, new: str) -> None:
        self._old, self._new, self._buf = old, new, ""
        self._prefixes = [old[:k] for k in range(len(old) - 1, 0, -1)]

    def feed(self, text: str) -> str:
        buf = self._buf + text
        out = []
        while (i := buf.find(self._old)) >= 0:
            out.append(buf[:i])
            out.append(self._new)
            buf = buf[i + len(self._old) :]
        hold = next((len(p) for p in self._prefixes if buf.endswith(p)), 0)
        cut = len(buf) - hold
        out.append(buf[:cut])
        self._buf = buf[cut:]
        return "".join(out)

    def flush(self) -> str:
        buf, self._buf = self._buf, ""
        return buf


class _StreamingCleanUp:
    """transformers' clean_up_tokenization applied to a stream (bounded look-behind)."""

    def __init__(self) -> None:
        self._stages = [_StreamingReplace(old, new) for old, new in _CLEAN_UP_REPLACEMENTS]

    def feed(self, text: str) -> str:
        for stage in self._stages:
            text = stage.feed(text)
        return text

    def flush(self) -> str:
        text = ""
        for stage in self._stages:
            text = stage.flush() if not text else stage.feed(text) + stage.flush()
        return text


class IncrementalDetokenizer:
    """Turns generated token ids into text as they arrive, for streaming.

    ``push(id)`` returns the new text that is safe to show; ``flush()`` returns what was
    held back. Joined, they equal ``tokenizer.decode(all_ids, skip_special_tokens=...)``.

    It decodes a small window (the tokens of the previous emission plus the new ones) and
    emits the difference, the prefix-offset method of vLLM / TGI, so word-boundary spaces
    come out right and the work per token is bounded. Text ending in an incomplete UTF-8
    character (U+FFFD) is held back until the character completes.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._special = tokenizer.special_ids if skip_special_tokens else frozenset()
        # Byte-fallback decoders decode a run of <0xNN> tokens as one unit (all U+FFFD if the
        # run is not valid UTF-8), so text is shown only once such a run has ended.
        self._byte_ids = tokenizer._byte_fallback_ids()
        self._ids: list[int] = []  # the window; starts at the prefix offset
        self._read = 0  # tokens before this index (in the window) are shown
        self._prefix_text = ""  # decode(self._ids[: self._read])
        self._clean = _StreamingCleanUp() if tokenizer.clean_up_tokenization_spaces else None

    @property
    def window_size(self) -> int:
        """Tokens currently kept for decoding (bounded; for tests and diagnostics)."""
        return len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer._raw_decode(ids, self._skip)

    def _advance(self, upto: int) -> None:
        # The new window starts where the previous emission's new tokens started.
        del self._ids[: self._read]
        self._read = upto - self._read
        self._prefix_text = self._decode(self._ids[: self._read])

    def _emit(self, text: str) -> str:
        return self._clean.feed(text) if self._clean is not None and text else text

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that can be shown now (may be "")."""
        try:
            tid = int(token_id)
        except (TypeError, ValueError):
            raise InputError(f"push() needs an int token id, got {token_id!r}") from None
        if tid < 0:
            raise InputError(f"token ids must be non-negative, got {tid}")
        if tid in self._special:
            return ""  # decode() drops it too; keeping it out keeps the window text-only
        ids = self._ids
        ids.append(tid)
        text = self._decode(ids)
        prefix = self._prefix_text
        if len(text) > len(prefix) and not text.endswith("\ufffd") and tid not in self._byte_ids:
            new = text[len(prefix) :]
            self._advance(len(ids))
            return self._emit(new)
        pending = len(ids) - self._read
        if pending > _MAX_PENDING:
            cut = len(ids) - _SYNC_TAIL
            head = self._decode(ids[:cut])
            context = self._decode(ids[cut - 1 : cut])
            rest = self._decode(ids[cut - 1 :])
            if (
                len(head) >= len(prefix)
                and not (ids[cut - 1] in self._byte_ids and ids[cut] in self._byte_ids)
                and rest.startswith(context)
                and head + rest[len(context) :] == text
            ):
                new = head[len(prefix) :]
                self._advance(cut)
                return self._emit(new)
            if pending > _HARD_LIMIT:
                new = text[len(prefix) :]
                self._advance(len(ids))
                return self._emit(new)
        return ""

    def push_many(self, token_ids: Iterable[int]) -> str:
        """``push`` each id; return the joined text."""
        return "".join(self.push(t) for t in token_ids)

    def flush(self) -> str:
        """Return everything held back (call once, at the end of the sequence)."""
        out = ""
        if len(self._ids) > self._read:
            text = self._decode(self._ids)
            out = text[len(self._prefix_text) :]
            self._advance(len(self._ids))
        if self._clean is not None:
            out = self._clean.feed(out) + self._clean.flush() if out else self._clean.flush()
        return out


# --------------------------------------------------------------------------- stop strings


class StopStringMatcher:
    """Finds stop strings in generated text, for generate() and for streaming.

    ``find(text)`` gives where the earliest stop string starts; ``safe_length(text)``
    how much of ``text`` can be shown while streaming without showing the start of a
    stop string that may complete with the next tokens.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        if isinstance(stop_strings, str):
            raise InputError(
                f"stop strings must be a list of strings, got the single string {stop_strings!r}; "
                f"write [{stop_strings!r}]"
            )
        try:
            items = list(stop_strings)
        except TypeError:
            raise InputError(
                f"stop strings must be a list of strings, got {type(stop_strings).__name__}"
            ) from None
        for i, s in enumerate(items):
            if not isinstance(s, str):
                raise InputError(
                    f"stop strings must be strings, but item {i} is a {type(s).__name__}: {s!r}"
                )
            if not s:
                raise InputError(
                    f"stop string {i} is empty; an empty stop string would stop at once, "
                    "give non-empty strings"
                )
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(items))
        self._max_len = max((len(s) for s in self._stops), default=0)
        # Proper prefixes of the stop strings, longest first per length.
        self._prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self._stops

    @property
    def max_length(self) -> int:
        """Length of the longest stop string (0 when there are none)."""
        return self._max_len

    def __bool__(self) -> bool:
        return bool(self._stops)

    def find(self, text: str, start: int = 0) -> int | None:
        """Index in ``text`` where the earliest stop string starts, or None.

        ``start``: only matches that end after ``start`` are new (a streaming caller
        passes the length of the text it already searched; the search reaches back
        ``max_length - 1`` characters so a stop string spanning the boundary is found).
        """
        begin = max(0, start - self._max_len + 1) if start else 0
        best: int | None = None
        for s in self._stops:
            i = text.find(s, begin)
            if i >= 0 and (best is None or i < best):
                best = i
        return best

    def match(self, text: str, start: int = 0) -> tuple[int, str] | None:
        """Like :meth:`find`, with the stop string that matched (the longest at that index)."""
        at = self.find(text, start)
        if at is None:
            return None
        found = max((s for s in self._stops if text.startswith(s, at)), key=len)
        return at, found

    def safe_length(self, text: str) -> int:
        """Characters of ``text`` that can be shown now.

        If a stop string occurs, that is the text before it. Otherwise the longest suffix
        of ``text`` that is a prefix of a stop string is held back.
        """
        at = self.find(text)
        if at is not None:
            return at
        for k in range(min(self._max_len - 1, len(text)), 0, -1):
            if text[-k:] in self._prefixes:
                return len(text) - k
        return len(text)
