"""The OpenAI request fields ortgen accepts without acting on them, and those it accepts
only at values that leave the answer as it is, each with the reason.

The rule (docs/server.md, "Every Chat Completions field"): no field the official API
defines is refused as unknown. A field whose effect belongs to OpenAI's service (billing,
storage, its prompt cache's lifetime, its abuse checks) changes nothing in the answer, so
it is accepted and has no effect here (``IGNORED``). A field that would change the answer
in a way this server cannot give (audio, web search, moderation) is accepted at the
values that ask for nothing, and any other value is a 400 naming it with the reason
(``UNSUPPORTED``), never a silently different answer. ``openai_fields.settings_of`` reads
both tables; ``openapi`` publishes them with each field's JSON schema and reason.
"""

from __future__ import annotations

from typing import Any

_STRING = {"type": ["string", "null"]}
_BOOLEAN = {"type": ["boolean", "null"]}

#: accepted and ignored: field -> (JSON schema of its value, why it has no effect here)
NO_EFFECT: dict[str, tuple[dict[str, Any], str]] = {
    "user": (
        _STRING,
        "an end-user id for OpenAI's abuse checks and cache routing; nothing here reads it",
    ),
    "safety_identifier": (_STRING, "an end-user id for OpenAI's abuse checks"),
    "metadata": (
        {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        "tags for completions OpenAI stores; ortgen stores none",
    ),
    "store": (_BOOLEAN, "ortgen stores no completions (there is no stored-completions API)"),
    "service_tier": (
        {"type": ["string", "null"], "examples": ["auto", "default", "flex", "priority"]},
        "OpenAI's processing tiers; ortgen has one queue",
    ),
    "prompt_cache_key": (
        _STRING,
        "ortgen reuses any prompt prefix a cache slot holds by itself, with no key",
    ),
    "prompt_cache_retention": (
        {"enum": ["in_memory", "24h", None]},
        "how long OpenAI keeps cached prefixes; a slot here keeps its prompt until a new "
        "request takes it (--no-prefix-sharing turns reuse off)",
    ),
    "prompt_cache_options": (
        {
            "type": ["object", "null"],
            "properties": {"mode": {"enum": ["implicit", "explicit"]}, "ttl": {"type": "string"}},
        },
        "OpenAI's cache breakpoints and lifetime; ortgen reuses prefixes by itself",
    ),
}
IGNORED = frozenset(NO_EFFECT)

#: OpenAI fields the server cannot honour: accepted only at the values listed (those that
#: ask for nothing), any other value is a 400 naming the field with the reason
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((None, 1), "best_of is not supported; ask for n choices instead"),
    "suffix": ((None, ""), "insertion (suffix) is not supported"),
    "functions": (
        (None, []),
        "the deprecated functions field is not supported; send the functions as tools",
    ),
    "function_call": (
        (None, "none", "auto"),
        "the deprecated function_call is not supported; use tools and tool_choice",
    ),
    "modalities": ((None, ["text"]), "the server generates text only"),
    "audio": ((None,), "the server generates text only"),
    "web_search_options": (
        (None,),
        "the server has no web search: the model answers from the conversation alone",
    ),
    "moderation": (
        (None,),
        "the server runs no moderation model; moderate before or after the request",
    ),
}
