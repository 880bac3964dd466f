"""Speculative decoding (prompt lookup) in the one loop: exactly the tokens of plain
decoding, greedy and seeded, on both graph families; the cache after rejected drafts is
the cache of the kept tokens; what cannot speculate says so."""

from __future__ import annotations

import numpy as np
import pytest

import ortgen
from ortgen.plugins.drafters import PromptLookupDrafter
from tests.tiny_models import export_tiny

#: repeating prompts: random tiny models fall into loops, so drafts are proposed and kept
PROMPTS = [
    [5, 9, 33, 70, 12, 5, 9, 33, 70, 12, 5, 9],
    [44, 3, 8, 44, 3, 8, 44, 3],
    [100, 101, 102, 103, 104, 105, 106, 107, 100, 101],
]
LOOKUP = {"prompt_lookup_num_tokens": 6}


@pytest.fixture(scope="module", params=["optimum-llama", "fused-llama", "fused-qwen2"])
def gen(request, tiny_model_dirs, fused_model_dirs):
    graph, arch = request.param.split("-")
    dirs = tiny_model_dirs if graph == "optimum" else fused_model_dirs
    return ortgen.load(dirs[arch][1], threads=1)


@pytest.mark.parametrize("new", [40, 11])  # 11: the length comes inside a draft
def test_greedy_is_plain_decoding_token_for_token(gen, new) -> None:
    drafted = 0
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=new, eos_token_id=None, logprobs=True)
        fast = gen.generate(prompt, max_new_tokens=new, eos_token_id=None, logprobs=True, **LOOKUP)
        assert fast.tokens == plain.tokens
        assert fast.finish_reasons == plain.finish_reasons
        np.testing.assert_allclose(fast.logprobs[0], plain.logprobs[0], atol=1e-4)
        drafted += fast.stats["drafted"]
        assert fast.stats["verify_forwards"] <= new
    assert drafted > 0 or new < 40  # the drafts were proposed, so the path was taken


def test_eos_inside_a_draft_ends_there(gen) -> None:
    prompt = PROMPTS[0]
    plain = gen.generate(prompt, max_new_tokens=30, eos_token_id=None)
    eos = plain.tokens[0][5]  # a token the row emits: it ends the row at its first use
    plain = gen.generate(prompt, max_new_tokens=30, eos_token_id=eos)
    fast = gen.generate(prompt, max_new_tokens=30, eos_token_id=eos, **LOOKUP)
    assert fast.tokens == plain.tokens and fast.finish_reasons == plain.finish_reasons == ["eos"]


def test_seeded_sampling_draws_the_same_tokens(gen) -> None:
    settings = {"do_sample": True, "temperature": 0.7, "top_k": 20, "seed": 11}
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=30, eos_token_id=None, **settings)
        fast = gen.generate(prompt, max_new_tokens=30, eos_token_id=None, **settings, **LOOKUP)
        assert fast.tokens == plain.tokens


def test_penalties_see_each_position_own_prefix(gen) -> None:
    """repetition_penalty reads the tokens so far: at each verified position it sees the
    kept tokens before it, as plain decoding does."""
    settings = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 4, "eos_token_id": None}
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=30, **settings)
        assert gen.generate(prompt, max_new_tokens=30, **settings, **LOOKUP).tokens == plain.tokens


def test_the_cache_after_rejected_drafts_is_the_kept_tokens_cache(tiny_model_dirs) -> None:
    """Optimum graph, dynamic cache: after the request its keys/values equal plain
    decoding's, position for position (rejected drafts left nothing behind)."""
    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1)
    for prompt in PROMPTS:  # the first whose run rejects some drafts
        states = []
        for settings in ({}, LOOKUP):
            state = gen.start(prompt, max_new_tokens=40, eos_token_id=None, **settings)
            while not state.is_done:
                state.step()
            states.append(state)
        plain, fast = states
        if fast.drafted > fast.draft_kept:
            break
    assert fast.drafted > fast.draft_kept  # some drafts were rejected
    assert fast.chain.cache.length == plain.chain.cache.length
    for name, value in plain.chain.cache.inputs().items():
        mine = fast.chain.cache.inputs()[name]
        want = value.numpy() if hasattr(value, "numpy") else value
        got = mine.numpy() if hasattr(mine, "numpy") else mine
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_chat_with_stop_strings_speculates_exactly(tiny_root) -> None:
    folder = export_tiny("llama", tiny_root / "spec-chat", with_tokenizer=True)
    gen = ortgen.load(folder, threads=1)
    text = "abc abc abc abc abc"
    plain = gen.generate(text, max_new_tokens=30, eos_token_id=None)
    stop = plain.text[8:10]
    assert len(stop) == 2
    settings = {
        "max_new_tokens": 30,
        "eos_token_id": None,
        "stop_strings": [stop] if stop else None,
    }
    plain = gen.generate(text, **settings)
    fast = gen.generate(text, **settings, **LOOKUP)
    assert (fast.text, fast.tokens, fast.finish_reasons) == (
        plain.text,
        plain.tokens,
        plain.finish_reasons,
    )


