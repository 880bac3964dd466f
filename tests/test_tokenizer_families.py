"""ortgen's tokenizer against transformers' AutoTokenizer across tokenizer families.

Each family is a tiny model trained here with the ``tokenizers`` library (seconds) and
saved through the transformers class real models use: byte-level BPE like GPT-2, Qwen2
and Llama-3, Metaspace/sentencepiece-style like Llama-2/Mistral (the backend
transformers' LlamaConverter builds for legacy True/False and add_prefix_space
True/False; converting with add_prefix_space needs sentencepiece, so the converter's
output is built directly), and added special tokens with lstrip/rstrip. Every folder is
read each way ortgen can (exported by ortgen, resolved by transformers, best-effort)
and must give transformers' ids, decoded text and chat prompts.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from ortgen.errors import ExportError
from ortgen.export.exporter import save_tokenizer
from ortgen.export.tokenizer_export import save_resolved_tokenizer
from ortgen.text import Tokenizer
from ortgen.text.resolved_tokenizer import RESOLVED_FILE
from tests.text_fixtures import LOADERS, MESSAGES, SYSTEM, WORDS, auto, export_folder, make_corpus
from tests.text_fixtures import transformers as tf

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers  # isort: skip
from tokenizers import Tokenizer as RustTokenizer  # isort: skip
from tokenizers import processors, trainers  # isort: skip

# The pre-tokenizer split patterns of GPT-4-era byte-level BPEs (Qwen2 and Llama-3).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOL_USE = (
    "{{ bos_token }}TOOLS {{ tools | tojson }}\n{% for m in messages %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
)
LLAMA3_CHAT = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
LLAMA2_CHAT = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'system' %}"
    "{{ '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' }}"
    "{% else %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# Special tokens every family gets: a lstrip one and a rstrip one, plus a plain added token.
LSTRIP = "<mask>"
RSTRIP = "<|tool|>"
PLAIN_ADDED = "hello_world"

TEXTS = [
    "Hello, world! The quick brown fox.",
    "",
    " ",
    "东京 大阪 日本語のテキスト、中文文本。 한국어 서울",
    "مرحبا بالعالم، كيف حالك؟ नमस्ते दुनिया, आप कैसे हैं?",
    "emoji 🙂🚀 👍🏽 ❤️ family 👨‍👩‍👧 flag 🏳️‍🌈 zwj🧑‍💻",
    "\ttabs\tand  two  spaces,   three,\n\nnew lines\r\n  trailing  ",
    "   leading spaces",
    "\n\nleading new lines",
    f"special {LSTRIP} inside {RSTRIP} text {LSTRIP}{RSTRIP} and {PLAIN_ADDED} too",
    "I don't know , isn't it ? x=1 a+b 3.14 — naïve crème",
]


# --------------------------------------------------------------------------- backends


def _corpus() -> list[str]:
    extra = [*TEXTS, " ".join(WORDS["cjk"]), "مرحبا بالعالم नमस्ते दुनिया 🙂 👨‍👩‍👧"]
    return make_corpus(300, seed=1) + extra * 3


def byte_level_bpe(pattern: str | None, specials: list[str]) -> RustTokenizer:
    """A byte-level BPE: GPT-2's ByteLevel regex, or a Split(pattern) + ByteLevel."""
    tok = RustTokenizer(models.BPE())
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def metaspace_bpe(*, legacy: bool, add_prefix_space: bool) -> RustTokenizer:
    """A byte-fallback BPE set up as transformers' LlamaConverter sets it up."""
    trainer_tok = RustTokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Replace(" ", "▁")
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"])
    trainer_tok.train_from_iterator(_corpus(), trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = RustTokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    if legacy:
        parts = [normalizers.Prepend("▁")] if add_prefix_space else []
        tok.normalizer = normalizers.Sequence([*parts, normalizers.Replace(" ", "▁")])
    else:
        scheme = "first" if add_prefix_space else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme=scheme, split=False
        )
    return tok


def _add_extra_tokens(hf: Any) -> None:
    """Added tokens with lstrip / rstrip / single_word, as models declare them."""
    hf.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(LSTRIP, lstrip=True, rstrip=False, normalized=False, special=True),
                AddedToken(RSTRIP, lstrip=False, rstrip=True, normalized=False, special=True),
            ]
        }
    )
    hf.add_tokens([AddedToken(PLAIN_ADDED, single_word=True, normalized=False)])


# --------------------------------------------------------------------------- families


def gpt2(folder: Path, add_prefix_space: bool) -> None:
    backend = byte_level_bpe(None, ["<|endoftext|>"])
    hf = tf.GPT2TokenizerFast(tokenizer_object=backend, add_prefix_space=add_prefix_space)
    _add_extra_tokens(hf)
    hf.chat_template = CHATML.replace("<|im_start|>", "").replace("<|im_end|>", "<|endoftext|>")
    hf.save_pretrained(str(folder))


