"""Small real tokenizers for the tiny GGUF files of ``tests/gguf_models.py``.

Not a test module. :func:`tiny_vocab` gives the vocabulary an architecture's GGUF carries and
:func:`write_vocab` writes it with the keys llama.cpp's ``convert_hf_to_gguf.py`` writes
(``TextModel._set_vocab_gpt2`` and ``TextModel._set_vocab_sentencepiece``, read on
ggml-org/llama.cpp; the special ids, ``add_*`` flags and the chat template come from
``gguf.SpecialVocab``). Two flavours:

* ``gpt2`` (byte-level BPE; Llama 3, Qwen2/3): ``tokenizer.ggml.model = "gpt2"``, ``.pre``
  (the pre-tokenizer name llama.cpp derives from a hash of the HF tokenizer's output,
  ``get_vocab_base_pre``: "llama-bpe", "qwen2"), ``.tokens`` (byte-level strings, "Ġ" for a
  space), ``.token_type``, ``.merges`` ("a b" strings), no scores.
* ``llama`` (SentencePiece; Mistral v0.1-v0.3, Gemma 2/3, Phi-3): ``model = "llama"``,
  ``pre = "default"``, ``.tokens`` ("▁" for a space, ``<0xNN>`` byte tokens of type BYTE),
  ``.scores``, ``.token_type``, no merges. Gemma adds ``tokenizer.ggml.add_space_prefix =
  False`` (``Gemma2Model.set_vocab``).

Both write ``bos_token_id``/``eos_token_id`` (``unknown_token_id``/``padding_token_id`` where
the family has them), ``add_bos_token``, ``add_eos_token`` and ``tokenizer.chat_template`` (a
short template in the family's format, not the checkpoint's full one).

Why the flavour follows the architecture rather than being one ``gpt2`` vocabulary for all:
transformers 4.57 picks its GGUF tokenizer converter by architecture, not by
``tokenizer.ggml.model`` (``GGUF_TO_FAST_CONVERTERS`` in transformers/integrations/ggml.py),
and those converters assume the real family's vocabulary: gemma2/gemma3 build a Unigram model
from (tokens, scores), so a vocabulary without scores fails; phi3 reads ``pad_token_id``
and fails without it; qwen2/qwen3 add ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``
(new ids unless the vocabulary has them); llama builds a byte-level BPE when ``model`` is not
"llama" (Llama 3) and a SentencePiece-style byte-fallback BPE, with merges rebuilt from the
scores, when it is. The family also fixes the special tokens and chat template the tests see.

The vocabulary is learned by a tiny deterministic BPE (ties broken by the pair's text) on a
fixed English text, so ordinary text tokenizes into real multi-character pieces in both
llama.cpp and transformers. Special tokens take the first ids; every vocabulary has exactly
:data:`VOCAB_SIZE` entries, padded with ``[PAD{i}]`` UNUSED tokens as llama.cpp pads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

import gguf

VOCAB_SIZE = 384

_TEXT = """The quick brown fox jumps over the lazy dog. A tiny model reads the text and writes
the next token. It is not a real language model: its weights are random, but the tokenizer is
real, so the words in these sentences break into pieces that both runtimes agree on. Hello
world! What is the capital of France? Paris is the capital of France, and Berlin is the
capital of Germany. One, two, three, four, five: numbers like 12, 345 and 2024 are split too.
We test the loader, the converter and the generator; they should give the same answer for the
same input. Where there is a will there is a way. Tell me a story about a cat and a dog that
lived in the same house and were the best of friends. The end."""

_SPACE = "▁"  # SentencePiece's space marker
# GPT-2's pre-tokenizer split (ASCII classes are enough for the text above)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+"


@dataclass(frozen=True)
class TinyVocab:
    """A tokenizer as stored in GGUF metadata (see the module docstring for the keys)."""

    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...] | None  # SentencePiece only
    merges: tuple[str, ...] | None  # byte-level BPE only
    special_ids: dict[str, int]  # "bos", "eos" and, where the family has them, "unk", "pad"
    add_bos: bool
    add_space_prefix: bool | None  # written only when not None (Gemma: False)
    chat_template: str

    def token_id(self, text: str) -> int:
        """The id of the token spelled ``text`` (a special token, say)."""
        return self.tokens.index(text)


@dataclass(frozen=True)
class _Family:
    model: str
    pre: str
    specials: tuple[str, ...]  # in id order, from 0
    roles: dict[str, str]  # special role -> token text
    add_bos: bool
    add_space_prefix: bool | None
    template: str


_LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }}"
    " [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
_GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
_PHI3_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_FAMILIES = {
    "llama3": _Family(
        "gpt2", "llama-bpe",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|eot_id|>"),
        {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"}, True, None, _LLAMA3_TEMPLATE,
    ),
    "qwen": _Family(
        "gpt2", "qwen2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        {"bos": "<|endoftext|>", "eos": "<|im_end|>", "pad": "<|endoftext|>"}, False, None,
        _CHATML_TEMPLATE,
    ),
    "mistral": _Family(
        "llama", "default", ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
        {"unk": "<unk>", "bos": "<s>", "eos": "</s>"}, True, None, _MISTRAL_TEMPLATE,
    ),
    "gemma": _Family(
        "llama", "default",
        ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}, True, False,
        _GEMMA_TEMPLATE,
    ),
    "phi3": _Family(
        "llama", "default",
        ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>",
         "<|user|>"),
        {"unk": "<unk>", "bos": "<s>", "eos": "<|end|>", "pad": "<|endoftext|>"}, False, None,
        _PHI3_TEMPLATE,
    ),
}  # fmt: skip

#: the tokenizer family each architecture's real checkpoints carry
ARCH_FAMILY = {
    "llama": "llama3",
    "mistral": "mistral",
    "qwen2": "qwen",
    "qwen3": "qwen",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "phi3": "phi3",
}


def _byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (``bytes_to_unicode``), in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _train_bpe(words: Counter[tuple[str, ...]], n_new: int) -> list[tuple[str, str]]:
    """Merges (most frequent pair first, ties by text) until ``n_new`` new pieces exist or no
    pair is left; two merges can spell the same piece, so pieces are counted, not merges."""
    merges: list[tuple[str, str]] = []
    pieces: set[str] = set()
    while len(pieces) < n_new:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        pieces.add(best[0] + best[1])
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            merged[_merge_word(word, best)] += count
        words = merged
    return merges


def _pad(tokens: list[str], types: list[int], scores: list[float] | None) -> None:
    """Pad to VOCAB_SIZE with ``[PAD{i}]`` UNUSED tokens, as llama.cpp pads a vocabulary."""
    if len(tokens) > VOCAB_SIZE:
        raise ValueError(f"vocabulary of {len(tokens)} tokens exceeds VOCAB_SIZE={VOCAB_SIZE}")
    for i in range(len(tokens), VOCAB_SIZE):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
        if scores is not None:
            scores.append(-1000.0)


def _build(family: _Family) -> TinyVocab:
    tokens = list(family.specials)
    types = [gguf.TokenType.CONTROL] * len(tokens)
    if "unk" in family.roles:
        types[tokens.index(family.roles["unk"])] = gguf.TokenType.UNKNOWN
    scores: list[float] | None = None
    merges: list[str] | None = None
    if family.model == "gpt2":
        table = _byte_chars()
        words = Counter(tuple(table[b] for b in w.encode()) for w in re.findall(_GPT2_SPLIT, _TEXT))
        tokens += table
        types += [gguf.TokenType.NORMAL] * 256
        pairs = _train_bpe(words, VOCAB_SIZE - len(tokens))
        merges = [f"{a} {b}" for a, b in pairs]
    else:
        scores = [0.0] * len(tokens)
        tokens += [f"<0x{b:02X}>" for b in range(256)]
        types += [gguf.TokenType.BYTE] * 256
        scores += [0.0] * 256
        words = Counter(tuple(_SPACE + w) for w in _TEXT.split())
        chars = sorted({c for w in words for c in w})
        tokens += chars
        types += [gguf.TokenType.NORMAL] * len(chars)
        scores += [-1000.0 - i for i in range(len(chars))]
        pairs = _train_bpe(words, VOCAB_SIZE - len(tokens))
    for rank, (a, b) in enumerate(pairs):
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(gguf.TokenType.NORMAL)
            if scores is not None:
                scores.append(-float(rank))  # an earlier merge wins, as in SentencePiece BPE
    _pad(tokens, types, scores)
    return TinyVocab(
        model=family.model,
        pre=family.pre,
        tokens=tuple(tokens),
        token_types=tuple(int(t) for t in types),
        scores=None if scores is None else tuple(scores),
        merges=None if merges is None else tuple(merges),
        special_ids={role: tokens.index(text) for role, text in family.roles.items()},
        add_bos=family.add_bos,
        add_space_prefix=family.add_space_prefix,
        chat_template=family.template,
    )


@cache
def tiny_vocab(arch: str) -> TinyVocab:
    """The vocabulary (of :data:`VOCAB_SIZE` tokens) a tiny ``arch`` GGUF carries."""
    if arch not in ARCH_FAMILY:
        raise ValueError(
            f"no tokenizer family for arch {arch!r}; choose one of {list(ARCH_FAMILY)}"
        )
    return _build(_FAMILIES[ARCH_FAMILY[arch]])


def write_vocab(writer: gguf.GGUFWriter, vocab: TinyVocab) -> None:
    """Write ``vocab``'s ``tokenizer.*`` keys in the order llama.cpp's converter writes them."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(list(vocab.tokens))
    if vocab.scores is not None:
        writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.token_types))
    if vocab.merges is not None:
        writer.add_token_merges(list(vocab.merges))
    ids = vocab.special_ids
    writer.add_bos_token_id(ids["bos"])
    writer.add_eos_token_id(ids["eos"])
    if "unk" in ids:
        writer.add_unk_token_id(ids["unk"])
    if "pad" in ids:
        writer.add_pad_token_id(ids["pad"])
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    writer.add_chat_template(vocab.chat_template)
