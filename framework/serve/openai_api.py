"""OpenAI requests in, engine rows out: every field checked and named when it is wrong.

A completions or chat request becomes one :class:`Row` per choice (``n`` per prompt): its
prompt token ids and its ortgen settings, the *call* layer of ``resolve_config``. OpenAI
fields are translated (``max_tokens`` -> ``max_new_tokens``, ``stop`` -> ``stop_strings``,
``temperature=0`` -> greedy, ...); every other top-level key is passed on as an ortgen
setting (what the OpenAI client's ``extra_body`` sends), so ``resolve_config`` is the one
judge of what exists and an unknown key fails with its did-you-mean.

Errors are ``RequestError`` (``ortgen.serve.errors``): the HTTP status and OpenAI's
``param``, the request field at fault (not the ortgen setting it became), so a client
sees the name it sent. A body is read without the model in ``ortgen.request.openai_body``
(the sampling fields in ``ortgen.request.openai_fields``), which an OpenAI batch job reads
its lines with too; the response side (chunks, logprobs) lives in ``responses``.
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
from ..request.openai_body import BodyFields, ChatFields, chat_fields, completion_fields
from ..request.openai_errors import request_error
from .engine import Engine
from .errors import RequestError
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
    """``POST /v1/completions``: the body read as ``ortgen.request.openai_body`` reads it
    (``prompt`` in any of its shapes, ``logprobs`` the number of alternatives, ``echo``,
    ``max_tokens: 0`` and ``prompt_logprobs``), then each prompt encoded and checked
    against the vocabulary. ``echo`` puts the prompt (and, with ``logprobs``, its tokens'
    logprobs, the first null) before the answer; ``max_tokens: 0`` only scores the prompt
    (one token is picked and dropped, as vLLM does)."""
    fields = completion_fields(body)
    prompts = _encoded(fields.prompts, gen)
    settings, names = fields.settings, fields.names
    if fields.logprobs is not None:
        settings.update(logprobs=True, top_logprobs=fields.logprobs)
        names.update(logprobs="logprobs", top_logprobs="logprobs")
    scored = [n for n in (fields.prompt_logprobs, fields.logprobs if fields.echo else None)
              if n is not None]  # fmt: skip
    if scored:  # echo with logprobs shows the prompt's, with as many alternatives
        settings["prompt_logprobs"] = max(scored)
        names["prompt_logprobs"] = (
            "prompt_logprobs" if fields.prompt_logprobs is not None else "echo"
        )
    texts = _texts(fields.prompts, prompts, gen) if fields.echo else None
    request = _request(
        gen, prompts, settings, names, fields, chat=False, max_rows=max_rows, texts=texts
    )
    request.echo, request.score_only = fields.echo, fields.score_only
    request.prompt_logprobs = fields.prompt_logprobs
    return request


def _texts(given: list[str | list[int]], rows: list[list[int]], gen: TextGenerator) -> list[str]:
    """Each prompt's text for ``echo``: as given, or its token ids decoded, special
    tokens kept."""
    tokenizer = gen.tokenizer
    assert tokenizer is not None  # a served model has one
    return [
        item if isinstance(item, str) else tokenizer.decode(row, skip_special_tokens=False)
        for item, row in zip(given, rows, strict=True)
    ]


def parse_chat(body: Mapping[str, Any], gen: TextGenerator, *, max_rows: int) -> ParsedRequest:
    """``POST /v1/chat/completions``: the body read as ``ortgen.request.openai_body``
    reads it, then ``messages`` rendered with the model's chat template (``tools`` and
    ``chat_template_kwargs`` reach it too)."""
    fields = chat_fields(body)
    names = fields.names
    chat = _chat(fields, gen)
    settings = chat.settings
    names.update(chat.sources)
    settings = with_prediction(body, gen, settings, names)  # drafts from the prediction
    if fields.logprobs:
        settings.update(logprobs=True, top_logprobs=fields.top_logprobs)
        names.update(logprobs="logprobs", top_logprobs="top_logprobs")
    if fields.prompt_logprobs is not None:
        settings["prompt_logprobs"] = fields.prompt_logprobs
        names["prompt_logprobs"] = "prompt_logprobs"
    request = _request(gen, [chat.prompt], settings, names, fields, chat=True, max_rows=max_rows)
    request.reply_plan = chat.plan
    request.reasoning_effort, request.verbosity = fields.reasoning_effort, fields.verbosity
    request.prompt_logprobs = fields.prompt_logprobs
    return request


def _encoded(prompts: list[str | list[int]], gen: TextGenerator) -> list[list[int]]:
    """Each completions prompt encoded and checked against the vocabulary."""
    rows = []
    for i, item in enumerate(prompts):
        try:
            if isinstance(item, str):
                rows.append(gen.prompts.encode_text(item, i))
            else:
                rows.append(gen.prompts.check_ids(list(item), i))
        except InputError as exc:
            raise RequestError(str(exc), param="prompt") from None
    return rows


def _chat(fields: ChatFields, gen: TextGenerator) -> ChatRequest:
    """The conversation through the one request builder (``ortgen.request.build_chat``,
    as ``gen.chat()``); its errors name their field, mapped to the request's name."""
    try:
        return build_chat(
            gen,
            fields.messages,
            fields.settings,
            **fields.options,
            template_kwargs=fields.template_kwargs,
            reasoning_effort=fields.reasoning_effort,
        )
    except OrtgenError as exc:
        raise request_error(exc, fields.names, default="messages") from None


def _request(
    gen: TextGenerator,
    prompts: list[list[int]],
    settings: dict[str, Any],
    names: dict[str, str],
    fields: BodyFields,
    *,
    chat: bool,
    max_rows: int,
    texts: list[str] | None = None,
) -> ParsedRequest:
    """Rows for each prompt and choice. Choice ``i`` samples with ``seed + i``. Without a
    length in the request, a row whose model default would run past the context gets
    what is left of it (as ``generate`` clips), instead of an error. ``texts``: each
    prompt's text, for rows that echo it."""
    n, seed = fields.n, fields.seed
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
        stream=fields.stream,
        include_usage=fields.include_usage,
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
