"""ortgen.gguf.tokenizer: a GGUF's tokenizer and chat template as an ortgen model folder.

Each GGUF (the real SmolLM2 file, and small ones written here with ``gguf.GGUFWriter`` from
vocabularies the tokenizers library trains) is turned into a folder by
``write_tokenizer_files``, loaded by ``ortgen.text`` and compared with transformers' GGUF
tokenizer (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``) after the header's
corrections (``tests/gguf_hf_reference.py``: special tokens and BOS/EOS from the header, no
decode clean-up, byte-level decoding): ids with and without
special tokens, decoded text, the special/added tokens and the chat prompt. Where
transformers reads the metadata wrongly the test pins the difference and what ortgen
matches instead (the original tokenizer, as llama.cpp reads the file).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import gguf
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from ortgen.errors import ExportError
from ortgen.gguf.tokenizer import build_tokenizer, write_tokenizer_files
from ortgen.text import Tokenizer as OrtgenTokenizer
from tests.gguf_hf_reference import transformers_tokenizer

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Über naïve crème brûlée — façade, résumé, Ærø, Ångström, İstanbul",
    "東京 日本語のテキスト 中文 한국어 ภาษาไทย",
    "emoji 🙂🚀 👍🏽 👨‍👩‍👧 ❤️ 🇫🇷",
    "def f(x):\n    return x ** 2  # square\n\tif x != 0: print(f'{x!r}')",
    "   leading spaces and trailing   ",
    "\n\nnew lines\r\n and\ttabs\t\t",
    "digits 1 12 123 1234 12345 3.14159 2024-06-01 1,000,000",
    "don't I'M you've THEY'LL we'd it's",
    "x=1;y=2;z=x+y",
    "a  b   c    d",
    " ",
    "",
    "mixed ÄÖÜ äöü ß ẞ and the ﬁ ligature",
    "A\u0301 e\u0301 (combining) vs Á é",
    "URL https://example.com/path?q=1&r=two#frag",
    "    indented\n        more",
    "!!!???...,,,;;; a , b . c ' d",
]
MESSAGES = [
    [{"role": "user", "content": "Hi there 🙂"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Über 東京?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "  and 12345 ?"},
    ],
]
# Text the small vocabularies are trained on (the corpus is added, so its pieces exist).
TRAINING = """The quick brown fox jumps over the lazy dog. A tiny model reads the text and
writes the next token. Hello world! What is the capital of France? Paris is the capital of
France, and Berlin is the capital of Germany. Numbers like 12, 345, 2024, 1000 and 123456
are split too; 3.14 and 2.71 are constants. We test the loader, the converter and the
generator: they should give the same answer for the same input. Don't stop, it's fine, I'm
sure we'll see. Über Größe schön, déjà vu, naïve café. 東京 大阪 日本語 中文 한국어 서울.
def main(argv): return 0  # code too; x = [1, 2, 3]; print(x)
"""
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_CHAT = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SPM_CHAT = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }}"
    " [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
GEMMA_CHAT = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = QWEN2_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


# ---------------------------------------------------------------- building GGUF files


def _lines() -> list[str]:
    return [line for line in TRAINING.splitlines() if line.strip()] + CORPUS * 2


def train_byte_level(split: str | None, specials: list[str]) -> tuple[list[str], list[str]]:
    """(tokens, merges) of a byte-level BPE trained with Qwen2's, Llama 3's or (None)
    GPT-2's split; the specials take the first ids, as in the real files' token lists."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    if split is not None:
        regex = pre_tokenizers.Split(Regex(split), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([regex, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_lines(), trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def train_sentencepiece(prefix: bool) -> list[str]:
    """Pieces of a SentencePiece-style BPE ("▁" for spaces, ``prefix``: "▁" before each word),
    in merge order; a small alphabet, so CJK and emoji need the byte pieces."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always" if prefix else "never")
    trainer = trainers.BpeTrainer(vocab_size=600, limit_alphabet=70, show_progress=False)
    tok.train_from_iterator(_lines(), trainer)
    vocab = json.loads(tok.to_str())["model"]["vocab"]
    return sorted(vocab, key=vocab.get)


def spm_vocab(
    head: list[str],
    pieces: list[str],
    tail: Sequence[str] = (),
) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types) laid out as llama.cpp stores a SentencePiece vocabulary: the
    control tokens, the 256 byte pieces, the pieces (scores falling with the merge order, as
    SentencePiece BPE scores them) and any added control tokens at the end."""
    tokens = [*head, *(f"<0x{b:02X}>" for b in range(256)), *pieces, *tail]
    scores = [0.0] * (len(head) + 256) + [-float(i) for i in range(len(pieces))] + [0.0] * len(tail)
    types = [CONTROL] * len(head) + [BYTE] * 256 + [NORMAL] * len(pieces) + [CONTROL] * len(tail)
    return tokens, scores, types


def write_gguf(path: Path, arch: str, keys: dict[str, Any]) -> Path:
    """A metadata-only GGUF of architecture ``arch`` with the ``tokenizer.*`` values in
    ``keys`` (GGUFWriter's own methods, so types are what llama.cpp's converter writes)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    adders: dict[str, Callable[[Any], None]] = {
        "model": writer.add_tokenizer_model,
        "pre": writer.add_tokenizer_pre,
        "tokens": writer.add_token_list,
        "scores": writer.add_token_scores,
        "types": writer.add_token_types,
        "merges": writer.add_token_merges,
        "bos": writer.add_bos_token_id,
        "eos": writer.add_eos_token_id,
        "unk": writer.add_unk_token_id,
        "pad": writer.add_pad_token_id,
        "eot": writer.add_eot_token_id,
        "add_bos": writer.add_add_bos_token,
        "add_eos": writer.add_add_eos_token,
        "add_space_prefix": writer.add_add_space_prefix,
        "template": writer.add_chat_template,
    }
    for key, value in keys.items():
        adders[key](value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_ids(tokens: list[str], **roles: str) -> dict[str, int]:
    return {role: tokens.index(text) for role, text in roles.items()}


# ---------------------------------------------------------------- the two sides


def ortgen_tokenizer(source: Any, dest: Path) -> OrtgenTokenizer:
    """The folder ``write_tokenizer_files`` writes, loaded as any model folder is."""
    write_tokenizer_files(source, dest)
    return OrtgenTokenizer.from_folder(dest)


def assert_same(ours: OrtgenTokenizer, hf: Any, texts: Iterable[str]) -> None:
    """Same ids (with and without special tokens), decoded text and special tokens."""
    for text in texts:
        for add in (True, False):
            want = hf(text, add_special_tokens=add)["input_ids"]
            assert ours.encode(text, add_special_tokens=add) == want, (text, add)
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            want_text = hf.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == want_text, (text, skip)
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.special_ids == {i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert len(ours) == len(hf)


def assert_same_chat(ours: OrtgenTokenizer, hf: Any) -> None:
    for messages in MESSAGES:
        for prompt in (True, False):
            want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert ours.apply_chat_template(messages, add_generation_prompt=prompt) == want


def _split(tok: Any, text: str) -> list[str]:
    backend = tok.backend_tokenizer if hasattr(tok, "backend_tokenizer") else tok.backend
    return [piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text)]


# ---------------------------------------------------------------- the real SmolLM2 file


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[OrtgenTokenizer, Any]:
    from ortgen.gguf.default_model import download_default_gguf
    from ortgen.model.paths import models_dir

    path = download_default_gguf(models_dir() / ".cache", progress=lambda _msg: None)
    reader = gguf.GGUFReader(path)
    ours = ortgen_tokenizer(reader, tmp_path_factory.mktemp("smollm2"))
    return ours, transformers_tokenizer(path, reader)


# Numerals that are not ASCII digits: SmolLM2's own pre-tokenizer (Digits then GPT-2's
# regex; llama.cpp's "smollm" split) cuts them from the space before them, transformers'
# GGUF tokenizer (GPT-2's regex alone) does not.
SMOLLM2_NUMERALS = "fractions ½ and ① ② x²"


@pytest.mark.default_model
def test_smollm2_gguf_equals_transformers(smollm2: tuple[OrtgenTokenizer, Any]) -> None:
    ours, hf = smollm2
    assert_same(ours, hf, [*CORPUS, "<|im_start|>user\nHi<|im_end|>\n", "a<|endoftext|>b"])
    assert_same_chat(ours, hf)
    assert ours.encode("<|im_start|>") == [1]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 2)
    assert not ours.clean_up_tokenization_spaces  # SmolLM2's own config: no clean-up


@pytest.mark.default_model
def test_smollm2_numerals_follow_the_original_split(smollm2: tuple[OrtgenTokenizer, Any]) -> None:
    ours, hf = smollm2
    assert _split(ours, " ½ 12") == ["Ġ", "Â½", "Ġ", "1", "2"]  # Â½: ½'s UTF-8 bytes
    assert _split(hf, " ½ 12") == ["ĠÂ½", "Ġ12"]
    assert ours.encode(SMOLLM2_NUMERALS) != hf(SMOLLM2_NUMERALS)["input_ids"]
    assert ours.decode(ours.encode(SMOLLM2_NUMERALS)) == SMOLLM2_NUMERALS


# ---------------------------------------------------------------- byte-level BPE


def test_qwen2_gguf_equals_transformers(tmp_path: Path) -> None:
    """Qwen2.5/Qwen3 (``pre`` = "qwen2" in a qwen2 GGUF): NFC, then Qwen2's split."""
    tokens, merges = train_byte_level(QWEN2_SPLIT, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    ids = gguf_ids(tokens, bos="<|endoftext|>", eos="<|im_end|>", pad="<|endoftext|>")
    types = [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3)
    keys: dict[str, Any] = dict(
        model="gpt2", pre="qwen2", tokens=tokens, types=types, merges=merges, **ids
    )
    path = write_gguf(
        tmp_path / "qwen.gguf", "qwen2", {**keys, "add_bos": False, "template": CHATML}
    )
    ours, hf = ortgen_tokenizer(path, tmp_path / "out"), transformers_tokenizer(path)
    # transformers' Qwen2 class makes <|endoftext|> its unk token; the GGUF names none.
    assert hf.unk_token == "<|endoftext|>"
    hf.unk_token = None
    assert_same(ours, hf, [*CORPUS, "<|im_start|>user\nHi<|im_end|>\n"])
    assert_same_chat(ours, hf)
    assert _split(ours, "12345 I'M") == ["1", "2", "3", "4", "5", "ĠI", "'M"]
    assert ours.encode("e\u0301") == ours.encode("é")  # NFC


def test_qwen2_control_and_user_defined_tokens(tmp_path: Path) -> None:
    """Every CONTROL piece is special and every USER_DEFINED piece is matched whole (as in
    llama.cpp and the original tokenizer.json); transformers' Qwen2 GGUF tokenizer adds only
    <|endoftext|>, <|im_start|> and <|im_end|>."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>"]
    tokens, merges = train_byte_level(QWEN2_SPLIT, specials)
    tokens.append("<tool_call>")
    types = [CONTROL] * 4 + [NORMAL] * (len(tokens) - 5) + [USER_DEFINED]
    ids = gguf_ids(tokens, bos="<|endoftext|>", eos="<|im_end|>")
    keys: dict[str, Any] = dict(
        model="gpt2", pre="qwen2", tokens=tokens, types=types, merges=merges, **ids
    )
    path = write_gguf(tmp_path / "qwen.gguf", "qwen2", keys)
    ours, hf = ortgen_tokenizer(path, tmp_path / "out"), transformers_tokenizer(path)
    text = "a<|fim_prefix|>b<tool_call>c"
    fim, call = tokens.index("<|fim_prefix|>"), len(tokens) - 1
    ids_ours = ours.encode(text)
    assert fim in ids_ours and call in ids_ours
    assert fim not in hf(text)["input_ids"] and call not in hf(text)["input_ids"]
    assert fim in ours.special_ids and call not in ours.special_ids
    assert ours.decode(ids_ours, skip_special_tokens=True) == "ab<tool_call>c"
    assert ours.decode(ids_ours, skip_special_tokens=False) == text


def test_llama_bpe_gguf_follows_llama3_split(tmp_path: Path) -> None:
    """Llama 3 (``pre`` = "llama-bpe" in a llama GGUF): Llama 3's split, whole words taken
    from the vocabulary (``ignore_merges``), BOS added when the file does not say.

    transformers' GGUF tokenizer uses GPT-2's split here (it ignores ``pre``): equal ids on
    text where the two splits agree, others on digit runs and upper-case contractions. The
    reference for those is the trained tokenizer itself, i.e. the original tokenizer.json.
    """
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>"]
    specials += ["<|end_header_id|>", "<|eot_id|>"]
    tokens, merges = train_byte_level(LLAMA3_SPLIT, specials)
    tokens.append("Ġzyxw")  # a word no merge spells: only ignore_merges finds it
    ids = gguf_ids(tokens, bos="<|begin_of_text|>", eos="<|end_of_text|>", eot="<|eot_id|>")
    types = [CONTROL] * len(specials) + [NORMAL] * (len(tokens) - len(specials))
    keys: dict[str, Any] = dict(
        model="gpt2", pre="llama-bpe", tokens=tokens, types=types, merges=merges
    )
    path = write_gguf(tmp_path / "l3.gguf", "llama", {**keys, **ids, "template": LLAMA3_CHAT})
    ours, hf = ortgen_tokenizer(path, tmp_path / "out"), transformers_tokenizer(path)
    original = _original_llama3(tokens, merges)
    texts = [*CORPUS, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"]
    same_split = [t for t in texts if _split(ours, t) == _split(hf, t)]
    assert len(same_split) > len(texts) // 2
    hf.clean_up_tokenization_spaces = True  # Llama 3's config and llama.cpp clean up
    assert_same(ours, hf, same_split)
    assert_same_chat(ours, hf)
    for text in texts:
        assert ours.encode(text) == [0, *original.encode(text).ids], text
        got = ours.encode(text)  # the backends' decode: no clean-up on either side
        assert ours.backend.decode(got, skip_special_tokens=False) == original.decode(
            got, skip_special_tokens=False
        )
    assert _split(ours, " 12345 I'M") == ["Ġ", "123", "45", "ĠI", "'M"]
    assert _split(hf, " 12345 I'M") == ["Ġ12345", "ĠI", "'", "M"]
    assert ours.encode(" zyxw", add_special_tokens=False) == [len(tokens) - 1]
    assert len(hf(" zyxw", add_special_tokens=False)["input_ids"]) > 1
    assert ours.encode("hi")[0] == 0  # BOS by default for this pre
    assert ours.clean_up_tokenization_spaces
    info = build_tokenizer(gguf.GGUFReader(path))[1]
    assert info.eos_token_ids == (ids["eos"], ids["eot"])
    assert info.generation_ids() == {"bos_token_id": 0, "eos_token_id": [1, 4]}


def _original_llama3(tokens: list[str], merges: list[str]) -> Tokenizer:
    """The tokenizer.json Llama 3 ships, on these tokens (its pre-tokenizer and model flags)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=True))
    regex = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([regex, byte_level])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(tokens[:5])
    return tok


@pytest.mark.parametrize("pre", ["gpt-2", "an-unknown-pre", None])
def test_gpt2_split_and_unknown_pre(tmp_path: Path, pre: str | None) -> None:
    """``pre`` "gpt-2" is GPT-2's byte-level split; a name ortgen does not know (or none)
    gets the same split, which is what transformers uses for every byte-level vocabulary,
    with a warning (llama.cpp would use its own default split)."""
    tokens, merges = train_byte_level(None, ["<|endoftext|>"])
    keys: dict[str, Any] = dict(model="gpt2", tokens=tokens, merges=merges, bos=0, eos=0)
    keys.update(types=[CONTROL] + [NORMAL] * (len(tokens) - 1), add_bos=False)
    if pre is not None:
        keys["pre"] = pre
    path = write_gguf(tmp_path / "g.gguf", "llama", keys)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = ortgen_tokenizer(path, tmp_path / "out")
    notes = [str(w.message) for w in caught if "tokenizer.ggml.pre" in str(w.message)]
    assert len(notes) == (pre != "gpt-2"), notes
    hf = transformers_tokenizer(path)
    # Decode clean-up: llama.cpp's for "gpt-2" (and transformers' own before ortgen's
    # correction turns it off); none for a guessed split, as ortgen's import did.
    assert ours.clean_up_tokenization_spaces is (pre == "gpt-2")
    hf.clean_up_tokenization_spaces = pre == "gpt-2"
    assert_same(ours, hf, CORPUS)
    resolved = json.loads((tmp_path / "out" / "ortgen_tokenizer.json").read_text())
    assert resolved["source"]["split"] == "gpt2"


# ---------------------------------------------------------------- SentencePiece BPE


def test_llama_spm_gguf_equals_transformers(tmp_path: Path) -> None:
    """Llama 2 / Mistral: pieces with scores and the 256 byte pieces, no merges."""
    tokens, scores, types = spm_vocab(["<unk>", "<s>", "</s>"], train_sentencepiece(True))
    tokens += ["[INST]", "[/INST]"]
    scores += [0.0, 0.0]
    types[0] = UNKNOWN
    types += [CONTROL, CONTROL]
    keys: dict[str, Any] = dict(
        model="llama", pre="default", tokens=tokens, scores=scores, types=types
    )
    keys.update(bos=1, eos=2, unk=0, add_bos=True, add_eos=False, template=SPM_CHAT)
    path = write_gguf(tmp_path / "llama2.gguf", "llama", keys)
    ours, hf = ortgen_tokenizer(path, tmp_path / "out"), transformers_tokenizer(path)
    assert_same(ours, hf, [*CORPUS, "[INST] hi [/INST] there</s> <s>x"])
    assert_same_chat(ours, hf)
    byte_ids = set(range(3, 259))
    assert byte_ids & set(ours.encode("東京 🙂"))  # not in the small alphabet: byte pieces
    assert ours.byte_fallback_ids == frozenset(byte_ids)
    for text in CORPUS:
        assert ours.decode(ours.encode(text)) == text


def test_add_eos_and_missing_ids(tmp_path: Path) -> None:
    """``add_eos_token`` appends EOS; a SentencePiece header without ids gets llama.cpp's
    defaults (1, 2, 0); BOS asked for without a bos id is an error."""
    tokens, scores, types = spm_vocab(["<unk>", "<s>", "</s>"], train_sentencepiece(True))
    keys: dict[str, Any] = dict(
        model="llama", tokens=tokens, scores=scores, types=types, add_eos=True
    )
    tok, info = build_tokenizer(keys_as_fields(keys))
    assert (info.bos_token_id, info.eos_token_id, info.unk_token_id) == (1, 2, 0)
    assert tok.encode("hi").ids[0] == 1 and tok.encode("hi").ids[-1] == 2
    bpe_tokens, merges = train_byte_level(None, ["<|endoftext|>"])
    bpe = dict(model="gpt2", tokens=bpe_tokens, merges=merges, add_bos=True)
    with pytest.raises(ExportError, match="names no bos token id"):
        build_tokenizer(keys_as_fields(bpe))


def keys_as_fields(keys: dict[str, Any]) -> dict[str, Any]:
    """The keyword names of :func:`write_gguf` as GGUF keys with plain values."""
    names = {
        "model": "tokenizer.ggml.model",
        "pre": "tokenizer.ggml.pre",
        "tokens": "tokenizer.ggml.tokens",
        "scores": "tokenizer.ggml.scores",
        "types": "tokenizer.ggml.token_type",
        "merges": "tokenizer.ggml.merges",
        "add_bos": "tokenizer.ggml.add_bos_token",
        "add_eos": "tokenizer.ggml.add_eos_token",
    }
    return {names[k]: v for k, v in keys.items()}


def _gemma_keys() -> dict[str, Any]:
    head = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tokens, scores, types = spm_vocab(head, train_sentencepiece(False))
    types[3] = UNKNOWN
    keys: dict[str, Any] = dict(
        model="llama", pre="default", tokens=tokens, scores=scores, types=types
    )
    keys.update(bos=2, eos=1, unk=3, pad=0, eot=5, add_bos=True, add_eos=False)
    return {**keys, "add_space_prefix": False, "template": GEMMA_CHAT}


def test_gemma_gguf_is_sentencepiece_bpe(tmp_path: Path) -> None:
    """Gemma: no space prefix, SentencePiece BPE as for Llama 2, which is transformers' own
    reading of such a vocabulary in a llama GGUF. transformers' gemma2/gemma3 GGUF tokenizer
    builds a Unigram model from the scores instead (transformers issue 41494), which splits
    most words into other pieces."""
    keys = _gemma_keys()
    gemma = write_gguf(tmp_path / "gemma.gguf", "gemma2", keys)
    as_llama = write_gguf(tmp_path / "as-llama.gguf", "llama", keys)
    ours = ortgen_tokenizer(gemma, tmp_path / "out")
    assert_same(ours, transformers_tokenizer(as_llama), [*CORPUS, "<start_of_turn>user\nhi"])
    assert_same_chat(ours, transformers_tokenizer(as_llama))
    unigram = transformers_tokenizer(gemma)
    assert type(unigram.backend_tokenizer.model).__name__ == "Unigram"
    differ = [t for t in CORPUS if ours.encode(t) != unigram(t)["input_ids"]]
    assert len(differ) > len(CORPUS) // 2
    assert ours.encode("Hello world")[1:] == ours.encode("Hello world", add_special_tokens=False)
    assert ours.decode(ours.encode(" a  b ")) == " a  b "  # no prefix space to strip


def test_phi3_gguf_is_sentencepiece_bpe(tmp_path: Path) -> None:
    """Phi-3 (a llama vocabulary in a phi3 GGUF) reads as Llama 2 does; transformers' phi3
    GGUF converter has no space handling (no "▁" normalizer), so spaces are dropped."""
    tail = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"]
    tokens, scores, types = spm_vocab(["<unk>", "<s>", "</s>"], train_sentencepiece(True), tail)
    keys: dict[str, Any] = dict(
        model="llama", pre="default", tokens=tokens, scores=scores, types=types
    )
    keys.update(bos=1, eos=tokens.index("<|end|>"), unk=0, pad=tokens.index("<|endoftext|>"))
    keys.update(add_bos=False, add_eos=False)
    phi3 = write_gguf(tmp_path / "phi3.gguf", "phi3", keys)
    as_llama = write_gguf(tmp_path / "as-llama.gguf", "llama", keys)
    ours = ortgen_tokenizer(phi3, tmp_path / "out")
    assert_same(ours, transformers_tokenizer(as_llama), [*CORPUS, "<|user|>\nhi<|end|>"])
    from transformers import AutoTokenizer

    hf_phi3 = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=phi3.name)
    assert hf_phi3.decode(hf_phi3("a b", add_special_tokens=False)["input_ids"]) == "ab"
    assert ours.decode(ours.encode("a b")) == "a b"


# ---------------------------------------------------------------- chat templates, files


def test_named_chat_templates(tmp_path: Path) -> None:
    """A GGUF with named templates (``tokenizer.chat_template.tool_use``) keeps them all."""
    tokens, merges = train_byte_level(None, ["<|endoftext|>"])
    tool = "{{ 'tools: ' ~ (tools | length) }}"
    keys: dict[str, Any] = dict(
        model="gpt2", pre="gpt-2", tokens=tokens, merges=merges, bos=0, eos=0
    )
    keys["template"] = [
        {"name": "default", "template": CHATML},
        {"name": "tool_use", "template": tool},
    ]
    path = write_gguf(tmp_path / "named.gguf", "gpt2", keys)
    ours = ortgen_tokenizer(path, tmp_path / "out")
    assert ours.chat_templates == {"default": CHATML, "tool_use": tool}
    assert ours.apply_chat_template(MESSAGES[0], tools=[{"name": "x"}]) == "tools: 1"
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert saved.chat_template == {"default": CHATML, "tool_use": tool}


def test_folder_loads_in_transformers_too(tmp_path: Path) -> None:
    """The folder's transformers files give transformers the same tokenizer."""
    from transformers import AutoTokenizer

    keys = _gemma_keys()
    path = write_gguf(tmp_path / "gemma.gguf", "gemma2", keys)
    ours = ortgen_tokenizer(path, tmp_path / "out")
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert_same(ours, hf, CORPUS)
    assert_same_chat(ours, hf)
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {
        "tokenizer.json",
        "ortgen_tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    }


def test_gguf_without_tokenizer_is_an_error(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "bare.gguf", "llama", {})
    with pytest.raises(ExportError, match="no tokenizer metadata"):
        write_tokenizer_files(gguf.GGUFReader(path), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model", ["rwkv", "t5", "bert", "plamo2", "none"])
def test_other_tokenizer_models_are_refused(tmp_path: Path, model: str) -> None:
    path = write_gguf(tmp_path / "x.gguf", "llama", {"model": model, "tokens": ["a", "b"]})
    with pytest.raises(ExportError, match=f"tokenizer.ggml.model='{model}'"):
        build_tokenizer(gguf.GGUFReader(path))


def test_neither_transformers_nor_torch_is_imported(tmp_path: Path) -> None:
    """Building the folder and loading it uses the tokenizers library alone."""
    keys = _gemma_keys()
    path = write_gguf(tmp_path / "gemma.gguf", "gemma2", keys)
    code = textwrap.dedent(
        f"""
        import sys
        import gguf
        from ortgen.gguf.tokenizer import write_tokenizer_files
        from ortgen.text import Tokenizer
        write_tokenizer_files(gguf.GGUFReader({str(path)!r}), {str(tmp_path / "out")!r})
        tok = Tokenizer.from_folder({str(tmp_path / "out")!r})
        assert tok.decode(tok.encode("Hello world")) == "Hello world"
        tok.apply_chat_template([{{"role": "user", "content": "hi"}}])
        print(sorted(m for m in ("transformers", "torch") if m in sys.modules))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
