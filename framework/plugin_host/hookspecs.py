"""The plugin contract: pluggy markers and the six registration hooks.

Each hook is called once, when a plugin manager is built, with a ``register``
callback. A plugin declares named factories through it; pluggy is never called
inside the per-token loop. Factories are called once per request with their
parameters as keyword arguments (plus ``ctx``, a :class:`GenerationContext`, when
their signature has a parameter of that name), so per-request state never leaks
between requests.

``register(name, factory, *, replace=False)``: ``name`` is what configs and
pipeline files use; registering a name twice is an error naming both plugins
unless the later one passes ``replace=True``. ``register`` is typed per hook
(``Register[LogitsProcessorFactory]`` and so on), so a type checker refuses a
factory whose component lacks the kind's call contract where it is registered, not
at the first request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import pluggy

from ..protocols import Drafter, KVCache, LogitsProcessor, Sampler, StoppingCriterion
from ..protocols.chat_formats import ChatFormat

PROJECT_NAME = "ortgen"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: what each kind's factory returns: any callable (usually the component's class)
#: called with the user's parameters as keywords (and ``ctx=`` when it asks for it)
LogitsProcessorFactory = Callable[..., LogitsProcessor]
SamplerFactory = Callable[..., Sampler]
StoppingCriterionFactory = Callable[..., StoppingCriterion]
KVCacheFactory = Callable[..., KVCache]
DrafterFactory = Callable[..., Drafter]
ChatFormatFactory = Callable[..., ChatFormat]

Factory = TypeVar("Factory", contravariant=True)


class Register(Protocol[Factory]):
    """The callback each ``register_*`` hook receives: ``register(name, factory, *,
    replace=False)``. Generic in the factory it takes, one kind per hook:
    ``Register[LogitsProcessorFactory]`` takes factories of logits processors only."""

    def __call__(self, name: str, factory: Factory, *, replace: bool = False) -> None: ...


@hookspec
def register_logits_processors(register: Register[LogitsProcessorFactory]) -> None:
    """Register logits-processor factories.

    A processor is called as ``processor(input_ids, scores) -> scores`` with
    ``input_ids`` int64 of shape (B, T) (prompt and tokens so far) and ``scores``
    float32 of shape (B, V) (raw logits in, processed logits out). It may set
    ``-inf`` and must not mutate its inputs.
    """


@hookspec
def register_samplers(register: Register[SamplerFactory]) -> None:
    """Register sampler factories.

    A sampler is called as ``sampler(input_ids, scores) -> next_ids`` and returns
    int64 of shape (B,): one token per row, picked from the processed scores.
    Samplers only pick; reshaping the distribution is the processors' job.
    """


@hookspec
def register_stopping_criteria(register: Register[StoppingCriterionFactory]) -> None:
    """Register stopping-criterion factories.

    A criterion is called as ``criterion(input_ids, scores) -> done`` after the
    new token was appended and returns bool of shape (B,): True where that row is
    finished. Its ``finish_reason`` (:class:`ortgen.NamesFinishReason`, a short string
    such as ``"eos"`` or ``"length"``) is reported for the rows it finished.
    """


@hookspec
def register_kv_caches(register: Register[KVCacheFactory]) -> None:
    """Register KV-cache backend factories (see :class:`ortgen.KVCache`)."""


@hookspec
def register_drafters(register: Register[DrafterFactory]) -> None:
    """Register drafter factories (speculative decoding, see :class:`ortgen.Drafter`): a
    drafter proposes the next tokens of a row, and one forward verifies them."""


@hookspec
def register_chat_formats(register: Register[ChatFormatFactory]) -> None:
    """Register chat formats (see :class:`ortgen.ChatFormat` and docs/chat-formats.md): how
    a model family writes tool calls, the grammar that keeps them whole, and how to read
    them back. A request names one with the ``chat_format`` setting, or gets the first
    whose ``recognizes`` accepts the model's template. Factories take no parameters of
    the request (``ctx`` is not given): a format is built once per model."""
