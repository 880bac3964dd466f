"""A request's step object: its rows grouped into chains over one KV cache."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..loop.chain import Chain
from ..loop.generate import Generation
from ..plugin_host.chains import build_chain, cache_spec
from .rows import group_rows, settings_key

if TYPE_CHECKING:
    from ..api import TextGenerator
    from ..config import GenerationConfig


def start_generation(
    gen: TextGenerator,
    rows: list[list[int]],
    configs: list[GenerationConfig],
    seeds: list[int | None] | None = None,
) -> Generation:
    """The step object for ``rows``: one chain per distinct settings group (one for the
    whole batch without per-row settings); the first group's chain holds the cache and
    the others share it. ``seeds`` (per-row settings only): each row's own seed, so its
    sampler keeps one random stream per row."""
    copies = max(configs[0].num_beams, configs[0].num_return_sequences)
    if copies > 1:
        rows = [row for row in rows for _ in range(copies)]
        configs = [c for c in configs for _ in range(copies)]
        seeds = [s for s in seeds for _ in range(copies)] if seeds else None
    prompt_length = max(len(r) for r in rows)
    groups = group_rows(configs)
    chains: dict[str, Any] = {}
    cache = None
    if len(groups) > 1:  # one cache for the whole batch, whichever group comes first
        whole = gen.context(rows, configs[0])
        name, params = cache_spec(configs[0], whole)
        cache = (name, gen.registry.create("kv_cache", name, params, whole))
    max_length = 0
    for key, members in groups.items():
        config = configs[members[0]]
        row_seeds = tuple(seeds[r] for r in members) if seeds is not None else ()
        ctx = gen.context(
            [rows[r] for r in members], config, prompt_length=prompt_length, row_seeds=row_seeds
        )
        chains[key] = build_chain(gen.registry, ctx, cache=cache)
        cache = cache or (chains[key].cache_name, chains[key].cache)
        max_length = max(max_length, ctx.max_length)
    row_chains = [chains[settings_key(c)] for c in configs] if len(chains) > 1 else None
    first = next(iter(chains.values()))
    return Generation(
        gen.model,
        first,
        rows,
        max_length=max_length,
        pad_token_id=configs[0].padding_id,
        tokenizer=gen.tokenizer,
        row_chains=row_chains,
    )


def start_row(
    gen: TextGenerator, prompt: list[int], config: GenerationConfig, chain: Chain
) -> Generation:
    """One row's step object from the components a check built already (the server
    checks a row's components before queuing it, then runs it with those very ones):
    only the KV cache is made here."""
    ctx = gen.context([prompt], config)
    name, params = cache_spec(config, ctx)
    cache = gen.registry.create("kv_cache", name, params, ctx)
    return Generation(
        gen.model,
        dataclasses.replace(chain, cache=cache, cache_name=name),
        [prompt],
        max_length=ctx.max_length,
        pad_token_id=config.padding_id,
        tokenizer=gen.tokenizer,
    )
