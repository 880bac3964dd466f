"""The user-facing object: a loaded model folder that generates text.

``load()`` reads the folder once (graph, tokenizer, model config layers, plugins);
every ``generate``/``stream``/``chat`` call resolves its config, builds a fresh
component chain and drives a ``Generation`` step object.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import config as config_mod
from .chain import build_chain
from .errors import ComponentError, InputError, ModelLoadError
from .generate import Generation
from .model import ExportedModel
from .paths import default_model_dir
from .plugin_manager import build_registry, make_plugin_manager
from .protocols import GenerationContext
from .text import Tokenizer, load_tokenizer

Prompt = str | Sequence[int] | np.ndarray
Prompts = Prompt | Sequence[str] | Sequence[Sequence[int]]


@dataclass
class GenerationOutput:
    """What one ``generate`` call produced.

    ``text`` is a str for one prompt and a list for a batch (prompt excluded, stop
    strings trimmed; None without a tokenizer). ``tokens`` holds the generated ids
    per row (no prompt, no padding; the EOS that ended a row is included, as in
    Hugging Face). ``sequences`` is Hugging Face's (B, T) array: left-padded
    prompts plus generated tokens, padded after a row finished.
    """

    text: str | list[str] | None
    tokens: list[list[int]]
    sequences: np.ndarray
    finish_reasons: list[str]
    stats: dict[str, float] = field(default_factory=dict)
    #: per row, the log-probability of each generated token (``logprobs=True``)
    logprobs: list[list[float]] | None = None
    #: per row and token, the best (token, logprob) pairs (``top_logprobs=N``)
    top_logprobs: list[list[list[tuple[int, float]]]] | None = None
    #: one (B, V) array per step: processed scores / raw logits (``output_scores`` /
    #: ``output_logits``), as transformers' ``scores`` / ``logits``
    scores: list[np.ndarray] | None = None
    logits: list[np.ndarray] | None = None


class TextGenerator:
    """A model folder ready to generate: graph session, tokenizer, config layers, plugins."""

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int | None = None,
        spinning: bool = False,
        plugins: Iterable[object] = (),
        disable_plugins: Iterable[str] = (),
    ) -> None:
        self.path = Path(path)
        # the tokenizer first: parsing tokenizer.json briefly needs memory that is freed
        # again, and before the session loads that peak stays below the final RSS
        self.tokenizer: Tokenizer | None = load_tokenizer(self.path)
        self.model = ExportedModel(self.path, threads=threads, spinning=spinning)
        self.plugin_manager = make_plugin_manager(disable=disable_plugins, extra=plugins)
        self.registry = build_registry(self.plugin_manager)
        self._model_layers = config_mod.model_layers(self.path)

    # -- config --------------------------------------------------------------------

    def resolve_config(
        self,
        settings: Mapping[str, Any] | None = None,
        *,
        pipeline: Mapping[str, Any] | None = None,
    ) -> config_mod.Resolved:
        """Library defaults < model files < ``pipeline`` < ``settings``, validated."""
        layers = [*self._model_layers, ("pipeline", pipeline or {}), ("call", settings or {})]
        return config_mod.resolve(layers)

    # -- generation ----------------------------------------------------------------

    def start(
        self,
        prompts: Prompts,
        *,
        pipeline: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> Generation:
        """Encode, check and set up one request; the caller drives ``step()``."""
        resolved = self.resolve_config(settings, pipeline=pipeline)
        rows, _ = self._encode(prompts)
        return self._start(rows, resolved.config)

    def generate(
        self, prompts: Prompts, *, pipeline: Mapping[str, Any] | None = None, **settings: Any
    ) -> GenerationOutput:
        """Generate for one prompt or a batch (text or token ids)."""
        config = self.resolve_config(settings, pipeline=pipeline).config
        rows, single = self._encode(prompts)
        single = single and config.num_return_sequences == 1  # then `text` is a str
        started = time.perf_counter()
        state = self._start(rows, config)
        stats: dict[str, float] = {"prompt_tokens": float(state.prompt_length)}
        try:
            while not state.is_done:
                state.step()
                if state.steps == 1:
                    stats["prefill_s"] = time.perf_counter() - started
        except ComponentError as exc:
            for row in np.flatnonzero(state.unfinished).tolist():
                state.finish(row, "error")  # keeps what the row produced, text included
            exc.partial = self._output(state, single, stats)  # type: ignore[attr-defined]
            raise
        stats["total_s"] = time.perf_counter() - started
        return self._output(state, single, stats)

    def stream(
        self, prompt: Prompt, *, pipeline: Mapping[str, Any] | None = None, **settings: Any
    ) -> Iterator[str]:
        """Yield text pieces as they are generated (one prompt); stop strings held back."""
        self._need_tokenizer("stream()")
        config = self.resolve_config(settings, pipeline=pipeline).config
        rows, single = self._encode(prompt)
        if not single or config.num_return_sequences != 1:
            raise InputError("stream() takes one prompt and num_return_sequences=1; use generate()")
        return self.stream_state(self._start(rows, config))

    def stream_state(self, state: Generation) -> Iterator[str]:
        """Drive a one-row ``state`` to its end, yielding its text as it becomes safe to show."""
        self._need_tokenizer("stream()")
        while not state.is_done:
            state.step()
            piece = state.new_text(0)
            if piece:
                yield piece
        piece = state.new_text(0)
        if piece:
            yield piece

    def next_turn(
        self, state: Generation | None, prompt: list[int], **settings: Any
    ) -> Generation:
        """A one-row request for ``prompt`` that reuses ``state``'s KV cache when it can.

        When the tokens already in ``state`` are a prefix of ``prompt`` (a conversation
        that went on), only the rest is fed; otherwise the prompt starts afresh.
        """
        config = self.resolve_config(settings).config
        if config.num_return_sequences != 1:
            raise InputError("a conversation continues one row; num_return_sequences must be 1")
        self._check_ids(prompt, 0)
        held = state.sequences[0].tolist() if state is not None and state.batch_size == 1 else []
        if not held or len(prompt) <= len(held) or prompt[: len(held)] != held:
            return self._start([prompt], config)
        assert state is not None
        ctx = self._context([prompt], config)
        cache = (state.chain.cache_name, state.chain.cache)  # the conversation's keys/values
        state.reserve(ctx.max_length)
        state.append([prompt[len(held) :]], chain=build_chain(self.registry, ctx, cache=cache))
        return state

    def chat_session(self, messages: Sequence[Mapping[str, str]] = (), **settings: Any):
        """A conversation that keeps its KV cache between turns (see ``ChatSession``)."""
        from .chat import ChatSession

        return ChatSession(self, messages, **settings)

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        pipeline: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> GenerationOutput:
        """Answer a conversation using the model's chat template."""
        return self.generate(self.chat_prompt(messages), pipeline=pipeline, **settings)

    def chat_prompt(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        tokenizer = self._need_tokenizer("chat()")
        text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)

    # -- internals -----------------------------------------------------------------

    def _need_tokenizer(self, what: str) -> Tokenizer:
        if self.tokenizer is None:
            raise InputError(
                f"{what} needs a tokenizer, and {self.path} has none; pass token ids to generate()"
            )
        return self.tokenizer

    def _encode(self, prompts: Prompts) -> tuple[list[list[int]], bool]:
        """Token-id rows for the prompts, and whether a single prompt was given."""
        if isinstance(prompts, str):
            return [self._encode_text(prompts, 0)], True
        if isinstance(prompts, np.ndarray):
            if prompts.ndim == 1:
                return [self._check_ids(prompts.tolist(), 0)], True
            if prompts.ndim == 2:
                return [self._check_ids(r, i) for i, r in enumerate(prompts.tolist())], False
            raise InputError(f"token-id prompts must be 1-D or 2-D, got shape {prompts.shape}")
        items = list(prompts)
        if not items:
            raise InputError("no prompt given (an empty list)")
        if all(isinstance(x, int | np.integer) for x in items):
            return [self._check_ids([int(x) for x in items], 0)], True
        rows = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                rows.append(self._encode_text(item, i))
            elif isinstance(item, Sequence | np.ndarray):
                rows.append(self._check_ids([int(x) for x in item], i))
            else:
                raise InputError(f"prompt {i} is a {type(item).__name__}; give text or token ids")
        return rows, False

    def _encode_text(self, text: str, index: int) -> list[int]:
        if not text:
            raise InputError(f"prompt {index} is empty")
        ids = self._need_tokenizer("a text prompt").encode(text)
        return self._check_ids(ids, index)

    def _check_ids(self, ids: list[int], index: int) -> list[int]:
        if not ids:
            raise InputError(f"prompt {index} is empty (no tokens)")
        vocab = self.model.signature.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InputError(f"prompt {index} has token ids outside [0, {vocab}): {bad[:5]}")
        context = self.model.max_context
        if context is not None and len(ids) >= context:
            raise InputError(
                f"prompt {index} has {len(ids)} tokens; the model's context is {context} tokens, "
                "which leaves no room to generate. Shorten the prompt."
            )
        return ids

    def _start(self, rows: list[list[int]], config: config_mod.GenerationConfig) -> Generation:
        if config.num_return_sequences > 1:
            rows = [row for row in rows for _ in range(config.num_return_sequences)]
        ctx = self._context(rows, config)
        chain = build_chain(self.registry, ctx)
        return Generation(
            self.model,
            chain,
            rows,
            max_length=ctx.max_length,
            pad_token_id=ctx.pad_token_id,
            tokenizer=self.tokenizer,
        )

    def _context(
        self, rows: list[list[int]], config: config_mod.GenerationConfig
    ) -> GenerationContext:
        prompt_length = max(len(r) for r in rows)
        eos = config.eos_token_ids
        pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
        return GenerationContext(
            config=config,
            batch_size=len(rows),
            prompt_length=prompt_length,
            vocab_size=self.model.signature.vocab_size,
            eos_token_ids=eos,
            pad_token_id=pad,
            max_length=self._max_length(config, prompt_length),
            signature=self.model.signature,
            seed=config.seed,
            tokenizer=self.tokenizer,
        )

    def _max_length(self, config: config_mod.GenerationConfig, prompt_length: int) -> int:
        if config.max_new_tokens is not None:
            max_length = prompt_length + config.max_new_tokens
        else:
            assert config.max_length is not None
            max_length = config.max_length
            if max_length <= prompt_length:
                raise InputError(
                    f"max_length={max_length} leaves no room after the {prompt_length}-token "
                    "prompt; set max_new_tokens instead"
                )
        context = self.model.max_context
        return min(max_length, context) if context else max_length

    def _output(
        self, state: Generation, single: bool, stats: dict[str, float]
    ) -> GenerationOutput:
        tokens = [state.generated(r) for r in range(state.batch_size)]
        texts = None
        if self.tokenizer is not None:
            texts = [state.text(r) for r in range(state.batch_size)]
        reasons = [r or "error" for r in state.finish_reasons]
        steps = state.steps
        if "prefill_s" in stats and steps > 1 and "total_s" in stats:
            stats["decode_ms_per_token"] = (
                1e3 * (stats["total_s"] - stats["prefill_s"]) / (steps - 1)
            )
        text: str | list[str] | None = texts[0] if single and texts is not None else texts
        rows = range(state.batch_size)
        record = state.record
        return GenerationOutput(
            text,
            tokens,
            state.sequences.copy(),
            reasons,
            stats,
            logprobs=[state.logprobs(r) for r in rows] if record.want_logprobs else None,
            top_logprobs=[state.top_logprobs(r) for r in rows] if record.top else None,
            scores=list(record.scores) if record.want_scores else None,
            logits=list(record.logits) if record.want_logits else None,
        )


