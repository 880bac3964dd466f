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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import TextGenerator
from ..chat_formats.reply import ReplyPlan
from ..errors import ConfigError, InputError, OrtgenError
from ..loop.chain import Chain
from ..request import COMPONENT_KINDS, ChatRequest, build_chat, clipped_length, component_problems
from .engine import Engine
from .errors import RequestError
from .openai_fields import (
    COMPLETION_LOGPROBS,
    INTEGERS,
    REASONING_EFFORTS,
    VERBOSITIES,
    boolean,
    integer,
    one_of,
    settings_of,
)
from .openai_prediction import with_prediction


@dataclass
class Row:
    """One choice of one prompt: what the engine runs."""

    index: int  # the choice's index in the response: prompt_index * n + i
    prompt: list[int]
    settings: dict[str, Any]
    #: completions with ``echo``: the prompt's text, which the answer's text starts with
    echo_text: str | None = None


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
    #: a chat request whose answers are read back (thought, calls): ``ortgen.chat_formats.reply``
    reply_plan: ReplyPlan | None = None
    #: chat: OpenAI's ``reasoning_effort`` and ``verbosity``, checked (None: not given)
    reasoning_effort: str | None = None
    verbosity: str | None = None
    #: completions: the prompt is echoed before the answer (``echo``), and nothing is
    #: generated (``max_tokens: 0``: the prompt is only scored)
    echo: bool = False
    score_only: bool = False
    #: vLLM's ``prompt_logprobs``: alternatives per prompt token (None: not asked)
    prompt_logprobs: int | None = None


# -- requests --------------------------------------------------------------------------


def parse_completion(
    body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int
) -> ParsedRequest:
    """``POST /v1/completions``: ``prompt`` is text, a list of texts, token ids or a list
    of token-id lists; ``logprobs`` is the number of alternatives (0-5). ``echo`` puts
    the prompt (and, with ``logprobs``, its tokens' logprobs, the first null) before the
    answer; ``max_tokens: 0`` generates nothing (with ``echo`` or ``prompt_logprobs``:
    the prompt is only scored; one token is picked and dropped, as vLLM does)."""
    if "prompt" not in body:
        raise RequestError("prompt is required", param="prompt")
    prompts, texts = _completion_prompts(body["prompt"], gen)
    logprobs = integer(body, "logprobs", *COMPLETION_LOGPROBS)
    echo = bool(boolean(body, "echo"))
    prompt_logprobs = _prompt_logprobs(body)
    score_only = body.get("max_tokens") == 0 and not isinstance(body.get("max_tokens"), bool)
    if score_only and not echo and prompt_logprobs is None:
        raise RequestError(
            "max_tokens=0 generates nothing: it scores the prompt, with echo=true or "
            "prompt_logprobs; otherwise max_tokens must be >= 1",
            param="max_tokens",
        )
    settings, names, rest = settings_of(
        {**body, "max_tokens": 1} if score_only else body, chat=False
    )
    if logprobs is not None:
        settings.update(logprobs=True, top_logprobs=logprobs)
        names.update(logprobs="logprobs", top_logprobs="logprobs")
    scored = [n for n in (prompt_logprobs, logprobs if echo else None) if n is not None]
    if scored:  # echo with logprobs shows the prompt's, with as many alternatives
        settings["prompt_logprobs"] = max(scored)
        names["prompt_logprobs"] = "prompt_logprobs" if prompt_logprobs is not None else "echo"
    echoed = texts if echo else None
    request = _request(
        gen, prompts, settings, names, rest, chat=False, max_rows=max_rows, texts=echoed
    )
    request.echo, request.score_only = echo, score_only
    request.prompt_logprobs = prompt_logprobs
    return request


def _prompt_logprobs(body: Mapping[str, Any]) -> int | None:
    """vLLM's ``prompt_logprobs``: 0-20 alternatives per prompt token, with the whole
    answer only (as vLLM, not in a stream)."""
    value = integer(body, "prompt_logprobs", *INTEGERS["prompt_logprobs"])
    if value is not None and body.get("stream"):
        raise RequestError(
            "prompt_logprobs come with the whole answer only: not with stream=true",
            param="prompt_logprobs",
        )
    return value


def parse_chat(body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int) -> ParsedRequest:
    """``POST /v1/chat/completions``: ``messages`` rendered with the model's chat
    template (``tools`` and ``chat_template_kwargs`` reach it too)."""
    if "messages" not in body:
        raise RequestError("messages is required", param="messages")
    logprobs = boolean(body, "logprobs")
    top = integer(body, "top_logprobs", *INTEGERS["top_logprobs"])
    if top and not logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    effort = one_of(body, "reasoning_effort", REASONING_EFFORTS)
    verbosity = one_of(body, "verbosity", VERBOSITIES)
    prompt_logprobs = _prompt_logprobs(body)
    settings, names, rest = settings_of(body, chat=True)
    chat = _chat(body, gen, settings, names)
    settings = chat.settings
    names.update(chat.sources)
    settings = with_prediction(body, gen, settings, names)  # drafts from the prediction
    if logprobs:
        settings.update(logprobs=True, top_logprobs=top or 0)
        names.update(logprobs="logprobs", top_logprobs="top_logprobs")
    if prompt_logprobs is not None:
        settings["prompt_logprobs"] = prompt_logprobs
        names["prompt_logprobs"] = "prompt_logprobs"
    request = _request(gen, [chat.prompt], settings, names, rest, chat=True, max_rows=max_rows)
    request.reply_plan = chat.plan
    request.reasoning_effort, request.verbosity = effort, verbosity
    request.prompt_logprobs = prompt_logprobs
    return request


