"""Chat templates rendered like transformers' apply_chat_template: the same prompt text
and ids, the jinja environment and helpers, and the errors for bad templates and
messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortgen.errors import InputError, ModelLoadError
from ortgen.text import Tokenizer
from tests.text_fixtures import (
    MESSAGES,
    SYSTEM,
    RustTokenizer,
    auto,
    backend,
    chatml_dir,
    pair,
    root,
    save_folder,
)

# Shared pytest fixtures, imported so pytest finds them here; listed so that linters
# see them used (tests take them by name as arguments).
__all__ = ["backend", "chatml_dir", "pair", "root"]


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
