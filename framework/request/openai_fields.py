"""The OpenAI sampling fields of a request, checked and turned into ortgen settings.

Ranges are OpenAI's (``temperature`` in [0, 2], ``stop`` up to 4 strings, ...), checked
here so the error names the field the client sent. What is not an OpenAI field is kept as
an ortgen setting for ``resolve_config`` to judge (the OpenAI client's ``extra_body``).
``COMPLETION_FIELDS`` and ``CHAT_FIELDS`` list the fields each route reads with the JSON
schema of their values (the ranges from ``NUMBERS`` and ``INTEGERS``, the ones checked
here): the server's ``openapi`` publishes them at ``/openapi.json``. The fields accepted
with no effect and those accepted only at their defaults are in ``openai_ignored``, with
the reasons. The server reads its requests with them, and an OpenAI batch job its lines
(``openai_body`` reads a whole body).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .openai_errors import RequestError
from .openai_ignored import IGNORED, UNSUPPORTED  # the tests read them here too

#: most rows (prompts x n) one request may ask for: one request must fit the engine
MAX_N = 128
#: OpenAI's ranges of the numeric fields, checked here and published in the schemas
#: (``openapi``): field -> (low, high); an integer's high None is unbounded
NUMBERS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
INTEGERS: dict[str, tuple[int, int | None]] = {
    "max_tokens": (1, None),
    "max_completion_tokens": (1, None),
    "n": (1, MAX_N),
    "seed": (0, None),
    "top_logprobs": (0, 20),  # chat
    "prompt_logprobs": (0, 20),  # vLLM's: alternatives per prompt token
}
#: ``logprobs`` of /v1/completions: how many alternatives per token (chat: true or false)
COMPLETION_LOGPROBS = (0, 5)
#: OpenAI's values of ``reasoning_effort`` and ``verbosity`` (chat): checked here, handed
#: on as ``ParsedRequest.reasoning_effort`` / ``.verbosity`` for the chat template
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
VERBOSITIES = ("low", "medium", "high")


_OBJECT_OR_NULL = {"type": ["object", "null"]}


def _number_schema(key: str) -> dict[str, Any]:
    low, high = NUMBERS[key]
    return {"type": ["number", "null"], "minimum": low, "maximum": high}


def _integer_schema(low: int, high: int | None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": ["integer", "null"], "minimum": low}
    return schema if high is None else {**schema, "maximum": high}


_STOP = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
        {"type": "null"},
    ]
}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        _TOKEN_IDS,
        {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
    ]
}
_PART = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string"}, "text": {"type": "string"}},
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "examples": ["system", "user", "assistant", "tool"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": _PART},
                {"type": "object"},  # a tool result as a JSON object (role tool)
                {"type": "null"},  # only with tool_calls
            ]
        },
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
    },
}


def _function_tool(**properties: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``{"type": "function", "function": {"name": ..., ...}}`` shape: a tool
    (with its description and parameters) or a named tool_choice (a name only)."""
    function = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, **properties},
    }
    return {
        "type": "object",
        "required": ["type", "function"],
        "properties": {"type": {"const": "function"}, "function": function},
    }


_TOOL = _function_tool(
    description={"type": "string"},
    parameters={"type": "object"},
    strict={"type": ["boolean", "null"]},
)
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_PREDICTION = {
    "anyOf": [
        {
            "type": "object",
            "required": ["type", "content"],
            "properties": {
                "type": {"const": "content"},
                "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
            },
        },
        {"type": "null"},
    ],
    "description": "text the answer is expected to repeat: its tokens are drafts for "
    "speculative decoding (the answer is the same; it may come in fewer forwards)",
}
_STREAM_OPTIONS = {
    "type": ["object", "null"],
    "properties": {
        "include_usage": {"type": ["boolean", "null"]},
        "include_obfuscation": {"type": ["boolean", "null"]},
    },
    "additionalProperties": False,
    "description": "only with stream=true",
}

