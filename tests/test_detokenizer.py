"""IncrementalDetokenizer: streamed pieces join to exactly what decode() gives, for
byte-level and byte-fallback tokenizers, with partial characters held back and a bounded
window."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgen.errors import InputError
from ortgen.text import Tokenizer
from ortgen.text.detokenizer import IncrementalDetokenizer
from tests.text_fixtures import (
    FIXTURE_SETTINGS,
    TEXTS,
    WORDS,
    RustTokenizer,
    backend,
    chatml_dir,
    cleanup_pair,
    decoders,
    make_corpus,
    models,
    pair,
    pre_tokenizers,
    root,
    stream,
    trainers,
)

# Shared pytest fixtures, imported so pytest finds them here; listed so that linters
# see them used (tests take them by name as arguments).
__all__ = ["backend", "chatml_dir", "cleanup_pair", "pair", "root"]


@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_streams_text(pair, text: str):
    tok, _ = pair
    ids = tok.encode(text)
    for skip in (True, False):
        joined, pieces = stream(tok, ids, skip_special_tokens=skip)
        assert joined == tok.decode(ids, skip_special_tokens=skip)
        assert not any(p.endswith("\ufffd") for p in pieces)


def test_detokenizer_holds_partial_characters(pair):
    tok, _ = pair
    # Byte-by-byte tokens: each multi-byte character is split over several ids.
    text = "Ü東🙂"
    ids = []
    for ch in text:
        for b in ch.encode():
            ids.append(tok.backend.token_to_id(_byte_level_char(b)))
    assert None not in ids and tok.decode(ids) == text
    det = IncrementalDetokenizer(tok)
    out = [det.push(i) for i in ids]
    assert out == ["", "Ü", "", "", "東", "", "", "", "🙂"]
    assert det.flush() == ""


def _byte_level_char(b: int) -> str:
    from tokenizers.pre_tokenizers import ByteLevel

    # GPT-2's bytes_to_unicode, as the ByteLevel alphabet exposes it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, map(chr, cs), strict=True))
    assert set(table.values()) == set(ByteLevel.alphabet())
    return table[b]


def test_detokenizer_word_boundary_spaces(pair):
    tok, _ = pair
    ids = tok.encode("the quick brown fox jumps")
    _, pieces = stream(tok, ids)
    assert "".join(pieces) == "the quick brown fox jumps"
    assert any(p.startswith(" ") for p in pieces[1:])


def test_detokenizer_skips_special_tokens(pair):
    tok, _ = pair
    ids = tok.encode("<|im_start|>assistant\nHi 🙂<|im_end|><|endoftext|>")
    assert stream(tok, ids)[0] == "assistant\nHi 🙂"
    assert stream(tok, ids, skip_special_tokens=False)[0] == (
        "<|im_start|>assistant\nHi 🙂<|im_end|><|endoftext|>"
    )


def _stream_with_window(tok, ids) -> tuple[str, int]:
    """Stream ``ids`` one at a time; the joined text and the largest window seen."""
    det = IncrementalDetokenizer(tok)
    out, biggest = [], 0
    for i in ids:
        out.append(det.push(i))
        biggest = max(biggest, det.window_size)
    out.append(det.flush())
    return "".join(out), biggest


def test_detokenizer_window_is_bounded(pair):
    tok, _ = pair
    rng = random.Random(1)
    text = " ".join(rng.choice(WORDS[k]) for k in rng.choices(list(WORDS), k=2000))
    ids = tok.encode(text)
    joined, biggest = _stream_with_window(tok, ids)
    assert joined == tok.decode(ids)
    assert biggest <= 12

    # Invalid byte runs (lone lead / continuation bytes) never complete: the window must
    # still stay bounded and the text exact.
    lead, cont = (
        tok.backend.token_to_id(_byte_level_char(0xE6)),
        tok.backend.token_to_id(_byte_level_char(0x9D)),
    )
    four = tok.backend.token_to_id(_byte_level_char(0xF0))
    bad = [lead] * 50 + [cont] * 50 + [four, cont, cont] * 30 + tok.encode("ok 東京")
    joined, biggest = _stream_with_window(tok, bad)
    assert joined == tok.decode(bad)
    assert biggest <= 2 * 8 + 4


@given(ids=st.lists(st.integers(min_value=0, max_value=699), max_size=60), skip=st.booleans())
@settings(FIXTURE_SETTINGS, max_examples=400)
def test_detokenizer_random_ids(pair, ids: list[int], skip: bool):
    tok, _ = pair
    assert tok.vocab_size == 700
    joined, _ = stream(tok, ids, skip_special_tokens=skip)
    final = tok.decode(ids, skip_special_tokens=skip)
    assert joined == final
    # Nothing safe is held back: whenever the text of the ids so far is already final
    # (a prefix of the whole text) and does not end in a replacement character (an
    # incomplete UTF-8 sequence that later bytes may complete), all of it has been shown.
    det = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    shown = ""
    for k, token in enumerate(ids, 1):
        shown += det.push(token)
        now = tok.decode(ids[:k], skip_special_tokens=skip)
        if final.startswith(now) and not now.endswith("\ufffd"):
            assert shown == now, (k, ids[:k])


_BYTEISH = st.sampled_from([0xE6, 0x9D, 0xB1, 0xF0, 0x9F, 0x99, 0x82, 0xC3, 0x9C, 0x80, 0x41])


@given(st.lists(_BYTEISH, max_size=60))
@settings(FIXTURE_SETTINGS, max_examples=300)
def test_detokenizer_random_byte_tokens(pair, raw: list[int]):
    """Sequences of single-byte tokens: valid, partial and invalid UTF-8 mixed."""
    tok, _ = pair
    ids = [tok.backend.token_to_id(_byte_level_char(b)) for b in raw]
    joined, _ = stream(tok, ids)
    assert joined == tok.decode(ids) == bytes(raw).decode("utf-8", errors="replace")


_PIECES = [*"aeoun t'.,?!\n", *"ÜäéçñßÆ", *"東京日本語你好한", "🙂", "🚀", "👍🏽", "❤️", "👨‍👩‍👧"]
_MIXED_TEXT = st.lists(st.sampled_from(_PIECES), max_size=60).map("".join)


@given(_MIXED_TEXT)
@settings(FIXTURE_SETTINGS, max_examples=300)
def test_detokenizer_text_with_emoji_cjk_accents(pair, cleanup_pair, text: str):
    for tok, hf in (pair, cleanup_pair):
        ids = tok.encode(text)
        joined, pieces = stream(tok, ids)
        assert joined == tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert all("\ufffd" not in p for p in pieces)


@pytest.fixture(scope="module")
def sentencepiece_tok() -> Tokenizer:
    """A Llama-2-style tokenizer: Metaspace, byte-fallback tokens <0x00>..<0xFF>, and a
    decoder that strips the first leading space (so windows must be decoded with context)."""
    tok = RustTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(make_corpus(), trainer=trainer)
    state = json.loads(tok.to_str())
    vocab = state["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    backend = RustTokenizer.from_str(json.dumps(state))
    return Tokenizer(backend, special_tokens={"eos_token": "</s>"})


@given(ids=st.lists(st.integers(min_value=0, max_value=755), max_size=60), skip=st.booleans())
@settings(FIXTURE_SETTINGS, max_examples=300)
def test_detokenizer_random_ids_byte_fallback(sentencepiece_tok, ids: list[int], skip: bool):
    tok = sentencepiece_tok
    assert tok.vocab_size == 756
    joined, _ = stream(tok, ids, skip_special_tokens=skip)
    assert joined == tok.decode(ids, skip_special_tokens=skip)


@given(_MIXED_TEXT)
@settings(FIXTURE_SETTINGS, max_examples=200)
def test_detokenizer_byte_fallback_text(sentencepiece_tok, text: str):
    tok = sentencepiece_tok
    ids = [1, *tok.encode(text), 2]
    joined, pieces = stream(tok, ids)
    assert joined == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    assert tok.eos_token_id == 2


@given(ids=st.lists(st.integers(min_value=0, max_value=699), max_size=60))
@settings(FIXTURE_SETTINGS, max_examples=200)
def test_detokenizer_random_ids_with_clean_up(cleanup_pair, ids: list[int]):
    tok, hf = cleanup_pair
    joined, _ = stream(tok, ids)
    assert joined == tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_detokenizer_rejects_bad_ids(pair):
    tok, _ = pair
    det = IncrementalDetokenizer(tok)
    with pytest.raises(InputError):
        det.push(-3)
    with pytest.raises(InputError):
        det.push("x")  # type: ignore[arg-type]
