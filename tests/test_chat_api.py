"""Chat through the API: tools and template options reach the model's chat template as
transformers' ``apply_chat_template`` passes them, on the default model's own template."""

from __future__ import annotations

import pytest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Let me check: it is"},
]


@pytest.fixture(scope="module")
def hf_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.mark.parametrize(
    "options",
    [{}, {"tools": TOOLS}, {"continue_final_message": True}],
    ids=["plain", "tools", "continue"],
)
def test_chat_prompt_equals_transformers(default_gen, hf_tokenizer, options):
    messages = MESSAGES if options.get("continue_final_message") else MESSAGES[:1]
    add = not options.get("continue_final_message")
    expected = hf_tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add, **options
    )
    assert default_gen.chat_prompt(messages, **options) == list(expected)


def test_chat_continues_the_final_message(default_gen):
    out = default_gen.chat(
        MESSAGES, template_kwargs={"continue_final_message": True}, max_new_tokens=6
    )
    prompt = default_gen.chat_prompt(MESSAGES, continue_final_message=True)
    assert default_gen.tokenizer.decode(prompt).endswith("Let me check: it is")
    assert out.tokens[0] == default_gen.generate(prompt, max_new_tokens=6).tokens[0]
