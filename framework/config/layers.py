"""Generation config: Hugging Face ``generation_config.json`` field names, resolved in layers.

Layers, later wins: library defaults < model ``config.json`` < model
``generation_config.json`` < pipeline file < call arguments. Each resolved value
remembers which layer set it, so ``ortgen config show`` can say why a value is
what it is.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Problem
from ..plugin_host.registry import did_you_mean
from ..structured.settings import CONSTRAINT_FIELDS
from ..util.jsonfile import read_json_object
from .fields import (
    DEFAULTS,
    FIELDS,
    IGNORED_HF_FIELDS,
    SAMPLING_ONLY,
    UNSUPPORTED_HF_FIELDS,
    GenerationConfig,
)
from .values import normalise, validate

LAYERS = ("defaults", "model config.json", "generation_config.json", "pipeline", "call")


@dataclass
class Resolved:
    """A resolved config and, per field, the layer that set it."""

    config: GenerationConfig
    sources: dict[str, str] = field(default_factory=dict)

    def describe(self) -> list[tuple[str, Any, str]]:
        """(field, value, layer) for every field, in declaration order."""
        values = self.config.to_dict()
        return [(name, values[name], self.sources.get(name, "defaults")) for name in FIELDS]


def model_layers(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """The two model layers: token ids from ``config.json``, then ``generation_config.json``."""
    layers: list[tuple[str, dict[str, Any]]] = []
    cfg = read_json_object(folder / "config.json", error=ConfigError, missing_ok=True)
    if not cfg and (folder / "genai_config.json").is_file():  # a builder folder from elsewhere
        from ..model.session import read_model_config

        cfg = read_model_config(folder)
    derived = {
        k: cfg[k]
        for k in ("eos_token_id", "pad_token_id", "bos_token_id")
        if cfg.get(k) is not None
    }
    layers.append(("model config.json", derived))
    gen = read_json_object(folder / "generation_config.json", error=ConfigError, missing_ok=True)
    layers.append(("generation_config.json", gen))
    return layers


def resolve(layers: Iterable[tuple[str, Mapping[str, Any]]]) -> Resolved:
    """Merge layers (later wins), normalise and validate; one error lists every problem."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[Problem] = []
    for layer, settings in layers:
        strict = layer in ("pipeline", "call")
        for key, value in settings.items():
            if key in FIELDS:
                values[key] = value
                sources[key] = layer
            elif key.startswith("_"):
                continue
            elif key in UNSUPPORTED_HF_FIELDS:
                default, why = UNSUPPORTED_HF_FIELDS[key]
                if value != default:
                    problems.append((key, f"{key}={value!r} ({layer}): {why}"))
            elif key in IGNORED_HF_FIELDS:
                if strict:
                    warnings.warn(
                        f"{key!r} only shapes what transformers' generate returns or how it "
                        "runs; ortgen ignores it",
                        UserWarning,
                        stacklevel=3,
                    )
            elif strict:
                problems.append((key, f"unknown setting {key!r}{did_you_mean(key, list(FIELDS))}"))
            else:
                warnings.warn(f"{layer}: ignoring unknown generation setting {key!r}", stacklevel=2)
    _limit_from_latest_layer(values, sources)
    _constraint_from_latest_layer(values, sources)
    normalised: dict[str, Any] = {}
    for key, value in values.items():
        try:
            normalised[key] = _normalise(key, value)
        except TypeError as exc:  # keep going: report every problem at once
            problems.append((key, f"{key} must be {exc}, got {value!r}"))
    config = GenerationConfig(**normalised)
    problems.extend(validate(config))
    if problems:
        raise ConfigError(_problem_list([m for _, m in problems]), problems=problems)
    _warn_ineffective(config, sources)
    return Resolved(config, sources)


def _problem_list(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"invalid generation config: {problems[0]}"
    return "invalid generation config:\n" + "\n".join(f"  - {p}" for p in problems)


def _limit_from_latest_layer(values: dict[str, Any], sources: dict[str, str]) -> None:
    """Of ``max_length`` and ``max_new_tokens``, keep the one the later layer set."""
    if values.get("max_length") is None:
        return
    rank = {name: i for i, name in enumerate(LAYERS)}
    length_rank = rank.get(sources.get("max_length", "defaults"), 0)
    new_rank = rank.get(sources.get("max_new_tokens", "defaults"), 0)
    if "max_new_tokens" not in values or length_rank > new_rank:
        values["max_new_tokens"] = None
        sources["max_new_tokens"] = sources["max_length"]


def _constraint_from_latest_layer(values: dict[str, Any], sources: dict[str, str]) -> None:
    """Of the structured-output constraints, keep those the latest layer that set one set
    (a call's ``regex`` replaces a pipeline's ``json_schema``); two in one layer stay,
    for validation to name."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    given = [key for key in CONSTRAINT_FIELDS if values.get(key) not in (None, False)]
    if len(given) < 2:
        return
    latest = max(rank.get(sources.get(key, "defaults"), 0) for key in given)
    for key in given:
        if rank.get(sources.get(key, "defaults"), 0) < latest:
            del values[key]
            sources.pop(key, None)


#: Fields where None is a meaningful value ("not set"); None elsewhere is an error.
_NULLABLE = {name for name, f in FIELDS.items() if f.default is None} | {"max_new_tokens"}


def _normalise(key: str, value: Any) -> Any:
    """Coerce a JSON/TOML value to the field's type; TypeError says what was expected."""
    if value is None:
        if key in _NULLABLE:
            return None
        raise TypeError(f"set (it cannot be null; the default is {FIELDS[key].default!r})")
    return normalise(key, value)


def _warn_ineffective(config: GenerationConfig, sources: dict[str, str]) -> None:
    """Warn once about sampling settings a caller set that greedy decoding ignores."""
    if config.do_sample:
        return
    ignored = [
        k
        for k in SAMPLING_ONLY
        if sources.get(k) in ("pipeline", "call") and getattr(config, k) != getattr(DEFAULTS, k)
    ]
    if ignored:
        verb, be, obj = ("applies", "is", "it") if len(ignored) == 1 else ("apply", "are", "them")
        warnings.warn(
            f"{', '.join(ignored)} only {verb} when sampling and {be} ignored because "
            f"do_sample=false; pass do_sample=true to use {obj}",
            UserWarning,
            stacklevel=3,
        )
