"""The ``prefix`` KV cache: a later request reuses the keys/values of a shared start.

Reuse must not change a token (fp32 tiny models, both graph families, batches whose
rows reuse different amounts), must really skip the prefill of what it reuses, must
stay within its byte bound, and must never serve another model's keys/values.
"""

from __future__ import annotations

import pytest

import ortgen
from ortgen import ConfigError

BASE = [1, 5, 9, 33, 70, 12, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]


def _gen(graph: str, tiny_model_dirs, fused_model_dirs):
    folder = (tiny_model_dirs if graph == "optimum" else fused_model_dirs)["llama"][1]
    return ortgen.load(folder, threads=1)


def _run(gen, prompts, cache=None, new: int = 10):
    return gen.generate(
        prompts, max_new_tokens=new, do_sample=False, eos_token_id=None, cache=cache
    )


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_second_call_reuses_the_shared_prefix_and_gives_the_same_tokens(
    graph, tiny_model_dirs, fused_model_dirs
) -> None:
    gen = _gen(graph, tiny_model_dirs, fused_model_dirs)
    first_prompt = [*BASE, 60, 61, 62]
    second_prompt = [*BASE, 90, 91, 92, 93]
    first = _run(gen, first_prompt, "prefix")
    assert first.stats["prefill_tokens"] == len(first_prompt)
    second = _run(gen, second_prompt, "prefix")
    assert second.stats["prefill_tokens"] == 4  # only what follows the shared start
    assert second.tokens == _run(gen, second_prompt).tokens
    again = _run(gen, second_prompt, "prefix")  # the whole prompt is held: one token fed
    assert again.stats["prefill_tokens"] == 1
    assert again.tokens == second.tokens


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_generated_tokens_are_reused_by_the_next_turn(
    graph, tiny_model_dirs, fused_model_dirs
) -> None:
    gen = _gen(graph, tiny_model_dirs, fused_model_dirs)
    first = _run(gen, BASE, "prefix")
    follow = [*BASE, *first.tokens[0], 7, 8, 9]
    second = _run(gen, follow, "prefix")
    # the store held the prompt and all generated tokens but the last (never fed)
    assert second.stats["prefill_tokens"] == 4
    assert second.tokens == _run(gen, follow).tokens


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_rows_of_a_batch_find_their_own_prefixes(graph, tiny_model_dirs, fused_model_dirs) -> None:
    gen = _gen(graph, tiny_model_dirs, fused_model_dirs)
    _run(gen, BASE, "prefix")
    _run(gen, [1, 200, 201, 202, 203, 204, 205, 206], "prefix")
    batch = [[*BASE, 60, 61], [1, 200, 201, 202, 99], [1, 7, 7, 7], BASE[:6]]
    out = _run(gen, batch, "prefix")
    assert out.tokens == _run(gen, batch).tokens
    fed = out.stats["prefill_tokens"]
    if graph == "fused":  # each row starts where its own prefix ends
        assert fed == 2 + 1 + 3 + 1
    else:  # one sequence axis: the rows start where the shortest reuse ends
        assert fed < sum(map(len, batch))


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_beam_search_with_prefix_reuse(graph, tiny_model_dirs, fused_model_dirs) -> None:
    gen = _gen(graph, tiny_model_dirs, fused_model_dirs)
    settings = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, eos_token_id=None)
    _run(gen, BASE, "prefix")
    prompt = [*BASE, 60, 61]
    beams = gen.generate(prompt, cache="prefix", **settings)
    assert beams.stats["prefill_tokens"] < 3 * len(prompt)
    assert beams.tokens == gen.generate(prompt, **settings).tokens


def test_the_store_stays_within_max_bytes(tiny_llama_gen) -> None:
    gen = tiny_llama_gen
    sig = gen.model.signature
    per_token = len(sig.past_inputs) * sig.num_kv_heads * sig.head_dim * 4
    bound = 30 * per_token
    spec = {"name": "prefix", "max_bytes": bound}
    for start in range(10, 60, 10):  # five unrelated 20-token prompts
        _run(gen, [1, *range(start, start + 19)], spec, new=2)
    store = gen.model_state["prefix"]
    assert store.nbytes <= bound
    assert len(store) == 1  # ~21 tokens each: one fits, the most recent
    assert _run(gen, [1, *range(50, 69), 3], spec, new=2).stats["prefill_tokens"] == 1


def test_a_store_is_per_model(tiny_model_dirs, fused_model_dirs) -> None:
    llama = ortgen.load(tiny_model_dirs["llama"][1], threads=1)
    qwen = ortgen.load(tiny_model_dirs["qwen2"][1], threads=1)
    _run(llama, BASE, "prefix")
    assert _run(qwen, BASE, "prefix").stats["prefill_tokens"] == len(BASE)


def test_a_cache_of_another_model_is_refused(tiny_model_dirs, fused_model_dirs) -> None:
    from ortgen.plugin_host.chains import build_chain

    llama = ortgen.load(tiny_model_dirs["llama"][1], threads=1)
    fused = ortgen.load(fused_model_dirs["llama"][1], threads=1)
    state = fused.start(BASE, max_new_tokens=4)
    config = llama.resolve_config({"max_new_tokens": 4}).config
    ctx = llama.context([BASE], config)
    chain = build_chain(llama.registry, ctx, cache=(state.chain.cache_name, state.chain.cache))
    with pytest.raises(ortgen.InputError, match="made for another model's graph"):
        ortgen.Generation(llama.model, chain, [BASE], max_length=30, pad_token_id=0)


def test_bad_max_bytes_is_named(tiny_llama_gen) -> None:
    with pytest.raises(ConfigError, match="max_bytes must be a non-negative integer"):
        _run(tiny_llama_gen, BASE, {"name": "prefix", "max_bytes": -1})


def test_a_batch_of_conversations_reuses_each_history(reference_gen) -> None:
    """Chat with several rows: each conversation's next turn, sent as a batch with
    ``cache="prefix"``, feeds only what is new in that conversation, and answers as the
    full prompt would (fp32 graph: other chunkings round the same)."""
    gen = reference_gen
    chats = [
        [{"role": "user", "content": "Name a colour."}],
        [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi!"}],
    ]
    settings = dict(max_new_tokens=12, do_sample=False, cache="prefix")
    first = gen.generate([{"messages": c} for c in chats], **settings)
    for chat, answer in zip(chats, first.text, strict=True):
        chat += [{"role": "assistant", "content": answer}, {"role": "user", "content": "More."}]
    rows = [{"messages": c} for c in chats]
    second = gen.generate(rows, **settings)
    prompts = [gen.chat_prompt(c) for c in chats]
    assert second.stats["prefill_tokens"] < 0.5 * sum(map(len, prompts))
    fresh = gen.generate(rows, **{**settings, "cache": "static"})
    assert second.tokens == fresh.tokens
