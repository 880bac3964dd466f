"""OpenAI requests in, engine rows out: every field checked and named when it is wrong.

A completions or chat request becomes one :class:`Row` per choice (``n`` per prompt): its
prompt token ids and its ortgen settings, the *call* layer of ``resolve_config``. OpenAI
fields are translated (``max_tokens`` -> ``max_new_tokens``, ``stop`` -> ``stop_strings``,
``temperature=0`` -> greedy, ...); every other top-level key is passed on as an ortgen
setting (what the OpenAI client's ``extra_body`` sends), so ``resolve_config`` is the one
judge of what exists and an unknown key fails with its did-you-mean.

Errors are :class:`RequestError`: the HTTP status and OpenAI's ``param`` (the request
field at fault, not the ortgen setting it became), so a client sees the name it sent.
The response side (chunks, logprobs) lives in ``ortgen.serve.responses``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import TextGenerator
from ..config import FIELDS
from ..config_values import normalise
from ..errors import ConfigError, InputError, OrtgenError

#: most rows (prompts x n) one request may ask for: one request must fit the engine
MAX_N = 128
#: accepted and ignored: they change nothing here
IGNORED = frozenset(
    {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
)
#: OpenAI fields the server cannot honour: accepted only at these values (their defaults)
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "echo": ((None, False), "echoing the prompt back is not supported"),
    "best_of": ((None, 1), "best_of is not supported; ask for n choices instead"),
    "suffix": ((None,), "insertion (suffix) is not supported"),
    "tool_choice": (
        (None, "auto", "none"),
        "the server renders tools into the prompt but cannot force a tool call",
    ),
    "parallel_tool_calls": ((None, True, False), ""),
    "functions": ((None,), "the deprecated functions field is not supported; use tools"),
    "function_call": ((None,), "the deprecated function_call is not supported; use tools"),
    "response_format": ((None, {"type": "text"}), "structured outputs are not supported"),
    "modalities": ((None, ["text"]), "the server generates text only"),
    "audio": ((None,), "the server generates text only"),
}
#: the ortgen components a request may name; checked against the registry before queuing
COMPONENT_KINDS = {
    "sampler": "sampler",
    "cache": "kv_cache",
    "logits_processors": "logits_processor",
    "stopping_criteria": "stopping_criterion",
}


class RequestError(Exception):
    """What the client did wrong (or why the server cannot serve it), as OpenAI reports it."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Row:
    """One choice of one prompt: what the engine runs."""

    index: int  # the choice's index in the response: prompt_index * n + i
    prompt: list[int]
    settings: dict[str, Any]


@dataclass
class ParsedRequest:
    """A checked request: its rows and how to answer."""

    chat: bool
    rows: list[Row]
    prompt_tokens: int  # usage: each prompt counted once, whatever n is
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_field: str = "prompt"
    #: ortgen setting -> the request field it came from (for ``param`` in errors)
    names: dict[str, str] = field(default_factory=dict)


# -- typed fields ----------------------------------------------------------------------


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(
            f"{key} must be a number in [{low:g}, {high:g}], got {value!r}", param=key
        )
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    bad = isinstance(value, bool) or not isinstance(value, int)
    if bad or value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise RequestError(f"{key} must be an integer {span}, got {value!r}", param=key)
    return value


