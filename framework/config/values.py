"""Turning layer values into ``GenerationConfig`` fields, and checking them.

``normalise(key, value)`` coerces a JSON/TOML/Python value to the field's type (a
``TypeError`` says what was expected); ``validate(config)`` lists every out-of-range value
and contradiction as a sentence. Ranges follow the source of each setting: Hugging Face
for its fields, the OpenAI API for ``presence_penalty``/``frequency_penalty``/
``logit_bias``/``top_logprobs``, llama.cpp for its samplers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import Problem
from ..structured.settings import CONSTRAINT_FIELDS
from ..structured.settings import normalise as normalise_constraint
from ..structured.settings import validate as validate_constraints
from .fields import FIELDS

if TYPE_CHECKING:
    from .fields import GenerationConfig


def _annotated(*types: str) -> frozenset[str]:
    """The fields whose annotation is one of ``types`` (``int | None`` counts as ``int``:
    None is checked apart, ``ortgen.config.layers``), so a new field is coerced by its
    declared type without a table to keep in step."""
    wanted = {t for kind in types for t in (kind, f"{kind} | None")}
    return frozenset(name for name, f in FIELDS.items() if f.type in wanted)


INT_FIELDS = _annotated("int")
FLOAT_FIELDS = _annotated("float")
BOOL_FIELDS = _annotated("bool")
TOKEN_LIST_FIELDS = _annotated("tuple[int, ...]")


def normalise(key: str, value: Any) -> Any:
    """Coerce a non-null value to the field's type; TypeError says what was expected."""
    if key in INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("an integer")
        return value
    if key in FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError("a number")
        if not math.isfinite(value):  # NaN fails every range check by comparing False
            raise TypeError("a finite number")
        return float(value)
    if key in BOOL_FIELDS:
        if not isinstance(value, bool):
            raise TypeError("true or false")
        return value
    if key in ("eos_token_id", "forced_eos_token_id"):
        return _token_ids(value)
    if key in TOKEN_LIST_FIELDS:
        return _id_list(value, allow_empty=True)
    if key == "bad_words_ids":
        if not isinstance(value, list | tuple) or not value:
            raise TypeError("a non-empty list of token-id lists")
        return tuple(_id_list(seq) for seq in value)
    if key == "sequence_bias":
        return _sequence_bias(value)
    if key == "logit_bias":
        return _logit_bias(value)
    if key == "exponential_decay_length_penalty":
        return _decay(value)
    if key == "early_stopping":
        if isinstance(value, bool) or value == "never":
            return value
        raise TypeError('true, false or "never"')
    if key in ("stop_strings", "dry_sequence_breakers"):
        strings = (value,) if isinstance(value, str) else value
        empty_ok = key == "dry_sequence_breakers"
        if not isinstance(strings, list | tuple) or (not strings and not empty_ok):
            raise TypeError("a non-empty string or a list of non-empty strings")
        if not all(isinstance(s, str) and s for s in strings):
            raise TypeError("a non-empty string or a list of non-empty strings")
        return tuple(strings)
    if key in ("cache", "sampler", "drafter"):
        return component_spec(value)
    if key in CONSTRAINT_FIELDS:
        return normalise_constraint(key, value)
    if key in ("logits_processors", "stopping_criteria"):
        specs = [value] if isinstance(value, str | Mapping) else value
        if not isinstance(specs, list | tuple):
            raise TypeError('a component name or a table with a "name" key')
        return tuple(component_spec(spec) for spec in specs)
    return value


def component_spec(spec: Any) -> Mapping[str, Any]:
    """A component as ``{"name": ..., **params}``; a bare name has no params."""
    if isinstance(spec, str) and spec:
        return {"name": spec}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        return dict(spec)
    raise TypeError('a component name or a table with a "name" key')


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _token_ids(value: Any) -> int | tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _id_list(value)


