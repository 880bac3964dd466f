"""TEMPORARY stand-in (replaced by the reasoning module in this change)."""

from __future__ import annotations

import json
from typing import Any

THINK_TAGS = ("<think>", "</think>")


def split_reasoning(text: str, tags: tuple[str, str], *, opened: bool) -> tuple[str | None, str]:
    body = text
    if not opened:
        stripped = text.lstrip()
        if not stripped.startswith(tags[0]):
            return None, text
        body = stripped[len(tags[0]) :]
    thought, closed, answer = body.partition(tags[1])
    if not closed:
        return thought.strip(), ""
    return thought.strip(), answer.lstrip()


class ReasoningStream:
    def __init__(self, tags: tuple[str, str], *, opened: bool) -> None:
        self.tags = tags
        self.opened = opened
        self.text = ""
        self.sent: tuple[str, str] = ("", "")

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.text += piece
        return []

    def finish(self) -> list[tuple[str, str]]:
        reasoning, answer = split_reasoning(self.text, self.tags, opened=self.opened)
        out = []
        if reasoning:
            out.append(("reasoning", reasoning))
        if answer:
            out.append(("answer", answer))
        return out


def after_thought(setting: str, value: Any, tags: tuple[str, str], *, opened: bool) -> str:
    answer: dict[str, Any]
    if setting == "json_schema":
        answer = {"json_schema": {**value, "x-guidance": {"whitespace_flexible": False}}}
    elif setting == "json_object":
        answer = {"json_schema": {"type": "object", "x-guidance": {"whitespace_flexible": False}}}
    elif setting == "grammar":
        answer = {"lark_grammar": value}
    elif setting == "regex":
        answer = {"lark_grammar": f"start: /{value}/"}
    else:
        answer = {"lark_grammar": "start: " + " | ".join(json.dumps(v) for v in value)}
    o, c = (json.dumps(t) for t in tags)
    thought = f"{o} ortgen_thought ORTGEN_GAP" if not opened else "ortgen_thought ORTGEN_GAP"
    main = (
        f"start: {'ortgen_think' if opened else 'ortgen_think?'} @answer\n"
        f"ortgen_think: {thought}\nortgen_thought[suffix={c}]: /(?s:.*)/\n"
        "ORTGEN_GAP: /[ \\n]*/"
    )
    return json.dumps({"grammars": [{"lark_grammar": main}, {"name": "answer", **answer}]})
