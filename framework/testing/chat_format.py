"""``check_chat_format``: a chat format's parser run on known answers, whole and as they
stream, and its grammars compiled, without a model.

A format (:class:`~ortgen.protocols.chat_formats.ChatFormat`) promises three things this
checks, each failure an ``AssertionError`` naming the answer, the split and what differs:

- every golden answer, parsed whole (``final=True``), is its expectation: the same
  ``content``, the same calls in order (name, arguments compared as JSON values when both
  are JSON, ``complete``), and every complete call's arguments are one JSON object;
- streamed: the answer's every prefix parsed with ``final=False``, one character more at
  a time, then the whole answer with ``final=True``. ``content`` only grows; a call that
  has a name keeps it and its place, its arguments only grow and a complete call's never
  change; a call still without a name may be replaced. Growing one character at a time
  covers every other way to split the answer into chunks (a prefix of a prefix is one);
- ``answer_grammar`` compiles with llguidance for the specs made from ``spec`` (or a
  small weather tool): ``auto``, ``auto`` with one call, ``required`` and each function
  named. ``grammar_accepts`` answers must match the ``auto`` grammar, and those that are
  calls only the ``required`` one (checked on a byte-level vocabulary: the text, not a model's
  tokens);
- a format that :class:`~ortgen.protocols.chat_formats.ShapesText`: its ``auto`` grammar
  with a ``text_schema`` (:data:`TEXT_SCHEMA`) is another grammar than without one,
  refuses free text, still accepts the ``grammar_accepts`` answers that are calls only,
  and accepts each ``shaped_answers`` text (the answer as the format writes JSON for
  the schema), whose parse, whole and streamed, is no call and ``content`` that is the
  expected JSON value.

:func:`make_tool_spec` builds the :class:`~ortgen.protocols.chat_formats.ToolSpec` a
request would give a format, for a format's own tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..chat_formats.tools import tool_spec
from ..errors import InputError
from ..protocols.chat_formats import CallDraft, ChatFormat, ParsedAnswer, ShapesText, ToolSpec

__all__ = ["TEXT_SCHEMA", "check_chat_format", "make_tool_spec"]

#: the text schema a :class:`ShapesText` format's grammar is checked with
TEXT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature": {"type": "number"}},
    "required": ["city", "temperature"],
    "additionalProperties": False,
}
#: an answer no text schema allows
_FREE_TEXT = "Sunny and warm."

#: the tool the grammars are compiled for when no spec is given
_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "hourly": {"type": "boolean"},
            },
            "required": ["city"],
        },
    },
}


def make_tool_spec(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: str = "auto",
    *,
    parallel_tool_calls: bool | None = None,
) -> ToolSpec:
    """The :class:`ToolSpec` a request offering ``tools`` (OpenAI's function tools) with
    ``tool_choice`` ``"auto"``, ``"required"`` or a function's name gets: made by the
    request builder's own rule (``ortgen.chat_formats.tools.tool_spec``), so a format is
    tested against the very spec a request hands it."""
    choice: Any = tool_choice
    if tool_choice not in ("auto", "required", "none"):
        choice = {"type": "function", "function": {"name": tool_choice}}
    try:
        spec = tool_spec(tools, choice, parallel_tool_calls)
    except InputError as exc:
        raise ValueError(str(exc)) from None
    if spec is None:
        raise ValueError(f"tool_choice {tool_choice!r} with these tools offers no calls")
    return spec


def check_chat_format(
    fmt: ChatFormat,
    golden: Sequence[tuple[str, Any]],
    spec: ToolSpec | None = None,
    *,
    grammar_accepts: Sequence[str] = (),
    shaped_answers: Sequence[tuple[str, Any]] = (),
) -> dict[str, str]:
    """Check ``fmt`` (see module doc). ``golden`` pairs an answer's text with what its
    whole parse must be: a :class:`ParsedAnswer`, or any object with ``content`` and
    ``calls``, each call a :class:`CallDraft`, a ``(name, arguments[, complete])`` tuple
    or a mapping with those keys (``arguments`` a dict or JSON text; ``complete``
    defaults to True). Returns what was checked, one line per answer and grammar."""
    if not isinstance(fmt, ChatFormat):
        raise AssertionError(f"{type(fmt).__name__} lacks a method of the ChatFormat protocol")
    report: dict[str, str] = {}
    for number, (text, expected) in enumerate(golden):
        where = f"golden answer {number} ({_short(text)})"
        whole = _parse(fmt, text, True, where)
        _compare(whole, _expectation(expected, where), where)
        _check_stream(fmt, text, whole, where)
        report[f"golden {number}"] = f"whole and streamed in {len(text) + 1} prefixes"
    for name, variant in _variants(spec or make_tool_spec([_WEATHER])).items():
        grammar = fmt.answer_grammar(variant)
        if not isinstance(grammar, str):
            raise AssertionError(f"answer_grammar({name}) returned {type(grammar).__name__}")
        _compile(grammar, name)
        report[f"grammar {name}"] = "compiles"
    if grammar_accepts:
        base = spec or make_tool_spec([_WEATHER])
        auto = fmt.answer_grammar(_variants(base)["auto"])
        required = fmt.answer_grammar(_variants(base)["required"])
        for text in grammar_accepts:
            _accepts(auto, text, "auto")
            parsed = _parse(fmt, text, True, f"answer {_short(text)}")
            if parsed.calls and not parsed.content:
                _accepts(required, text, "required")
        report["grammar_accepts"] = f"accepted: {len(grammar_accepts)}"
    if isinstance(fmt, ShapesText) and fmt.shapes_text is True:
        report["text_schema"] = _check_shaped(fmt, spec, grammar_accepts, shaped_answers)
    elif shaped_answers:
        raise AssertionError(
            f"{type(fmt).__name__} has shaped_answers but does not set shapes_text = True"
        )
    return report


def _check_shaped(
    fmt: ChatFormat,
    spec: ToolSpec | None,
    grammar_accepts: Sequence[str],
    shaped_answers: Sequence[tuple[str, Any]],
) -> str:
    """The :class:`ShapesText` promise (see module doc); what was checked."""
    auto = _variants(spec or make_tool_spec([_WEATHER]))["auto"]
    grammar = fmt.answer_grammar(replace(auto, text_schema=TEXT_SCHEMA))
    _compile(grammar, "auto with a text_schema")
    if grammar == fmt.answer_grammar(auto):
        raise AssertionError(
            f"{type(fmt).__name__} sets shapes_text but its answer_grammar ignores "
            "ToolSpec.text_schema (the auto grammar is the same with and without one)"
        )
    if _refusal(grammar, _FREE_TEXT) is None:
        raise AssertionError(
            f"the auto grammar with a text_schema accepts free text {_FREE_TEXT!r}\n{grammar}"
        )
    for text in grammar_accepts:
        parsed = _parse(fmt, text, True, f"answer {_short(text)}")
        if parsed.calls and not parsed.content:
            _accepts(grammar, text, "auto with a text_schema")
    for number, (text, value) in enumerate(shaped_answers):
        where = f"shaped answer {number} ({_short(text)})"
        _accepts(grammar, text, "auto with a text_schema")
        whole = _parse(fmt, text, True, where)
        if whole.calls or _json(whole.content) != value:
            raise AssertionError(
                f"{where}: parsed as content {whole.content!r} and {len(whole.calls)} "
                f"calls, expected no call and content holding {json.dumps(value)}"
            )
        _check_stream(fmt, text, whole, where)
    return f"shaped: free text refused, {len(shaped_answers)} JSON answers read back"


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


#: what a content that is not JSON compares as (equal to no JSON value)
_NOT_JSON = object()


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def _parse(fmt: ChatFormat, text: str, final: bool, where: str) -> ParsedAnswer:
    try:
        got = fmt.parse(text, final=final)
    except Exception as exc:
        raise AssertionError(f"{where}: parse(final={final}) raised {exc!r}") from exc
    if not isinstance(got.content, str) or not isinstance(got.calls, list):
        raise AssertionError(f"{where}: parse(final={final}) returned {got!r}")
    for call in got.calls:
        if not isinstance(call.arguments, str) or not (call.name is None or call.name):
            raise AssertionError(f"{where}: parse(final={final}) returned the call {call!r}")
    return got


def _expectation(expected: Any, where: str) -> ParsedAnswer:
    """``expected`` as a ParsedAnswer of CallDrafts (see check_chat_format)."""
    calls = []
    for call in getattr(expected, "calls", None) or []:
        if isinstance(call, CallDraft):
            calls.append(call)
            continue
        if isinstance(call, Mapping):
            name, arguments, complete = (
                call.get("name"),
                call.get("arguments", {}),
                call.get("complete", True),
            )
        elif isinstance(call, tuple) and len(call) in (2, 3):
            name, arguments, complete = (*call, True)[:3]
        else:
            raise AssertionError(f"{where}: the expected call {call!r} is not a call")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        calls.append(CallDraft(name, text, bool(complete)))
    if not isinstance(getattr(expected, "content", None), str):
        raise AssertionError(f"{where}: the expectation {expected!r} has no content string")
    return ParsedAnswer(expected.content, calls)


def _same_arguments(got: str, want: str) -> bool:
    try:
        return bool(json.loads(got) == json.loads(want))
    except ValueError:
        return got == want


def _compare(got: ParsedAnswer, want: ParsedAnswer, where: str) -> None:
    if got.content != want.content:
        raise AssertionError(f"{where}: content is {got.content!r}, expected {want.content!r}")
    if len(got.calls) != len(want.calls):
        raise AssertionError(
            f"{where}: {len(got.calls)} calls {got.calls!r}, expected {len(want.calls)} "
            f"{want.calls!r}"
        )
    for index, (call, expected) in enumerate(zip(got.calls, want.calls, strict=True)):
        same = call.name == expected.name and call.complete == expected.complete
        if not same or not _same_arguments(call.arguments, expected.arguments):
            raise AssertionError(f"{where}: call {index} is {call!r}, expected {expected!r}")
        if call.complete and not _is_object(call.arguments):
            raise AssertionError(
                f"{where}: call {index} is complete but its arguments {call.arguments!r} "
                "are not one JSON object"
            )


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _check_stream(fmt: ChatFormat, text: str, whole: ParsedAnswer, where: str) -> None:
    """Each prefix's parse grows from the one before, and the whole parse from the last."""
    before = ParsedAnswer()
    for size in range(len(text) + 1):
        now = _parse(fmt, text[:size], False, where)
        _grows(before, now, f"{where}, streamed: after {size} characters")
        before = now
    _grows(before, whole, f"{where}, streamed: the final parse")


def _grows(before: ParsedAnswer, now: ParsedAnswer, where: str) -> None:
    if not now.content.startswith(before.content):
        raise AssertionError(
            f"{where}: content {now.content!r} does not extend {before.content!r} (what a "
            "stream sent is never taken back; hold back text that may still change)"
        )
    for index, call in enumerate(before.calls):
        if call.name is None:
            continue  # a call without a name sent nothing yet
        if index >= len(now.calls):
            raise AssertionError(f"{where}: call {index} ({call.name!r}) disappeared")
        later = now.calls[index]
        if later.name != call.name:
            raise AssertionError(
                f"{where}: call {index} was named {call.name!r}, now {later.name!r}"
            )
        if not later.arguments.startswith(call.arguments):
            raise AssertionError(
                f"{where}: call {index} ({call.name!r}) arguments {later.arguments!r} do not "
                f"extend {call.arguments!r}"
            )
        if call.complete and (not later.complete or later.arguments != call.arguments):
            raise AssertionError(
                f"{where}: call {index} ({call.name!r}) was complete with {call.arguments!r}, "
                f"now {later!r}"
            )


def _variants(spec: ToolSpec) -> dict[str, ToolSpec]:
    """auto, auto with one call, required, and each function named, from ``spec``."""
    variants = {
        "auto": ToolSpec(spec.tools, spec.functions, False, max(spec.max_calls, 2)),
        "auto, one call": ToolSpec(spec.tools, spec.functions, False, 1),
        "required": ToolSpec(spec.tools, spec.functions, True, max(spec.max_calls, 2)),
    }
    for name, parameters in spec.functions.items():
        variants[f"named {name!r}"] = ToolSpec(spec.tools, {name: parameters}, True, 1, name)
    return variants


def _compile(grammar: str, name: str) -> None:
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if failed:
        reason = messages[0].strip() if messages else "no reason given"
        raise AssertionError(f"the {name} grammar does not compile: {reason}\n{grammar}")


class _Bytes:
    """A vocabulary of the 256 bytes and an end token, for ``llguidance.TokenizerWrapper``:
    a grammar checked on it accepts a text exactly when it accepts the text's bytes."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.special_token_ids = [256]
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xffeos"]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


def _refusal(grammar: str, text: str) -> str | None:
    """Why ``grammar`` (on the byte vocabulary) refuses ``text``, or None: it accepts it."""
    import llguidance

    tokenizer = llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_Bytes()), n_vocab=257, eos_token=256
    )
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.consume_tokens(list(text.encode())) and matcher.is_accepting():
        return None
    return str(matcher.get_error()).split("\n")[0] or "the text ends too early"


def _accepts(grammar: str, text: str, name: str) -> None:
    reason = _refusal(grammar, text)
    if reason is not None:
        raise AssertionError(f"the {name} grammar refuses {_short(text)}: {reason}\n{grammar}")
