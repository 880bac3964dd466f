"""Chat messages as transformers accepts them: content parts, tool calls, tool results,
``tools=``, ``documents=`` and ``continue_final_message``, rendered by real models' chat
templates exactly as transformers' ``apply_chat_template(..., tokenize=False)`` renders
them; and a clear InputError, naming the message and the problem, for bad input."""

# The models' templates are kept verbatim, long lines included.
# ruff: noqa: E501

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ortgen.errors import InputError
from ortgen.text import Tokenizer, load_tokenizer
from ortgen.text.chat_template import ChatTemplate
from tests.text_fixtures import (
    MESSAGES,
    SMOLLM2_TEMPLATE,
    RustTokenizer,
    auto,
    backend,
    root,
    save_folder,
)

# Shared pytest fixtures, imported so pytest finds them here; listed so that linters
# see them used (tests take them by name as arguments).
__all__ = ["backend", "root"]

# Qwen2.5-Instruct's template, as published: tools with `tojson`, tool_calls in either
# shape (`tool_call.function is defined`), consecutive tool results merged in one turn.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Llama 3.2-Instruct's template: `tools is not none`, tools in the first user message
# or the system prompt (`tools_in_user_message`), `tojson(indent=4)`, one OpenAI-shape
# tool call, ipython/tool results (a dict result printed with `tojson`), date_string.
LLAMA32_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Gemma 3's template: content as a string or a list of parts, an image part becoming
# <start_of_image>, text parts trimmed; the system prompt (string or parts) prefixed.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# SmolVLM / Idefics3's template: content must be a list of parts (indexes [0]['type']).
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}"
    "{% endif %}"
)

# A retrieval template in the Command-R manner: documents listed before the chat.
DOCUMENTS_TEMPLATE = """{{ bos_token }}
{%- if documents %}
<documents>
{%- for doc in documents %}

Document: {{ loop.index0 }}
title: {{ doc.title }}
text: {{ doc.text }}
{%- endfor %}
</documents>
{% endif %}
{%- for message in messages %}
<|{{ message.role }}|>{{ message.content }}<|end|>
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>
{%- endif %}"""

TEMPLATES = {
    "qwen25": QWEN25_TEMPLATE,
    "llama32": LLAMA32_TEMPLATE,
    "gemma3": GEMMA3_TEMPLATE,
    "smolvlm": SMOLVLM_TEMPLATE,
    "smollm2": SMOLLM2_TEMPLATE,
    "documents": DOCUMENTS_TEMPLATE,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time <&> in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

USER_ASKS = {"role": "user", "content": "What's the weather in 東京?"}
OPENAI_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "東京", "unit": "celsius"}},
        }
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "22°C"}
ANSWER = {"role": "assistant", "content": "It is 22°C in 東京."}

# Qwen-style conversations: every tool-call shape transformers users send.
QWEN_CONVERSATIONS = [
    [USER_ASKS],
    [{"role": "system", "content": "Be brief."}, USER_ASKS],
    [USER_ASKS, OPENAI_CALL, TOOL_RESULT, ANSWER, {"role": "user", "content": "Thanks!"}],
    # The plain {"name", "arguments"} shape, content absent.
    [
        USER_ASKS,
        {
            "role": "assistant",
            "tool_calls": [
                {"name": "get_weather", "arguments": {"city": "東京"}},
                {"name": "get_time", "arguments": {"city": "東京"}},
            ],
        },
        {"role": "tool", "name": "get_weather", "content": "22°C"},
        {"role": "tool", "name": "get_time", "content": "14:05"},
    ],
    # Arguments as the JSON string OpenAI sends (printed as the template prints it),
    # with visible content before the call.
    [
        USER_ASKS,
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "東京"}'},
                }
            ],
        },
        TOOL_RESULT,
    ],
]

LLAMA_CONVERSATIONS = [
    [USER_ASKS],
    [{"role": "system", "content": "Be brief. "}, USER_ASKS, OPENAI_CALL, TOOL_RESULT],
    # A dict tool result (Llama prints it with tojson) and the ipython role.
    [USER_ASKS, OPENAI_CALL, {"role": "tool", "content": {"temp": 22, "unit": "°C"}}],
    [USER_ASKS, OPENAI_CALL, {"role": "ipython", "content": "22°C"}, ANSWER],
]

