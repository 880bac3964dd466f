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


def _transformers5_folder(root: Path, backend: RustTokenizer, name: str, **changes) -> Path:
    """A folder as transformers 5 saves its generic class (onnxruntime-genai 0.18's builder
    writes SmolLM2's this way): ``tokenizer_class`` TokenizersBackend, unset fields as null."""
    folder = save_folder(root / name, backend)
    edit_config(folder, tokenizer_class="TokenizersBackend", backend="tokenizers", **changes)
    return folder


def test_a_transformers5_folder_loads_without_importing_transformers4(
    root: Path, backend: RustTokenizer, monkeypatch: pytest.MonkeyPatch
):
    """transformers 4.x cannot read the TokenizersBackend class at all; asking it cost 5-7 s and
    ~290 MB per load. The folder is read directly, with transformers 5's rules, which differ
    from 4.57's in the three places checked here (each compared with transformers 5.24 on
    SmolLM2's folder from onnxruntime-genai 0.18 and edited copies of it):
    ``add_prefix_space`` in the config leaves the pre-tokenizer alone, ``add_bos_token``
    adds nothing to a generic class, and ``extra_special_tokens`` may be a list."""
    from ortgen.text import tokenizer_folder

    def no_transformers(folder: Path):
        raise AssertionError("transformers was asked about a folder it cannot read")

    monkeypatch.setattr(tokenizer_folder, "_read_with_transformers", no_transformers)
    folder = _transformers5_folder(
        root, backend, "v5-generic", add_prefix_space=True, add_bos_token=True
    )
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["extra_special_tokens"] = ["<fancy>"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match="written by transformers 5") as caught:
        tok = Tokenizer.from_folder(folder)
    assert not any("sets add_prefix_space" in str(w.message) for w in caught)
    for text in TEXTS:  # as tokenizer.json has it: no leading space, no BOS
        assert tok.encode(text) == backend.encode(text).ids, text
    fancy = tok.encode("a <fancy> b")
    assert tok.token_to_id("<fancy>") == backend.get_vocab_size()  # added, one special token
    assert tok.token_to_id("<fancy>") in fancy and "<fancy>" in tok.all_special_tokens
    assert tok.decode(fancy) == "a  b"


def test_a_transformers5_folder_goes_to_an_installed_transformers5(
    root: Path, backend: RustTokenizer, monkeypatch: pytest.MonkeyPatch
):
    """With transformers 5 installed, AutoTokenizer reads the folder (the exact way)."""
    from ortgen.plugin_host import installed
    from ortgen.text import tokenizer_folder

    asked: list[Path] = []

    def read(folder: Path):
        asked.append(folder)
        return None, "transformers 5 stand-in declined"

    monkeypatch.setattr(tokenizer_folder, "_read_with_transformers", read)
    monkeypatch.setattr(installed, "tool_versions", lambda: {"transformers": "5.24.0"})
    folder = _transformers5_folder(root, backend, "v5-installed")
    with pytest.warns(UserWarning, match="stand-in declined"):
        Tokenizer.from_folder(folder)
    assert asked == [folder]


def test_add_prefix_space_null_is_unset(
    root: Path, backend: RustTokenizer, monkeypatch: pytest.MonkeyPatch
):
    """``"add_prefix_space": null`` (what transformers 5 writes when it is unset): transformers
    4.57 fails to rebuild the pre-tokenizer with None and ignores it; so does ortgen, quietly."""
    folder = save_folder(root / "prefix-null", backend)
    edit_config(folder, tokenizer_class="GPT2Tokenizer")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["add_prefix_space"] = None
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    from ortgen.text.tokenizer_folder import FALLBACK_ENV

    monkeypatch.setenv(FALLBACK_ENV, "best-effort")
    with pytest.warns(UserWarning, match="read best-effort") as caught:
        tok = Tokenizer.from_folder(folder)
    assert [str(w.message) for w in caught if "add_prefix_space" in str(w.message)] == []
    hf = auto(folder)
    for text in TEXTS:
        assert tok.encode(text) == hf(text)["input_ids"], text