def _boolean(body: Mapping[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, got {value!r}", param=key)
    return value


# -- requests --------------------------------------------------------------------------


def parse_completion(
    body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int
) -> ParsedRequest:
    """``POST /v1/completions``: ``prompt`` is text, a list of texts, token ids or a list
    of token-id lists; ``logprobs`` is the number of alternatives (0-5)."""
    if "prompt" not in body:
        raise RequestError("prompt is required", param="prompt")
    prompts = _completion_prompts(body["prompt"], gen)
    logprobs = _integer(body, "logprobs", 0, 5)
    settings, names, rest = _settings(body, chat=False)
    if logprobs is not None:
        settings.update(logprobs=True, top_logprobs=logprobs)
        names.update(logprobs="logprobs", top_logprobs="logprobs")
    return _request(body, gen, prompts, settings, names, rest, chat=False, max_rows=max_rows)


def parse_chat(body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int) -> ParsedRequest:
    """``POST /v1/chat/completions``: ``messages`` rendered with the model's chat
    template (``tools`` and ``chat_template_kwargs`` reach it too)."""
    if "messages" not in body:
        raise RequestError("messages is required", param="messages")
    logprobs = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, 20)
    if top is not None and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    prompt = _chat_prompt(body, gen)
    settings, names, rest = _settings(body, chat=True)
    if logprobs:
        settings.update(logprobs=True, top_logprobs=top or 0)
        names.update(logprobs="logprobs", top_logprobs="top_logprobs")
    request = _request(body, gen, [prompt], settings, names, rest, chat=True, max_rows=max_rows)
    request.prompt_field = "messages"
    return request


def _completion_prompts(prompt: Any, gen: TextGenerator) -> list[list[int]]:
    """Every completions prompt shape, encoded and checked against the vocabulary."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise RequestError(
            "prompt must be a non-empty string, list of strings, list of token ids or list "
            f"of token-id lists, got {prompt!r:.80}",
            param="prompt",
        )
    rows = []
    for i, item in enumerate(items):
        try:
            if isinstance(item, str):
                rows.append(gen.prompts.encode_text(item, i))
            elif isinstance(item, list) and all(_is_id(t) for t in item):
                rows.append(gen.prompts.check_ids(list(item), i))
            else:
                raise InputError(f"prompt {i} must be a string or a list of token ids")
        except InputError as exc:
            raise RequestError(str(exc), param="prompt") from None
    return rows


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _chat_prompt(body: Mapping[str, Any], gen: TextGenerator) -> list[int]:
    """The conversation's token ids. Content parts are joined (text models take text:
    as vLLM, text parts with newlines); ``developer`` is OpenAI's new name for ``system``."""
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        message = dict(message)
        if message.get("role") == "developer":
            message["role"] = "system"
        if isinstance(message.get("content"), list):
            message["content"] = _join_parts(message["content"], f"messages[{i}].content")
        rendered.append(message)
    tools = body.get("tools")
    if body.get("tool_choice") == "none":
        tools = None  # the model is told no tools exist, the closest this server can do
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping) or "tools" in kwargs:
        raise RequestError(
            "chat_template_kwargs must be an object of template variables (tools go in tools)",
            param="chat_template_kwargs",
        )
    try:
        return gen.chat_prompt(rendered, tools=tools, **kwargs)
    except OrtgenError as exc:
        param = "tools" if str(exc).startswith("tools") else "messages"
        raise RequestError(str(exc), param=param) from None