def _completion_prompts(prompt: Any, gen: TextGenerator) -> tuple[list[list[int]], list[str]]:
    """Every completions prompt shape, encoded and checked against the vocabulary; and
    each prompt's text (``echo``): as given, or token ids decoded, special tokens kept."""
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
    rows, texts = [], []
    tokenizer = gen.tokenizer
    assert tokenizer is not None  # a served model has one
    for i, item in enumerate(items):
        try:
            if isinstance(item, str):
                rows.append(gen.prompts.encode_text(item, i))
                texts.append(item)
            elif isinstance(item, list) and all(_is_id(t) for t in item):
                rows.append(gen.prompts.check_ids(list(item), i))
                texts.append(tokenizer.decode(rows[-1], skip_special_tokens=False))
            else:
                raise InputError(f"prompt {i} must be a string or a list of token ids")
        except InputError as exc:
            raise RequestError(str(exc), param="prompt") from None
    return rows, texts


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _chat(
    body: Mapping[str, Any], gen: TextGenerator, settings: dict[str, Any], names: dict[str, str]
) -> ChatRequest:
    """The conversation through the one request builder (``ortgen.request.build_chat``,
    as ``gen.chat()``); its errors name their field, mapped to the request's name."""
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise RequestError(
            "chat_template_kwargs must be an object of template variables",
            param="chat_template_kwargs",
        )
    try:
        return build_chat(
            gen,
            messages,
            settings,
            tools=body.get("tools"),
            tool_choice=body.get("tool_choice"),
            parallel_tool_calls=body.get("parallel_tool_calls"),
            response_format=body.get("response_format"),
            template_kwargs=kwargs,
            reasoning_effort=body.get("reasoning_effort"),
        )
    except OrtgenError as exc:
        raise request_error(exc, names, default="messages") from None


def _request(
    gen: TextGenerator,
    prompts: list[list[int]],
    settings: dict[str, Any],
    names: dict[str, str],
    rest: dict[str, Any],
    *,
    chat: bool,
    max_rows: int,
    texts: list[str] | None = None,
) -> ParsedRequest:
    """Rows for each prompt and choice. Choice ``i`` samples with ``seed + i``. Without a
    length in the request, a row whose model default would run past the context gets
    what is left of it (as ``generate`` clips), instead of an error. ``texts``: each
    prompt's text, for rows that echo it."""
    n, seed = rest["n"], rest["seed"]
    if len(prompts) * n > max_rows:
        raise RequestError(
            f"{len(prompts)} prompt(s) x n={n} is {len(prompts) * n} rows; this server takes "
            f"at most {max_rows} per request (--max-queue)",
            param="n" if n > 1 else ("messages" if chat else "prompt"),
        )
    length_set = "max_new_tokens" in settings or "max_length" in settings
    default_length = None if length_set else _default_length(gen, settings, names)
    rows = []
    for p, prompt in enumerate(prompts):
        own = dict(settings)
        clipped = clipped_length(default_length, len(prompt), gen.model.max_context)
        if clipped is not None:
            own["max_new_tokens"] = clipped
        for i in range(n):
            row_settings = dict(own) if seed is None else {**own, "seed": seed + i}
            echo = texts[p] if texts is not None else None
            rows.append(Row(p * n + i, prompt, row_settings, echo))
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
        raise request_error(exc, names) from None


# -- checking rows ---------------------------------------------------------------------


def check_row(engine: Engine, gen: TextGenerator, row: Row, request: ParsedRequest) -> Chain:
    """The engine's check of one row, then the named components against the registry
    (``ortgen.request.component_problems``: unknown names and parameters fail here, with
    400, not later in the engine), then the components themselves, which the row then
    runs with."""
    try:
        config = engine.check(row.prompt, row.settings)
    except OrtgenError as exc:
        raise request_error(exc, request.names, prompt=request.prompt_field) from None
    problems = component_problems(gen.registry, row.settings)
    if problems:
        field, message = problems[0]
        raise RequestError(message, param=request.names.get(field or "", field))
    try:  # the factories themselves, with the values given
        return engine.check_components(row.prompt, config)
    except OrtgenError as exc:
        given = [k for k in COMPONENT_KINDS if row.settings.get(k) is not None]
        raise request_error(exc, request.names, default=given[0] if given else None) from None


def request_error(
    exc: OrtgenError,
    names: Mapping[str, str],
    *,
    prompt: str = "prompt",
    default: str | None = None,
) -> RequestError:
    """A 400 for an ortgen error, its ``param`` the request field the error's own field
    (``ConfigError.problems``, ``InputError.field``) came from: ``names`` maps an ortgen
    setting to the OpenAI field that set it, ``prompt`` names the request's prompt field
    (``messages`` in a chat). The message is never read."""
    field = getattr(exc, "field", None)
    if field == "prompt":
        param: str | None = prompt
    elif field is not None:
        param = names.get(field, field)
    else:
        param = default
    return RequestError(str(exc), param=param)
