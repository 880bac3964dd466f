"""Speculative decoding in the one loop: exactly the tokens of plain decoding, greedy,
seeded, with processors, EOS and stop strings, on both graph families; the cache after
rejected drafts is the cache of the kept tokens; what cannot speculate says so.

Random tiny models rarely repeat themselves, so prompt lookup drafts little and keeps
nothing. The exactness tests therefore draft with ``ScriptDrafter``: plain decoding's own
continuation with a wrong token at chosen positions (``WRONG``), so every other draft is
kept and those are rejected, for certain. Then the counts are known in advance
(``expected_stats``), and a test whose drafts were all rejected, or never proposed,
fails instead of passing on the plain path."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import pytest

import ortgen
from ortgen.plugins.drafters import PromptLookupDrafter
from tests.tiny_models import VOCAB_SIZE, export_tiny

#: repeating prompts: prompt lookup finds earlier matches in them and drafts
PROMPTS = [
    [5, 9, 33, 70, 12, 5, 9, 33, 70, 12, 5, 9],
    [44, 3, 8, 44, 3, 8, 44, 3],
    [100, 101, 102, 103, 104, 105, 106, 107, 100, 101],
]
LOOKUP = {"prompt_lookup_num_tokens": 6}
#: generated positions ``ScriptDrafter`` drafts wrong (3, 8, 13, ...), and its drafts per
#: step: the first step keeps 2 and rejects 1, the next keeps 3, the next rejects at once
WRONG = frozenset(range(3, 200, 5))
WIDTH = 3
#: positions a step after a wrong draft drafts right with a draft after them (4, 5, 9,
#: 10, ...): a row that ends at one ends inside a draft
INSIDE_A_DRAFT = frozenset(p for w in WRONG for p in (w + 1, w + 2))


class BadDrafter:
    def draft(self, tokens, limit):
        return [10**9]


class ScriptDrafter:
    """Drafts the next ``width`` tokens of a given continuation (plain decoding's, say),
    each generated position in ``wrong`` replaced by another token: with plain decoding's
    continuation, the drafts there are rejected and all others kept, for certain."""

    def __init__(
        self,
        script: list[int],
        prompt_length: int,
        wrong: Collection[int] = (),
        width: int = WIDTH,
    ) -> None:
        self.script, self.prompt_length = script, prompt_length
        self.wrong, self.width = frozenset(wrong), width

    def draft(self, tokens, limit):
        done = len(tokens) - self.prompt_length
        ahead = self.script[done : done + min(limit, self.width)]
        return [(t + 1) % VOCAB_SIZE if i in self.wrong else t for i, t in enumerate(ahead, done)]


class Plugin:
    @ortgen.hookimpl
    def register_drafters(self, register):
        register("bad", BadDrafter)
        register("script", ScriptDrafter)


def scripted(plain: Sequence[int], prompt_length: int) -> dict[str, Any]:
    """Settings that draft ``plain`` (plain decoding's tokens) wrong at ``WRONG``."""
    spec = {"name": "script", "script": list(plain), "prompt_length": prompt_length}
    return {"drafter": {**spec, "wrong": sorted(WRONG)}}


def expected_stats(total: int, max_new_tokens: int) -> dict[str, int]:
    """``drafted``, ``accepted`` and ``verify_forwards`` of ``scripted`` drafts of plain
    decoding's ``max_new_tokens`` tokens for a row that ends after ``total`` of them (by
    its length, an EOS or a stop string). Derived from the rule, not the code: no drafts
    before the prompt is fed (the first token); a step drafts ``WIDTH`` tokens, fewer
    where the buffer keeps room only for fewer and the model's own token after them; a
    verifying forward keeps drafts up to the first wrong one or the one that ends the row
    (neither counts as kept) and adds the model's own token after what it kept."""
    drafted = accepted = forwards = 0
    done = 1
    while done < total:
        count = min(WIDTH, max_new_tokens - done - 1)
        if count < 1:  # no room for a draft: a plain step
            done += 1
            continue
        kept = 0
        while kept < count and done + kept not in WRONG and done + kept != total - 1:
            kept += 1
        drafted, accepted, forwards = drafted + count, accepted + kept, forwards + 1
        done += kept + 1
    return {"drafted": drafted, "accepted": accepted, "verify_forwards": forwards}


def assert_drafts_as_scripted(out: Any, total: int, max_new_tokens: int) -> None:
    """The run's draft counts are ``expected_stats``, and it both kept and rejected."""
    stats = {k: int(out.stats[k]) for k in ("drafted", "accepted", "verify_forwards")}
    assert stats == expected_stats(total, max_new_tokens)
    assert stats["drafted"] > stats["accepted"] > 0


@pytest.fixture(scope="module", params=["optimum-llama", "fused-llama", "fused-qwen2"])
def gen(request, tiny_model_dirs, fused_model_dirs):
    graph, arch = request.param.split("-")
    dirs = tiny_model_dirs if graph == "optimum" else fused_model_dirs
    return ortgen.load(dirs[arch][1], threads=1, plugins=[Plugin()])


@pytest.mark.parametrize("new", [40, 11])  # 11: the buffer's end cuts the last drafts
def test_greedy_is_plain_decoding_token_for_token(gen, new) -> None:
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=new, eos_token_id=None, logprobs=True)
        fast = gen.generate(
            prompt, max_new_tokens=new, eos_token_id=None, logprobs=True,
            **scripted(plain.tokens[0], len(prompt)),
        )  # fmt: skip
        assert fast.tokens == plain.tokens
        assert fast.finish_reasons == plain.finish_reasons
        np.testing.assert_allclose(fast.logprobs[0], plain.logprobs[0], atol=1e-4)
        assert_drafts_as_scripted(fast, new, new)


def test_prompt_lookup_is_plain_decoding_token_for_token(gen) -> None:
    """The built-in drafter through its setting: plain decoding's tokens, and it drafted
    (from the prompts' repeats; the random models reject what it drafts, so kept drafts
    are the scripted tests' part)."""
    drafted = 0
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=40, eos_token_id=None)
        fast = gen.generate(prompt, max_new_tokens=40, eos_token_id=None, **LOOKUP)
        assert fast.tokens == plain.tokens
        drafted += int(fast.stats["drafted"])
    assert drafted > 0