def qwen2(folder: Path) -> None:
    backend = byte_level_bpe(QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    hf = tf.Qwen2TokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    _add_extra_tokens(hf)
    hf.chat_template = {"default": CHATML, "tool_use": TOOL_USE}
    hf.save_pretrained(str(folder))


def llama3(folder: Path) -> None:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>"]
    specials += ["<|end_header_id|>", "<|eot_id|>"]
    backend = byte_level_bpe(LLAMA3_PATTERN, specials)
    bos = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    hf = tf.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    )
    _add_extra_tokens(hf)
    hf.chat_template = LLAMA3_CHAT
    hf.save_pretrained(str(folder))


def llama2(folder: Path, legacy: bool, add_prefix_space: bool, add_eos: bool = False) -> None:
    backend = metaspace_bpe(legacy=legacy, add_prefix_space=add_prefix_space)
    hf = tf.LlamaTokenizerFast(tokenizer_object=backend, legacy=legacy, add_eos_token=add_eos)
    _add_extra_tokens(hf)
    hf.chat_template = LLAMA2_CHAT
    hf.save_pretrained(str(folder))


FAMILIES = {
    "gpt2": lambda f: gpt2(f, add_prefix_space=False),
    "gpt2-add_prefix_space": lambda f: gpt2(f, add_prefix_space=True),
    "qwen2": qwen2,
    "llama3": llama3,
    "llama2-legacy": lambda f: llama2(f, legacy=True, add_prefix_space=True),
    "llama2-legacy-no_prefix": lambda f: llama2(f, legacy=True, add_prefix_space=False),
    "llama2-nonlegacy": lambda f: llama2(f, legacy=False, add_prefix_space=True),
    "llama2-nonlegacy-no_prefix": lambda f: llama2(f, legacy=False, add_prefix_space=False),
    "mistral-add_eos": lambda f: llama2(f, legacy=False, add_prefix_space=True, add_eos=True),
}


@pytest.fixture(scope="module")
def family_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenizer-families")


def built(family_root: Path, name: str) -> Path:
    """Family ``name``'s tokenizer as save_pretrained wrote it (built once per module)."""
    folder = family_root / name
    if not (folder / "tokenizer.json").is_file():
        FAMILIES[name](folder)
    return folder


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_dir(request: pytest.FixtureRequest, family_root: Path) -> Path:
    """A family's tokenizer folder as ortgen did not export it (save_pretrained only)."""
    return built(family_root, request.param)


@pytest.fixture(scope="module", params=list(LOADERS))
def family_pair(request: pytest.FixtureRequest, family_dir: Path) -> tuple[Tokenizer, Any]:
    return LOADERS[request.param](family_dir), auto(family_dir)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_text_equal_transformers(family_pair, text: str) -> None:
    tok, hf = family_pair
    for add in (True, False):
        ids = tok.encode(text, add_special_tokens=add)
        assert ids == hf(text, add_special_tokens=add)["input_ids"], (add, text)
        for skip in (True, False):
            got = tok.decode(ids, skip_special_tokens=skip)
            assert got == hf.decode(ids, skip_special_tokens=skip), (add, skip)


def test_batch_special_tokens_and_vocab_equal_transformers(family_pair) -> None:
    tok, hf = family_pair
    assert tok.encode_batch(TEXTS) == hf(TEXTS)["input_ids"]
    assert tok.special_tokens_map == hf.special_tokens_map
    assert tok.all_special_ids == hf.all_special_ids
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(tok, name) == getattr(hf, name), name
    assert tok.vocab_size == len(hf)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", [MESSAGES, SYSTEM + MESSAGES[:1]])
def test_chat_prompt_equals_transformers(family_pair, messages, add_generation_prompt) -> None:
    tok, hf = family_pair
    want = hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want
    want_ids = hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt
    )
    assert tok.encode_chat(messages, add_generation_prompt=add_generation_prompt) == want_ids


def test_named_templates_pick_tool_use_like_transformers(family_root: Path) -> None:
    """Qwen2's folder has a dict of templates: "tool_use" when tools are given."""
    folder = built(family_root, "qwen2")
    hf = auto(folder)
    tools = [{"name": "get_time", "parameters": {}}]
    for load in LOADERS.values():
        tok = load(folder)
        assert tok.chat_templates == hf.chat_template
        for kwargs in ({}, {"tools": tools}):
            want = hf.apply_chat_template(MESSAGES, tokenize=False, **kwargs)
            assert tok.apply_chat_template(MESSAGES, add_generation_prompt=False, **kwargs) == want


