"""Byte-level BPE from a GGUF whose ``tokenizer.ggml.model`` is ``"gpt2"``.

The vocabulary and merges say which pieces exist; how text is cut into words before the
merges run is not stored, only named: ``tokenizer.ggml.pre`` is the name llama.cpp's
converter gives the original ``tokenizer.json``'s pre-tokenizer (found by hashing its
output). :data:`PRE_STYLES` turns each name ortgen knows back into that pre-tokenizer,
following llama.cpp's ``llama-vocab.cpp`` (which names share a split, ``ignore_merges``,
the decode clean-up, the BOS default) and the original ``tokenizer.json`` files (Qwen2's
NFC normalizer, which llama.cpp does not apply).

transformers' GGUF loader ignores ``tokenizer.ggml.pre``: it picks a converter by
architecture, so a Llama-3 vocabulary in a ``llama`` GGUF gets GPT-2's split (digit runs
stay whole instead of groups of up to three) and Qwen2's split only comes with a ``qwen2``
or ``qwen3`` architecture. ortgen follows the name, so the ids are the model's own; where
transformers' split is already the right one (GPT-2, Qwen2 in a Qwen GGUF) they are equal.
A name ortgen does not know gets transformers' choice (GPT-2's byte-level split) and a
warning, since llama.cpp would use its own default split and the ids may differ from both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from ..errors import ExportError

__all__ = ["PRE_STYLES", "PreStyle", "bpe_tokenizer", "pre_style"]

# The original tokenizer.json patterns (llama.cpp spells the case-insensitive group out,
# (?:'[sS]|...), because its regex engine lacks (?i:); the tokenizers library has it).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreStyle:
    """How text is split before the merges for one ``tokenizer.ggml.pre`` value.

    ``split`` is one of "gpt2" (GPT-2's byte-level regex), "digits" (each digit alone, then
    GPT-2's regex: StarCoder, SmolLM), "qwen2" (NFC, then Qwen2's regex) and "llama3"
    (Llama 3's regex: digits in groups of up to three). ``clean_spaces`` is llama.cpp's
    decode clean-up for the name (the original tokenizer_config's
    ``clean_up_tokenization_spaces``), ``ignore_merges`` takes a whole word that is in the
    vocabulary as one token (Llama 3's ``tokenizer.json`` and llama.cpp), ``add_bos`` is
    llama.cpp's default when the file has no ``tokenizer.ggml.add_bos_token``.
    """

    split: str
    clean_spaces: bool
    ignore_merges: bool = False
    add_bos: bool = False


def _styles(split: str, names: dict[str, bool], **extra: bool) -> dict[str, PreStyle]:
    """One :class:`PreStyle` per name of a llama.cpp group (``names``: name -> clean-up)."""
    return {name: PreStyle(split, clean, **extra) for name, clean in names.items()}


#: ``tokenizer.ggml.pre`` -> its split, as llama.cpp's ``llama_vocab::impl::load`` groups
#: them (the bool per name is llama.cpp's ``clean_spaces``). Names llama.cpp maps to a
#: regex with no tokenizers equivalent here (deepseek, falcon, tekken, gpt-4o, ...) are
#: left out and get the fallback.
PRE_STYLES: dict[str, PreStyle] = {
    **_styles(
        "gpt2",
        {
            "gpt-2": True,
            "phi-2": True,
            "mpt": True,
            "olmo": True,
            "jais": True,
            "gigachat": True,
            "a.x-4.0": True,
            "mellum": True,
            "exaone4": True,
            "trillion": False,
            "granite-docling": False,
        },
    ),
    **_styles(
        "digits",
        {
            "starcoder": True,
            "refact": True,
            "command-r": False,
            "smollm": False,
            "codeshell": True,
            "exaone": True,
            "minerva-7b": True,
        },
    ),
    **_styles("qwen2", {"qwen2": False, "deepseek-r1-qwen": False, "megrez": True}),
    **_styles(
        "llama3",
        {
            "llama3": True,
            "llama-v3": True,
            "llama-bpe": True,
            "falcon3": True,
            "falcon-h1": True,
            "pixtral": True,
            "midm-2.0": True,
            "lfm2": True,
        },
        ignore_merges=True,
        add_bos=True,
    ),
    **_styles("llama3", {"dbrx": True, "smaug-bpe": True}),
}

#: What a name outside :data:`PRE_STYLES` gets: transformers' split for every ``gpt2``
#: vocabulary, and no decode clean-up (the text comes back as the tokens spell it).
FALLBACK_STYLE = PreStyle("gpt2", clean_spaces=False)


def pre_style(pre: str | None) -> tuple[PreStyle, str | None]:
    """The split for ``tokenizer.ggml.pre`` = ``pre``, and a warning when it is a guess."""
    style = PRE_STYLES.get(pre or "")
    if style is not None:
        return style, None
    return FALLBACK_STYLE, (
        f"tokenizer.ggml.pre is {pre!r}, which ortgen does not map to a pre-tokenizer; it "
        "uses GPT-2's byte-level split, as transformers does for every GGUF byte-level "
        "vocabulary, but llama.cpp uses its own default split and the model may have been "
        "trained with another one, so token ids may differ from both"
    )


def bpe_tokenizer(
    tokens: Sequence[str], merges: Sequence[str], style: PreStyle, unk_token: str | None
) -> Tokenizer:
    """The byte-level BPE pipeline (model, normalizer, pre-tokenizer, decoder) of a ``gpt2``
    vocabulary split as ``style`` says; special tokens and BOS/EOS are added by the caller."""
    vocab = {token: i for i, token in enumerate(tokens)}  # a repeated token: the last id wins
    pairs = [_merge_pair(m, vocab) for m in merges]
    model = models.BPE(
        vocab=vocab,
        merges=[p for p in pairs if p is not None],
        unk_token=unk_token,
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=style.ignore_merges,
    )
    tok = Tokenizer(model)
    if style.split == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer(style.split)
    tok.decoder = decoders.ByteLevel()
    return tok


def _pre_tokenizer(split: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer as the original tokenizer.json spells it: GPT-2's regex lives in
    ByteLevel itself, the other splits are a Split then a regex-free ByteLevel."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split == "gpt2")
    if split == "gpt2":
        return byte_level
    if split == "digits":
        digits = pre_tokenizers.Digits(individual_digits=True)
        gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        return pre_tokenizers.Sequence([digits, gpt2])
    pattern = {"qwen2": _QWEN2_SPLIT, "llama3": _LLAMA3_SPLIT}[split]
    regex = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    return pre_tokenizers.Sequence([regex, byte_level])


def _merge_pair(merge: str, vocab: dict[str, int]) -> tuple[str, str] | None:
    """``"a b"`` as ``("a", "b")``, split at the first space after the first character as
    llama.cpp does; None when a part or the result is not in the vocabulary (llama.cpp
    never applies such a merge; the tokenizers library refuses to build with one)."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ExportError(f"tokenizer.ggml.merges holds {merge!r}, which is not two pieces")
    left, right = merge[:cut], merge[cut + 1 :]
    if left in vocab and right in vocab and left + right in vocab:
        return left, right
    return None