def load(
    path: str | Path | None = None,
    *,
    threads: int | None = None,
    spinning: bool = False,
    plugins: Iterable[object] = (),
    disable_plugins: Iterable[str] = (),
) -> TextGenerator:
    """Load an exported model folder; without a path, the default model (built on first use)."""
    if path is None:
        path = ensure_default_model()
    return TextGenerator(
        path, threads=threads, spinning=spinning, plugins=plugins, disable_plugins=disable_plugins
    )


def ensure_default_model() -> Path:
    """The default model folder, exported on first use and rebuilt when it is out of date.

    Out of date means its manifest does not match what this ortgen builds (format,
    ortgen version, variant, source, export tools). Without the export extra nothing
    can be rebuilt, so a finished folder is used as it is.
    """
    import importlib.util

    from .export.manifest import is_complete_model_folder

    folder = default_model_dir()
    can_export = importlib.util.find_spec("onnxruntime_genai") is not None
    if is_complete_model_folder(folder) and not can_export:
        return folder
    if not can_export:
        raise ModelLoadError(
            f"the default model is not built yet ({folder}) and building it needs the export "
            "tools: pip install 'ortgen[export]', then run `ortgen export --default`"
        )
    from .export import print_progress
    from .export.default_model import build_default_model

    return build_default_model(folder.parent, progress=print_progress)
