"""The user-facing object: a loaded model folder that generates text.

``load()`` reads the folder once (graph, tokenizer, model config layers, plugins);
every ``generate``/``stream``/``chat`` call resolves its config, builds a fresh
component chain and drives a ``Generation`` step object.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pluggy

from . import config as config_mod
from .config.pipeline import Pipeline, load_pipeline
from .errors import ComponentError, ConfigError, InputError
from .loop.embedding import check_embedder, embed_rows
from .loop.generate import Generation
from .model.locate import model_folder
from .model.session import ExportedModel
from .plugin_host.chains import build_chain
from .plugin_host.manager import build_registry, make_plugin_manager
from .plugin_host.registry import Registry
from .protocols import GenerationContext, LiftsContext
from .request import build_chat, row_settings, start_generation
from .request import max_length as context_max_length
from .request.outputs import GenerationOutput, PromptScore, StreamPiece, output_of, with_reply
from .request.prompts import Prompt, PromptEncoder, Prompts
from .text import Tokenizer, load_tokenizer

#: A pipeline layer: a pipeline file's path, a mapping of settings, or None.
PipelineArg = str | Path | Mapping[str, Any] | None


class TextGenerator:
    """A model folder ready to generate: graph session, tokenizer, config layers, plugins."""

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int | None = None,
        spinning: bool = False,
        spin_us: int | None = None,
        memory_arena: bool = True,
        plugins: Iterable[object] = (),
        disable_plugins: Iterable[str] = (),
        pipeline: Pipeline | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
        model: ExportedModel | None = None,
    ) -> None:
        """``model``: a stand-in for the folder's graph (``ortgen.testing.FakeModel``, so
        a cache can be tested without the export stack); the folder still gives the
        tokenizer and the model layers of the config, if it has them."""
        self.path = Path(path)
        self.pipeline = pipeline  # its settings are the pipeline layer of every call
        # the tokenizer first: parsing tokenizer.json briefly needs memory that is freed
        # again, and before the session loads that peak stays below the final RSS
        self.tokenizer: Tokenizer | None = load_tokenizer(self.path)
        self.model = model or ExportedModel(
            self.path,
            threads=threads,
            spinning=spinning,
            spin_us=spin_us,
            memory_arena=memory_arena,
        )
        #: ``load()`` passes the manager it checked the pipeline with: one per generator
        self.plugin_manager = plugin_manager or make_plugin_manager(
            disable=disable_plugins, extra=plugins
        )
        self.registry = build_registry(self.plugin_manager)
        #: state cache backends keep across requests of this model (see GenerationContext)
        self.model_state: dict[str, Any] = {}
        self._model_layers = config_mod.model_layers(self.path)
        self.prompts = PromptEncoder(
            self._need_tokenizer,
            self.model.signature.vocab_size,
            self.model.max_context,
            lambda messages: build_chat(self, messages, {}).prompt,  # a row's conversation
        )

    # -- config --------------------------------------------------------------------

    def resolve_config(
        self,
        settings: Mapping[str, Any] | None = None,
        *,
        pipeline: PipelineArg = None,
    ) -> config_mod.Resolved:
        """Library defaults < model files < ``pipeline`` < ``settings``, validated.

        ``pipeline`` is a pipeline file's path, a mapping of settings, or None for the
        pipeline given to ``load()`` (if any)."""
        layer = self._pipeline_layer(pipeline)
        layers = [*self._model_layers, ("pipeline", layer), ("call", settings or {})]
        return config_mod.resolve(layers)

    # -- generation ----------------------------------------------------------------

    def start(
        self,
        prompts: Prompts,
        *,
        pipeline: PipelineArg = None,
        **settings: Any,
    ) -> Generation:
        """Encode, check and set up one request; the caller drives ``step()``."""
        rows, _, configs, seeds = self._prepare(prompts, settings, pipeline)
        return self._start(rows, configs, seeds)

    def generate(
        self, prompts: Prompts, *, pipeline: PipelineArg = None, **settings: Any
    ) -> GenerationOutput:
        """Generate for one prompt or a batch (text or token ids).

        A prompt may also be a dict: ``{"prompt": text or ids}`` or ``{"messages": [...]}``
        plus settings for that row alone (they override the call's): every row of a batch
        then gives what that prompt gives alone with the same settings, seeded rows too.
        """
        rows, single, configs, seeds = self._prepare(prompts, settings, pipeline)
        single = single and configs[0].num_return_sequences == 1  # then `text` is a str
        started = time.perf_counter()
        state = self._start(rows, configs, seeds)
        stats: dict[str, float] = {
            "prompt_tokens": float(state.prompt_length),
            "prefill_tokens": float(state.prefill_tokens),  # reused prefixes excluded
        }
        try:
            while not state.is_done:
                state.step()
                if state.steps == 1:
                    stats["prefill_s"] = time.perf_counter() - started
        except ComponentError as exc:
            for row in np.flatnonzero(state.unfinished).tolist():
                state.finish(row, "error")  # keeps what the row produced, text included
            exc.partial = output_of(state, single, stats)
            raise
        stats["total_s"] = time.perf_counter() - started
        if state.chain.drafter is not None:  # drafted, accepted, verify_forwards, rate
            stats.update({k: float(v) for k, v in state.speculation_stats().items()})
        return output_of(state, single, stats)

    def score(
        self,
        prompts: Prompts,
        *,
        top_logprobs: int = 0,
        pipeline: PipelineArg = None,
        **settings: Any,
    ) -> PromptScore | list[PromptScore]:
        """Score prompts (text or token ids, one or a batch of any lengths): each token's
        log-probability under the model given the tokens before it (None for the first),
        their sum, and with ``top_logprobs=N`` each position's N best alternatives. One
        prefill per batch and nothing generated (``prompt_logprobs``, docs/config.md)."""
        fixed = {"prompt_logprobs": top_logprobs, "max_new_tokens": 1, "num_beams": 1}
        fixed["num_return_sequences"] = 1
        clash = sorted(set(settings) & set(fixed))
        if clash:
            raise InputError(f"score() sets {', '.join(clash)} itself; use generate() for it")
        rows, single, configs, seeds = self._prepare(prompts, {**settings, **fixed}, pipeline)
        state = self._start(rows, configs, seeds)
        state.prefill()
        scores = [
            PromptScore.of(row, state.prompt_logprobs(i), top_logprobs)
            for i, row in enumerate(rows)
        ]
        return scores[0] if single else scores

    def embed(
        self, texts: Prompts, *, pooling: str = "last", normalize: bool = True,
        dimensions: int | None = None,
    ) -> np.ndarray:  # fmt: skip
        """Embeddings of ``texts`` (text or token ids, one or a batch): a (N, D) float32
        array from one forward, the last hidden state pooled over each text's tokens
        (``last`` token or ``mean``), cut to ``dimensions`` and L2-normalised. Needs a
        graph built to output it (``ortgen export SOURCE OUT --embeddings``)."""
        check_embedder(self.model, self.path, pooling, dimensions)
        rows, _, own = self.prompts.encode(texts)
        if any(own):
            raise InputError("embed() takes texts or token ids, not rows with settings")
        return embed_rows(self.model, rows, pooling=pooling, normalize=normalize, dims=dimensions)

    def stream(
        self, prompt: Prompt, *, pipeline: PipelineArg = None, **settings: Any
    ) -> Iterator[str]:
        """Yield text pieces as they are generated (one prompt); stop strings held back."""
        self._need_tokenizer("stream()")
        rows, single, configs, seeds = self._prepare(prompt, settings, pipeline)
        if not single or configs[0].num_return_sequences != 1:
            raise InputError("stream() takes one prompt and num_return_sequences=1; use generate()")
        return self.stream_state(self._start(rows, configs, seeds))

    def stream_state(self, state: Generation) -> Iterator[str]:
        """Drive a one-row ``state`` to its end, yielding its text as it becomes safe to show.

        A search (beam search) knows its text only once it has chosen: the best sequence's
        text comes as one piece at the end (transformers refuses a streamer with beams)."""
        self._need_tokenizer("stream()")
        if state.is_search:
            while not state.is_done:
                state.step()
            texts = output_of(state, False, {}).text  # a list: single=False
            if isinstance(texts, list) and texts[0]:
                yield texts[0]
            return
        while not state.is_done:
            state.step()
            piece = state.new_text(0)
            if piece:
                yield piece
        piece = state.new_text(0)
        if piece:
            yield piece

    def stream_pieces(
        self, prompt: Prompt, *, pipeline: PipelineArg = None, **settings: Any
    ) -> Iterator[StreamPiece]:
        """Like ``stream()``, one :class:`StreamPiece` per token: the token, the text
        that became safe to show (may be empty), the token's logprob and alternatives
        (with ``logprobs``/``top_logprobs``) and, on the last piece, the finish reason —
        what an OpenAI-style streaming response carries."""
        self._need_tokenizer("stream_pieces()")
        rows, single, configs, seeds = self._prepare(prompt, settings, pipeline)
        if not single or configs[0].num_return_sequences != 1 or configs[0].num_beams != 1:
            raise InputError("stream_pieces() takes one prompt, one sequence and no beams")
        state = self._start(rows, configs, seeds)
        while not state.is_done:
            report = state.step()  # a speculative step may keep several tokens
            yield from StreamPiece.since(state, 0, int(report.starts[0]))

    def next_turn(self, state: Generation | None, prompt: list[int], **settings: Any) -> Generation:
        """A one-row request for ``prompt`` that reuses ``state``'s KV cache when it can.

        When the tokens already in ``state`` are a prefix of ``prompt`` (a conversation
        that went on), only the rest is fed; otherwise the prompt starts afresh.
        """
        config = self.resolve_config(settings).config
        if config.num_return_sequences != 1:
            raise InputError("a conversation continues one row; num_return_sequences must be 1")
        self.prompts.check_ids(prompt, 0)
        held = state.sequences[0].tolist() if state is not None and state.batch_size == 1 else []
        if not held or len(prompt) <= len(held) or prompt[: len(held)] != held:
            return self._start([prompt], [config])
        assert state is not None
        ctx = self.context([prompt], config)
        cache = (state.chain.cache_name, state.chain.cache)  # the conversation's keys/values
        state.reserve(ctx.max_length)
        state.append([prompt[len(held) :]], chain=build_chain(self.registry, ctx, cache=cache))
        return state

    def chat_session(
        self,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **settings: Any,
    ):
        """A conversation that keeps its KV cache between turns (see ``ChatSession``)."""
        from .request.sessions import ChatSession

        return ChatSession(self, messages, tools=tools, **settings)

    def chat_batch(
        self,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **settings: Any,
    ):
        """Several conversations answered together, each keeping its KV cache between
        turns (see ``ChatBatch``)."""
        from .request.sessions import ChatBatch

        return ChatBatch(self, conversations, tools=tools, **settings)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Any = None,
        parallel_tool_calls: bool | None = None,
        response_format: Any = None,
        template_kwargs: Mapping[str, Any] | None = None,
        reasoning_effort: str | None = None,
        pipeline: PipelineArg = None,
        **settings: Any,
    ) -> GenerationOutput:
        """Answer a conversation using the model's chat template.

        ``tools`` (OpenAI's function tools), ``tool_choice`` (``"none"``, ``"auto"``,
        ``"required"`` or a named function) and ``parallel_tool_calls`` make the answer
        text or tool calls, constrained to the tools' schemas (``out.tool_calls``,
        finish reason ``"tool_calls"``; see ``ortgen.structured.tool_calls``). ``response_format``
        is OpenAI's (``json_object``, ``json_schema``, or a Pydantic model class): the
        answer follows it and ``out.parsed`` holds it. ``template_kwargs``
        (``continue_final_message``, ``enable_thinking``, ``documents``, ...) reach the
        template as transformers' ``apply_chat_template`` passes them.

        The model family's chat format (``chat_format=`` names one; else the template's,
        docs/chat-formats.md) says how calls are written and read. A model that thinks
        (``<think>``) gets its thought in ``out.reasoning_content`` and the answer in
        ``out.text``; ``thinking_budget=N`` closes the thought after N tokens,
        ``reasoning_effort`` reaches a template that reads it (``"none"`` turns Qwen3's
        ``enable_thinking`` off), and a constraint applies to the answer only."""
        layer = self._pipeline_layer(pipeline)
        request = build_chat(
            self,
            messages,
            settings,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            response_format=response_format,
            template_kwargs=template_kwargs,
            reasoning_effort=reasoning_effort,
            chat_format=settings.get("chat_format") or layer.get("chat_format"),
        )
        out = self.generate(request.prompt, pipeline=pipeline, **request.settings)
        if request.plan is not None:
            with_reply(out, request.plan)
        return out

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids of the chat prompt for ``messages``, with the generation prompt
        (unless ``continue_final_message=True``)."""
        tokenizer = self._need_tokenizer("chat()")
        if tools is not None:
            template_kwargs["tools"] = tools
        return tokenizer.encode_chat(messages, **template_kwargs)  # it checks their shape

    # -- internals -----------------------------------------------------------------

    def _pipeline_layer(self, pipeline: PipelineArg) -> Mapping[str, Any]:
        if pipeline is None:
            return self.pipeline.settings if self.pipeline is not None else {}
        if isinstance(pipeline, str | Path):
            return load_pipeline(pipeline, registry=self.registry).settings
        return pipeline

    def _need_tokenizer(self, what: str) -> Tokenizer:
        if self.tokenizer is None:
            raise InputError(
                f"{what} needs a tokenizer, and {self.path} has none; pass token ids to generate()"
            )
        return self.tokenizer

    def _prepare(
        self, prompts: Prompts, settings: Mapping[str, Any], pipeline: PipelineArg
    ) -> tuple[list[list[int]], bool, list[config_mod.GenerationConfig], list[int | None] | None]:
        """Token rows, whether one prompt was given, each row's resolved config, and (with
        per-row settings) each row's own seed."""
        pipeline = self._pipeline_layer(pipeline)  # a file is read once, not per row
        base = self.resolve_config(settings, pipeline=pipeline).config
        rows, single, owns = self.prompts.encode(prompts)
        configs = []
        for i, own in enumerate(owns):
            if not own:
                configs.append(base)
                continue
            try:
                config = self.resolve_config(row_settings(settings, own), pipeline=pipeline).config
            except ConfigError as exc:
                raise ConfigError(f"prompt {i}: {exc}", problems=exc.problems) from None
            configs.append(config)
        seeds = [own.get("seed") for own in owns] if any(owns) else None
        return rows, single, configs, seeds

    def _start(
        self,
        rows: list[list[int]],
        configs: list[config_mod.GenerationConfig],
        seeds: list[int | None] | None = None,
    ) -> Generation:
        """The step object for ``rows`` (``ortgen.request.start``)."""
        return start_generation(self, rows, configs, seeds)

    def context(
        self,
        rows: list[list[int]],
        config: config_mod.GenerationConfig,
        *,
        prompt_length: int | None = None,
        row_seeds: tuple[int | None, ...] = (),
    ) -> GenerationContext:
        """What a request's components are told (``GenerationContext``) for token ``rows``
        under a resolved ``config``: the facts of this model and request. The server
        builds each row's components from it with ``ortgen.plugin_host.chains.build_chain``."""
        prompt_length = prompt_length or max(len(r) for r in rows)
        _check_padding_id(config, self.model.signature.vocab_size)
        return GenerationContext(
            config=config,
            batch_size=len(rows),
            prompt_length=prompt_length,
            vocab_size=self.model.signature.vocab_size,
            eos_token_ids=config.eos_token_ids,
            pad_token_id=config.padding_id,
            max_length=self.max_length(config, prompt_length),
            signature=self.model.signature,
            seed=config.seed,
            tokenizer=self.tokenizer,
            row_seeds=row_seeds,
            model_config=self.model.config,
            model_state=self.model_state,
        )

    def max_length(self, config: config_mod.GenerationConfig, prompt_length: int) -> int:
        """The one context-length rule, for the library and the server alike: a request
        may ask for more tokens than the model's context holds, and then ends at the
        context with finish reason "length" (clipped, as llama.cpp does; nothing already
        generated is lost); see ``ortgen.request.context``. A cache that keeps positions
        within a window lifts the limit."""
        lifted = self._cache_lifts_context(config)
        return context_max_length(config, prompt_length, self.model.max_context, lifted=lifted)

    def _cache_lifts_context(self, config: config_mod.GenerationConfig) -> bool:
        """True when the configured cache keeps positions within a window (its factory's
        ``lifts_context(signature)`` says so), so the model's trained context does not
        bound the length."""
        if not config.cache:
            return False
        entry = self.registry.get("kv_cache", config.cache["name"])
        factory: object = entry.factory  # object: isinstance narrows it, so mypy checks the call
        return isinstance(factory, LiftsContext) and factory.lifts_context(self.model.signature)


