"""Shared material for the tests of the tokenizer, chat template and detokenizer modules.

The tokenizer folders are built here: a small byte-level BPE trained with ``tokenizers``
and saved with transformers' ``save_pretrained`` (a "foreign" folder, as optimum or a user
writes it), then saved again the way ortgen's export does (:func:`export_folder`: plus
``ortgen_tokenizer.json``), so ortgen can be compared with transformers on the same
folder. ``LOADERS`` reads a foreign folder each way ortgen can: exported first, through
transformers' AutoTokenizer, or best-effort. Test modules import the fixtures by name:
pytest finds fixtures among a test module's names.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import transformers
from hypothesis import HealthCheck, settings
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from ortgen.text import Tokenizer
from ortgen.text.detokenizer import IncrementalDetokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Module-scoped fixtures are safe to share between hypothesis examples.
FIXTURE_SETTINGS = settings(
    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _words(text: str) -> list[str]:
    return text.split()


WORDS = {
    "en": _words(
        "the quick brown fox jumps over lazy dog I don't know isn't it you're we've "
        "they'll can't won't she's model token stream text generation runtime fast small "
        "hello world Python code function return value number"
    ),
    "de": _words("Über Größe schön Straße Mädchen Käse grün für müssen Fußball"),
    "fr": _words("été déjà où naïve crème brûlée garçon français très être"),
    "es": _words("niño año mañana señor corazón canción pequeño"),
    "cjk": _words("東京 大阪 日本語 中文 你好 世界 こんにちは 한국어 서울 漢字"),
    "emoji": _words("🙂 🚀 👍🏽 ❤️ 🎉 🤖 👨‍👩‍👧 😀"),
    "misc": _words("( ) [ ] { } ... !? , ; : - — – ' \" 123 4567 3.14 x=1 a+b #"),
}
PUNCT = [".", ",", "!", "?", " .", " ,", " ?", " !", " 's", " n't", " ' ", ":"]


def make_corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    langs = list(WORDS)
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(3, 14)):
            words.append(rng.choice(WORDS[rng.choice(langs)]))
            if rng.random() < 0.15:
                words[-1] += rng.choice(PUNCT)
        sep = rng.choice([" ", " ", " ", "  ", "\t"])
        lines.append(sep.join(words) + rng.choice(["", ".", "!", "?", "\n"]))
    return lines


def train_backend() -> RustTokenizer:
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(make_corpus(), trainer=trainer)
    return tok


def save_folder(
    folder: Path,
    backend: RustTokenizer,
    *,
    chat_template: str | None = SMOLLM2_TEMPLATE,
    **kwargs,
) -> Path:
    """Save like exported models carry a tokenizer: transformers' save_pretrained."""
    kwargs.setdefault("bos_token", "<|im_start|>")
    kwargs.setdefault("eos_token", "<|im_end|>")
    kwargs.setdefault("pad_token", "<|endoftext|>")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    if chat_template is not None:
        hf.chat_template = chat_template
    hf.save_pretrained(str(folder))
    return folder


def edit_config(folder: Path, **changes) -> None:
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def auto(folder: Path):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def export_folder(source: Path, dest: Path) -> Path:
    """Save ``source``'s tokenizer to ``dest`` with the function ortgen's export uses."""
    from ortgen.export.exporter import save_tokenizer

    assert save_tokenizer(source, dest, progress=lambda _msg: None)
    return dest


def load_exported(folder: Path) -> Tokenizer:
    """An ortgen-exported copy of the foreign ``folder``, loaded (no transformers involved)."""
    out = folder.with_name(folder.name + "-ortgen")
    shutil.rmtree(out, ignore_errors=True)  # tests re-export edited folders
    out = export_folder(folder, out)
    assert (out / "ortgen_tokenizer.json").is_file()
    return Tokenizer.from_folder(out)


def load_via_transformers(folder: Path) -> Tokenizer:
    """The foreign ``folder`` loaded the default way: transformers resolves it, no warning."""
    assert not (folder / "ortgen_tokenizer.json").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return Tokenizer.from_folder(folder)


def load_best_effort(folder: Path) -> Tokenizer:
    """The foreign ``folder`` read without transformers: it must warn that ids may differ."""
    from ortgen.text.tokenizer_folder import FALLBACK_ENV

    with (
        mock.patch.dict(os.environ, {FALLBACK_ENV: "best-effort"}),
        pytest.warns(UserWarning, match="read best-effort") as caught,
    ):
        tok = Tokenizer.from_folder(folder)
    assert "Token ids may differ" in str(caught[0].message)
    return tok


LOADERS: dict[str, Callable[[Path], Tokenizer]] = {
    "exported": load_exported,
    "transformers": load_via_transformers,
    "best-effort": load_best_effort,
}


@pytest.fixture(scope="module")
def backend() -> RustTokenizer:
    return train_backend()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("text-tokenizers")


@pytest.fixture(scope="module")
def chatml_dir(root: Path, backend: RustTokenizer) -> Path:
    """The ChatML tokenizer as ortgen's export writes it (read without transformers)."""
    return export_folder(save_folder(root / "chatml-source", backend), root / "chatml")


@pytest.fixture(scope="module")
def pair(chatml_dir: Path):
    return Tokenizer.from_folder(chatml_dir), auto(chatml_dir)


@pytest.fixture(scope="module")
def cleanup_pair(root: Path, backend: RustTokenizer):
    source = save_folder(root / "cleanup-source", backend, clean_up_tokenization_spaces=True)
    folder = export_folder(source, root / "cleanup")
    return Tokenizer.from_folder(folder), auto(folder)


TEXTS = [
    "Hello, world!\nÜber 東京 🙂",
    "",
    " ",
    "I don't know , isn't it ? Yes ! They 're here . He 's ' quoted ' .",
    "  two leading spaces and trailing   ",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "naïve crème brûlée — 日本語のテキスト、中文文本。 👨‍👩‍👧 👍🏽",
    "tabs\tand\nnew\n\nlines\r\n",
    "unseen: ÆØÅ ß ŋ ʃ Ω ∑ ≠ ∞ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]

MESSAGES = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Über 東京 🙂?"},
]
SYSTEM = [{"role": "system", "content": "You answer in one sentence."}]


def stream(tok: Tokenizer, ids, **kwargs) -> tuple[str, list[str]]:
    det = IncrementalDetokenizer(tok, **kwargs)
    pieces = [det.push(i) for i in ids]
    pieces.append(det.flush())
    return "".join(pieces), pieces


def stop_inside(text: str, avoid: str = "") -> str:
    """A two-character stop string from the middle of ``text`` (first met there, and
    absent from ``avoid``): taken from the model's own output, so the test asserts how stop
    strings work, not what this CPU's int8 graph happens to write."""
    for start in range(len(text) // 3, len(text) - 2):
        stop = text[start : start + 2]
        if stop.strip() and text.index(stop) == start and stop not in avoid:
            return stop
    raise AssertionError(f"no stop string to take from {text!r}")
