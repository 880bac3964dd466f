"""Helpers the chat-format tests share (not a test module): whether a format's grammar
lets a tiny family model write an answer and stop."""

from __future__ import annotations

from pathlib import Path

import llguidance

import ortgen
from ortgen.plugins.grammar_compile import shared_tokenizer
from ortgen.text import Tokenizer


def accepts(folder: Path, grammar: str, text: str, eos: str) -> bool:
    """Whether ``grammar`` lets a model with the tokenizer in ``folder`` write ``text``
    and stop there (``eos``: its end-of-sequence token)."""
    tok = Tokenizer.from_folder(folder)
    end = tok.encode(eos, add_special_tokens=False)
    matcher = llguidance.LLMatcher(
        shared_tokenizer({}, tok, 256, end), ortgen.grammar_text("grammar", grammar)
    )
    return all(matcher.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) and (
        matcher.is_accepting()
    )


#: ortgen's hermes-style template and the tokens a tiny model speaking it needs as one
#: token each (the first two are control tokens: left out of decoded text)
HERMES_TEMPLATE = (
    Path(__file__).resolve().parent.parent / "plugins/chat_formats/templates/hermes.jinja"
)
HERMES_SPECIAL = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
)


#: answers the hermes-family model is made to write (``says``): a thought, then text;
#: one call of ``add``
THOUGHT_THEN_ANSWER = "<think>\nI add them.\n</think>\n\nThree."
CALL = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'


def says(text: str) -> dict:
    """The openai client's ``extra_body`` that makes a server started with
    ``--plugin tests.server_plugin`` answer ``text`` (its ``says`` processor)."""
    return {"extra_body": {"logits_processors": [{"name": "says", "text": text}]}}


def export_hermes_family(root: Path) -> Path:
    """A tiny random model speaking ortgen's hermes template (it thinks and calls tools):
    the server, Responses and third-party-format tests' model."""
    from tests.tiny_models import export_chat_family

    return export_chat_family(
        root, "hermes", HERMES_TEMPLATE.read_text(), special_tokens=HERMES_SPECIAL,
        eos="<|im_end|>", control_tokens=HERMES_SPECIAL[:2],
    )  # fmt: skip
