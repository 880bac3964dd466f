"""ortgen.text against transformers on the same tokenizer folders.

The folders are built here: a small byte-level BPE trained with ``tokenizers`` and saved
with transformers' ``save_pretrained`` (the way exported models carry their tokenizer).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortgen.errors import InputError, ModelLoadError
from ortgen.text import (
    IncrementalDetokenizer,
    StopStringMatcher,
    Tokenizer,
    _StreamingCleanUp,
    clean_up_tokenization,
    load_tokenizer,
)

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer as RustTokenizer  # noqa: E402
from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Module-scoped fixtures are safe to share between hypothesis examples.
_FIXTURES = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Uses bos_token / eos_token from the special tokens map, raise_exception, loop controls,
# the {% generation %} tag, tojson and extra keyword arguments, with whitespace that
# trim_blocks / lstrip_blocks act on.
RICH_TEMPLATE = """{{ bos_token }}
{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}
    {% set messages = messages[1:] %}
{% else %}
    {% set system = default_system | default('none') %}
{% endif %}
[SYS] {{ system }}
{% if tools %}
[TOOLS] {{ tools | tojson }}
{% endif %}
{% for message in messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['content'] == 'STOP' %}{% break %}{% endif %}
    {% if message['role'] == 'assistant' %}
        {% generation %}{{ message['content'] + eos_token }}{% endgeneration %}
    {% else %}
        [INST] {{ message['content'] }} [/INST]
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}>>{% endif %}"""


def _words(text: str) -> list[str]:
    return text.split()


_WORDS = {
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
    langs = list(_WORDS)
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(3, 14)):
            words.append(rng.choice(_WORDS[rng.choice(langs)]))
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


@pytest.fixture(scope="module")
def backend() -> RustTokenizer:
    return train_backend()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("text-tokenizers")


@pytest.fixture(scope="module")
def chatml_dir(root: Path, backend: RustTokenizer) -> Path:
    return save_folder(root / "chatml", backend)


@pytest.fixture(scope="module")
def pair(chatml_dir: Path):
    return Tokenizer.from_folder(chatml_dir), auto(chatml_dir)


@pytest.fixture(scope="module")
def cleanup_pair(root: Path, backend: RustTokenizer):
    folder = save_folder(root / "cleanup", backend, clean_up_tokenization_spaces=True)
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


# --------------------------------------------------------------------------- tokenizer


def test_saved_folder_has_transformers_files(chatml_dir: Path):
    names = {p.name for p in chatml_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= names
    assert (chatml_dir / "chat_template.jinja").read_text() == SMOLLM2_TEMPLATE


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_equal_transformers(pair, text: str):
    tok, hf = pair
    ids = tok.encode(text)
    assert ids == hf(text)["input_ids"]
    assert (
        tok.encode(text, add_special_tokens=False)
        == hf(text, add_special_tokens=False)["input_ids"]
    )
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_encode_batch(pair):
    tok, hf = pair
    assert tok.encode_batch(TEXTS) == hf(TEXTS)["input_ids"]
    assert tok.encode_batch([]) == []


def test_special_tokens_equal_transformers(pair):
    tok, hf = pair
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


@given(st.text(max_size=60))
@settings(_FIXTURES, max_examples=200)
def test_clean_up_equals_transformers(text: str):
    base = transformers.PreTrainedTokenizerBase
    assert clean_up_tokenization(text) == base.clean_up_tokenization(text)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
@settings(_FIXTURES, max_examples=150)
def test_encode_decode_random_text_equal_transformers(pair, text: str):
    tok, hf = pair
    ids = tok.encode(text)
    assert ids == hf(text)["input_ids"]
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True) == text


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


# --------------------------------------------------------------------------- loading variants


def test_llama_class_post_processor_and_legacy_special_map(root: Path, backend: RustTokenizer):
    """tokenizer_class LlamaTokenizer: transformers rebuilds the BOS/EOS post-processor from
    add_bos_token / add_eos_token (the exported SmolLM2 folder is of this kind)."""
    for add_bos, add_eos in [(True, False), (True, True), (False, True), (None, None)]:
        folder = save_folder(root / f"llama-{add_bos}-{add_eos}", backend)
        edit_config(
            folder,
            tokenizer_class="LlamaTokenizer",
            add_bos_token=add_bos,
            add_eos_token=add_eos,
            legacy=True,
            add_prefix_space=None,
        )
        tok, hf = Tokenizer.from_folder(folder), auto(folder)
        assert type(hf).__name__ == "LlamaTokenizerFast"
        for text in TEXTS:
            assert tok.encode(text) == hf(text)["input_ids"], (add_bos, add_eos, text)
        ids = tok.encode("hi there")
        assert ids[0] == (1 if add_bos in (True, None) else ids[0])
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids)


def test_special_token_missing_from_vocab_is_added(root: Path, backend: RustTokenizer):
    folder = save_folder(root / "unk", backend)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["unk_token"] = "<unk>"  # not in tokenizer.json: transformers adds it as a new token
    cfg["additional_special_tokens"] = ["<tool>"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    assert len(hf) == tok.vocab_size == backend.get_vocab_size() + 2
    text = "a<unk>b <tool> c"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert tok.unk_token_id == hf.unk_token_id
    assert tok.all_special_ids == hf.all_special_ids
    ids = tok.encode(text)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True) == "ab  c"


def test_legacy_special_tokens_map_without_added_tokens_decoder(root, backend):
    folder = save_folder(root / "legacy-map", backend)
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
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    assert tok.special_tokens_map == hf.special_tokens_map
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == hf.eos_token_id == 0


def test_split_special_tokens(root: Path, backend: RustTokenizer):
    folder = save_folder(root / "split", backend)
    edit_config(folder, split_special_tokens=True)
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    text = "<|im_start|>user\nhi<|im_end|>"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert 1 not in tok.encode(text)


def test_chat_template_in_tokenizer_config(root: Path, backend: RustTokenizer):
    """Older folders keep the template in tokenizer_config.json, as a string or as a list
    of named templates ("default" is used)."""
    folder = save_folder(root / "cfg-template", backend, chat_template=None)
    edit_config(folder, chat_template=SMOLLM2_TEMPLATE)
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    expected = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(MESSAGES) == expected

    named = [
        {"name": "tool_use", "template": "TOOLS {{ messages[0]['content'] }}"},
        {"name": "default", "template": SMOLLM2_TEMPLATE},
    ]
    edit_config(folder, chat_template=named)
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    assert tok.apply_chat_template(MESSAGES) == expected
    assert hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == expected

    edit_config(folder, chat_template=named[:1])
    tok = Tokenizer.from_folder(folder)
    assert not tok.has_chat_template
    with pytest.raises(InputError, match="none named 'default'"):
        tok.apply_chat_template(MESSAGES)


def test_chat_template_jinja_file_preferred(root: Path, backend: RustTokenizer):
    folder = save_folder(root / "both-templates", backend)
    edit_config(folder, chat_template="CONFIG TEMPLATE")
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    assert tok.chat_template == hf.chat_template == SMOLLM2_TEMPLATE


# --------------------------------------------------------------------------- chat template


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", [MESSAGES, SYSTEM + MESSAGES, MESSAGES[:1]])
def test_chat_template_equals_transformers(pair, messages, add_generation_prompt):
    tok, hf = pair
    got = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    want = hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert got == want
    ids = tok.encode_chat(messages, add_generation_prompt=add_generation_prompt)
    assert ids == hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt
    )
    if add_generation_prompt:
        assert got.endswith("<|im_start|>assistant\n")


def test_default_add_generation_prompt_is_true(pair):
    tok, _ = pair
    assert tok.apply_chat_template(MESSAGES).endswith("<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def rich_pair(root: Path, backend: RustTokenizer):
    folder = save_folder(root / "rich", backend, chat_template=RICH_TEMPLATE)
    return Tokenizer.from_folder(folder), auto(folder)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rich_template_equals_transformers(rich_pair, add_generation_prompt):
    """bos_token/eos_token variables, tojson, loop controls, {% generation %}, extra kwargs,
    trim_blocks/lstrip_blocks."""
    tok, hf = rich_pair
    tools = [{"name": "get_weather", "parameters": {"city": "東京", "unit": "°C <&>"}}]
    cases = [
        (MESSAGES, {}),
        (SYSTEM + MESSAGES, {}),
        (MESSAGES, {"tools": tools}),
        (MESSAGES, {"default_system": "custom system"}),
        (MESSAGES, {"eos_token": "</override>"}),  # extra overrides special tokens
        ([*MESSAGES[:2], {"role": "user", "content": "STOP"}, MESSAGES[1]], {}),
    ]
    for messages, extra in cases:
        got = tok.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **extra
        )
        want = hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
        assert got == want, (messages, extra)
    assert tok.apply_chat_template(MESSAGES).startswith("<|im_start|>")


def test_raise_exception_in_template(rich_pair):
    tok, hf = rich_pair
    bad = [MESSAGES[0], MESSAGES[0]]
    import jinja2

    with pytest.raises(jinja2.TemplateError) as hf_err:
        hf.apply_chat_template(bad, tokenize=False)
    with pytest.raises(InputError, match="rejected the messages") as err:
        tok.apply_chat_template(bad)
    assert str(hf_err.value) in str(err.value)
    assert "roles must alternate" in str(err.value)


def test_strftime_now_and_sandbox(root: Path, backend: RustTokenizer):
    template = "{{ strftime_now('%Y') }}|{{ messages | length }}|{{ messages[0].content | upper }}"
    folder = save_folder(root / "strftime", backend, chat_template=template)
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    assert tok.apply_chat_template(MESSAGES) == hf.apply_chat_template(MESSAGES, tokenize=False)

    # ImmutableSandboxedEnvironment: templates cannot mutate the caller's objects.
    folder = save_folder(root / "mutate", backend, chat_template="{{ messages.append(1) }}")
    with pytest.raises(InputError, match="rejected the messages"):
        Tokenizer.from_folder(folder).apply_chat_template(MESSAGES)


def test_template_syntax_error_is_model_load_error(root: Path, backend: RustTokenizer):
    folder = save_folder(root / "syntax", backend, chat_template="{% for m in messages %}")
    tok = Tokenizer.from_folder(folder)  # loading still works: plain text generation is fine
    with pytest.raises(ModelLoadError, match="not valid Jinja"):
        tok.apply_chat_template(MESSAGES)


def test_no_chat_template(root: Path, backend: RustTokenizer):
    folder = save_folder(root / "no-template", backend, chat_template=None)
    tok = Tokenizer.from_folder(folder)
    assert not tok.has_chat_template and tok.chat_template is None
    with pytest.raises(InputError, match="has no chat template") as err:
        tok.apply_chat_template(MESSAGES)
    assert "generate() with plain text" in str(err.value)


@pytest.mark.parametrize(
    ("messages", "pattern"),
    [
        ("hello", "must be a list"),
        ({"role": "user", "content": "x"}, "must be a list"),
        ([], "messages is empty"),
        ([MESSAGES[0], "hi"], r"messages\[1\] is a str"),
        ([MESSAGES[0], MESSAGES[1], {"role": "user"}], r"messages\[2\] has no 'content'"),
        ([{"content": "x"}], r"messages\[0\] has no 'role'"),
        ([MESSAGES[0], {"role": "assistant", "content": None}], r"messages\[1\]\['content'\]"),
        ([{"role": 3, "content": "x"}], r"messages\[0\]\['role'\] is a int"),
    ],
)
def test_bad_messages(pair, messages, pattern):
    tok, _ = pair
    with pytest.raises(InputError, match=pattern):
        tok.apply_chat_template(messages)


# --------------------------------------------------------------------------- folder errors


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
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"tokenizer_config\.json"):
        Tokenizer.from_folder(folder)
    (folder / "tokenizer.json").write_text('{"model": 1}')
    with pytest.raises(ModelLoadError, match="tokenizers library"):
        load_tokenizer(folder)


def test_load_tokenizer_returns_tokenizer(chatml_dir: Path):
    tok = load_tokenizer(chatml_dir)
    assert isinstance(tok, Tokenizer)
    assert "chatml" in repr(tok)


# --------------------------------------------------------------------------- streaming


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


def test_detokenizer_window_is_bounded(pair):
    tok, _ = pair
    rng = random.Random(1)
    text = " ".join(rng.choice(_WORDS[k]) for k in rng.choices(list(_WORDS), k=2000))
    ids = tok.encode(text)
    det = IncrementalDetokenizer(tok)
    out, biggest = [], 0
    for i in ids:
        out.append(det.push(i))
        biggest = max(biggest, det.window_size)
    out.append(det.flush())
    assert "".join(out) == tok.decode(ids)
    assert biggest <= 12

    # Invalid byte runs (lone lead / continuation bytes) never complete: the window must
    # still stay bounded and the text exact.
    lead, cont = (
        tok.backend.token_to_id(_byte_level_char(0xE6)),
        tok.backend.token_to_id(_byte_level_char(0x9D)),
    )
    four = tok.backend.token_to_id(_byte_level_char(0xF0))
    bad = [lead] * 50 + [cont] * 50 + [four, cont, cont] * 30 + tok.encode("ok 東京")
    det = IncrementalDetokenizer(tok)
    out, biggest = [], 0
    for i in bad:
        out.append(det.push(i))
        biggest = max(biggest, det.window_size)
    out.append(det.flush())
    assert "".join(out) == tok.decode(bad)
    assert biggest <= 2 * 8 + 4


@given(ids=st.lists(st.integers(min_value=0, max_value=699), max_size=60), skip=st.booleans())
@settings(_FIXTURES, max_examples=400)
def test_detokenizer_random_ids(pair, ids: list[int], skip: bool):
    tok, _ = pair
    assert tok.vocab_size == 700
    joined, pieces = stream(tok, ids, skip_special_tokens=skip)
    assert joined == tok.decode(ids, skip_special_tokens=skip)
    assert not any(p.endswith("\ufffd") for p in pieces[:-1]) or "\ufffd" in joined


_BYTEISH = st.sampled_from([0xE6, 0x9D, 0xB1, 0xF0, 0x9F, 0x99, 0x82, 0xC3, 0x9C, 0x80, 0x41])


@given(st.lists(_BYTEISH, max_size=60))
@settings(_FIXTURES, max_examples=300)
def test_detokenizer_random_byte_tokens(pair, raw: list[int]):
    """Sequences of single-byte tokens: valid, partial and invalid UTF-8 mixed."""
    tok, _ = pair
    ids = [tok.backend.token_to_id(_byte_level_char(b)) for b in raw]
    joined, _ = stream(tok, ids)
    assert joined == tok.decode(ids) == bytes(raw).decode("utf-8", errors="replace")


_PIECES = [*"aeoun t'.,?!\n", *"ÜäéçñßÆ", *"東京日本語你好한", "🙂", "🚀", "👍🏽", "❤️", "👨‍👩‍👧"]
_MIXED_TEXT = st.lists(st.sampled_from(_PIECES), max_size=60).map("".join)


@given(_MIXED_TEXT)
@settings(_FIXTURES, max_examples=300)
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
@settings(_FIXTURES, max_examples=300)
def test_detokenizer_random_ids_byte_fallback(sentencepiece_tok, ids: list[int], skip: bool):
    tok = sentencepiece_tok
    assert tok.vocab_size == 756
    joined, _ = stream(tok, ids, skip_special_tokens=skip)
    assert joined == tok.decode(ids, skip_special_tokens=skip)


@given(_MIXED_TEXT)
@settings(_FIXTURES, max_examples=200)
def test_detokenizer_byte_fallback_text(sentencepiece_tok, text: str):
    tok = sentencepiece_tok
    ids = [1, *tok.encode(text), 2]
    joined, pieces = stream(tok, ids)
    assert joined == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    assert tok.eos_token_id == 2


@given(ids=st.lists(st.integers(min_value=0, max_value=699), max_size=60))
@settings(_FIXTURES, max_examples=200)
def test_detokenizer_random_ids_with_clean_up(cleanup_pair, ids: list[int]):
    tok, hf = cleanup_pair
    joined, _ = stream(tok, ids)
    assert joined == tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


@given(
    st.lists(st.text(alphabet=st.sampled_from(list(" .?!,'ntmsvrex ")), max_size=6), max_size=30)
)
@settings(_FIXTURES, max_examples=500)
def test_streaming_clean_up_equals_clean_up(chunks: list[str]):
    cleaner = _StreamingCleanUp()
    out = "".join(cleaner.feed(c) for c in chunks) + cleaner.flush()
    assert out == clean_up_tokenization("".join(chunks))


def test_detokenizer_rejects_bad_ids(pair):
    tok, _ = pair
    det = IncrementalDetokenizer(tok)
    with pytest.raises(InputError):
        det.push(-3)
    with pytest.raises(InputError):
        det.push("x")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- stop strings


def test_stop_find():
    m = StopStringMatcher(["###", "\nUser:", "END"])
    assert m.find("hello") is None
    assert m.find("hello ### END") == 6
    assert m.find("END then ###") == 0
    assert m.find("a\nUser: b") == 1
    assert m.find("") is None
    assert m.max_length == 6 and bool(m)
    assert m.match("x ##### y") == (2, "###")
    assert m.match("nothing") is None


def test_stop_find_start_reaches_back():
    m = StopStringMatcher(["###"])
    text = "abc##"
    assert m.find(text) is None
    text += "#tail"
    assert m.find(text, start=5) == 3  # spans the boundary of the earlier search
    assert m.find("###abcdef", start=8) is None  # ends before start - max_length + 1


def test_stop_overlapping_and_same_start():
    m = StopStringMatcher(["ab", "abc", "bcd"])
    assert m.find("xabcd") == 1
    assert m.match("xabcd") == (1, "abc")
    assert m.find("xbcd") == 1


def test_stop_safe_length():
    m = StopStringMatcher(["###", "<|end|>"])
    assert m.safe_length("Hello") == 5
    assert m.safe_length("Hello #") == 6
    assert m.safe_length("Hello ##") == 6
    assert m.safe_length("Hello <|en") == 6
    assert m.safe_length("Hello <|end|> more") == 6
    assert m.safe_length("Hello ### more") == 6
    assert m.safe_length("") == 0
    assert m.safe_length("#") == 0
    assert StopStringMatcher([]).safe_length("abc") == 3
    assert StopStringMatcher([]).find("abc") is None


@given(
    stops=st.lists(st.text(alphabet="ab#", min_size=1, max_size=4), min_size=1, max_size=3),
    chunks=st.lists(st.text(alphabet="ab#c", max_size=3), max_size=20),
)
@settings(_FIXTURES, max_examples=500)
def test_stop_streaming_never_shows_stop_prefix(stops: list[str], chunks: list[str]):
    """Streaming with safe_length shows exactly the text before the first stop string."""
    m = StopStringMatcher(stops)
    text, shown = "", ""
    stopped = False
    for chunk in chunks:
        text += chunk
        safe = m.safe_length(text)
        assert safe >= len(shown)  # never retracts
        assert text.startswith(shown)
        shown = text[:safe]
        if m.find(text) is not None:
            stopped = True
            break
    full_stop = m.find(text)
    if stopped:
        assert shown == text[:full_stop]
    else:
        # What is held back is a prefix of some stop string, and nothing more.
        held = text[len(shown) :]
        assert all(not text.endswith(s) for s in stops)
        assert held == "" or any(s.startswith(held) and s != held for s in stops)


@pytest.mark.parametrize(
    ("stops", "pattern"),
    [
        (["ok", ""], "stop string 1 is empty"),
        ("###", "single string"),
        (["ok", 3], "item 1 is a int"),
        (5, "must be a list"),
    ],
)
def test_stop_errors(stops, pattern):
    with pytest.raises(InputError, match=pattern):
        StopStringMatcher(stops)


# --------------------------------------------------------------------------- import weight


def test_import_does_not_pull_transformers_or_torch(chatml_dir: Path):
    code = (
        "import sys; from ortgen.text import load_tokenizer; "
        f"t = load_tokenizer({str(chatml_dir)!r}); "
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}]); t.decode(t.encode('hi')); "
        "bad = [m for m in ('transformers', 'torch') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- default model


@pytest.mark.default_model
def test_default_model_tokenizer_equals_transformers(default_model_dir: Path):
    tok, hf = Tokenizer.from_folder(default_model_dir), auto(default_model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
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
