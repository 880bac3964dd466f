"""Every KV-cache backend through the same loop: rewinding into the prompt and going on
equals a fresh run, beam search reorders every backend's rows, and on the default model
the exact backends give exactly the ``dynamic`` cache's tokens."""

from __future__ import annotations

import warnings

import pytest

import ortgen

PROMPT = [1, 5, 9, 33, 70, 12, 40, 41, 42, 43, 44]
#: backends that hold every position exactly; (spec, graph families it runs on)
EXACT = ["dynamic", "static", "prefix", {"name": "sliding_window", "window": 64, "sink": 2}]


def _gen(graph: str, tiny_model_dirs, fused_model_dirs):
    folder = (tiny_model_dirs if graph == "optimum" else fused_model_dirs)["llama"][1]
    return ortgen.load(folder, threads=1)


def _start(gen, prompt, cache, **settings):
    settings = {"max_new_tokens": 8, "eos_token_id": None, "cache": cache, **settings}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the window's approximation notice
        return gen.start(prompt, **settings)


def _finish(state) -> list[int]:
    while not state.is_done:
        state.step()
    return state.generated(0)


@pytest.mark.parametrize("graph", ["optimum", "fused"])
@pytest.mark.parametrize("cache", [*EXACT, "quantized"], ids=str)
def test_rewind_into_the_prompt_then_continue_equals_a_fresh_run(
    graph, cache, tiny_model_dirs, fused_model_dirs
) -> None:
    gen = _gen(graph, tiny_model_dirs, fused_model_dirs)
    state = _start(gen, PROMPT, cache)
    for _ in range(5):
        state.step()
    state.rewind(5 + 4)  # all five generated tokens and four of the prompt
    assert state.prompt_length == len(PROMPT) - 4
    assert state.sequences[0].tolist() == PROMPT[:-4]
    continued = _finish(state)  # the length limit stays where it was: 4 more tokens
    assert continued == _finish(_start(gen, PROMPT[:-4], cache, max_new_tokens=12))


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_rewind_keeps_one_token_per_row(graph, tiny_model_dirs, fused_model_dirs) -> None:
    gen = _gen(graph, tiny_model_dirs, fused_model_dirs)
    state = _start(gen, [PROMPT, PROMPT[:4]], "static")
    state.step()
    with pytest.raises(ortgen.InputError, match="keeps at least one token per row"):
        state.rewind(5)  # the short row holds 4 + 1


@pytest.mark.parametrize("graph", ["optimum", "fused"])
@pytest.mark.parametrize("cache", [*EXACT, "quantized"], ids=str)
def test_beam_search_reorders_every_backend(
    graph, cache, tiny_model_dirs, fused_model_dirs
) -> None:
    gen = _gen(graph, tiny_model_dirs, fused_model_dirs)
    prompts = [PROMPT, PROMPT[:5]]
    if graph == "fused" and cache == "dynamic":  # it refuses rows of different lengths there
        prompts = [PROMPT, PROMPT[::-1]]
    settings = dict(max_new_tokens=10, num_beams=3, num_return_sequences=3, eos_token_id=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        beams = gen.generate(prompts, cache=cache, **settings)
        alone = [gen.generate(p, cache=cache, **settings) for p in prompts]
    assert beams.tokens == alone[0].tokens + alone[1].tokens
    if cache != "quantized":  # exact backends: the same beams as the default cache
        assert beams.tokens == gen.generate(prompts, **settings).tokens


def test_exact_backends_give_the_dynamic_tokens_on_the_default_model(default_gen) -> None:
    """The int4 default model, one request each, fed as ``dynamic`` feeds it."""
    from ortgen.bench.quality import eval_ids

    prompt = eval_ids(default_gen)[:300]
    settings = dict(max_new_tokens=32, do_sample=False, eos_token_id=None)
    dynamic = default_gen.generate(prompt, cache="dynamic", **settings).tokens
    for cache in ("static", "prefix"):
        assert default_gen.generate(prompt, cache=cache, **settings).tokens == dynamic, cache


def test_reuse_and_batches_are_exact_on_the_fp32_default_model(reference_gen) -> None:
    """Reusing a prefix feeds the prompt in other chunks, and a batch decodes rows
    together: on the fp32 graph neither changes a token. (The int4 graph's kernels round
    slightly differently for other chunkings, which can flip a near-tie.)"""
    from ortgen.bench.quality import eval_ids

    gen = reference_gen
    text = eval_ids(gen)
    settings = dict(max_new_tokens=24, do_sample=False, eos_token_id=None)
    dynamic = gen.generate(text[:300], cache="dynamic", **settings).tokens
    window = {"name": "sliding_window", "window": 400, "sink": 4}  # holds everything
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert gen.generate(text[:300], cache=window, **settings).tokens == dynamic
    gen.generate(text[:300], cache="prefix", **settings)
    again = gen.generate(text[:300], cache="prefix", **settings)  # reusing 299 tokens
    assert again.stats["prefill_tokens"] == 1
    assert again.tokens == dynamic
    prompts = [text[:40], text[100:117], text[200:260]]
    for cache in ("static", "prefix"):
        batch = gen.generate(prompts, cache=cache, **settings).tokens
        alone = [gen.generate(p, cache=cache, **settings).tokens[0] for p in prompts]
        assert batch == alone, cache


@pytest.mark.parametrize("cache", ["static", "quantized"])
def test_a_batch_appends_several_tokens_after_a_rewind_on_a_fused_graph(
    cache, fused_model_dirs
) -> None:
    """Several new tokens per row on top of a past go row by row on a fused graph
    (GroupQueryAttention takes them for one row only), inside the prompt or after it."""
    gen = ortgen.load(fused_model_dirs["llama"][1], threads=1)
    prompts = [PROMPT, PROMPT[:6]]
    state = _start(gen, prompts, cache, max_new_tokens=20)
    for _ in range(4):
        state.step()
    state.rewind(2)
    state.append([[7, 8, 9], [7, 8, 9]])
    _finish(state)
    for row, prompt in enumerate(prompts):
        kept = state.generated(row)[:2]
        continued = state.generated(row)[5:]
        assert state.generated(row)[2:5] == [7, 8, 9]
        fresh = _start(gen, [*prompt, *kept, 7, 8, 9], cache, max_new_tokens=len(continued))
        assert _finish(fresh) == continued, row
