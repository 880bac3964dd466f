"""``GenerationConfig``: every generation setting, its type and default (Hugging Face's
``generation_config.json`` names, plus OpenAI's and llama.cpp's), and the Hugging Face
fields ortgen ignores or refuses. A leaf: the value tables (``ortgen.config.values``) are
derived from these annotations, and the layers (``ortgen.config.layers``) resolve into it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Hugging Face generation fields that only shape what transformers' ``generate`` returns
#: or how it runs (caches, compilation): they change no token, so ortgen accepts and
#: ignores them (with a warning when a pipeline or call sets them).
IGNORED_HF_FIELDS = frozenset(
    [
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict_in_generate",
        "return_legacy_cache",
        "cache_implementation",
        "cache_config",
        "compile_config",
        "disable_compile",
        "prefill_chunk_size",
        "low_memory",
        "transformers_version",
        "trust_remote_code",
        "typical_p_deprecated",
    ]
)

_ENCODER = "an encoder-decoder setting; ortgen runs decoder-only graphs"
_ASSISTED = "assisted (speculative) decoding is not implemented yet"
#: Hugging Face fields that would change the output but cannot apply to a decoder-only
#: ONNX graph here, with their default and why. At the default they are accepted;
#: any other value is an error naming the reason, in every layer.
UNSUPPORTED_HF_FIELDS: dict[str, tuple[Any, str]] = {
    "encoder_repetition_penalty": (1.0, _ENCODER),
    "encoder_no_repeat_ngram_size": (0, _ENCODER),
    "decoder_start_token_id": (None, _ENCODER),
    "watermarking_config": (None, "watermarking is not implemented"),
    "guidance_scale": (None, "classifier-free guidance is not implemented"),
    "penalty_alpha": (
        None,
        "contrastive search needs the model's hidden states, which the graph does not return",
    ),
    "dola_layers": (
        None,
        "DoLa needs intermediate layers' logits, which the graph does not return",
    ),
    "num_beam_groups": (1, "group (diverse) beam search is not implemented"),
    "diversity_penalty": (0.0, "group (diverse) beam search is not implemented"),
    "constraints": (None, "constrained beam search is not implemented"),
    "force_words_ids": (None, "constrained beam search is not implemented"),
    "token_healing": (False, "token healing is not implemented"),
    "top_h": (None, "top-H sampling is not implemented"),
    "is_assistant": (False, _ASSISTED),
    "num_assistant_tokens": (20, _ASSISTED),
    "num_assistant_tokens_schedule": ("constant", _ASSISTED),
    "assistant_confidence_threshold": (0.4, _ASSISTED),
    "assistant_early_exit": (None, _ASSISTED),
    "assistant_lookbehind": (10, _ASSISTED),
    "target_lookbehind": (10, _ASSISTED),
}


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
    min_length: int = 0
    max_time: float | None = None
    stop_strings: tuple[str, ...] | None = None
    # strategy
    do_sample: bool = False
    num_beams: int = 1
    num_return_sequences: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # distribution (Hugging Face)
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_p: float | None = None
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    sequence_bias: tuple[tuple[tuple[int, ...], float], ...] | None = None
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | tuple[int, ...] | None = None
    exponential_decay_length_penalty: tuple[int, float] | None = None
    remove_invalid_values: bool = False
    renormalize_logits: bool = False
    # distribution (OpenAI)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    # distribution (llama.cpp)
    top_n_sigma: float | None = None
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # what comes back besides tokens
    output_scores: bool = False
    output_logits: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    # special tokens
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    # structured output: at most one (the ``grammar`` logits processor, on llguidance)
    json_schema: Mapping[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: tuple[str, ...] | None = None
    #: take the tokens a constraint forces (``{"`` after ``{``) without sampling them;
    #: when every row is forced, they cost no forward of their own
    fast_forward: bool = True
    # reasoning
    #: most tokens a thought (``<think>...</think>``) may take: then its close tag is
    #: forced (the ``thinking_budget`` processor); None: no limit
    thinking_budget: int | None = None
    # ortgen
    seed: int | None = None
    cache: Mapping[str, Any] | None = None  # None: the graph's own default (see chain.py)
    sampler: Mapping[str, Any] | None = None
    # speculative decoding: a drafter proposes tokens, one forward verifies them
    prompt_lookup_num_tokens: int | None = None  # Hugging Face's: drafts from the text so far
    max_matching_ngram_size: int | None = None  # the longest n-gram prompt lookup matches
    drafter: Mapping[str, Any] | None = None  # any registered drafter, by name or table
    logits_processors: tuple[Mapping[str, Any], ...] = ()
    stopping_criteria: tuple[Mapping[str, Any], ...] = ()
    #: a chat's format by name (docs/chat-formats.md); None: the one the template teaches.
    #: Read by the chat builder; a plain ``generate`` ignores it
    chat_format: str | None = None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    @property
    def padding_id(self) -> int:
        """The id written into padding and finished rows: ``pad_token_id``, else the first
        EOS id, else 0."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        eos = self.eos_token_ids
        return eos[0] if eos else 0

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(GenerationConfig)}
DEFAULTS = GenerationConfig()
#: Settings that only matter when sampling (Hugging Face warns when they are set without it).
SAMPLING_ONLY = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "top_n_sigma",
    "xtc_probability",
    "mirostat",
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


#: The settings that name components, and the registry kind each names; the list-valued
#: ones hold several (``[[logits_processors]]``). The server's checks, pipeline files and
#: the request builder read this one table.
COMPONENT_KINDS = {
    "sampler": "sampler",
    "cache": "kv_cache",
    "drafter": "drafter",
    "logits_processors": "logits_processor",
    "stopping_criteria": "stopping_criterion",
}
COMPONENT_LISTS = frozenset({"logits_processors", "stopping_criteria"})