def test_eos_inside_a_draft_ends_there(gen) -> None:
    """An EOS token drafted right ends the row at it, as in plain decoding, and the
    drafts after it are not kept (nor counted kept)."""
    prompt = PROMPTS[0]
    plain = gen.generate(prompt, max_new_tokens=30, eos_token_id=None).tokens[0]
    # a token first emitted inside a draft: the row ends there
    end = next(i for i in sorted(INSIDE_A_DRAFT) if i < 30 and plain[i] not in plain[:i])
    eos = plain[end]
    plain_out = gen.generate(prompt, max_new_tokens=30, eos_token_id=eos)
    fast = gen.generate(prompt, max_new_tokens=30, eos_token_id=eos, **scripted(plain, len(prompt)))
    assert fast.tokens == plain_out.tokens == [plain[: end + 1]]
    assert fast.finish_reasons == plain_out.finish_reasons == ["eos"]
    assert_drafts_as_scripted(fast, end + 1, 30)


def test_seeded_sampling_draws_the_same_tokens(gen) -> None:
    settings = {"do_sample": True, "temperature": 0.7, "top_k": 20, "seed": 11}
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=30, eos_token_id=None, **settings)
        fast = gen.generate(
            prompt, max_new_tokens=30, eos_token_id=None, **settings,
            **scripted(plain.tokens[0], len(prompt)),
        )  # fmt: skip
        assert fast.tokens == plain.tokens
        assert_drafts_as_scripted(fast, 30, 30)


def test_penalties_see_each_position_own_prefix(gen) -> None:
    """repetition_penalty and no_repeat_ngram_size read the tokens so far: at each
    verified position they see the kept tokens before it, as plain decoding does, never
    the drafts after it (those are plain decoding's next tokens here, so a processor
    that saw them would penalize the very token plain decoding picks)."""
    settings = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 4, "eos_token_id": None}
    for prompt in PROMPTS:
        plain = gen.generate(prompt, max_new_tokens=30, **settings)
        fast = gen.generate(
            prompt, max_new_tokens=30, **settings, **scripted(plain.tokens[0], len(prompt))
        )
        assert fast.tokens == plain.tokens
        assert_drafts_as_scripted(fast, 30, 30)


def test_the_cache_after_rejected_drafts_is_the_kept_tokens_cache(tiny_model_dirs) -> None:
    """Optimum graph, dynamic cache: after drafts kept and rejected, its keys/values
    equal plain decoding's, position for position (rejected drafts left nothing behind,
    kept ones stayed)."""
    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[Plugin()])
    prompt = PROMPTS[0]
    tokens = gen.generate(prompt, max_new_tokens=40, eos_token_id=None).tokens[0]
    states = []
    for settings in ({}, scripted(tokens, len(prompt))):
        state = gen.start(prompt, max_new_tokens=40, eos_token_id=None, **settings)
        while not state.is_done:
            state.step()
        states.append(state)
    plain, fast = states
    assert fast.generated(0) == tokens
    assert fast.drafted > fast.draft_kept > 0  # some drafts were rejected, some kept
    assert fast.chain.cache.length == plain.chain.cache.length
    for name, value in plain.chain.cache.inputs().items():
        mine = fast.chain.cache.inputs()[name]
        want = value.numpy() if hasattr(value, "numpy") else value
        got = mine.numpy() if hasattr(mine, "numpy") else mine
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_chat_with_stop_strings_speculates_exactly(tiny_root) -> None:
    """A stop string that a drafted token completes (its two characters span two
    tokens) ends the row at that token, as in plain decoding; the drafts after it are
    dropped."""
    folder = export_tiny("llama", tiny_root / "spec-chat", with_tokenizer=True)
    gen = ortgen.load(folder, threads=1, plugins=[Plugin()])
    text = "abc abc abc abc abc"
    tokens = gen.generate(text, max_new_tokens=30, eos_token_id=None).tokens[0]
    pieces = [gen.tokenizer.decode([t]) for t in tokens]
    for end in (i for i in sorted(INSIDE_A_DRAFT) if i < 30):
        stop = pieces[end - 1][-1] + pieces[end][0]
        before = "".join(pieces[:end])  # the stop string first completes at token `end`
        if (before + pieces[end][0]).find(stop) == len(before) - 1:
            break
    else:
        pytest.fail(f"no stop string completes at a drafted token of {pieces}")
    settings = {"max_new_tokens": 30, "eos_token_id": None, "stop_strings": [stop]}
    plain = gen.generate(text, **settings)
    assert plain.tokens == [tokens[: end + 1]] and plain.finish_reasons == ["stop_string"]
    fast = gen.generate(text, **settings, **scripted(tokens, int(plain.stats["prompt_tokens"])))
    assert (fast.text, fast.tokens, fast.finish_reasons) == (
        plain.text,
        plain.tokens,
        plain.finish_reasons,
    )
    assert_drafts_as_scripted(fast, end + 1, 30)


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
