"""Tests of ortgen.gguf on the real default GGUF: the tokenizer follows the file's header."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortgen.export.gguf import gguf_to_hf_folder
from ortgen.gguf.default_model import download_default_gguf
from ortgen.paths import models_dir

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
ROUND_TRIP = "Hello, world!\nÜber 東京 🙂  a , b"


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The default model's GGUF, from the cache the default model build uses."""
    return download_default_gguf(models_dir() / ".cache", progress=lambda _msg: None)


@pytest.fixture(scope="module")
def gguf_hf(default_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GGUF converted to a transformers folder, with the tokenizer fix applied.

    This is the first stage of export_model; the ONNX stage is covered by the tiny models.
    """
    dest = tmp_path_factory.mktemp("gguf-hf") / "hf"
    gguf_to_hf_folder(default_gguf, dest)
    return dest


@pytest.fixture(scope="module")
def gguf_resaved(gguf_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer as optimum writes it into the export (it loads and re-saves it)."""
    from optimum.utils.save_utils import maybe_save_preprocessors

    dest = tmp_path_factory.mktemp("gguf-resaved")
    maybe_save_preprocessors(gguf_hf, dest)
    return dest


@pytest.mark.default_model
def test_gguf_special_tokens_follow_the_file(gguf_hf: Path, gguf_resaved: Path) -> None:
    from transformers import AutoTokenizer

    for folder in (gguf_hf, gguf_resaved):
        tok = AutoTokenizer.from_pretrained(folder)
        assert (tok.eos_token_id, tok.eos_token) == (2, "<|im_end|>")
        assert (tok.pad_token_id, tok.pad_token) == (2, "<|im_end|>")
        assert tok.bos_token_id == 1
        ids = tok("Hi")["input_ids"]
        assert ids == tok("Hi", add_special_tokens=False)["input_ids"]
        assert ids[0] != tok.bos_token_id
        assert (folder / "chat_template.jinja").is_file()
    for name in ("config.json", "generation_config.json"):
        config = json.loads((gguf_hf / name).read_text())
        assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (2, 2, 1)


@pytest.mark.default_model
def test_gguf_tokenizer_json_adds_no_bos(gguf_resaved: Path) -> None:
    """tokenizer.json is what ortgen loads (with `tokenizers`), so check it directly."""
    from tokenizers import Tokenizer

    raw = json.loads((gguf_resaved / "tokenizer.json").read_text())
    assert "<|im_start|>" not in json.dumps(raw["post_processor"])
    assert raw["decoder"]["type"] == "ByteLevel"
    tokenizer = Tokenizer.from_file(str(gguf_resaved / "tokenizer.json"))
    assert tokenizer.encode("Hi").ids == tokenizer.encode("Hi", add_special_tokens=False).ids
    assert tokenizer.decode(tokenizer.encode(ROUND_TRIP).ids) == ROUND_TRIP


@pytest.mark.default_model
def test_gguf_chat_template_starts_with_one_im_start(gguf_resaved: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_resaved)
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text)["input_ids"]  # encoding the rendered prompt the usual way
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == im_start and ids[1] != im_start
    assert tok.apply_chat_template(CHAT, add_generation_prompt=True) == ids


@pytest.mark.default_model
def test_gguf_decode_round_trips(gguf_resaved: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_resaved)
    for text in (ROUND_TRIP, "  leading spaces", "tabs\tand\nnewlines\n\n", "don 't , x ."):
        assert tok.decode(tok(text)["input_ids"]) == text
