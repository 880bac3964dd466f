"""Loading a tokenizer folder like transformers' AutoTokenizer: the files
save_pretrained writes, per-class BOS/EOS post-processors, legacy special-token maps,
added special tokens, where the chat template is found, and broken folders. Each case is
read every way ortgen can (``LOADERS``: exported by ortgen, resolved by transformers,
best-effort) and compared with transformers on the folder as save_pretrained wrote it."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from ortgen.errors import InputError, ModelLoadError
from ortgen.text import Tokenizer, load_tokenizer
from tests.text_fixtures import (
    LOADERS,
    MESSAGES,
    SMOLLM2_TEMPLATE,
    TEXTS,
    RustTokenizer,
    auto,
    backend,
    chatml_dir,
    edit_config,
    root,
    save_folder,
)

# Shared pytest fixtures, imported so pytest finds them here; listed so that linters
# see them used (tests take them by name as arguments).
__all__ = ["backend", "chatml_dir", "root"]


WAYS = pytest.mark.parametrize("way", list(LOADERS))


def test_saved_folder_has_transformers_files(chatml_dir: Path):
    """ortgen's export writes transformers' files too, so transformers can load it."""
    names = {p.name for p in chatml_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= names
    assert "ortgen_tokenizer.json" in names
    assert (chatml_dir / "chat_template.jinja").read_text() == SMOLLM2_TEMPLATE
    resolved = json.loads((chatml_dir / "ortgen_tokenizer.json").read_text())
    assert resolved["chat_template"] == SMOLLM2_TEMPLATE
    assert resolved["special_tokens"] == auto(chatml_dir).special_tokens_map


@WAYS
def test_llama_class_post_processor_and_legacy_special_map(
    root: Path, backend: RustTokenizer, way: str
):
    """tokenizer_class LlamaTokenizer: transformers rebuilds the BOS/EOS post-processor from
    add_bos_token / add_eos_token (the exported SmolLM2 folder is of this kind)."""
    for add_bos, add_eos in [(True, False), (True, True), (False, True), (None, None)]:
        folder = save_folder(root / f"llama-{add_bos}-{add_eos}-{way}", backend)
        edit_config(
            folder,
            tokenizer_class="LlamaTokenizer",
            add_bos_token=add_bos,
            add_eos_token=add_eos,
            legacy=True,
            add_prefix_space=None,
        )
        tok, hf = LOADERS[way](folder), auto(folder)
        assert type(hf).__name__ == "LlamaTokenizerFast"
        for text in TEXTS:
            assert tok.encode(text) == hf(text)["input_ids"], (add_bos, add_eos, text)
        ids = tok.encode("hi there")
        plain = tok.encode("hi there", add_special_tokens=False)
        assert plain and not {1, 2} & set(plain)  # BOS <|im_start|> = 1, EOS <|im_end|> = 2
        bos = [1] if add_bos in (True, None) else []  # LlamaTokenizer: add_bos defaults on
        eos = [2] if add_eos else []  # ... and add_eos off
        assert ids == bos + plain + eos, (add_bos, add_eos)
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids)


@WAYS
def test_special_token_missing_from_vocab_is_added(root: Path, backend: RustTokenizer, way: str):
    folder = save_folder(root / f"unk-{way}", backend)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["unk_token"] = "<unk>"  # not in tokenizer.json: transformers adds it as a new token
    cfg["additional_special_tokens"] = ["<tool>"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok, hf = LOADERS[way](folder), auto(folder)
    assert len(hf) == tok.vocab_size == backend.get_vocab_size() + 2
    text = "a<unk>b <tool> c"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert tok.unk_token_id == hf.unk_token_id
    assert tok.all_special_ids == hf.all_special_ids
    ids = tok.encode(text)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True) == "ab  c"


@WAYS
def test_legacy_special_tokens_map_without_added_tokens_decoder(root, backend, way: str):
    folder = save_folder(root / f"legacy-map-{way}", backend)
    edit_config(folder, added_tokens_decoder=None, eos_token=None, bos_token=None)
    (folder / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "eos_token": {
                    "content": "<|endoftext|>",
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                },
                "bos_token": "<|im_start|>",
            }
        )
    )
    tok, hf = LOADERS[way](folder), auto(folder)
    assert tok.special_tokens_map == hf.special_tokens_map
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == hf.eos_token_id == 0


@WAYS
def test_split_special_tokens(root: Path, backend: RustTokenizer, way: str):
    folder = save_folder(root / f"split-{way}", backend)
    edit_config(folder, split_special_tokens=True)
    tok, hf = LOADERS[way](folder), auto(folder)
    text = "<|im_start|>user\nhi<|im_end|>"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert 1 not in tok.encode(text)


@WAYS
def test_chat_template_in_tokenizer_config(root: Path, backend: RustTokenizer, way: str):
    """Older folders keep the template in tokenizer_config.json, as a string or as a list
    of named templates ("default" is used)."""
    folder = save_folder(root / f"cfg-template-{way}", backend, chat_template=None)
    edit_config(folder, chat_template=SMOLLM2_TEMPLATE)
    tok, hf = LOADERS[way](folder), auto(folder)
    expected = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(MESSAGES) == expected

    named = [
        {"name": "tool_use", "template": "TOOLS {{ messages[0]['content'] }}"},
        {"name": "default", "template": SMOLLM2_TEMPLATE},
    ]
    edit_config(folder, chat_template=named)
    tok, hf = LOADERS[way](folder), auto(folder)
    assert tok.apply_chat_template(MESSAGES) == expected
    assert hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == expected

    edit_config(folder, chat_template=named[:1])
    tok = LOADERS[way](folder)
    assert not tok.has_chat_template
    with pytest.raises(InputError, match="none named 'default'"):
        tok.apply_chat_template(MESSAGES)


@WAYS
def test_chat_template_jinja_file_preferred(root: Path, backend: RustTokenizer, way: str):
    folder = save_folder(root / f"both-templates-{way}", backend)
    edit_config(folder, chat_template="CONFIG TEMPLATE")
    tok, hf = LOADERS[way](folder), auto(folder)
    assert tok.chat_template == hf.chat_template == SMOLLM2_TEMPLATE


def test_load_tokenizer_without_tokenizer_json(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    assert load_tokenizer(tmp_path) is None
    with pytest.raises(ModelLoadError, match=r"no tokenizer\.json"):
        Tokenizer.from_folder(tmp_path)


def test_load_tokenizer_missing_folder(tmp_path: Path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")


def test_corrupt_files(tmp_path: Path, chatml_dir: Path):
    folder = tmp_path / "corrupt"
    shutil.copytree(chatml_dir, folder)
    (folder / "ortgen_tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"ortgen_tokenizer\.json"):
        Tokenizer.from_folder(folder)
    (folder / "ortgen_tokenizer.json").write_text('{"format": 99}')
    with pytest.raises(ModelLoadError, match=r"format 99.*re-export"):
        Tokenizer.from_folder(folder)
    (folder / "ortgen_tokenizer.json").write_text('{"format": 1, "special_tokens": [1]}')
    with pytest.raises(ModelLoadError, match="special_tokens must be a dict"):
        Tokenizer.from_folder(folder)
    (folder / "ortgen_tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"tokenizer_config\.json"):
        Tokenizer.from_folder(folder)  # transformers fails on it: best-effort says why
    (folder / "tokenizer.json").write_text('{"model": 1}')
    with pytest.raises(ModelLoadError, match="tokenizers library"):
        load_tokenizer(folder)


def test_load_tokenizer_returns_tokenizer(chatml_dir: Path):
    tok = load_tokenizer(chatml_dir)
    assert isinstance(tok, Tokenizer)
    assert "chatml" in repr(tok)


def test_an_older_ortgen_export_without_the_resolved_file_says_so(tmp_path: Path, chatml_dir):
    """It still loads (through transformers), but its owner learns why the load is slow."""
    folder = tmp_path / "old-export"
    shutil.copytree(chatml_dir, folder)
    (folder / "ortgen_tokenizer.json").unlink()
    (folder / "ortgen_manifest.json").write_text('{"format": 2}')
    with pytest.warns(UserWarning, match=r"older ortgen \(manifest format 2.*re-export"):
        tok = Tokenizer.from_folder(folder)
    assert tok.encode(TEXTS[0]) == Tokenizer.from_folder(chatml_dir).encode(TEXTS[0])
    (folder / "ortgen_manifest.json").unlink()  # a foreign folder: no warning about exports
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tokenizer.from_folder(folder)