def _id_list(value: Any, *, allow_empty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or (not value and not allow_empty):
        raise TypeError("a token id or a non-empty list of token ids")
    if not all(_is_token(v) for v in value):
        raise TypeError("a list of non-negative token ids")
    return tuple(value)


def _sequence_bias(value: Any) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Hugging Face's two shapes: ``[[ids, bias], ...]`` (JSON) or ``{(ids...): bias}``."""
    items = value.items() if isinstance(value, Mapping) else value
    shape = "a list of [token-id list, bias] pairs (or a {tuple of ids: bias} dict)"
    if not isinstance(items, list | tuple) and not isinstance(value, Mapping):
        raise TypeError(shape)
    out = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise TypeError(shape)
        ids, bias = item
        if isinstance(ids, int) and not isinstance(ids, bool):
            ids = (ids,)
        if not isinstance(ids, list | tuple) or not ids or not all(_is_token(t) for t in ids):
            raise TypeError(shape + " with non-empty lists of non-negative token ids")
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise TypeError(shape + " with numeric biases")
        out.append((tuple(ids), float(bias)))
    if not out:
        raise TypeError(shape + " (non-empty)")
    return tuple(out)


def _logit_bias(value: Any) -> Mapping[int, float]:
    """OpenAI's ``{"token id": bias}`` (JSON keys are strings) or ``{id: bias}``."""
    if not isinstance(value, Mapping):
        raise TypeError('a {"token id": bias} mapping')
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key) if not isinstance(key, bool) else -1
        except (TypeError, ValueError):
            raise TypeError(f'a {{"token id": bias}} mapping, not key {key!r}') from None
        if token < 0 or (isinstance(key, float) and key != token):
            raise TypeError(f'a {{"token id": bias}} mapping with token ids >= 0, not {key!r}')
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise TypeError(f'a {{"token id": bias}} mapping with numeric biases, not {bias!r}')
        out[token] = float(bias)
    return out


def _decay(value: Any) -> tuple[int, float]:
    shape = "a [start_index, decay_factor] pair"
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise TypeError(shape)
    start, factor = value
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise TypeError(shape + " with an integer start_index >= 0")
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise TypeError(shape + " with a numeric decay_factor")
    return start, float(factor)


