"""ortgen.tokenizer against transformers on the same tokenizer folder: encode, decode,
special tokens, each way a folder can be read (exported by ortgen, resolved by
transformers, best-effort); and what importing and loading pull in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgen.errors import InputError, ModelLoadError
from ortgen.text import Tokenizer
from tests.text_fixtures import (
    FIXTURE_SETTINGS,
    LOADERS,
    MESSAGES,
    SMOLLM2_TEMPLATE,
    SYSTEM,
    TEXTS,
    auto,
    backend,
    chatml_dir,
    cleanup_pair,
    pair,
    root,
    stream,
)

# Shared pytest fixtures, imported so pytest finds them here; listed so that linters
# see them used (tests take them by name as arguments).
__all__ = ["backend", "chatml_dir", "cleanup_pair", "pair", "root"]


@pytest.fixture(scope="module", params=list(LOADERS))
def any_pair(request: pytest.FixtureRequest, chatml_dir: Path):
    """The ChatML folder as save_pretrained wrote it, read each way ortgen can, and
    transformers' AutoTokenizer on the same folder."""
    source = chatml_dir.with_name("chatml-source")
    return LOADERS[request.param](source), auto(source)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_equal_transformers(any_pair, text: str):
    tok, hf = any_pair
    ids = tok.encode(text)
    assert ids == hf(text)["input_ids"]
    assert (
        tok.encode(text, add_special_tokens=False)
        == hf(text, add_special_tokens=False)["input_ids"]
    )
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_encode_batch(any_pair):
    tok, hf = any_pair
    assert tok.encode_batch(TEXTS) == hf(TEXTS)["input_ids"]
    assert tok.encode_batch([]) == []


def test_special_tokens_equal_transformers(any_pair):
    tok, hf = any_pair
    assert tok.special_tokens_map == hf.special_tokens_map
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert tok.bos_token_id == hf.bos_token_id
    assert tok.eos_token_id == hf.eos_token_id
    assert tok.pad_token_id == hf.pad_token_id
    assert tok.unk_token_id is None and hf.unk_token_id is None
    assert tok.all_special_ids == hf.all_special_ids
    assert tok.all_special_tokens == hf.all_special_tokens
    assert tok.vocab_size == len(hf) == len(tok)
    assert tok.special_ids == {0, 1, 2}
    assert tok.token_to_id("<|im_end|>") == 2 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.has_chat_template and tok.chat_template == SMOLLM2_TEMPLATE


def test_decode_clean_up_tokenization_spaces(cleanup_pair):
    tok, hf = cleanup_pair
    assert tok.clean_up_tokenization_spaces and hf.clean_up_tokenization_spaces
    text = "I do n't know , is n't it ? Yes ! They 're here . He 's ' q ' . We 've I 'm"
    ids = tok.encode(text)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids) == "I don't know, isn't it? Yes! They're here. He's'q '. We've I'm"
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            )


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
@settings(FIXTURE_SETTINGS, max_examples=150)
def test_encode_decode_random_text_equal_transformers(any_pair, text: str):
    tok, hf = any_pair
    ids = tok.encode(text)
    assert ids == hf(text)["input_ids"]
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids) == text


def test_decode_accepts_any_int_sequence(pair):
    tok, _ = pair
    import numpy as np

    ids = tok.encode("Über 東京 🙂")
    assert tok.decode(np.array(ids, dtype=np.int64)) == "Über 東京 🙂"
    assert tok.decode(tuple(ids)) == "Über 東京 🙂"
    assert tok.decode([]) == ""


@pytest.mark.parametrize("bad", [[-1], [1.5], ["a"], 3, "abc"])
def test_decode_rejects_bad_ids(pair, bad):
    tok, _ = pair
    with pytest.raises(InputError, match="token ids"):
        tok.decode(bad)


def test_encode_rejects_non_str(pair):
    tok, _ = pair
    with pytest.raises(InputError, match="needs a str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="texts\\[1\\]"):
        tok.encode_batch(["ok", 5])  # type: ignore[list-item]
    with pytest.raises(InputError, match="one str"):
        tok.encode_batch("one string")


def test_import_does_not_pull_transformers_or_torch(chatml_dir: Path):
    code = (
        "import sys; import ortgen.text.detokenizer, ortgen.text.stop_strings; "
        "from ortgen.text import load_tokenizer; "
        f"t = load_tokenizer({str(chatml_dir)!r}); "
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}]); t.decode(t.encode('hi')); "
        "bad = [m for m in ('transformers', 'torch') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("fallback", "imported"), [(None, "['transformers']"), ("best-effort", "[]")]
)
def test_foreign_folder_imports_transformers_unless_told_not_to(
    chatml_dir: Path, fallback: str | None, imported: str
):
    """Only a folder ortgen did not export makes the loader import transformers, and
    ORTGEN_TOKENIZER_FALLBACK=best-effort prevents even that (with a warning)."""
    env = {k: v for k, v in os.environ.items() if k != "ORTGEN_TOKENIZER_FALLBACK"}
    if fallback is not None:
        env["ORTGEN_TOKENIZER_FALLBACK"] = fallback
    code = (
        "import sys, warnings; from ortgen.text import load_tokenizer; "
        "warnings.simplefilter('ignore'); "
        f"t = load_tokenizer({str(chatml_dir.with_name('chatml-source'))!r}); t.encode('hi'); "
        "print([m for m in ('transformers',) if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == imported


def test_unknown_fallback_setting_is_an_error(chatml_dir: Path, monkeypatch):
    monkeypatch.setenv("ORTGEN_TOKENIZER_FALLBACK", "guess")
    with pytest.raises(ModelLoadError, match="ORTGEN_TOKENIZER_FALLBACK='guess'"):
        Tokenizer.from_folder(chatml_dir.with_name("chatml-source"))
    assert Tokenizer.from_folder(chatml_dir).vocab_size  # an exported folder never asks


@pytest.mark.default_model
def test_default_model_tokenizer_equals_transformers(default_model_dir: Path):
    tok, hf = Tokenizer.from_folder(default_model_dir), auto(default_model_dir)
    for name in (
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "ortgen_tokenizer.json",
    ):  # fmt: skip
        assert (default_model_dir / name).is_file()
    text = "Hello, world!\nÜber 東京 🙂"
    ids = tok.encode(text)
    assert ids == hf(text)["input_ids"]
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids)
    assert stream(tok, ids)[0] == tok.decode(ids)
    for messages in (MESSAGES, SYSTEM + MESSAGES):
        got = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert got == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tok.encode_chat(messages) == hf.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True
        )
    assert tok.eos_token_id == hf.eos_token_id
    assert tok.bos_token_id == hf.bos_token_id
    assert tok.pad_token_id == hf.pad_token_id
    assert tok.all_special_ids == hf.all_special_ids
    assert tok.vocab_size == len(hf)