IMAGE = {"type": "image", "url": "https://example.com/cat.png"}
PARTS_CONVERSATIONS = [
    [{"role": "user", "content": [IMAGE, {"type": "text", "text": "What is this? "}]}],
    [
        {"role": "system", "content": [{"type": "text", "text": "You describe images."}]},
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, IMAGE, IMAGE]},
        {"role": "assistant", "content": [{"type": "text", "text": "Two cats."}]},
        {"role": "user", "content": [{"type": "text", "text": "Über 東京 🙂?"}]},
    ],
    # Unknown part types and extra keys pass through; the template decides.
    [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Listen:", "cache_control": {"type": "ephemeral"}},
                {"type": "audio", "path": "a.wav"},
                {"type": "video", "url": "v.mp4"},
            ],
        }
    ],
]
# Gemma 3 takes both forms, mixed.
MIXED_CONVERSATIONS = [
    *PARTS_CONVERSATIONS,
    [{"role": "system", "content": "Plain system."}, *PARTS_CONVERSATIONS[1][1:]],
    MESSAGES,
]


def _pair(root: Path, backend: RustTokenizer, name: str) -> tuple[Tokenizer, Any]:
    folder = root / f"msg-{name}"
    if not folder.exists():
        save_folder(folder, backend, chat_template=TEMPLATES[name], bos_token="<|endoftext|>")
    tok = load_tokenizer(folder)
    assert tok is not None
    return tok, auto(folder)


@pytest.fixture(scope="module")
def pairs(root: Path, backend: RustTokenizer) -> dict[str, tuple[Tokenizer, Any]]:
    return {name: _pair(root, backend, name) for name in TEMPLATES}


def _same(pair: tuple[Tokenizer, Any], messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """Render with ortgen and transformers; assert equal; return the prompt. Also checks
    that neither side changed the caller's messages."""
    tok, hf = pair
    before = copy.deepcopy(messages)
    want = hf.apply_chat_template(messages, tokenize=False, **kwargs)
    got = tok.apply_chat_template(messages, **kwargs)
    assert got == want
    assert messages == before
    return got


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("tools", [TOOLS, [WEATHER_TOOL["function"]], None])
@pytest.mark.parametrize("conversation", range(len(QWEN_CONVERSATIONS)))
def test_qwen25_tools_and_tool_calls(pairs, conversation, tools, add_generation_prompt):
    got = _same(
        pairs["qwen25"],
        QWEN_CONVERSATIONS[conversation],
        tools=tools,
        add_generation_prompt=add_generation_prompt,
    )
    if tools is not None:
        assert json.dumps(tools[0], ensure_ascii=False) in got


def test_qwen25_prompt_text(pairs):
    """The rendered tool call and result, spelled out, so a regression in both renderers
    at once would still show."""
    tok, _ = pairs["qwen25"]
    got = tok.apply_chat_template(QWEN_CONVERSATIONS[2], tools=TOOLS, add_generation_prompt=False)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "東京", "unit": "celsius"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n22°C\n</tool_response><|im_end|>\n"
    ) in got


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("tools_in_user_message", [True, False])
@pytest.mark.parametrize("conversation", range(len(LLAMA_CONVERSATIONS)))
def test_llama32_tools(pairs, conversation, tools_in_user_message, add_generation_prompt):
    _same(
        pairs["llama32"],
        LLAMA_CONVERSATIONS[conversation],
        tools=TOOLS,
        tools_in_user_message=tools_in_user_message,
        date_string="01 Jan 2025",
        add_generation_prompt=add_generation_prompt,
    )