#: The OpenAI fields each route reads, with the JSON schema of its value: what
#: ``settings_of`` and ``openai_api`` read by name (any other key is an ortgen setting)
#: and what ``openapi`` publishes. Ranges come from NUMBERS and INTEGERS above.
COMMON_FIELDS: dict[str, dict[str, Any]] = {
    "model": {
        "type": "string",
        "description": "one of the ids /v1/models lists (404 for another; a server of one "
        "model takes any name); omitted or empty: the first model the server was given",
    },
    "max_tokens": _integer_schema(*INTEGERS["max_tokens"]),
    "temperature": _number_schema("temperature"),
    "top_p": _number_schema("top_p"),
    "n": _integer_schema(*INTEGERS["n"]),
    "stop": _STOP,
    "seed": _integer_schema(*INTEGERS["seed"]),
    "presence_penalty": _number_schema("presence_penalty"),
    "frequency_penalty": _number_schema("frequency_penalty"),
    "logit_bias": {
        "type": ["object", "null"],
        "propertyNames": {"pattern": "^[0-9]+$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    },
    "stream": {"type": ["boolean", "null"]},
    "stream_options": _STREAM_OPTIONS,
}
_PROMPT_LOGPROBS = {
    **_integer_schema(*INTEGERS["prompt_logprobs"]),
    "description": "vLLM's extension: each prompt token's logprob, rank and N best "
    "alternatives, in the answer's prompt_logprobs (not with stream=true)",
}
COMPLETION_FIELDS: dict[str, dict[str, Any]] = {
    "prompt": _PROMPT,
    **COMMON_FIELDS,
    "max_tokens": {
        **_integer_schema(0, None),
        "description": "0: nothing is generated, the prompt is only scored (with echo "
        "or prompt_logprobs)",
    },
    "logprobs": _integer_schema(*COMPLETION_LOGPROBS),
    "echo": {
        "type": ["boolean", "null"],
        "description": "the answer's text (and logprobs) start with the prompt's",
    },
    "prompt_logprobs": _PROMPT_LOGPROBS,
}
CHAT_FIELDS: dict[str, dict[str, Any]] = {
    "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
    **COMMON_FIELDS,
    "max_completion_tokens": _integer_schema(*INTEGERS["max_completion_tokens"]),
    "logprobs": {"type": ["boolean", "null"]},
    "top_logprobs": _integer_schema(*INTEGERS["top_logprobs"]),
    "tools": {"type": ["array", "null"], "items": _TOOL},
    "tool_choice": {
        "anyOf": [
            {"enum": ["none", "auto", "required", None]},
            _function_tool(),
        ]
    },
    "parallel_tool_calls": {"type": ["boolean", "null"]},
    "response_format": {
        "anyOf": [
            {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"enum": ["text", "json_object", "json_schema"]},
                    "json_schema": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "schema": {"type": "object"},
                            "strict": {"type": ["boolean", "null"]},
                        },
                    },
                },
            },
            {"type": "null"},
        ]
    },
    "chat_template_kwargs": {
        **_OBJECT_OR_NULL,
        "description": "variables for the chat template (enable_thinking, ...); not tools",
    },
    "reasoning_effort": {
        "enum": [*REASONING_EFFORTS, None],
        "description": "checked; handed to the chat template builder (docs/server.md)",
    },
    "verbosity": {
        "enum": [*VERBOSITIES, None],
        "description": "checked; handed to the chat template builder (docs/server.md)",
    },
    "prediction": _PREDICTION,
    "prompt_logprobs": _PROMPT_LOGPROBS,
}
#: what ``settings_of`` reads by name on either route (every other key is a setting)
OPENAI_FIELDS = frozenset(COMPLETION_FIELDS) | frozenset(CHAT_FIELDS)


def number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(
            f"{key} must be a number in [{low:g}, {high:g}], got {value!r}", param=key
        )
    return float(value)


def integer(body: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    bad = isinstance(value, bool) or not isinstance(value, int)
    if bad or value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise RequestError(f"{key} must be an integer {span}, got {value!r}", param=key)
    return value


def boolean(body: Mapping[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, got {value!r}", param=key)
    return value


def one_of(body: Mapping[str, Any], key: str, values: tuple[str, ...]) -> str | None:
    """A field that takes one of ``values`` (or null)."""
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or value not in values):
        shown = ", ".join(repr(v) for v in values)
        raise RequestError(f"{key} must be one of {shown} or null, got {value!r}", param=key)
    return value


def settings_of(
    body: Mapping[str, Any], *, chat: bool
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The OpenAI sampling fields as ortgen settings, the field each came from, and the
    fields still to place (n, seed, stream). Other keys are ortgen settings as given."""
    settings: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, value in body.items():
        if key in OPENAI_FIELDS or key in IGNORED:
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
        put("max_new_tokens", integer(body, key, *INTEGERS[key]), key)
    temperature = number(body, "temperature", *NUMBERS["temperature"])
    top_p = number(body, "top_p", *NUMBERS["top_p"])
    if temperature is not None:
        if "do_sample" not in settings:
            put("do_sample", temperature > 0, "temperature")
        if temperature > 0:
            put("temperature", temperature, "temperature")
    if top_p is not None and temperature != 0:  # greedy ignores it: no warning for it
        put("top_p", top_p, "top_p")
    put("stop_strings", _stop(body.get("stop")), "stop")
    for key in ("presence_penalty", "frequency_penalty"):
        put(key, number(body, key, *NUMBERS[key]), key)
    put("logit_bias", body.get("logit_bias"), "logit_bias")
    rest = {
        "n": integer(body, "n", *INTEGERS["n"]) or 1,
        "seed": integer(body, "seed", *INTEGERS["seed"]),
        "stream": bool(boolean(body, "stream")),
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
    # include_obfuscation: ortgen pads no chunk (OpenAI's side-channel padding), so it is
    # only checked
    boolean(options, "include_obfuscation")
    return bool(boolean(options, "include_usage"))
