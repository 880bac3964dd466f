"""A request's components as the loop calls them: one ``Chain`` per settings group.

Plain callables with the names they were registered under; which ones a config asks
for, and building them through the plugin registry, is ``ortgen.chain_specs``: the
loop itself knows no plugin host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocols import (
    ChecksDrafts,
    Drafter,
    FollowsTokens,
    ForcesTokens,
    KVCache,
    LogitsProcessor,
    Sampler,
    SearchStrategy,
    StoppingCriterion,
)

Spec = tuple[str, dict[str, Any]]


@dataclass
class Chain:
    """The plain callables the loop calls, each with the name it was registered under."""

    processors: list[tuple[str, LogitsProcessor]]
    sampler: tuple[str, Sampler]
    stopping: list[tuple[str, StoppingCriterion]]
    #: the KV cache; None for a row of an open batch, which uses the batch's cache
    cache: KVCache | None
    cache_name: str = "dynamic"
    #: per-row text rule: a row stops once its text contains one of these (needs a tokenizer)
    stop_strings: tuple[str, ...] = ()
    #: what to keep besides tokens: {"logprobs", "top_logprobs", "scores", "logits"}
    record: dict[str, Any] = field(default_factory=dict)
    #: the output is JSON (a ``json_schema`` or ``json_object`` constraint): parse it
    output_json: bool = False
    #: the components that follow each row's tokens (``FollowsTokens``), and those of
    #: them that may know a row's next tokens (``ForcesTokens``); found once, here
    followers: list[tuple[str, FollowsTokens]] = field(default_factory=list)
    forcers: list[tuple[str, ForcesTokens]] = field(default_factory=list)
    #: followers that say which drafted tokens they allow (``ChecksDrafts``)
    draft_checkers: list[tuple[str, ChecksDrafts]] = field(default_factory=list)
    #: followers with ``prepare()``: work for the next step, started beside its forward
    preparers: list[tuple[str, Any]] = field(default_factory=list)
    #: the sampler, when it is a search strategy (beam search: it moves rows)
    search: SearchStrategy | None = None
    #: proposes the next tokens of a row; one forward verifies them (speculative decoding)
    drafter: tuple[str, Drafter] | None = None

    def __post_init__(self) -> None:
        components = [*self.processors, self.sampler, *self.stopping]
        self.followers = [(n, c) for n, c in components if isinstance(c, FollowsTokens)]
        self.forcers = [(n, c) for n, c in self.followers if isinstance(c, ForcesTokens)]
        self.draft_checkers = [(n, c) for n, c in self.followers if isinstance(c, ChecksDrafts)]
        sampler = self.sampler[1]
        self.search = sampler if isinstance(sampler, SearchStrategy) else None
        self.preparers = [
            (n, c) for n, c in self.followers if callable(getattr(c, "prepare", None))
        ]