def test_llama32_without_tools_uses_strftime_now(pairs):
    # `tools is not none`: no tools= means None, as in transformers (not undefined).
    got = _same(pairs["llama32"], [USER_ASKS], add_generation_prompt=True)
    assert "Environment: ipython" not in got


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", range(len(MIXED_CONVERSATIONS)))
def test_gemma3_content_parts(pairs, conversation, add_generation_prompt):
    _same(
        pairs["gemma3"],
        MIXED_CONVERSATIONS[conversation],
        add_generation_prompt=add_generation_prompt,
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", range(len(PARTS_CONVERSATIONS)))
def test_smolvlm_content_parts(pairs, conversation, add_generation_prompt):
    got = _same(
        pairs["smolvlm"],
        PARTS_CONVERSATIONS[conversation],
        add_generation_prompt=add_generation_prompt,
    )
    if conversation == 0:
        assert got.startswith("<|im_start|>User:<image>What is this? <end_of_utterance>\n")


@pytest.mark.parametrize("documents", [None, [], [{"title": "Cats", "text": "Cats purr."}]])
def test_documents(pairs, documents):
    docs = documents and [*documents, {"title": "東京", "text": "Capital <&>."}]
    got = _same(pairs["documents"], MESSAGES, documents=docs, add_generation_prompt=True)
    assert ("<documents>" in got) == bool(docs)


# ------------------------------------------------------------------ continue_final_message

PREFILL = {"role": "assistant", "content": "The answer is"}
CONTINUE_CASES = [
    ("smollm2", [*MESSAGES, PREFILL]),
    ("qwen25", [USER_ASKS, PREFILL]),
    ("qwen25", [USER_ASKS]),  # any final message can be continued, not only assistant
    ("llama32", [USER_ASKS, {"role": "assistant", "content": "Sure,  "}]),
    ("gemma3", [*PARTS_CONVERSATIONS[1][1:3]]),  # last text part of a parts message
    # Trailing space the template trims: transformers cuts before it (rstrip).
    ("gemma3", [MESSAGES[0], {"role": "assistant", "content": "Well, "}]),
    (
        "smolvlm",
        [
            PARTS_CONVERSATIONS[0][0],
            {"role": "assistant", "content": [{"type": "text", "text": "It is"}, IMAGE]},
        ],
    ),
]


@pytest.mark.parametrize(("name", "messages"), CONTINUE_CASES)
def test_continue_final_message(pairs, name, messages):
    got = _same(pairs[name], messages, continue_final_message=True, add_generation_prompt=False)
    last = messages[-1]["content"]
    text = last if isinstance(last, str) else next(p["text"] for p in last if "text" in p)
    assert got.endswith(text.rstrip()) or got.endswith(text)


def test_continue_final_message_with_tools(pairs):
    _same(
        pairs["qwen25"],
        [*QWEN_CONVERSATIONS[2][:3], PREFILL],
        tools=TOOLS,
        continue_final_message=True,
        add_generation_prompt=False,
    )


def test_continue_final_message_needs_generation_prompt_off(pairs):
    tok, hf = pairs["smollm2"]
    messages = [*MESSAGES, PREFILL]
    with pytest.raises(ValueError, match="not compatible"):
        hf.apply_chat_template(
            messages, tokenize=False, continue_final_message=True, add_generation_prompt=True
        )
    # Asking for both is the same error in ortgen; by default ortgen's Tokenizer adds the
    # generation prompt only when not continuing, so continuing alone just works.
    with pytest.raises(InputError, match="add_generation_prompt=False"):
        tok.apply_chat_template(messages, continue_final_message=True, add_generation_prompt=True)
    assert tok.apply_chat_template(messages, continue_final_message=True) == (
        hf.apply_chat_template(
            messages, tokenize=False, continue_final_message=True, add_generation_prompt=False
        )
    )


def test_continue_final_message_default_generation_prompt():
    """add_generation_prompt=None (the default an API can pass): on, unless continuing."""
    template = ChatTemplate(SMOLLM2_TEMPLATE, owner="test")
    messages = [*MESSAGES, PREFILL]
    kwargs: dict[str, Any] = {"add_generation_prompt": None, "special_tokens": {}}
    assert template.render(messages, extra={}, **kwargs).endswith("<|im_start|>assistant\n")
    got = template.render(messages, extra={"continue_final_message": True}, **kwargs)
    assert got.endswith("<|im_start|>assistant\nThe answer is")
    off = template.render(messages, extra={"continue_final_message": False}, **kwargs)
    assert off.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("messages", "pattern"),
    [
        ([USER_ASKS, OPENAI_CALL], r"final message \(messages\[1\]\) has no text"),
        ([{"role": "user", "content": [IMAGE]}], r"final message \(messages\[0\]\) has no text"),
    ],
)
def test_continue_final_message_without_text(pairs, messages, pattern):
    tok, hf = pairs["qwen25"]
    with pytest.raises((ValueError, TypeError)):
        hf.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    with pytest.raises(InputError, match=pattern):
        tok.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)


