"""The OpenAI sampling fields of a request, checked and turned into ortgen settings.

Ranges are OpenAI's (``temperature`` in [0, 2], ``stop`` up to 4 strings, ...), checked
here so the error names the field the client sent. What is not an OpenAI field is kept as
an ortgen setting for ``resolve_config`` to judge (the OpenAI client's ``extra_body``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import RequestError

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
    "functions": ((None,), "the deprecated functions field is not supported; use tools"),
    "function_call": ((None,), "the deprecated function_call is not supported; use tools"),
    "modalities": ((None, ["text"]), "the server generates text only"),
    "audio": ((None,), "the server generates text only"),
}


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


def settings_of(
    body: Mapping[str, Any], *, chat: bool
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The OpenAI sampling fields as ortgen settings, the field each came from, and the
    fields still to place (n, seed, stream). Other keys are ortgen settings as given."""
    openai_fields = {
        "model", "prompt", "messages", "tools", "tool_choice", "parallel_tool_calls",
        "response_format", "chat_template_kwargs", "max_tokens",
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
        put("max_new_tokens", integer(body, key, 1), key)
    temperature = number(body, "temperature", 0.0, 2.0)
    top_p = number(body, "top_p", 0.0, 1.0)
    if temperature is not None:
        if "do_sample" not in settings:
            put("do_sample", temperature > 0, "temperature")
        if temperature > 0:
            put("temperature", temperature, "temperature")
    if top_p is not None and temperature != 0:  # greedy ignores it: no warning for it
        put("top_p", top_p, "top_p")
    put("stop_strings", _stop(body.get("stop")), "stop")
    for key in ("presence_penalty", "frequency_penalty"):
        put(key, number(body, key, -2.0, 2.0), key)
    put("logit_bias", body.get("logit_bias"), "logit_bias")
    rest = {
        "n": integer(body, "n", 1, MAX_N) or 1,
        "seed": integer(body, "seed", 0),
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
    return bool(boolean(options, "include_usage"))