def load(
    path: str | Path | None = None,
    *,
    pipeline: str | Path | Pipeline | None = None,
    threads: int | None = None,
    spinning: bool = False,
    spin_us: int | None = None,
    memory_arena: bool = True,
    plugins: Iterable[object] = (),
    disable_plugins: Iterable[str] = (),
) -> TextGenerator:
    """Load a model folder or a GGUF file (built into a cached folder on first use, see
    :mod:`ortgen.gguf`); without a path, the pipeline's ``model`` or else the default model
    (built on first use). ``pipeline`` (a pipeline file or a loaded
    :class:`~ortgen.config.pipeline.Pipeline`) becomes the pipeline layer of every call, and its
    ``[plugins] disable`` list is honoured. ``threads`` is onnxruntime's intra-op threads
    (default: the usable cores); between two parallel ops its idle workers spin ``spin_us``
    microseconds before they sleep (None: ``ortgen.model.session.DEFAULT_SPIN_US``, 10; 0: never
    spin), or, with ``spinning=True``, as long as onnxruntime's own policy says (fastest on an
    idle machine, half speed on a busy one). ``memory_arena=False``: onnxruntime's CPU arena
    off, every tensor from the C heap (:mod:`ortgen.model.memory`)."""
    plugins = list(plugins)
    managers: list[pluggy.PluginManager] = []

    def registry_for(disabled_by_file: tuple[str, ...]) -> Registry:
        manager = make_plugin_manager(disable=[*disable_plugins, *disabled_by_file], extra=plugins)
        managers.append(manager)
        return build_registry(manager)

    if isinstance(pipeline, str | Path):  # its components checked against this generator's
        pipeline = load_pipeline(pipeline, registry=registry_for)
    if path is None and pipeline is not None:
        path = pipeline.model_path()
    if path is None:
        from .gguf.default_model import ensure_default_model

        path = ensure_default_model()
    else:
        path = model_folder(path)
    disabled = [*disable_plugins, *(pipeline.disable_plugins if pipeline else ())]
    return TextGenerator(
        path,
        threads=threads,
        spinning=spinning,
        spin_us=spin_us,
        memory_arena=memory_arena,
        plugins=plugins,
        disable_plugins=disabled,
        pipeline=pipeline,
        plugin_manager=managers[0] if managers else None,
    )


def _check_padding_id(config: config_mod.GenerationConfig, vocab: int | None) -> None:
    """The padding id is fed to the model (padded and finished rows), so one the
    embedding has no row for fails inside onnxruntime's Gather; say which setting."""
    pad = config.padding_id
    if vocab and pad >= vocab:
        setting = "pad_token_id" if config.pad_token_id is not None else "eos_token_id"
        message = (
            f"{setting}={pad} is outside the vocabulary [0, {vocab}): padded and finished "
            "rows feed the padding id to the model"
        )
        raise ConfigError(message, problems=[(setting, message)])
