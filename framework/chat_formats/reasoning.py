"""Thinking: a reply that reasons inside tags first, then answers.

Qwen3, SmolLM3 and the DeepSeek-R1 distills write ``<think>...</think>`` before the
answer. Some templates open the thought themselves (DeepSeek-R1's generation prompt ends
with ``<think>\\n``), so the reply then starts inside it: :func:`opens_thought` says so
from the rendered prompt. Pure functions on text, no model:

- :func:`split_reasoning`: a whole reply as (reasoning, answer);
- :class:`ReasoningStream`: the same split as the reply streams, delta by delta;
- :func:`after_thought`: llguidance grammar text that leaves the thought free and holds
  the answer to a structured-output constraint ("free to think, strict to answer").

Tags are two non-empty strings without whitespace at either end (``("<think>",
"</think>")``, or a format's own through :class:`~ortgen.protocols.chat_formats.MarksReasoning`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "THINK_TAGS",
    "ReasoningStream",
    "after_thought",
    "opens_thought",
    "split_reasoning",
]

#: the tags nearly every thinking family uses
THINK_TAGS = ("<think>", "</think>")

#: llguidance's JSON options for an answer (framework/structured/check.py's JSON_DEFAULTS:
#: compact, since with flexible whitespace a small model drifts into endless spaces)
_JSON_DEFAULTS = {"whitespace_flexible": False}
#: most whitespace the grammar allows between a thought and its answer (a small model
#: may otherwise drift into endless newlines there, as in flexible JSON)
_GAP = 8
#: Rust regex-syntax's meta characters (``regex_syntax::is_meta_character``)
_META = frozenset("\\.+*?()|[]{}^$#&-~")
_SETTINGS = ("json_schema", "json_object", "regex", "grammar", "choice")


def _tags(tags: Sequence[str]) -> tuple[str, str]:
    """The (open, close) pair, checked: a tag with whitespace at an end would make the
    stream's held-back whitespace and a tag's start overlap."""
    if isinstance(tags, str) or len(tags) != 2:
        raise ValueError(f"tags must be an (open, close) pair of strings, got {tags!r}")
    open_tag, close_tag = tags
    for tag in (open_tag, close_tag):
        if not isinstance(tag, str) or not tag or tag != tag.strip():
            raise ValueError(
                f"a reasoning tag must be a non-empty string without whitespace at its "
                f"ends, got {tag!r}"
            )
    return open_tag, close_tag


def opens_thought(prompt_text: str, tags: Sequence[str]) -> bool:
    """Whether the rendered ``prompt_text`` ends inside an open thought: its last open
    tag comes after its last close tag (DeepSeek-R1's ``...<think>\\n``; Qwen3's empty
    ``<think>\\n\\n</think>\\n\\n`` with ``enable_thinking=False`` is closed)."""
    open_tag, close_tag = _tags(tags)
    opened = prompt_text.rfind(open_tag)
    return opened >= 0 and prompt_text.find(close_tag, opened + len(open_tag)) < 0


def split_reasoning(text: str, tags: Sequence[str], *, opened: bool) -> tuple[str | None, str]:
    """A whole reply as (reasoning, answer).

    The thought starts at the start of ``text`` when ``opened`` (the prompt opened it),
    else when ``text``, after leading whitespace, starts with the open tag; without one
    the whole text is the answer (reasoning None). The reasoning is the text up to the
    close tag, stripped; the answer what follows, without its leading whitespace. A
    thought never closed (cut by the token limit) is all reasoning, answer ``''``.
    """
    open_tag, close_tag = _tags(tags)
    if opened:
        body = text
    else:
        lead = text.lstrip()
        if not lead.startswith(open_tag):
            return None, text
        body = lead[len(open_tag) :]
    end = body.find(close_tag)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(close_tag) :].lstrip()


class ReasoningStream:
    """:func:`split_reasoning` as the reply streams.

    ``feed(piece)`` returns the new ``("reasoning" | "answer", text)`` deltas (never an
    empty one) and ``finish()`` the last ones; for every way of cutting a text into
    pieces, the joined reasoning deltas are its :func:`split_reasoning` reasoning (``''``
    for None) and the joined answer deltas its answer. So a stream holds back what the
    rest may still change: the text that may be the start of a tag, and whitespace that
    the whole split would strip (a thought's trailing whitespace, an answer's leading).
    Each piece costs its own length plus the tags' (nothing is rescanned).
    """

    _START, _THOUGHT, _GAP, _ANSWER = range(4)

    def __init__(self, tags: Sequence[str], *, opened: bool) -> None:
        self._open, self._close = _tags(tags)
        self._state = self._THOUGHT if opened else self._START
        #: before the open tag: leading whitespace (kept: it is answer text if no thought
        #: follows); in a thought: whitespace after the last text sent (sent only once
        #: more text follows it)
        self._space: list[str] = []
        #: text that may be the start of the tag looked for next (open, then close)
        self._partial = ""
        #: whether the thought has sent text (its leading whitespace is dropped)
        self._started = False

    def feed(self, piece: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if piece:
            self._take(piece, out)
        return out

    def finish(self) -> list[tuple[str, str]]:
        """The deltas held back, now that the reply is whole."""
        out: list[tuple[str, str]] = []
        if self._state == self._START:  # never became a thought: all of it is answer
            _send(out, "answer", "".join(self._space) + self._partial)
        elif self._state == self._THOUGHT:  # never closed: the rest is reasoning
            tail = self._partial.rstrip()
            if tail:
                _send(out, "reasoning", ("".join(self._space) if self._started else "") + tail)
        self._space, self._partial = [], ""
        self._state = self._ANSWER
        return out

    def _take(self, piece: str, out: list[tuple[str, str]]) -> None:
        if self._state == self._START:
            piece = self._before_thought(piece, out)
        if self._state == self._THOUGHT and piece:
            piece = self._in_thought(piece, out)
        if self._state == self._GAP and piece:
            piece = piece.lstrip()
            if piece:
                self._state = self._ANSWER
        if self._state == self._ANSWER and piece:
            _send(out, "answer", piece)

    def _before_thought(self, piece: str, out: list[tuple[str, str]]) -> str:
        """Leading whitespace, then either the open tag (a thought: the rest of the piece
        goes on into it) or anything else (no thought: everything is answer)."""
        if not self._partial:
            text = piece.lstrip()
            if len(text) < len(piece):
                self._space.append(piece[: len(piece) - len(text)])
            if not text:
                return ""
        else:
            text = self._partial + piece
        if text.startswith(self._open):
            self._state, self._space, self._partial = self._THOUGHT, [], ""
            return text[len(self._open) :]
        if self._open.startswith(text):  # still maybe the tag
            self._partial = text
            return ""
        self._state = self._ANSWER
        _send(out, "answer", "".join(self._space) + text)
        self._space, self._partial = [], ""
        return ""

    def _in_thought(self, piece: str, out: list[tuple[str, str]]) -> str:
        """Reasoning up to the close tag; returns what follows the tag (the answer's
        start), or '' while the thought goes on."""
        if not self._started:  # the reasoning is stripped: its leading whitespace goes
            piece = piece.lstrip() if not self._partial else piece
        text = self._partial + piece  # the partial starts with the tag's first character
        end = text.find(self._close)
        if end >= 0:
            self._send_reasoning(text[:end].rstrip(), out)
            self._state, self._space, self._partial = self._GAP, [], ""
            return text[end + len(self._close) :]
        held = _tag_start(text, self._close)
        ready = text[: len(text) - held]
        self._partial = text[len(text) - held :]
        kept = ready.rstrip()
        if kept:
            self._send_reasoning(kept, out)
            if len(kept) < len(ready):
                self._space = [ready[len(kept) :]]
        elif ready and self._started:
            self._space.append(ready)
        return ""

    def _send_reasoning(self, text: str, out: list[tuple[str, str]]) -> None:
        """Reasoning text that ends in a non-space: the whitespace held before it goes
        first (inside the thought it is reasoning)."""
        if not text:
            return
        space = "".join(self._space) if self._started else ""
        self._space = []
        self._started = True
        _send(out, "reasoning", space + text)


def _send(out: list[tuple[str, str]], kind: str, text: str) -> None:
    if text:
        out.append((kind, text))


def _tag_start(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` are a proper start of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


# -- grammars -------------------------------------------------------------------------------


def after_thought(setting: str, value: Any, tags: Sequence[str], *, opened: bool) -> str:
    """llguidance grammar text (a TopLevelGrammar, JSON): a thought, then an answer that
    follows the structured-output constraint ``setting`` = ``value`` (``json_schema``,
    ``json_object``, ``regex``, ``grammar`` — a Lark grammar or TopLevelGrammar JSON —
    or ``choice``, as the settings of the same names take them).

    The thought is optional (it starts with the open tag), or required and already
    going when ``opened`` (the prompt opened it); it is any text without the close tag,
    then the close tag, then up to 8 whitespace characters. Only the answer is held to
    the constraint: free to think, strict to answer. The close tag may come at any point
    of the thought, so a ``thinking_budget`` that forces it always continues the grammar.
    Pass the result as the ``grammar`` setting.
    """
    open_tag, close_tag = _tags(tags)
    answer = _answer_grammars(setting, value)
    name = answer[0]["name"]
    close = _regex_literal(close_tag)
    thought = f"THOUGHT: /(?s:.*){close}/ & ~/(?s:.*{close}.+)/\nGAP: /[ \\t\\r\\n]{{0,{_GAP}}}/\n"
    if opened:
        start = f"start: THOUGHT GAP @{name}\n"
    else:
        start = (
            f"start: thought? @{name}\n"
            f"thought: {json.dumps(open_tag, ensure_ascii=False)} THOUGHT GAP\n"
        )
    top = {"grammars": [{"lark_grammar": start + thought}, *answer]}
    return json.dumps(top, ensure_ascii=False)


def _answer_grammars(setting: str, value: Any) -> list[dict[str, Any]]:
    """The answer's grammars for the TopLevelGrammar, the first one named (the one the
    thought's rule refers to)."""
    if setting == "json_schema":
        if value is True:
            value = {}
        if not isinstance(value, Mapping):
            raise ValueError(f"json_schema must be a JSON Schema object, got {value!r}")
        return [{"name": "answer", "json_schema": _compact(value)}]
    if setting == "json_object":
        return [{"name": "answer", "json_schema": _compact({"type": "object"})}]
    if setting == "regex":
        _need_text(setting, value)
        return [{"name": "answer", "lark_grammar": f"start: /{_lark_regex(value)}/"}]
    if setting == "grammar":
        _need_text(setting, value)
        if value.lstrip().startswith("{"):  # a TopLevelGrammar of its own
            grammars = [dict(g) for g in json.loads(value)["grammars"]]
            if not grammars[0].get("name"):  # a name its other grammars do not use
                taken = {g.get("name") for g in grammars}
                grammars[0]["name"] = next(
                    name
                    for name in (f"answer{i or ''}" for i in itertools.count())
                    if name not in taken
                )
            return grammars
        return [{"name": "answer", "lark_grammar": value}]
    if setting == "choice":
        if isinstance(value, str) or not value:
            raise ValueError(f"choice must be a non-empty list of strings, got {value!r}")
        options = " | ".join(json.dumps(option, ensure_ascii=False) for option in value)
        return [{"name": "answer", "lark_grammar": f"start: {options}"}]
    raise ValueError(f"unknown structured-output setting {setting!r}; one of {_SETTINGS}")


def _need_text(setting: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{setting} must be a non-empty string, got {value!r}")


def _compact(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with llguidance's JSON options defaulting to compact (the schema's own
    ``x-guidance`` keys win, as with the ``json_schema`` setting)."""
    own = schema.get("x-guidance")
    options = {**_JSON_DEFAULTS, **(own if isinstance(own, Mapping) else {})}
    return {**schema, "x-guidance": options}


def _lark_regex(regex: str) -> str:
    """``regex`` made safe inside Lark's ``/.../`` as llguidance's own ``regex_to_lark``
    makes it (use_ascii ''): ``/`` escaped, newline, CR and tab written as escapes; a
    backslash keeps the character after it escaped (unless that is one of those four)."""
    out: list[str] = []
    quoted = False
    for char in regex:
        was_quoted, quoted = quoted, False
        if char == "/":
            out.append("\\/")
        elif char in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char])
        elif char == "\\" and not was_quoted:
            quoted = True
        else:
            out.append(f"\\{char}" if was_quoted else char)
    return "".join(out)


def _regex_literal(text: str) -> str:
    """A regex (inside Lark's ``/.../``) matching exactly ``text``."""
    return _lark_regex("".join(f"\\{c}" if c in _META else c for c in text))