def test_continue_final_message_dropped_by_template(root: Path, backend: RustTokenizer):
    """A template that does not print the final message cannot be continued."""
    folder = save_folder(
        root / "msg-first-only", backend, chat_template="{{ messages[0]['content'] }}"
    )
    tok, hf = Tokenizer.from_folder(folder), auto(folder)
    with pytest.raises(ValueError, match="does not appear"):
        hf.apply_chat_template(MESSAGES, tokenize=False, continue_final_message=True)
    with pytest.raises(InputError, match="does not render the final message"):
        tok.apply_chat_template(MESSAGES, add_generation_prompt=False, continue_final_message=True)


# ------------------------------------------------------------------ transformers' own options


def test_tokenize_options_off_are_accepted(pairs):
    tok, hf = pairs["smollm2"]
    off = {"tokenize": False, "padding": False, "truncation": False, "return_dict": False}
    got = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, **off, max_length=None)
    assert got == hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize(
    ("option", "pattern"),
    [
        ({"tokenize": True}, "tokenize=True is a transformers tokenization option"),
        ({"return_dict": True}, "encode_chat"),
        ({"return_tensors": "np"}, "return_tensors='np'"),
        ({"chat_template": "{{ messages }}"}, "chat_template= is not supported"),
    ],
)
def test_tokenize_options_on_are_refused(pairs, option, pattern):
    tok, _ = pairs["smollm2"]
    with pytest.raises(InputError, match=pattern):
        tok.apply_chat_template(MESSAGES, **option)


# ------------------------------------------------------------------ tools and documents errors