def test_what_cannot_speculate_says_so(tiny_llama_gen) -> None:
    gen = tiny_llama_gen
    with pytest.raises(ortgen.InputError, match="verifies one row per forward"):
        gen.generate(PROMPTS[:2], max_new_tokens=4, **LOOKUP)
    with pytest.raises(ortgen.InputError, match="search strategy"):
        gen.generate(PROMPTS[0], max_new_tokens=4, num_beams=2, **LOOKUP)
    with pytest.raises(ortgen.ConfigError, match="prompt_lookup_num_tokens must be > 0"):
        gen.generate(PROMPTS[0], prompt_lookup_num_tokens=0)
    with pytest.raises(ortgen.ConfigError, match="max_matching_ngram_size must be >= 2"):
        gen.generate(PROMPTS[0], prompt_lookup_num_tokens=3, max_matching_ngram_size=1)
    with pytest.raises(ortgen.ConfigError, match="not both"):
        gen.generate(PROMPTS[0], prompt_lookup_num_tokens=3, drafter="prompt_lookup")


class BadDrafter:
    def draft(self, tokens, limit):
        return [10**9]


class ScriptDrafter:
    """Drafts the next tokens of a given continuation (greedy decoding's, say)."""

    def __init__(self, script: list[int], prompt_length: int) -> None:
        self.script, self.prompt_length = script, prompt_length

    def draft(self, tokens, limit):
        done = len(tokens) - self.prompt_length
        return self.script[done : done + min(limit, 3)]


class Plugin:
    @ortgen.hookimpl
    def register_drafters(self, register):
        register("bad", BadDrafter)
        register("script", ScriptDrafter)


def test_a_drafter_proposing_a_token_outside_the_vocabulary_fails_the_request(
    tiny_model_dirs,
) -> None:
    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[Plugin()])
    with pytest.raises(ortgen.ComponentError, match="drafter 'bad' returned") as caught:
        gen.generate(PROMPTS[0], max_new_tokens=8, eos_token_id=None, drafter="bad")
    assert len(caught.value.partial.tokens[0]) == 1  # the first token, from the prefill


def test_prompt_lookup_drafts_what_followed_the_latest_match() -> None:
    drafter = PromptLookupDrafter(num_tokens=3)
    tokens = np.array([1, 2, 3, 4, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    assert drafter.draft(tokens, 10) == [7, 8, 1]  # the 3-gram's latest earlier match
    assert drafter.draft(tokens, 2) == [7, 8]
    assert drafter.draft(np.array([5, 6, 7, 8]), 4) == []  # nothing repeats
    assert drafter.draft(np.array([1, 5, 6, 1]), 4) == []  # one-token matches are not tried
    drafter.accepted(3, 0)
    assert drafter.draft(tokens, 10) == [7]  # adapts: one more than was kept
    with pytest.raises(ortgen.ConfigError, match="min_ngram"):
        PromptLookupDrafter(min_ngram=4, max_ngram=3)


def _chi_square_p(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square test that ``a`` and ``b`` come from one distribution; the
    p-value by Wilson and Hilferty's normal approximation of the chi-square tail (no
    scipy here). Values seen fewer than 10 times in both samples together are pooled."""
    import math
    from collections import Counter

    both = Counter(a) + Counter(b)
    common = {v for v, n in both.items() if n >= 10}
    key = lambda v: v if v in common else -1  # noqa: E731
    ca, cb = Counter(map(key, a)), Counter(map(key, b))
    bins = sorted(set(ca) | set(cb))
    total_a, total_b = len(a), len(b)
    statistic = 0.0
    for v in bins:
        column = ca[v] + cb[v]
        for count, total in ((ca[v], total_a), (cb[v], total_b)):
            expected = column * total / (total_a + total_b)
            statistic += (count - expected) ** 2 / expected
    df = len(bins) - 1
    z = ((statistic / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampling_with_drafts_keeps_the_token_distribution(tiny_model_dirs) -> None:
    """Unseeded in spirit: runs with and without drafts use different seeds, so this is a
    test of the distribution, not of identity. Greedy decoding's tokens are drafted; the
    4th token (after drafts were kept and rejected) is distributed alike (p > 0.001);
    the same test tells temperature 0.5 from 0.7 apart (p < 0.001), so it can fail."""
    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[Plugin()])
    prompt, runs = PROMPTS[0], 300
    greedy = gen.generate(prompt, max_new_tokens=4, eos_token_id=None).tokens[0]
    script = {"drafter": {"name": "script", "script": greedy, "prompt_length": len(prompt)}}

    def fourth_tokens(first_seed: int, temperature: float, **extra) -> tuple[list[int], int]:
        tokens, kept = [], 0
        for seed in range(first_seed, first_seed + runs):
            out = gen.generate(
                prompt, max_new_tokens=4, eos_token_id=None, do_sample=True, top_k=0,
                temperature=temperature, seed=seed, **extra,
            )  # fmt: skip
            tokens.append(out.tokens[0][3])
            kept += int(out.stats.get("accepted", 0))
        return tokens, kept

    plain, _ = fourth_tokens(0, 0.5)
    drafted, kept = fourth_tokens(10_000, 0.5, **script)
    assert runs < kept < 3 * runs  # greedy's drafts: often kept, often not
    assert _chi_square_p(plain, drafted) > 1e-3
    hotter, _ = fourth_tokens(20_000, 0.7, **script)
    assert _chi_square_p(plain, hotter) < 1e-3
