"""OpenAI requests in, engine rows out: every field checked and named when it is wrong.

A completions or chat request becomes one :class:`Row` per choice (``n`` per prompt): its
prompt token ids and its ortgen settings, the *call* layer of ``resolve_config``. OpenAI
fields are translated (``max_tokens`` -> ``max_new_tokens``, ``stop`` -> ``stop_strings``,
``temperature=0`` -> greedy, ...); every other top-level key is passed on as an ortgen
setting (what the OpenAI client's ``extra_body`` sends), so ``resolve_config`` is the one
judge of what exists and an unknown key fails with its did-you-mean.

Errors are ``RequestError`` (``ortgen.serve.errors``): the HTTP status and OpenAI's
``param``, the request field at fault (not the ortgen setting it became), so a client
sees the name it sent. The OpenAI sampling fields are translated in ``openai_fields``;
the response side (chunks, logprobs) lives in ``responses``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import TextGenerator
from ..config import FIELDS
from ..config_values import normalise
from ..errors import ConfigError, InputError, OrtgenError
from ..loop.chain import Chain
from ..structured_output import response_format_settings
from ..structured_settings import CONSTRAINT_FIELDS
from ..tool_calls import ToolPlan, plan_tools
from .engine import Engine
from .errors import RequestError
from .openai_fields import COMPLETION_LOGPROBS, INTEGERS, boolean, integer, settings_of

#: the ortgen components a request may name; checked against the registry before queuing
COMPONENT_KINDS = {
    "sampler": "sampler",
    "cache": "kv_cache",
    "logits_processors": "logits_processor",
    "stopping_criteria": "stopping_criterion",
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
    #: a chat request with tools: how its answers hold calls (``ortgen.tool_calls``)
    tool_plan: ToolPlan | None = None


# -- requests --------------------------------------------------------------------------


def parse_completion(
    body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int
) -> ParsedRequest:
    """``POST /v1/completions``: ``prompt`` is text, a list of texts, token ids or a list
    of token-id lists; ``logprobs`` is the number of alternatives (0-5)."""
    if "prompt" not in body:
        raise RequestError("prompt is required", param="prompt")
    prompts = _completion_prompts(body["prompt"], gen)
    logprobs = integer(body, "logprobs", *COMPLETION_LOGPROBS)
    settings, names, rest = settings_of(body, chat=False)
    if logprobs is not None:
        settings.update(logprobs=True, top_logprobs=logprobs)
        names.update(logprobs="logprobs", top_logprobs="logprobs")
    return _request(gen, prompts, settings, names, rest, chat=False, max_rows=max_rows)


def parse_chat(body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int) -> ParsedRequest:
    """``POST /v1/chat/completions``: ``messages`` rendered with the model's chat
    template (``tools`` and ``chat_template_kwargs`` reach it too)."""
    if "messages" not in body:
        raise RequestError("messages is required", param="messages")
    logprobs = boolean(body, "logprobs")
    top = integer(body, "top_logprobs", *INTEGERS["top_logprobs"])
    if top and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    settings, names, rest = settings_of(body, chat=True)
    for key, value in _response_format(body).items():
        if key in settings:
            raise RequestError(f"give response_format or {key}, not both", param=key)
        settings[key] = value
        names[key] = "response_format"
    prompt, plan = _chat_prompt(body, gen)
    if plan is not None and plan.settings:
        constrained = [k for k in CONSTRAINT_FIELDS if settings.get(k) not in (None, False)]
        if constrained:
            raise RequestError(
                f"tool_choice {body.get('tool_choice') or 'auto'!r} constrains the answer to "
                f"tool calls, and {names[constrained[0]]} constrains it too: give one of them",
                param=names[constrained[0]],
            )
        settings.update(plan.settings)
        names.update({key: "tools" for key in plan.settings})
    if logprobs:
        settings.update(logprobs=True, top_logprobs=top or 0)
        names.update(logprobs="logprobs", top_logprobs="top_logprobs")
    request = _request(gen, [prompt], settings, names, rest, chat=True, max_rows=max_rows)
    request.prompt_field = "messages"
    request.tool_plan = plan
    return request


def _response_format(body: Mapping[str, Any]) -> dict[str, Any]:
    """``response_format`` as ortgen settings (``ortgen.structured_output``)."""
    try:
        return response_format_settings(body.get("response_format"))
    except InputError as exc:
        raise RequestError(str(exc), param="response_format") from None


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


def _chat_prompt(body: Mapping[str, Any], gen: TextGenerator) -> tuple[list[int], ToolPlan | None]:
    """The conversation's token ids, and with ``tools`` the plan for calls. Content parts
    go to the chat template, which joins text parts for a template written for strings
    (``ortgen.text.content_format``, as ``gen.chat()``); ``developer`` is OpenAI's new
    name for ``system``."""
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
        rendered.append(message)
    tools = body.get("tools")
    plan = None
    if tools is not None or body.get("tool_choice") is not None:
        template = gen.tokenizer.chat_template if gen.tokenizer is not None else None
        try:
            plan = plan_tools(
                rendered, tools, body.get("tool_choice"), body.get("parallel_tool_calls"),
                template,
            )  # fmt: skip
        except InputError as exc:
            message = str(exc)
            param = next(
                (p for p in ("tool_choice", "parallel_tool_calls", "messages") if p in message),
                "tools",
            )
            raise RequestError(message, param=param) from None
        rendered, tools = plan.messages, plan.template_tools
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping) or "tools" in kwargs:
        raise RequestError(
            "chat_template_kwargs must be an object of template variables (tools go in tools)",
            param="chat_template_kwargs",
        )
    try:
        return gen.chat_prompt(rendered, tools=tools, **kwargs), plan
    except OrtgenError as exc:
        where = re.match(r"tools|messages\[\d+\]\.content\[\d+\]", str(exc))
        raise RequestError(str(exc), param=where[0] if where else "messages") from None


def _request(
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
            f"at most {max_rows} per request (--max-queue)",
            param="n" if n > 1 else ("messages" if chat else "prompt"),
        )
    length_set = "max_new_tokens" in settings or "max_length" in settings
    default_length = None if length_set else _default_length(gen, settings, names)
    context = gen.model.max_context
    rows = []
    for p, prompt in enumerate(prompts):
        own = dict(settings)
        if default_length and context and len(prompt) < context < len(prompt) + default_length:
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


def check_row(engine: Engine, gen: TextGenerator, row: Row, request: ParsedRequest) -> Chain:
    """The engine's check of one row, then the named components against the registry
    (unknown names and parameters fail here, with 400, not later in the engine), then
    the components themselves, which the row then runs with."""
    try:
        config = engine.check(row.prompt, row.settings)
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
    try:  # the factories themselves, with the values given
        return engine.check_components(row.prompt, config)
    except (ConfigError, InputError) as exc:
        given = [k for k in COMPONENT_KINDS if row.settings.get(k) is not None]
        param = config_param(str(exc), request.names) or (given[0] if given else None)
        raise RequestError(str(exc), param=param) from None


def config_param(message: str, names: Mapping[str, str]) -> str | None:
    """The request field a ``ConfigError`` is about (its first problem)."""
    body = message.removeprefix("invalid generation config:").strip()
    first = body.splitlines()[0].strip().removeprefix("- ") if body else ""
    unknown = re.match(r"unknown setting '([^']+)'", first)
    key = unknown.group(1) if unknown else re.split(r"[ =(:]", first, maxsplit=1)[0]
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