def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: The city.
    """
    return city


@pytest.mark.parametrize(
    ("tools", "pattern"),
    [
        ([get_weather], r"tools\[0\] is the function get_weather.*get_json_schema"),
        ([WEATHER_TOOL, "get_time"], r"tools\[1\] is a str"),
        (WEATHER_TOOL, "tools must be a list of JSON-schema dicts.*got dict"),
        ("get_weather", "tools must be a list.*got str"),
    ],
)
def test_bad_tools(pairs, tools, pattern):
    tok, _ = pairs["qwen25"]
    with pytest.raises(InputError, match=pattern):
        tok.apply_chat_template([USER_ASKS], tools=tools)


@pytest.mark.parametrize(
    ("documents", "pattern"),
    [
        ([{"title": "a", "text": "b"}, "c"], r"documents\[1\] is a str"),
        ({"title": "a", "text": "b"}, "documents must be a list"),
    ],
)
def test_bad_documents(pairs, documents, pattern):
    tok, hf = pairs["documents"]
    if isinstance(documents, list):
        with pytest.raises(TypeError, match="Documents should be a list of dicts"):
            hf.apply_chat_template(MESSAGES, tokenize=False, documents=documents)
    with pytest.raises(InputError, match=pattern):
        tok.apply_chat_template(MESSAGES, documents=documents)


# ------------------------------------------------------------------ bad messages

CALL = {"type": "function", "function": {"name": "f", "arguments": {}}}


@pytest.mark.parametrize(
    ("messages", "pattern"),
    [
        ("hello", "messages must be a list"),
        ([], "messages is empty"),
        ([MESSAGES, MESSAGES], "list of conversations"),
        ([USER_ASKS, 3], r"messages\[1\] is a int"),
        ([{"content": "x"}], r"messages\[0\] has no 'role'.*got keys \['content'\]"),
        ([{"role": None, "content": "x"}], r"messages\[0\]\['role'\] is a NoneType"),
        ([{"role": " ", "content": "x"}], r"messages\[0\]\['role'\] is empty"),
        ([{"role": "user"}], r"messages\[0\] has no 'content'; only an assistant"),
        ([{"role": "user", "content": None}], r"messages\[0\]\['content'\] is None"),
        ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] is a int"),
        ([{"role": "user", "content": {"text": "x"}}], r"messages\[0\]\['content'\] is a dict"),
        ([{"role": "user", "content": ["hi"]}], r"messages\[0\]\['content'\]\[0\] is a str"),
        (
            [{"role": "user", "content": [{"text": "hi"}]}],
            r"messages\[0\]\['content'\]\[0\] has no 'type' string \(got keys \['text'\]\)",
        ),
        (
            [{"role": "user", "content": [IMAGE, {"type": "text"}]}],
            r"messages\[0\]\['content'\]\[1\] is a text part whose 'text' is nothing",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 5}]}],
            r"'text' is int",
        ),
        (
            [USER_ASKS, {"role": "assistant", "content": None, "tool_calls": []}],
            r"messages\[1\]\['content'\] is None; only an assistant message with 'tool_calls'",
        ),
        (
            [USER_ASKS, {"role": "assistant", "tool_calls": CALL}],
            r"messages\[1\]\['tool_calls'\] is a dict; it must be a list",
        ),
        (
            [USER_ASKS, {"role": "assistant", "tool_calls": [CALL, "f()"]}],
            r"messages\[1\]\['tool_calls'\]\[1\] is a str",
        ),
        (
            [USER_ASKS, {"role": "assistant", "tool_calls": [{"function": "f"}]}],
            r"messages\[1\]\['tool_calls'\]\[0\]\['function'\] is a str",
        ),
        (
            [USER_ASKS, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}],
            r"messages\[1\]\['tool_calls'\]\[0\]\['function'\] has no 'name' string",
        ),
        (
            [USER_ASKS, {"role": "assistant", "tool_calls": [{"arguments": {}}]}],
            r"messages\[1\]\['tool_calls'\]\[0\] has no 'name' string",
        ),
        (
            [USER_ASKS, {"role": "tool", "tool_call_id": "call_1"}],
            r"messages\[1\] has no 'content'",
        ),
    ],
)
def test_bad_messages(pairs, messages, pattern):
    tok, _ = pairs["qwen25"]
    with pytest.raises(InputError, match=pattern):
        tok.apply_chat_template(messages, tools=TOOLS)


@pytest.mark.parametrize(
    ("name", "messages", "hint"),
    [
        # The template's own raise_exception (Llama takes one tool call per turn).
        ("llama32", [USER_ASKS, {"role": "assistant", "tool_calls": [CALL, CALL]}], "single"),
        # Tool calls without content on a template that concatenates content.
        ("smollm2", [USER_ASKS, OPENAI_CALL], r"messages\[1\] has no content"),
    ],
)
def test_template_crash_is_input_error(pairs, name, messages, hint):
    """Where transformers lets the template crash (TypeError, UndefinedError...), ortgen
    says which template failed and what in the messages it likely did not expect."""
    import jinja2

    tok, hf = pairs[name]
    with pytest.raises((TypeError, jinja2.TemplateError)):
        hf.apply_chat_template(messages, tokenize=False)
    with pytest.raises(InputError, match=r"chat template of .* (failed on|rejected)") as err:
        tok.apply_chat_template(messages)
    assert re.search(hint, str(err.value))


def test_a_string_template_takes_text_parts_joined(pairs):
    """Text-only parts render as their newline-joined text on a template written for
    strings (transformers' template crashes on the list); the same text as a string
    gives the same prompt. A template that loops over parts gets them as they are."""
    from ortgen.text.content_format import detect_content_format

    tok, hf = pairs["smollm2"]
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
        },
    ]
    strings = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]
    want = hf.apply_chat_template(strings, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(parts, add_generation_prompt=True) == want
    with pytest.raises(InputError, match=r"messages\[0\]\.content\[0\] is a 'image' part"):
        tok.apply_chat_template(PARTS_CONVERSATIONS[0])
    assert detect_content_format(SMOLLM2_TEMPLATE) == "string"
    assert detect_content_format(pairs["smolvlm"][0].chat_template) == "openai"
    assert detect_content_format(pairs["gemma3"][0].chat_template) == "openai"