def validate(config: GenerationConfig) -> list[Problem]:
    """Every out-of-range value and contradiction, as ``(field, sentence)``: the field
    is the setting the sentence starts with (the one a caller should change)."""
    c = config
    problems: list[Problem] = []

    def need(ok: bool, field: str, message: str) -> None:
        if not ok:
            problems.append((field, message))

    # length
    need(
        c.max_new_tokens is None or c.max_new_tokens > 0,
        "max_new_tokens",
        f"max_new_tokens must be > 0, got {c.max_new_tokens}",
    )
    need(
        c.max_length is None or c.max_length > 0,
        "max_length",
        f"max_length must be > 0, got {c.max_length}",
    )
    need(
        c.prompt_lookup_num_tokens is None or c.prompt_lookup_num_tokens > 0,
        "prompt_lookup_num_tokens",
        f"prompt_lookup_num_tokens must be > 0 (null: no prompt lookup), "
        f"got {c.prompt_lookup_num_tokens}",
    )
    need(
        c.max_matching_ngram_size is None or c.max_matching_ngram_size >= 2,
        "max_matching_ngram_size",
        "max_matching_ngram_size must be >= 2 (one-token matches draft too often to pay), "
        f"got {c.max_matching_ngram_size}",
    )
    need(
        c.drafter is None or c.prompt_lookup_num_tokens is None,
        "prompt_lookup_num_tokens",
        "set prompt_lookup_num_tokens or drafter, not both",
    )
    need(
        c.max_new_tokens is not None or c.max_length is not None,
        "max_new_tokens",
        "set max_new_tokens or max_length: without either, generation has no end",
    )
    need(
        c.min_new_tokens is None or c.min_new_tokens >= 0,
        "min_new_tokens",
        f"min_new_tokens must be >= 0, got {c.min_new_tokens}",
    )
    need(c.min_length >= 0, "min_length", f"min_length must be >= 0, got {c.min_length}")
    need(
        c.max_time is None or c.max_time > 0,
        "max_time",
        f"max_time must be > 0 seconds, got {c.max_time}",
    )
    # strategy
    need(c.num_beams >= 1, "num_beams", f"num_beams must be >= 1, got {c.num_beams}")
    need(
        c.num_return_sequences >= 1,
        "num_return_sequences",
        f"num_return_sequences must be >= 1, got {c.num_return_sequences}",
    )
    if c.num_beams > 1:
        need(
            c.num_return_sequences <= c.num_beams,
            "num_return_sequences",
            f"num_return_sequences ({c.num_return_sequences}) must be <= num_beams "
            f"({c.num_beams}): beam search returns its best finished beams",
        )
        need(
            c.mirostat == 0,
            "mirostat",
            "mirostat is a sampler of its own; it cannot run with num_beams > 1",
        )
    else:
        need(
            c.num_return_sequences == 1 or c.do_sample,
            "num_return_sequences",
            "num_return_sequences > 1 needs do_sample=true (or num_beams > 1): greedy "
            "decoding returns the same sequence every time",
        )
    need(
        math.isfinite(c.length_penalty),
        "length_penalty",
        f"length_penalty must be finite, got {c.length_penalty}",
    )
    # distribution (Hugging Face)
    need(
        not c.do_sample or c.temperature > 0,
        "temperature",
        f"temperature must be > 0 when sampling, got {c.temperature} (for greedy decoding set "
        "do_sample=false)",
    )
    need(c.top_k >= 0, "top_k", f"top_k must be >= 0 (0 disables it), got {c.top_k}")
    need(0.0 <= c.top_p <= 1.0, "top_p", f"top_p must be in [0, 1], got {c.top_p}")
    need(
        c.min_p is None or 0.0 <= c.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {c.min_p}"
    )
    need(0.0 < c.typical_p <= 1.0, "typical_p", f"typical_p must be in (0, 1], got {c.typical_p}")
    for key in ("epsilon_cutoff", "eta_cutoff"):
        value = getattr(c, key)
        need(0.0 <= value < 1.0, key, f"{key} must be in [0, 1) (0 disables it), got {value}")
    need(
        c.repetition_penalty > 0,
        "repetition_penalty",
        f"repetition_penalty must be > 0 (1.0 disables it), got {c.repetition_penalty}",
    )
    need(
        c.no_repeat_ngram_size >= 0,
        "no_repeat_ngram_size",
        f"no_repeat_ngram_size must be >= 0, got {c.no_repeat_ngram_size}",
    )
    # OpenAI
    for key in ("presence_penalty", "frequency_penalty"):
        value = getattr(c, key)
        need(-2.0 <= value <= 2.0, key, f"{key} must be in [-2, 2] (OpenAI's range), got {value}")
    if c.logit_bias:
        bad = {t: b for t, b in c.logit_bias.items() if not -100.0 <= b <= 100.0}
        need(
            not bad,
            "logit_bias",
            f"logit_bias values must be in [-100, 100] (OpenAI's range), got {bad}",
        )
    need(
        0 <= c.top_logprobs <= 20,
        "top_logprobs",
        f"top_logprobs must be in [0, 20], got {c.top_logprobs}",
    )
    need(
        c.prompt_logprobs is None or 0 <= c.prompt_logprobs <= 20,
        "prompt_logprobs",
        f"prompt_logprobs must be in [0, 20] (null: none), got {c.prompt_logprobs}",
    )
    # llama.cpp
    need(
        c.top_n_sigma is None or c.top_n_sigma > 0,
        "top_n_sigma",
        f"top_n_sigma must be > 0 (null disables it), got {c.top_n_sigma}",
    )
    need(
        0.0 <= c.xtc_probability <= 1.0,
        "xtc_probability",
        f"xtc_probability must be in [0, 1], got {c.xtc_probability}",
    )
    need(
        0.0 <= c.xtc_threshold <= 1.0,
        "xtc_threshold",
        f"xtc_threshold must be in [0, 1], got {c.xtc_threshold}",
    )
    need(
        c.dry_multiplier >= 0,
        "dry_multiplier",
        f"dry_multiplier must be >= 0, got {c.dry_multiplier}",
    )
    need(c.dry_base >= 1.0, "dry_base", f"dry_base must be >= 1, got {c.dry_base}")
    need(
        c.dry_allowed_length >= 0,
        "dry_allowed_length",
        f"dry_allowed_length must be >= 0, got {c.dry_allowed_length}",
    )
    need(
        c.dry_penalty_last_n >= -1,
        "dry_penalty_last_n",
        f"dry_penalty_last_n must be >= -1 (-1: the whole context), got {c.dry_penalty_last_n}",
    )
    need(
        c.mirostat in (0, 2),
        "mirostat",
        f"mirostat={c.mirostat}: ortgen has mirostat v2 (2) and off (0); v1 is not implemented",
    )
    need(c.mirostat_tau > 0, "mirostat_tau", f"mirostat_tau must be > 0, got {c.mirostat_tau}")
    need(c.mirostat_eta > 0, "mirostat_eta", f"mirostat_eta must be > 0, got {c.mirostat_eta}")
    # reasoning
    need(
        c.thinking_budget is None or c.thinking_budget > 0,
        "thinking_budget",
        f"thinking_budget must be > 0 tokens (null: no limit), got {c.thinking_budget}",
    )
    # ids
    need(c.seed is None or c.seed >= 0, "seed", f"seed must be >= 0, got {c.seed}")
    for key in ("pad_token_id", "bos_token_id", "forced_bos_token_id"):
        value = getattr(c, key)
        need(value is None or value >= 0, key, f"{key} must be >= 0, got {value}")
    problems.extend(validate_constraints(c))
    return problems
