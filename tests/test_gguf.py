"""The ``export`` extra's GGUF path (``ortgen.export.gguf``): transformers' weights, the
tokenizer of ortgen's GGUF builder.

``gguf_to_hf_folder`` dequantises a GGUF with transformers and writes its tokenizer with
``ortgen.gguf.tokenizer.write_tokenizer_files``; the export then re-resolves that tokenizer
through transformers (and optimum re-saves it, for an optimum graph). On tiny GGUF files
(tests/gguf_models.py) of both kinds of vocabulary, the folder and the finished export must
tokenize as a build of the same file with ortgen's builder does: same ids, decoded text,
special tokens, chat templates and special-token ids. Before, the export took transformers'
reading of the tokenizer and corrected it, which differed from the builder on Llama 3's
digit runs and Gemma's whole vocabulary (transformers builds a Unigram model) and refused
Phi-3 (transformers drops its spaces). The real default GGUF's tokenizer goes through the
export's tokenizer stage here (without its weights: dequantising them takes ~50 s), and is
compared with transformers' and llama.cpp's reading in tests/test_gguf_tokenizer.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import gguf
import pytest

import ortgen
from ortgen.errors import ExportError
from ortgen.export import Variant, export_model
from ortgen.export.gguf import gguf_to_hf_folder
from ortgen.gguf.build import build_folder
from ortgen.text import Tokenizer
from tests.gguf_models import write_tiny_gguf
from tests.gguf_vocab import TinyVocab, tiny_vocab, write_vocab
from tests.test_gguf_tokenizer import CORPUS, MESSAGES

#: arch -> the export variant: a gpt2-type vocabulary (Llama 3's) through the fused graph,
#: SentencePiece ones (Gemma's without a space prefix, Phi-3's) through both graph families
#: (optimum re-saves the tokenizer before the export writes its own)
CASES = {
    "llama": Variant(graph="fused", precision="int4"),
    "gemma3": Variant(graph="fused", precision="int4"),
    "phi3": Variant(graph="optimum", precision="fp32"),
}
TOKENIZER_FILES = (
    "tokenizer.json", "ortgen_tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja",
)  # fmt: skip
ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
#: the special ids the header names, as config.json and generation_config.json hold them:
#: llama's header names an end-of-turn token besides EOS (see :func:`_llama3_base_vocab`),
#: which llama.cpp and ortgen stop on too; transformers' config has EOS alone
HEADER_IDS = {
    "llama": {"bos_token_id": 0, "eos_token_id": [1, 4]},
    "gemma3": {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
    "phi3": {"bos_token_id": 1, "eos_token_id": 6, "pad_token_id": 3},
}


def _quiet(_msg: str) -> None:
    """A progress callback that keeps test output clean."""


def _llama3_base_vocab(writer: gguf.GGUFWriter, vocab: TinyVocab) -> None:
    """Llama 3's vocabulary as its base model's GGUF has it: EOS <|end_of_text|>, and the
    end-of-turn token <|eot_id|> as ``tokenizer.ggml.eot_token_id``."""
    eos = {**vocab.special_ids, "eos": vocab.token_id("<|end_of_text|>")}
    write_vocab(writer, dataclasses.replace(vocab, special_ids=eos))
    writer.add_eot_token_id(vocab.token_id("<|eot_id|>"))


class Folders:
    """One tiny GGUF, its build by ortgen's builder, and (on first use) its conversion and
    export through the extra."""

    def __init__(self, root: Path, arch: str) -> None:
        self.arch = arch
        with pytest.MonkeyPatch.context() as patch:
            if arch == "llama":
                patch.setattr("tests.gguf_models.write_vocab", _llama3_base_vocab)
            self.gguf = write_tiny_gguf(root / f"{arch}.gguf", arch)
        self.built = build_folder(self.gguf, root / f"{arch}-built")
        self.hf = root / f"{arch}-hf"
        self.exported = root / f"{arch}-exported"

    def convert(self) -> Path:
        if not self.hf.exists():
            gguf_to_hf_folder(self.gguf, self.hf)
        return self.hf

    def export(self) -> Path:
        if not self.exported.exists():
            export_model(self.gguf, self.exported, variant=CASES[self.arch], progress=_quiet)
        return self.exported


@pytest.fixture(scope="module", params=list(CASES))
def folders(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Folders:
    return Folders(tmp_path_factory.mktemp(request.param), request.param)


def _ids(folder: Path, name: str) -> dict[str, Any]:
    config = json.loads((folder / name).read_text(encoding="utf-8"))
    return {key: config[key] for key in ID_KEYS if config.get(key) is not None}


def _texts(arch: str) -> list[str]:
    """The corpus, and each of the file's control tokens inside text."""
    vocab = tiny_vocab(arch)
    kinds = zip(vocab.tokens, vocab.token_types, strict=True)
    controls = [token for token, kind in kinds if kind == gguf.TokenType.CONTROL]
    return [*CORPUS, *(f"a{token}b {token}" for token in controls)]


