"""An example ortgen plugin: two logits processors, a stopping criterion, a drafter, a
KV cache composed from a built-in one and a chat format.

ortgen finds this module through the ``ortgen`` entry-point group (see
``pyproject.toml``) and calls its ``@hookimpl`` functions once per ``load()``.
Each hook registers *factories*: ortgen calls a factory once per request with the
parameters the user wrote in ``logits_processors=[{"name": ..., **params}]`` (or
``stopping_criteria=[...]``, ``drafter=...``, ``cache=...``), plus ``ctx`` when its
``__init__`` asks for it. The object a factory returns is then called once per
generated token, so everything that can be worked out in advance is worked out in
``__init__``.

Only ``ortgen`` (the public API; for the composed cache also the built-in caches that
``ortgen.plugins.caches`` makes public, for the chat format the format author's kit
``ortgen.chat_formats``) and numpy are imported: a plugin needs no base class, only the
call shape described in ``ortgen.LogitsProcessor``, ``ortgen.StoppingCriterion``,
``ortgen.Drafter``, ``ortgen.KVCache`` and ``ortgen.ChatFormat``. A chat format is built
once per model (its factory takes no parameters), not per request. The package
ships ``py.typed`` and passes ``mypy --strict`` against the installed ortgen (see
``[tool.mypy]`` in ``pyproject.toml``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from ortgen import (
    CallDraft,
    ChatFormatFactory,
    ConfigError,
    DrafterFactory,
    GenerationContext,
    KVCacheFactory,
    LogitsProcessorFactory,
    ParsedAnswer,
    Register,
    StoppingCriterionFactory,
    TemplateProbe,
    ToolSpec,
    hookimpl,
)
from ortgen.chat_formats import held_back, json_grammar, json_value_end, partial_json_text

from .cache import CappedStaticCache
from .drafter import RepeatTokenDrafter

__all__ = [
    "BanTokens",
    "CappedStaticCache",
    "RepeatTokenDrafter",
    "SeenTokenPenalty",
    "StopTokens",
    "XmlCallsFormat",
]


@hookimpl
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    register("ban_tokens", BanTokens)
    register("seen_token_penalty", SeenTokenPenalty)


@hookimpl
def register_stopping_criteria(register: Register[StoppingCriterionFactory]) -> None:
    register("stop_tokens", StopTokens)


@hookimpl
def register_drafters(register: Register[DrafterFactory]) -> None:
    register("repeat_token", RepeatTokenDrafter)


@hookimpl
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    register("capped_static", CappedStaticCache)


@hookimpl
def register_chat_formats(register: Register[ChatFormatFactory]) -> None:
    register("xml_calls", XmlCallsFormat)


def _token_ids(component: str, value: Any, vocab_size: int) -> np.ndarray:
    """``value`` as an int64 array of ids in ``[0, vocab_size)``, or a ConfigError.

    Checked in the factory, not per token: a bad value then fails the request
    before the first forward, with a message naming the component and parameter.
    (ortgen itself only checks parameter *names* against the signature.)
    """
    is_list = isinstance(value, Sequence) and not isinstance(value, str)
    if not is_list or not value or not all(_is_id(i, vocab_size) for i in value):
        raise ConfigError(
            f"{component}: `token_ids` has to be a non-empty list of token ids in "
            f"[0, {vocab_size}), but is {value!r}"
        )
    return np.unique(np.asarray(value, dtype=np.int64))


def _is_id(value: object, vocab_size: int) -> bool:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return False
    return 0 <= int(value) < vocab_size


class BanTokens:
    """Never generate any of ``token_ids``: their scores become ``-inf``.

    Works for greedy decoding and sampling alike, because it runs before the
    sampler. Banning every token leaves nothing to pick, and the sampler then
    fails the request with a ``ComponentError``.
    """

    def __init__(self, token_ids: list[int], *, ctx: GenerationContext) -> None:
        self.token_ids = _token_ids("ban_tokens", token_ids, ctx.vocab_size)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = scores.copy()  # processors must not write into the array they were given
        out[:, self.token_ids] = -np.inf
        return out


class SeenTokenPenalty:
    """Subtract ``penalty`` from the score of every token the row has already generated.

    Unlike the built-in ``repetition_penalty`` (which scales scores and counts
    the prompt), this is OpenAI's additive presence penalty and only counts the
    generated tokens: ``ctx.prompt_length`` (the padded prompt length, the same
    for every row) is where they start in ``input_ids``. A negative penalty
    encourages repeats.
    """

    def __init__(self, penalty: float, *, ctx: GenerationContext) -> None:
        ok = isinstance(penalty, numbers.Real) and not isinstance(penalty, bool)
        if not ok or not math.isfinite(penalty):
            raise ConfigError(
                f"seen_token_penalty: `penalty` has to be a number, but is {penalty!r}"
            )
        self.penalty = np.float32(penalty)
        self.prompt_length = ctx.prompt_length

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32)  # a copy, float32 whatever came in
        generated = input_ids[:, self.prompt_length :]
        if generated.shape[1] == 0 or self.penalty == 0:
            return out
        seen = np.zeros(out.shape, dtype=bool)
        np.put_along_axis(seen, generated, True, axis=1)  # one flag per (row, token), no loop
        out[seen] -= self.penalty
        return out


class StopTokens:
    """Finish a row right after it generates one of ``token_ids`` (kept in its output).

    ``finish_reason`` is what ``GenerationOutput.finish_reasons`` reports for the
    rows this criterion ended; without the attribute ortgen reports the
    registered name. The criterion runs after the new token was appended, so the
    last column of ``input_ids`` is the token just generated.
    """

    finish_reason = "stop_token"

    def __init__(self, token_ids: list[int], *, ctx: GenerationContext) -> None:
        self.token_ids = _token_ids("stop_tokens", token_ids, ctx.vocab_size)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return np.isin(input_ids[:, -1], self.token_ids)  # bool, shape (batch,)


# -- a chat format --------------------------------------------------------------------

OPEN, CLOSE = '<call name="', "</call>"


class XmlCallsFormat:
    """Tool calls written as ``<call name="get_weather">{"city": "Paris"}</call>``.

    For a model family whose template teaches that shape (a template that mentions
    ``<call name="`` picks it; ``chat_format="xml_calls"`` names it for any other). The
    answer is text, or text followed by calls, one per line. A template that renders no
    tools gets them described in the system message, and earlier calls as the text the
    model wrote. The grammar keeps each call's arguments to its function's JSON Schema
    (compact JSON, through the kit's ``json_grammar``) and allows at most
    ``spec.max_calls``; ``required`` or a named function allows calls only.

    Reading, as a stream reads it: text before ``<call name="`` is content, holding back
    a tail that may be the start of that marker; a call's name once its ``">`` is
    written; its arguments as written (JSON text only grows), complete at ``</call>``.
    Checked with ``ortgen.testing.check_chat_format``.
    """

    def recognizes(self, probe: TemplateProbe) -> bool:
        return OPEN in (probe.with_call or "") or OPEN in probe.source

    def prompt_messages(
        self,
        messages: list[dict[str, Any]],
        spec: ToolSpec | None,
        *,
        template_renders_tools: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        if template_renders_tools:
            return messages, [dict(t) for t in spec.tools] if spec is not None else None
        out = [_as_text(m) for m in messages]
        if spec is None:
            return out, None
        listed = json.dumps([t["function"] for t in spec.tools], ensure_ascii=False)
        told = (
            f'To call a tool, answer <call name="TOOL">{{JSON arguments}}</call>. Tools: {listed}'
        )
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            return [{**out[0], "content": f"{out[0]['content']}\n\n{told}"}, *out[1:]], None
        return [{"role": "system", "content": told}, *out], None

    def answer_grammar(self, spec: ToolSpec) -> str:
        rules = []
        for number, (name, parameters) in enumerate(spec.functions.items()):
            rules.append(f'f{number}: {json.dumps(name + chr(34) + ">")} a{number} "{CLOSE}"')
            rules.append(f"a{number}: {json_grammar(parameters)}")
        marker = json.dumps(OPEN)
        more = f' ("\\n" {marker} one)~0..{spec.max_calls - 1}' if spec.max_calls > 1 else ""
        start = f"{marker} calls" if spec.calls_only else "TEXT | lead calls"
        return "\n".join(
            [
                f"start: {start}",
                f"calls: one{more}",
                "one: " + " | ".join(f"f{n}" for n in range(len(spec.functions))),
                *rules,
                # a lazy lexeme ends at the first marker: text, then the calls
                'lead[lazy]: /(?s:.*)<call name="/',
                'TEXT: /(?s:.+)/ & ~/(?s:.*<call name=".*)/',
            ]
        )

    def parse(self, text: str, *, final: bool) -> ParsedAnswer:
        start = text.find(OPEN)
        if start < 0:
            head = text if final else text[: len(text) - held_back(text, [OPEN])]
            return ParsedAnswer(head.strip())
        return ParsedAnswer(text[:start].strip(), _calls(text, start + len(OPEN)))


def _calls(text: str, at: int) -> list[CallDraft]:
    """The calls from ``text[at:]`` (just past the first marker) as far as written."""
    calls: list[CallDraft] = []
    while True:
        name_end = text.find('">', at)
        if name_end < 0:  # the name is being written
            return [*calls, CallDraft(None)]
        name, start = text[at:name_end], name_end + 2
        end = json_value_end(text, start)
        if end is None:
            return [*calls, CallDraft(name, partial_json_text(text[start:].lstrip()))]
        arguments = text[start:end].strip()
        rest = text[end:].lstrip()
        if not rest.startswith(CLOSE):  # being closed (or not the shape: left incomplete)
            return [*calls, CallDraft(name, arguments)]
        calls.append(CallDraft(name, arguments, _is_object(arguments)))
        after = rest[len(CLOSE) :].lstrip()
        if not after.startswith(OPEN):
            return calls
        at = len(text) - len(after) + len(OPEN)


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's calls as the text the model wrote."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    written = []
    for call in calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        written.append(f'{OPEN}{function.get("name")}">{text}{CLOSE}')
    content = message.get("content")
    head = f"{content}\n" if isinstance(content, str) and content else ""
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": head + "\n".join(written)}