def _join_parts(parts: list[Any], where: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise RequestError(
                f"{where}[{j}] is a {kind!r} part; this server's model takes text parts only",
                param=f"{where}[{j}]",
            )
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{where}[{j}].text must be a string", param=f"{where}[{j}].text")
        texts.append(part["text"])
    return "\n".join(texts)


def _settings(
    body: Mapping[str, Any], *, chat: bool
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The OpenAI sampling fields as ortgen settings, the field each came from, and the
    fields still to place (n, seed, stream). Other keys are ortgen settings as given."""
    openai_fields = {
        "model", "prompt", "messages", "tools", "chat_template_kwargs", "max_tokens",
        "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs",
        "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias", "stream",
        "stream_options",
    }  # fmt: skip
    if not isinstance(body.get("model", ""), str):
        raise RequestError("model must be a string", param="model")
    settings: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, value in body.items():
        if key in openai_fields or key in IGNORED:
            continue
        if key in UNSUPPORTED:
            allowed, why = UNSUPPORTED[key]
            if value not in allowed:
                raise RequestError(f"{key}={value!r} is not supported: {why}", param=key)
            continue
        settings[key] = value
        names[key] = key

    def put(key: str, value: Any, source: str) -> None:
        if value is None:
            return
        if key in settings and names.get(key) != source:
            raise RequestError(f"give {source} or {names[key]}, not both", param=source)
        settings[key] = value
        names[key] = source

    length = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    given = [key for key in length if body.get(key) is not None]
    if len(given) > 1:
        raise RequestError("give max_completion_tokens or max_tokens, not both", param=given[1])
    for key in given:
        put("max_new_tokens", _integer(body, key, 1), key)
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if temperature is not None:
        if "do_sample" not in settings:
            put("do_sample", temperature > 0, "temperature")
        if temperature > 0:
            put("temperature", temperature, "temperature")
    if top_p is not None and temperature != 0:  # greedy ignores it: no warning for it
        put("top_p", top_p, "top_p")
    put("stop_strings", _stop(body.get("stop")), "stop")
    for key in ("presence_penalty", "frequency_penalty"):
        put(key, _number(body, key, -2.0, 2.0), key)
    put("logit_bias", body.get("logit_bias"), "logit_bias")
    rest = {
        "n": _integer(body, "n", 1, MAX_N) or 1,
        "seed": _integer(body, "seed", 0),
        "stream": bool(_boolean(body, "stream")),
        "include_usage": _stream_options(body),
    }
    return settings, names, rest


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > 4:
        raise RequestError("stop must be a string or a list of up to 4 strings", param="stop")
    if not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop strings must be non-empty strings", param="stop")
    return stops or None


def _stream_options(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not body.get("stream"):
        raise RequestError(
            "stream_options is only allowed with stream=true", param="stream_options"
        )
    if not isinstance(options, Mapping):
        raise RequestError("stream_options must be an object", param="stream_options")
    for key in options:
        if key not in ("include_usage", "include_obfuscation"):
            raise RequestError(f"unknown stream option {key!r}", param=f"stream_options.{key}")
    return bool(_boolean(options, "include_usage"))


def _request(
    body: Mapping[str, Any],
    gen: TextGenerator,
    prompts: list[list[int]],
    settings: dict[str, Any],
    names: dict[str, str],
    rest: dict[str, Any],
    *,
    chat: bool,
    max_rows: int,
) -> ParsedRequest:
    """Rows for each prompt and choice. Choice ``i`` samples with ``seed + i``. Without a
    length in the request, a row whose model default would run past the context gets
    what is left of it (as ``generate`` clips), instead of an error."""
    n, seed = rest["n"], rest["seed"]
    if len(prompts) * n > max_rows:
        raise RequestError(
            f"{len(prompts)} prompt(s) x n={n} is {len(prompts) * n} rows; this server takes "
            f"at most {max_rows} per request (--max-batch + --max-queue)",
            param="n" if n > 1 else ("messages" if chat else "prompt"),
        )
    length_set = "max_new_tokens" in settings or "max_length" in settings
    default_length = None if length_set else _default_length(gen, settings, names)
    context = gen.model.max_context
    rows = []
    for p, prompt in enumerate(prompts):
        own = dict(settings)
        if default_length and context and len(prompt) + default_length > context:
            own["max_new_tokens"] = context - len(prompt)
        for i in range(n):
            row_settings = dict(own) if seed is None else {**own, "seed": seed + i}
            rows.append(Row(p * n + i, prompt, row_settings))
    if seed is not None:
        names["seed"] = "seed"
    return ParsedRequest(
        chat=chat,
        rows=rows,
        prompt_tokens=sum(len(p) for p in prompts),
        stream=rest["stream"],
        include_usage=rest["include_usage"],
        logprobs=bool(settings.get("logprobs")),
        top_logprobs=int(settings.get("top_logprobs") or 0),
        prompt_field="messages" if chat else "prompt",
        names=names,
    )


def _default_length(gen: TextGenerator, settings: dict[str, Any], names: dict[str, str]) -> int:
    try:
        return gen.resolve_config(settings).config.max_new_tokens or 0
    except ConfigError as exc:
        raise RequestError(str(exc), param=config_param(str(exc), names)) from None


# -- checking rows ---------------------------------------------------------------------


def check_row(
    check: Callable[[list[int], dict[str, Any]], None],
    gen: TextGenerator,
    row: Row,
    request: ParsedRequest,
) -> None:
    """The engine's check of one row, then the named components against the registry
    (unknown names and parameters fail here, with 400, not later in the engine)."""
    try:
        check(row.prompt, row.settings)
    except ConfigError as exc:
        raise RequestError(str(exc), param=config_param(str(exc), request.names)) from None
    except InputError as exc:
        raise RequestError(str(exc), param=input_param(str(exc), request)) from None
    bias = row.settings.get("logit_bias")
    if bias:
        vocab = gen.model.signature.vocab_size
        outside = sorted(t for t in normalise("logit_bias", bias) if t >= vocab)
        if outside:
            raise RequestError(
                f"logit_bias names token ids outside the vocabulary [0, {vocab}): {outside[:5]}",
                param=request.names.get("logit_bias", "logit_bias"),
            )
    for key, kind in COMPONENT_KINDS.items():
        if key not in row.settings or row.settings[key] is None:
            continue
        value = normalise(key, row.settings[key])
        specs = value if isinstance(value, tuple) else (value,)
        for spec in specs:
            params = {k: v for k, v in spec.items() if k != "name"}
            problems = gen.registry.problems(kind, spec["name"], params)
            if problems:
                raise RequestError(f"{key} ({spec['name']}): {'; '.join(problems)}", param=key)


def config_param(message: str, names: Mapping[str, str]) -> str | None:
    """The request field a ``ConfigError`` is about (its first problem)."""
    body = message.removeprefix("invalid generation config:").strip()
    first = body.splitlines()[0].strip().removeprefix("- ") if body else ""
    unknown = re.match(r"unknown setting '([^']+)'", first)
    key = unknown.group(1) if unknown else re.split(r"[ =(]", first, maxsplit=1)[0]
    if key in names:
        return names[key]
    return key if unknown or key in FIELDS else None


def input_param(message: str, request: ParsedRequest) -> str | None:
    """The request field an ``InputError`` from the engine's check is about."""
    if message.startswith("prompt"):
        return request.prompt_field
    if "max_tokens" in message or "context" in message:
        return request.names.get("max_new_tokens", "max_tokens")
    for key, source in request.names.items():  # else the first setting it names
        if re.search(rf"\b{re.escape(key)}\b", message):
            return source
    return None