def test_hf_folder_has_the_builders_tokenizer_and_the_headers_ids(folders: Folders) -> None:
    hf = folders.convert()
    for name in TOKENIZER_FILES:
        assert (hf / name).read_bytes() == (folders.built / name).read_bytes(), name
    for name in ("config.json", "generation_config.json"):
        assert _ids(hf, name) == HEADER_IDS[folders.arch] == _ids(folders.built, name), name
    assert (hf / "model.safetensors").is_file()


def assert_same_tokenizer(ours: Tokenizer, want: Tokenizer, texts: list[str]) -> None:
    """Same ids (with and without special tokens), decoded text, special tokens and chat
    templates (their text, and the prompts they render)."""
    for text in texts:
        for add in (True, False):
            got = ours.encode(text, add_special_tokens=add)
            assert got == want.encode(text, add_special_tokens=add), (text, add)
        ids = want.encode(text)
        for skip in (True, False):
            got_text = ours.decode(ids, skip_special_tokens=skip)
            assert got_text == want.decode(ids, skip_special_tokens=skip), (text, skip)
    assert ours.special_tokens_map == want.special_tokens_map
    assert ours.special_ids == want.special_ids
    assert len(ours) == len(want)
    assert ours.chat_templates == want.chat_templates
    for messages in MESSAGES:
        for prompt in (True, False):
            got_chat = ours.apply_chat_template(messages, add_generation_prompt=prompt)
            assert got_chat == want.apply_chat_template(messages, add_generation_prompt=prompt)


def test_export_tokenizes_as_the_builder(folders: Folders) -> None:
    """The export's own tokenizer stage (AutoTokenizer, optimum) changes nothing."""
    exported, built = folders.export(), folders.built
    ours, want = Tokenizer.from_folder(exported), Tokenizer.from_folder(built)
    assert_same_tokenizer(ours, want, _texts(folders.arch))
    for name in ("config.json", "generation_config.json"):
        assert _ids(exported, name) == _ids(built, name), name
    assert ours.decode(ours.encode(" a  b ")) == " a  b "  # Phi-3: transformers drops spaces


def test_export_loads_and_generates(folders: Folders) -> None:
    gen = ortgen.load(folders.export(), threads=1)
    assert gen.tokenizer is not None
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = Tokenizer.from_folder(folders.built).encode_chat(messages)
    assert gen.tokenizer.encode_chat(messages) == prompt
    out = gen.chat(messages, max_new_tokens=5, eos_token_id=None)  # random weights
    assert len(out.tokens[0]) == 5 and isinstance(out.text, str)


def test_gguf_without_tokenizer_fails_before_transformers(tmp_path: Path) -> None:
    """Refused from the header, before transformers dequantises the whole model."""
    path = write_tiny_gguf(tmp_path / "bare.gguf", "llama", tokenizer=False)
    with pytest.raises(ExportError, match="has no tokenizer") as info:
        gguf_to_hf_folder(path, tmp_path / "hf")
    assert str(path) in str(info.value)
    assert "tokenizer.json" not in str(info.value)  # the advice for a model folder
    assert not (tmp_path / "hf").exists()


def test_tokenizer_ortgen_cannot_build_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def t5_vocab(writer: gguf.GGUFWriter, vocab: Any) -> None:
        writer.add_tokenizer_model("t5")
        writer.add_token_list(vocab.tokens)

    monkeypatch.setattr("tests.gguf_models.write_vocab", t5_vocab)
    path = write_tiny_gguf(tmp_path / "t5.gguf", "llama")
    with pytest.raises(ExportError, match=r"tokenizer\.ggml\.model='t5'") as info:
        gguf_to_hf_folder(path, tmp_path / "hf")
    assert str(path) in str(info.value)
    assert not (tmp_path / "hf" / "config.json").exists()


@pytest.mark.default_model
def test_default_gguf_tokenizer_survives_the_exports_tokenizer_stage(
    default_model_dir: Path, tmp_path: Path
) -> None:
    """The real file's tokenizer through what the export does to the folder
    ``gguf_to_hf_folder`` writes (whose tokenizer files are the builder's, as the default
    model's are): optimum's re-save, then the export's (AutoTokenizer and its own check).
    The weights, the slow part, are the tiny files' business."""
    from optimum.utils.save_utils import maybe_save_preprocessors

    from ortgen.export.exporter import save_tokenizer

    out = tmp_path / "out"
    maybe_save_preprocessors(default_model_dir, out)
    assert save_tokenizer(default_model_dir, out, progress=_quiet)
    ours, want = Tokenizer.from_folder(out), Tokenizer.from_folder(default_model_dir)
    assert_same_tokenizer(ours, want, [*CORPUS, "<|im_start|>user\nHi<|im_end|>\n"])
    # SmolLM2's header, where transformers' own reading guesses otherwise
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 2)
    assert ours.special_tokens_map["eos_token"] == "<|im_end|>"
    assert ours.encode("Hi") == ours.encode("Hi", add_special_tokens=False)
    prompt = ours.encode_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert prompt[0] == 1 and prompt[1] != 1  # one <|im_start|>, no BOS before it
