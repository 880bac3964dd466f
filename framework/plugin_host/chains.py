"""From a resolved config to the components of one request.

Flat Hugging Face fields become built-in processors in Hugging Face's order
(penalties and token rules, then the explicitly given components, then temperature,
top-k, top-p, min-p, typical, epsilon, eta), so the same settings give the same
distribution as ``transformers``; OpenAI's and llama.cpp's settings join the group
their source applies them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import GenerationConfig
from ..errors import ConfigError
from ..loop import scoring
from ..loop.chain import Chain, Spec
from ..protocols import (
    GenerationContext,
    KVCache,
    LogitsProcessor,
)
from ..structured.settings import constraint as structured_constraint
from .registry import Registry


def processor_specs(config: GenerationConfig, ctx: GenerationContext | None = None) -> list[Spec]:
    """Processors implied by flat fields, in Hugging Face's ``_get_logits_processor`` order.

    Penalties and token rules first (OpenAI's and llama.cpp's penalties beside Hugging
    Face's), then the components given explicitly (where transformers merges a user's
    ``logits_processor`` list), then, when sampling, the warpers (Hugging Face's, then
    llama.cpp's), and ``renormalize_logits`` last.
    """
    c = config
    eos = list(c.eos_token_ids)
    prompt_length = ctx.prompt_length if ctx is not None else 0
    max_length = ctx.max_length if ctx is not None else None
    specs: list[Spec] = []
    if c.num_beams > 1:  # transformers' beam search processes log-probabilities
        specs.append(("renormalize_logits", {}))
    if c.sequence_bias:
        bias = [[list(ids), value] for ids, value in c.sequence_bias]
        specs.append(("sequence_bias", {"sequence_bias": bias}))
    if c.logit_bias:
        specs.append(("logit_bias", {"logit_bias": dict(c.logit_bias)}))
    if c.repetition_penalty != 1.0:
        specs.append(("repetition_penalty", {"repetition_penalty": c.repetition_penalty}))
    if c.presence_penalty != 0.0:
        specs.append(("presence_penalty", {"presence_penalty": c.presence_penalty}))
    if c.frequency_penalty != 0.0:
        specs.append(("frequency_penalty", {"frequency_penalty": c.frequency_penalty}))
    if c.no_repeat_ngram_size > 0:
        specs.append(("no_repeat_ngram_size", {"no_repeat_ngram_size": c.no_repeat_ngram_size}))
    if c.dry_multiplier > 0:
        dry = {
            "multiplier": c.dry_multiplier,
            "base": c.dry_base,
            "allowed_length": c.dry_allowed_length,
            "penalty_last_n": c.dry_penalty_last_n,
            "sequence_breakers": list(c.dry_sequence_breakers),
        }
        specs.append(("dry", dry))
    if c.bad_words_ids:
        bad = [list(seq) for seq in c.bad_words_ids]
        specs.append(("bad_words_ids", {"bad_words_ids": bad, "eos_token_id": eos}))
    if c.min_length > 0 and eos:
        specs.append(("min_length", {"min_length": c.min_length, "eos_token_id": eos}))
    if c.min_new_tokens and eos:
        specs.append(("min_new_tokens", {"min_new_tokens": c.min_new_tokens, "eos_token_id": eos}))
    if c.forced_bos_token_id is not None:
        specs.append(("forced_bos_token_id", {"bos_token_id": c.forced_bos_token_id}))
    if c.forced_eos_token_id is not None and max_length is not None:
        forced = c.forced_eos_token_id
        ids = [forced] if isinstance(forced, int) else list(forced)
        specs.append(("forced_eos_token_id", {"max_length": max_length, "eos_token_id": ids}))
    if c.remove_invalid_values:
        specs.append(("remove_invalid_values", {}))
    if c.exponential_decay_length_penalty is not None and eos:
        start, factor = c.exponential_decay_length_penalty
        decay = {
            "start_index": start,
            "decay_factor": factor,
            "eos_token_id": eos,
            "input_ids_seq_length": prompt_length,
        }
        specs.append(("exponential_decay_length_penalty", decay))
    if c.suppress_tokens:
        specs.append(("suppress_tokens", {"suppress_tokens": list(c.suppress_tokens)}))
    if c.begin_suppress_tokens:
        # transformers: one step later when a one-token prompt gets a forced BOS first
        one_later = prompt_length == 1 and c.forced_bos_token_id is not None
        begin = {
            "begin_suppress_tokens": list(c.begin_suppress_tokens),
            "begin_index": prompt_length + one_later,
        }
        specs.append(("begin_suppress_tokens", begin))
    specs.extend(_explicit(c.logits_processors))
    if c.thinking_budget is not None:  # before the grammar: both follow the same tokens,
        # and a forced close tag is the budget's (the loop asks forcers in this order)
        specs.append(("thinking_budget", {"budget": c.thinking_budget}))
    structured = structured_constraint(c)
    if structured is not None:  # after every token rule, before the warpers
        key, value = structured
        params = {key: list(value) if key == "choice" else value, "fast_forward": c.fast_forward}
        specs.append(("grammar", params))
    if c.do_sample:
        # beams keep a non-EOS continuation alive, as transformers does
        keep = {"min_tokens_to_keep": (len(eos) + 1 if eos else 2) if c.num_beams > 1 else 1}
        if c.temperature != 1.0:
            specs.append(("temperature", {"temperature": c.temperature}))
        if c.top_k != 0:
            specs.append(("top_k", {"top_k": c.top_k, **keep}))
        if c.top_p < 1.0:
            specs.append(("top_p", {"top_p": c.top_p, **keep}))
        if c.min_p is not None:
            specs.append(("min_p", {"min_p": c.min_p, **keep}))
        if c.typical_p < 1.0:
            specs.append(("typical_p", {"typical_p": c.typical_p, **keep}))
        if c.epsilon_cutoff > 0.0:
            specs.append(("epsilon_cutoff", {"epsilon": c.epsilon_cutoff, **keep}))
        if c.eta_cutoff > 0.0:
            specs.append(("eta_cutoff", {"epsilon": c.eta_cutoff, **keep}))
        if c.top_n_sigma is not None:
            specs.append(("top_n_sigma", {"n": c.top_n_sigma}))
        if c.xtc_probability > 0.0:
            xtc = {"probability": c.xtc_probability, "threshold": c.xtc_threshold, **keep}
            specs.append(("xtc", xtc))
    if c.renormalize_logits:
        specs.append(("renormalize_logits", {}))
    return specs


def drafter_spec(config: GenerationConfig) -> Spec | None:
    """The drafter for speculative decoding: ``drafter`` as given, or ``prompt_lookup``
    from Hugging Face's ``prompt_lookup_num_tokens``; None: no speculation."""
    if config.drafter:
        return _explicit((config.drafter,))[0]
    if config.prompt_lookup_num_tokens:
        params = {"num_tokens": config.prompt_lookup_num_tokens}
        if config.max_matching_ngram_size is not None:
            params["max_ngram"] = config.max_matching_ngram_size
        return "prompt_lookup", params
    return None


def sampler_spec(config: GenerationConfig) -> Spec:
    if config.sampler:
        return _explicit((config.sampler,))[0]
    if config.num_beams > 1:
        beams: dict[str, Any] = {
            "num_beams": config.num_beams,
            "length_penalty": config.length_penalty,
            "early_stopping": config.early_stopping,
            "num_return_sequences": config.num_return_sequences,
            "do_sample": config.do_sample,
            "logprobs": config.logprobs,
            "top_logprobs": config.top_logprobs,
        }
        if config.stop_strings:
            beams["stop_strings"] = list(config.stop_strings)
        return "beam_search", beams
    if config.do_sample and config.mirostat == 2:
        return "mirostat_v2", {"tau": config.mirostat_tau, "eta": config.mirostat_eta}
    return ("multinomial" if config.do_sample else "greedy"), {}


def stopping_specs(config: GenerationConfig, max_length: int) -> list[Spec]:
    """The stopping criteria in the order a row's finish reason is taken: an end token
    that is the last one allowed is ``eos`` (the model ended its answer, as vLLM and
    OpenAI report it), not ``length``."""
    specs: list[Spec] = []
    if config.eos_token_ids:
        specs.append(("eos", {"eos_token_id": list(config.eos_token_ids)}))
    specs.append(("max_length", {"max_length": max_length}))
    if config.max_time is not None:
        specs.append(("max_time", {"max_time": config.max_time}))
    specs.extend(_explicit(config.stopping_criteria))
    return specs


def cache_spec(config: GenerationConfig, ctx: GenerationContext) -> Spec:
    """The configured cache, or the graph's own default: ``static`` on shared-buffer (fused)
    graphs, which it makes fast (one preallocated buffer bound as past and present), and
    ``dynamic`` on Concat-style (optimum) graphs, whose presents are new tensors anyway."""
    if config.cache:
        return _explicit((config.cache,))[0]
    shared = ctx.signature is None or ctx.signature.shared_kv
    return ("static" if shared else "dynamic"), {}


#: processors named unlike the setting that turns them on
_PROCESSOR_FIELDS = {"dry": "dry_multiplier", "xtc": "xtc_probability"}


def _processor_field(spec: Spec, config: GenerationConfig, explicit: bool) -> str | None:
    """The setting that put a processor in the chain, for an error about it."""
    name = spec[0]
    if explicit:
        return "logits_processors"
    if name == "grammar":
        found = structured_constraint(config)
        return found[0] if found else None
    name = _PROCESSOR_FIELDS.get(name, name)
    return name if hasattr(config, name) else None


def _explicit(components: tuple[Mapping[str, Any], ...]) -> list[Spec]:
    return [(spec["name"], {k: v for k, v in spec.items() if k != "name"}) for spec in components]


def build_chain(
    registry: Registry,
    ctx: GenerationContext,
    *,
    cache: tuple[str, KVCache | None] | None = None,
) -> Chain:
    """Create every component of one request (factories run once, here).

    ``cache`` (name, backend) carries a cache over from an earlier turn of the same
    conversation instead of creating a new one; ("none", None) builds a row's chain for
    an open batch, whose rows share the batch's cache.
    """
    config = ctx.config

    def create(kind: str, spec: Spec, field: str | None) -> tuple[str, Any]:
        """The component, or a ConfigError about the setting that asked for it."""
        name, params = spec
        try:
            return name, registry.create(kind, name, params, ctx)
        except ConfigError as exc:
            if exc.field is not None:
                raise
            raise ConfigError(str(exc), problems=[(field, str(exc))]) from exc.__cause__

    processors = processor_specs(config, ctx)
    given = _explicit(config.logits_processors)
    cache_name, cache_backend = cache or create("kv_cache", cache_spec(config, ctx), "cache")
    drafter = drafter_spec(config)
    drafter_field = "drafter" if config.drafter is not None else "prompt_lookup_num_tokens"
    return Chain(
        drafter=create("drafter", drafter, drafter_field) if drafter is not None else None,
        processors=[
            create("logits_processor", s, _processor_field(s, config, s in given))
            for s in processors
        ],
        sampler=create("sampler", sampler_spec(config), "sampler" if config.sampler else None),
        stopping=[
            create(
                "stopping_criterion", s, "stopping_criteria" if config.stopping_criteria else None
            )
            for s in stopping_specs(config, ctx.max_length)
        ],
        cache=cache_backend,
        cache_name=cache_name,
        stop_strings=tuple(config.stop_strings or ()),
        output_json=config.json_schema is not None or config.json_object,
        record={  # with beams the search strategy keeps the chosen tokens' logprobs
            "logprobs": config.logprobs and config.num_beams == 1,
            "top_logprobs": config.top_logprobs if config.num_beams == 1 else 0,
            "scores": config.output_scores,
            "logits": config.output_logits,
            "prompt_logprobs": config.prompt_logprobs,
        },
    )


class ProcessorChain:
    """The logits processors the loop would build for some settings, as one callable.

    ``chain(input_ids (B, T) int64, scores (B, V) float32) -> (B, V) float32``. The
    components are created on the first call, from its shapes (batch, prompt length =
    T, vocabulary = V), the way transformers' ``_get_logits_processor`` builds its list
    once per ``generate``; later calls (longer ``input_ids``) reuse them, so stateful
    components keep their state.
    """

    def __init__(self, config: GenerationConfig, registry: Registry, tokenizer: Any = None) -> None:
        self.config = config
        self._registry = registry
        self._tokenizer = tokenizer
        self.processors: list[tuple[str, LogitsProcessor]] | None = None
        self._scored: list[scoring.Scored] = []

    @property
    def names(self) -> list[str]:
        """Registered names of the components, in the order they run (after a call)."""
        return [name for name, _ in self.processors or []]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np

        input_ids = np.asarray(input_ids, dtype=np.int64)
        scores = np.asarray(scores, dtype=np.float32)
        if self.processors is None:
            self.processors = self._build(input_ids, scores)
            self._scored = scoring.resolve(self.processors)
        return scoring.dense(scoring.process(self._scored, input_ids, scores))

    def _build(self, input_ids: Any, scores: Any) -> list[tuple[str, LogitsProcessor]]:
        batch, prompt_length = input_ids.shape
        c = self.config
        new = c.max_new_tokens if c.max_new_tokens is not None else 0
        ctx = GenerationContext(
            config=c,
            batch_size=batch,
            prompt_length=prompt_length,
            vocab_size=scores.shape[1],
            eos_token_ids=c.eos_token_ids,
            pad_token_id=c.padding_id,
            max_length=c.max_length or prompt_length + new,
            seed=c.seed,
            tokenizer=self._tokenizer,
        )
        specs = processor_specs(c, ctx)
        return [
            (name, self._registry.create("logits_processor", name, p, ctx)) for name, p in specs
        ]


def logits_processors(
    *, plugins: Any = (), tokenizer: Any = None, **settings: Any
) -> ProcessorChain:
    """The logits-processor chain the loop builds for ``settings`` (library defaults <
    ``settings``; no model files), callable on numpy arrays, so users and tests can
    compare it with transformers' ``_get_logits_processor`` directly. ``plugins`` adds
    plugin objects as ``load(plugins=...)`` does."""
    from ..config import resolve
    from .manager import build_registry, make_plugin_manager

    config = resolve([("call", settings)]).config
    registry = build_registry(make_plugin_manager(extra=plugins))
    return ProcessorChain(config, registry, tokenizer=tokenizer)
