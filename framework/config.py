"""Generation config: Hugging Face ``generation_config.json`` field names, resolved in layers.

Layers, later wins: library defaults < model ``config.json`` < model
``generation_config.json`` < pipeline file < call arguments. Each resolved value
remembers which layer set it, so ``ortgen config show`` can say why a value is
what it is.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .jsonfile import read_json_object
from .registry import did_you_mean

LAYERS = ("defaults", "model config.json", "generation_config.json", "pipeline", "call")

#: Hugging Face generation fields ortgen accepts in model files and ignores: they
#: only shape what ``generate`` returns in transformers, or belong to features
#: (encoder-decoder, assisted decoding, watermarking…) that a decoder-only CPU
#: loop does not have. Unknown keys outside this list are an error.
IGNORED_HF_FIELDS = frozenset(
    [
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "decoder_start_token_id",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "num_beam_groups",
        "diversity_penalty",
        "penalty_alpha",
        "epsilon_cutoff",
        "eta_cutoff",
        "encoder_repetition_penalty",
        "encoder_no_repeat_ngram_size",
        "renormalize_logits",
        "constraints",
        "force_words_ids",
        "sequence_bias",
        "guidance_scale",
        "low_memory",
        "watermarking_config",
        "cache_implementation",
        "cache_config",
        "token_healing",
        "is_assistant",
        "prompt_lookup_num_tokens",
        "max_matching_ngram_size",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "assistant_early_exit",
        "assistant_lookbehind",
        "target_lookbehind",
        "dola_layers",
        "compile_config",
        "disable_compile",
        "return_legacy_cache",
        "trust_remote_code",
        "min_length",
        "length_penalty",
        "early_stopping",
        "transformers_version",
        "typical_p_deprecated",
        "top_h",
    ]
)


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding policy of one request. Field names and meaning follow Hugging Face.

    Divergence: ortgen's library default is ``max_new_tokens=256`` (Hugging Face's
    ``max_length=20`` counts the prompt, which truncates every chat answer). Of
    ``max_length`` and ``max_new_tokens``, the one set by the later layer wins.
    """

    # length
    max_length: int | None = None
    max_new_tokens: int | None = 256
    min_new_tokens: int | None = None
    max_time: float | None = None
    stop_strings: tuple[str, ...] | None = None
    # strategy
    do_sample: bool = False
    num_beams: int = 1
    num_return_sequences: int = 1
    # distribution
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_p: float | None = None
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    # special tokens
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    # ortgen
    seed: int | None = None
    cache: Mapping[str, Any] | None = None  # None: the graph's own default (see chain.py)
    sampler: Mapping[str, Any] | None = None
    logits_processors: tuple[Mapping[str, Any], ...] = ()
    stopping_criteria: tuple[Mapping[str, Any], ...] = ()

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(GenerationConfig)}
DEFAULTS = GenerationConfig()
#: Settings that only matter when sampling (Hugging Face warns when they are set without it).
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p")


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


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
        from .model import read_model_config

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
    problems: list[str] = []
    for layer, settings in layers:
        strict = layer in ("pipeline", "call")
        for key, value in settings.items():
            if key in FIELDS:
                values[key] = value
                sources[key] = layer
            elif key.startswith("_"):
                continue
            elif key in IGNORED_HF_FIELDS:
                if strict:
                    warnings.warn(
                        f"{key!r} is a Hugging Face setting ortgen does not implement; ignored",
                        UserWarning,
                        stacklevel=3,
                    )
            elif strict:
                problems.append(f"unknown setting {key!r}{did_you_mean(key, list(FIELDS))}")
            else:
                warnings.warn(f"{layer}: ignoring unknown generation setting {key!r}", stacklevel=2)
    _limit_from_latest_layer(values, sources)
    normalised: dict[str, Any] = {}
    for key, value in values.items():
        try:
            normalised[key] = _normalise(key, value)
        except TypeError as exc:  # keep going: report every problem at once
            problems.append(f"{key} must be {exc}, got {value!r}")
    config = GenerationConfig(**normalised)
    problems.extend(validate(config))
    if problems:
        raise ConfigError(_problem_list(problems))
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


_INT_FIELDS = {
    "max_length",
    "max_new_tokens",
    "min_new_tokens",
    "num_beams",
    "num_return_sequences",
    "top_k",
    "no_repeat_ngram_size",
    "pad_token_id",
    "bos_token_id",
    "seed",
}
_FLOAT_FIELDS = {"max_time", "temperature", "top_p", "min_p", "typical_p", "repetition_penalty"}


