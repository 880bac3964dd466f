"""A model's tokenizer and chat template at run time, without transformers or torch.

The tokenizer is the ``tokenizers`` library (the Rust tokenizer transformers' fast
tokenizers wrap). A folder ortgen exported carries the tokenizer as transformers resolved
it (``tokenizer.json`` + ``ortgen_tokenizer.json``, :mod:`.resolved_tokenizer`); other
folders are resolved by transformers when installed, else read best-effort with a warning
(:mod:`.tokenizer_folder`). The chat template is rendered with jinja2 the way transformers
renders it (:mod:`.chat_template`). So ``encode``, ``decode`` and ``apply_chat_template``
give the same results as transformers on the same folder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import tokenizers

from ..errors import InputError, ModelLoadError
from .chat_template import ChatTemplate
from .clean_up import clean_up_tokenization
from .resolved_tokenizer import TokenizerFolder
from .tokenizer_folder import TOKENIZER_FILE, read_tokenizer_folder, token_id

__all__ = ["Tokenizer", "load_tokenizer"]


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
        chat_template: str | Mapping[str, str] | None = None,
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
        # transformers' chat_template is one template or a dict of named ones.
        named = (
            {"default": chat_template}
            if isinstance(chat_template, str)
            else dict(chat_template or {})
        )
        self._templates = {
            name: ChatTemplate(text, owner=source if name == "default" else f"{source} ({name})")
            for name, text in named.items()
        }
        self._chat_template = self._templates.get("default")
        self._chat_template_problem: str | None = (
            f"it has chat templates {sorted(named)} but none named 'default'"
            if named and self._chat_template is None
            else None
        )
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self._special_ids = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        )

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer of the model folder ``path`` with transformers' results:
        exactly from ``ortgen_tokenizer.json`` when ortgen exported the folder, else via
        transformers' AutoTokenizer, else best-effort with a warning."""
        folder = Path(path)
        return cls.from_found(read_tokenizer_folder(folder), source=str(folder))

    @classmethod
    def from_found(cls, found: TokenizerFolder, *, source: str) -> Tokenizer:
        """The Tokenizer of what a folder reader found (``source`` names it in errors)."""
        tok = cls(
            found.backend,
            special_tokens=found.special_tokens,
            chat_template=found.chat_template,
            clean_up_tokenization_spaces=found.clean_up_tokenization_spaces,
            source=source,
        )
        tok._chat_template_problem = found.chat_template_problem or tok._chat_template_problem
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
        return None if token is None else token_id(self._tok, token, self.unk_token)

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

    @cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of the <0x00>..<0xFF> tokens when the decoder has a ByteFallback step
        (empty otherwise). Such a decoder decodes a run of them as one unit, all U+FFFD
        when the run is not valid UTF-8, which a streaming decoder must allow for."""
        decoder = self._tok.decoder
        if decoder is None or '"ByteFallback"' not in decoder.__getstate__().decode():
            return frozenset()
        found = (self._tok.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in found if i is not None)

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None

    @property
    def chat_template(self) -> str | None:
        """The default chat template's source (see :attr:`chat_templates` for all)."""
        return self._chat_template.source if self._chat_template is not None else None

    @property
    def chat_templates(self) -> dict[str, str]:
        """All chat templates by name (one template is named "default")."""
        return {name: t.source for name, t in self._templates.items()}

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

    # ------------------------------------------------------------------ chat template

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool | None = None,
        **extra: Any,
    ) -> str:
        """The chat prompt for ``messages``, as transformers'
        ``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``.

        ``extra`` keyword arguments are passed to the template like transformers does
        (``tools=[...]``, ``documents=[...]``, ``enable_thinking=...``, ...); they override
        the special tokens (``bos_token``, ``eos_token``, ...) the template also sees. As in
        transformers, a model with named templates uses "tool_use" when ``tools`` is given
        and it has one, else "default". ``add_generation_prompt`` defaults to True, or to
        False with ``continue_final_message=True`` (continuing the last message).
        """
        template = self._chat_template
        if extra.get("tools") is not None and "tool_use" in self._templates:
            template = self._templates["tool_use"]
        if template is None:
            detail = f" ({self._chat_template_problem})" if self._chat_template_problem else ""
            raise InputError(
                f"the model in {self._source} has no chat template{detail}, so chat messages "
                "cannot be turned into a prompt; use generate() with plain text instead"
            )
        return template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens_map,
            extra=extra,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool | None = None,
        **extra: Any,
    ) -> list[int]:
        """Token ids of the chat prompt, as ``apply_chat_template(..., tokenize=True)``
        (the rendered text encoded without adding special tokens)."""
        text = self.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **extra
        )
        return self.encode(text, add_special_tokens=False)


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