def test_exported_file_holds_what_transformers_resolved(family_root: Path) -> None:
    folder = built(family_root, "mistral-add_eos")
    out = export_folder(folder, family_root / "mistral-export")
    data = json.loads((out / RESOLVED_FILE).read_text())
    hf = auto(folder)
    assert data["tokenizer_class"] == "LlamaTokenizerFast"
    assert data["transformers_version"] == tf.__version__
    assert data["special_tokens"] == hf.special_tokens_map
    assert data["special_tokens"]["additional_special_tokens"] == [LSTRIP, RSTRIP]
    assert (data["add_bos"], data["add_eos"]) == (True, True)
    assert data["chat_template"] == LLAMA2_CHAT
    assert data["clean_up_tokenization_spaces"] is False
    # tokenizer.json is the backend transformers built: its post-processor adds BOS/EOS.
    backend = json.loads((out / "tokenizer.json").read_text())
    assert backend["post_processor"]["type"] == "TemplateProcessing"
    # transformers still loads the exported folder, with the same results.
    again = auto(out)
    assert again(TEXTS[3])["input_ids"] == hf(TEXTS[3])["input_ids"]


def test_best_effort_when_transformers_is_missing(family_dir: Path, monkeypatch) -> None:
    """Without transformers a foreign folder still loads, with a warning naming it."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.warns(UserWarning, match="transformers is not installed") as caught:
        tok = Tokenizer.from_folder(family_dir)
    message = str(caught[0].message)
    assert "read best-effort" in message and "Token ids may differ" in message
    cfg = json.loads((family_dir / "tokenizer_config.json").read_text())
    cls = cfg["tokenizer_class"].removesuffix("Fast")
    if cls != "PreTrainedTokenizer":
        assert f"tokenizer class {cls}'s defaults" in message
    if cfg.get("add_prefix_space") is not None:  # null: transformers leaves it alone too
        assert "add_prefix_space rewrite" in message
    assert tok.decode(tok.encode(TEXTS[0])).strip() == TEXTS[0]
    # An ortgen-exported folder needs no transformers and does not warn.
    monkeypatch.undo()
    out = export_folder(family_dir, family_dir.with_name(family_dir.name + "-exp"))
    want = auto(family_dir)(TEXTS[3])["input_ids"]
    monkeypatch.setitem(sys.modules, "transformers", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Tokenizer.from_folder(out).encode(TEXTS[3]) == want


def test_failed_add_prefix_space_rewrite_warns(family_root: Path, tmp_path: Path, monkeypatch):
    """transformers ignores a pre-tokenizer it cannot rebuild; best-effort says so."""
    folder = tmp_path / "bad-rewrite"
    shutil.copytree(built(family_root, "gpt2"), folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["add_prefix_space"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))

    def cannot_rebuild(**state: Any) -> None:
        raise ValueError(f"cannot rebuild from {sorted(state)}")

    # As if this tokenizers version's ByteLevel no longer took its own saved state.
    monkeypatch.setattr(pre_tokenizers, "ByteLevel", cannot_rebuild)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.warns(UserWarning) as caught:
        Tokenizer.from_folder(folder)
    found = [str(w.message) for w in caught if "could not be rebuilt" in str(w.message)]
    assert found and "add_prefix_space=True" in found[0] and "cannot rebuild from" in found[0]


def test_slow_only_tokenizer_is_not_exported_silently(tmp_path: Path) -> None:
    """A source transformers loads only as a slow tokenizer gets no tokenizer.json."""
    src = tmp_path / "ctrl"
    src.mkdir()
    (src / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "UNK": 3}))
    (src / "merges.txt").write_text("#version: 0.2\na b\n")
    (src / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "CTRLTokenizer", "unk_token": "UNK"})
    )
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "tokenizer.json").write_text("{}")  # as if optimum had written one
    messages: list[str] = []
    with pytest.warns(UserWarning, match="only as a slow CTRLTokenizer"):
        assert not save_tokenizer(src, dest, progress=messages.append)
    assert messages and messages[0].startswith("warning:") and "token ids" in messages[0]
    assert not (dest / "tokenizer.json").exists()
    assert not (dest / RESOLVED_FILE).exists()


def test_export_refuses_a_tokenizer_ortgen_would_read_differently(
    family_root: Path, tmp_path: Path
) -> None:
    """A class that changes results in Python (here: decode) fails the export loudly."""
    hf = auto(built(family_root, "qwen2"))
    hf.decode = lambda ids, skip_special_tokens=False, **_: "changed"
    with pytest.raises(ExportError, match="different results from transformers"):
        save_resolved_tokenizer(hf, tmp_path / "out")