#: Fields where None is a meaningful value ("not set"); None elsewhere is an error.
_NULLABLE = {name for name, f in FIELDS.items() if f.default is None} | {"max_new_tokens"}


def _normalise(key: str, value: Any) -> Any:
    """Coerce a JSON/TOML value to the field's type; TypeError says what was expected."""
    if value is None:
        if key in _NULLABLE:
            return None
        raise TypeError(f"set (it cannot be null; the default is {FIELDS[key].default!r})")
    if key in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("an integer")
        return value
    if key in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError("a number")
        return float(value)
    if key == "do_sample":
        if not isinstance(value, bool):
            raise TypeError("true or false")
        return value
    if key == "eos_token_id":
        return _token_ids(value)
    if key == "bad_words_ids":
        if not isinstance(value, list | tuple) or not value:
            raise TypeError("a non-empty list of token-id lists")
        return tuple(_id_list(seq) for seq in value)
    if key == "stop_strings":
        strings = (value,) if isinstance(value, str) else value
        if not isinstance(strings, list | tuple) or not strings:
            raise TypeError("a non-empty string or a list of non-empty strings")
        if not all(isinstance(s, str) and s for s in strings):
            raise TypeError("a non-empty string or a list of non-empty strings")
        return tuple(strings)
    if key in ("cache", "sampler"):
        return _component_spec(value)
    if key in ("logits_processors", "stopping_criteria"):
        specs = [value] if isinstance(value, str | Mapping) else value
        if not isinstance(specs, list | tuple):
            raise TypeError('a component name or a table with a "name" key')
        return tuple(_component_spec(spec) for spec in specs)
    return value


def _token_ids(value: Any) -> int | tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _id_list(value)


def _id_list(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise TypeError("a token id or a non-empty list of token ids")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise TypeError("a list of non-negative token ids")
    return tuple(value)


def _component_spec(spec: Any) -> Mapping[str, Any]:
    """A component as ``{"name": ..., **params}``; a bare name has no params."""
    if isinstance(spec, str) and spec:
        return {"name": spec}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        return dict(spec)
    raise TypeError('a component name or a table with a "name" key')


def validate(config: GenerationConfig) -> list[str]:
    """Every out-of-range value and contradiction, as readable sentences."""
    c = config
    problems: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    need(
        c.max_new_tokens is None or c.max_new_tokens > 0,
        f"max_new_tokens must be > 0, got {c.max_new_tokens}",
    )
    need(c.max_length is None or c.max_length > 0, f"max_length must be > 0, got {c.max_length}")
    need(
        c.max_new_tokens is not None or c.max_length is not None,
        "set max_new_tokens or max_length: without either, generation has no end",
    )
    need(
        c.min_new_tokens is None or c.min_new_tokens >= 0,
        f"min_new_tokens must be >= 0, got {c.min_new_tokens}",
    )
    need(c.max_time is None or c.max_time > 0, f"max_time must be > 0 seconds, got {c.max_time}")
    need(c.num_beams == 1, f"num_beams={c.num_beams}: beam search is not implemented yet; use 1")
    need(
        c.num_return_sequences >= 1,
        f"num_return_sequences must be >= 1, got {c.num_return_sequences}",
    )
    need(
        c.num_return_sequences == 1 or c.do_sample,
        "num_return_sequences > 1 needs do_sample=true: greedy decoding returns the same "
        "sequence every time",
    )
    need(
        not c.do_sample or c.temperature > 0,
        f"temperature must be > 0 when sampling, got {c.temperature} (for greedy decoding set "
        "do_sample=false)",
    )
    need(c.top_k >= 0, f"top_k must be >= 0 (0 disables it), got {c.top_k}")
    need(0.0 <= c.top_p <= 1.0, f"top_p must be in [0, 1], got {c.top_p}")
    need(c.min_p is None or 0.0 <= c.min_p <= 1.0, f"min_p must be in [0, 1], got {c.min_p}")
    need(0.0 < c.typical_p <= 1.0, f"typical_p must be in (0, 1], got {c.typical_p}")
    need(
        c.repetition_penalty > 0,
        f"repetition_penalty must be > 0 (1.0 disables it), got {c.repetition_penalty}",
    )
    need(
        c.no_repeat_ngram_size >= 0,
        f"no_repeat_ngram_size must be >= 0, got {c.no_repeat_ngram_size}",
    )
    need(c.seed is None or c.seed >= 0, f"seed must be >= 0, got {c.seed}")
    for key in ("pad_token_id", "bos_token_id"):
        value = getattr(c, key)
        need(value is None or value >= 0, f"{key} must be >= 0, got {value}")
    return problems


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
