"""A request's components as the loop calls them: one ``Chain`` per settings group.

Plain callables with the names they were registered under; which ones a config asks
for, and building them through the plugin registry, is ``ortgen.plugin_host.chains``: the
loop itself knows no plugin host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocols import (
    AdaptsDrafts,
    ChecksDrafts,
    DeclaresScoreUse,
    Drafter,
    FollowsTokens,
    ForcesTokens,
    KVCache,
    LogitsProcessor,
    NamesFinishReason,
    PreparesAhead,
    Sampler,
    SearchStrategy,
    StoppingCriterion,
    WorksOnCandidates,
)
from . import scoring

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
    #: followers with ``prepare()`` (``PreparesAhead``): work for the next step, started
    #: beside its forward
    preparers: list[tuple[str, PreparesAhead]] = field(default_factory=list)
    #: the sampler, when it is a search strategy (beam search: it moves rows)
    search: SearchStrategy | None = None
    #: proposes the next tokens of a row; one forward verifies them (speculative decoding)
    drafter: tuple[str, Drafter] | None = None
    #: the drafter, when it is told what was kept (``AdaptsDrafts``)
    draft_feedback: AdaptsDrafts | None = None
    #: the processors as the scoring path calls them (their ``sparse`` found once)
    scored: list[scoring.Scored] = field(default_factory=list)
    #: the sampler, when it picks among candidates (``WorksOnCandidates``)
    sparse_sampler: WorksOnCandidates | None = None
    #: (name, criterion, the finish reason of the rows it ends) per stopping criterion
    criteria: list[tuple[str, StoppingCriterion, str]] = field(default_factory=list)
    #: whether a stopping criterion reads scores (none says ``uses_scores = False``)
    stop_reads_scores: bool = True

    def __post_init__(self) -> None:
        """Every optional capability of the components, found once (``isinstance``): the
        loop reads these fields, never a component's members by name."""
        components = [*self.processors, self.sampler, *self.stopping]
        self.followers = [(n, c) for n, c in components if isinstance(c, FollowsTokens)]
        self.forcers = [(n, c) for n, c in self.followers if isinstance(c, ForcesTokens)]
        self.draft_checkers = [(n, c) for n, c in self.followers if isinstance(c, ChecksDrafts)]
        self.preparers = [(n, c) for n, c in self.followers if isinstance(c, PreparesAhead)]
        sampler = self.sampler[1]
        self.search = sampler if isinstance(sampler, SearchStrategy) else None
        self.sparse_sampler = scoring.works_on_candidates(sampler)
        self.scored = scoring.resolve(self.processors)
        self.criteria = [(n, c, _finish_reason(n, c)) for n, c in self.stopping]
        self.stop_reads_scores = any(
            not isinstance(c, DeclaresScoreUse) or c.uses_scores for _, c in self.stopping
        )
        drafter = self.drafter[1] if self.drafter is not None else None
        self.draft_feedback = drafter if isinstance(drafter, AdaptsDrafts) else None


def _finish_reason(name: str, criterion: StoppingCriterion) -> str:
    """What the rows ``criterion`` ends report: its ``finish_reason``, else its name."""
    return criterion.finish_reason if isinstance(criterion, NamesFinishReason) else name
