"""Per-row settings: a prompt may be a dict carrying its own settings; every row of a
mixed batch gives what that prompt gives alone with the same settings, seeded sampling
included (one random stream per row)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ortgen
from tests.test_logprobs import hf_generate
from tests.tiny_models import export_tiny

MIXED_GREEDY = [
    {"prompt": [5, 17, 42, 99, 3, 64], "repetition_penalty": 1.4},
    {"prompt": [7, 8], "max_new_tokens": 4},
    {"prompt": [200, 13, 55, 1, 9, 9, 9, 31, 77], "no_repeat_ngram_size": 2},
    {"prompt": [11, 12, 13]},
]
MIXED_SAMPLED = [
    {"prompt": [5, 17, 42, 99], "seed": 1, "temperature": 0.7},
    {"prompt": [7, 8], "seed": 2, "top_k": 5, "max_new_tokens": 6},
    {"prompt": [200, 13, 55, 1, 9], "seed": 3, "top_p": 0.8, "min_p": 0.05},
    {"prompt": [11, 12, 13], "seed": 4, "temperature": 0.7},  # same settings as row 0
    {"prompt": [11, 12, 13], "seed": 4, "temperature": 0.7},  # a duplicate: same draws
]


# One row per setting, greedy and seeded sampling in one batch: every row's prompt and
# seed are those of a plain row (the last two), and each setting changes its row's tokens
# there on every tiny arch (asserted below), so a row whose setting is lost shows it.
# no_repeat_ngram_size is 1: a bigram ban (2) changes nothing in 10 tokens of these models.
GREEDY_PROMPT = [197, 230, 110, 13, 69, 250, 133, 127, 106, 238, 203, 215, 80, 250, 125, 94]
SAMPLED_PROMPT = [5, 17, 42, 99]
SAMPLED: dict[str, Any] = {"prompt": SAMPLED_PROMPT, "do_sample": True, "seed": 1}
ONE_EACH: list[dict[str, Any]] = [
    {"prompt": GREEDY_PROMPT, "repetition_penalty": 1.4},
    {"prompt": GREEDY_PROMPT, "no_repeat_ngram_size": 1},
    {**SAMPLED, "temperature": 0.5},
    {**SAMPLED, "top_k": 3},
    {**SAMPLED, "top_p": 0.6},
    {**SAMPLED, "min_p": 0.2},
    {**SAMPLED, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
    {"prompt": GREEDY_PROMPT, "repetition_penalty": 1.2, "no_repeat_ngram_size": 1},
    SAMPLED,
    {"prompt": GREEDY_PROMPT},
]
PLAIN_SAMPLED, PLAIN_GREEDY = len(ONE_EACH) - 2, len(ONE_EACH) - 1
ONE_EACH_CALL = dict(max_new_tokens=10, eos_token_id=None)


def _split(row: dict) -> tuple[list[int], dict[str, Any]]:
    """A row's prompt and its settings, to give flat (as call arguments)."""
    return row["prompt"], {k: v for k, v in row.items() if k != "prompt"}


def _alone(gen, row: dict, **call) -> list[int]:
    return gen.generate(row, **call).tokens[0]


def test_each_row_equals_its_settings_given_flat(models):
    """Against the flat call, not against the same dict alone: a row setting the
    prompt encoder dropped would be dropped from both sides of that comparison."""
    _, gen = models
    out = gen.generate(ONE_EACH, **ONE_EACH_CALL)
    for i, row in enumerate(ONE_EACH):
        prompt, settings = _split(row)
        flat = gen.generate([prompt], **ONE_EACH_CALL, **settings).tokens[0]
        assert out.tokens[i] == flat, f"row {i}: {settings}"
        plain = PLAIN_SAMPLED if settings.get("do_sample") else PLAIN_GREEDY
        if i != plain:  # the setting matters here, or this row could not tell
            assert out.tokens[i] != out.tokens[plain], f"row {i}: {settings} changed nothing"


def hf_greedy(hf, prompt: list[int], new: int, **settings: Any) -> list[int]:
    """transformers' greedy continuation of ``prompt`` with ``settings`` (EOS ignored)."""
    out = hf_generate(
        hf, prompt, do_sample=False, max_new_tokens=new, eos_token_id=None, **settings
    )
    return out.sequences[0, len(prompt) :].tolist()


def test_each_row_equals_transformers_with_its_settings(models):
    """Each row against transformers' ``generate`` with that row's settings: greedy rows
    token for token with every step's processed scores; sampled rows (torch and numpy
    draw differently) by the first step's processed distribution (temperature, top-k,
    top-p, min-p), which no draw has touched yet."""
    hf, gen = models
    out = gen.generate(ONE_EACH, **ONE_EACH_CALL, output_scores=True)
    for i, row in enumerate(ONE_EACH):
        prompt, settings = _split(row)
        settings.pop("seed", None)
        sampled = settings.pop("do_sample", False)
        new = 1 if sampled else ONE_EACH_CALL["max_new_tokens"]
        expected = hf_generate(
            hf, prompt, do_sample=sampled, max_new_tokens=new, eos_token_id=None, **settings
        )
        steps = range(new)
        if not sampled:
            assert out.tokens[i] == expected.sequences[0, len(prompt) :].tolist(), f"row {i}"
        for step in steps:
            ours, theirs = out.scores[step][i], expected.scores[step][0].numpy()
            assert np.array_equal(np.isneginf(ours), np.isneginf(theirs)), f"row {i} step {step}"
            finite = np.isfinite(theirs)
            np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-4, atol=1e-4)


def test_mixed_greedy_rows_equal_each_prompt_alone(models):
    _, gen = models
    call = dict(max_new_tokens=10, eos_token_id=None)
    out = gen.generate(MIXED_GREEDY, **call)
    for i, row in enumerate(MIXED_GREEDY):
        assert out.tokens[i] == _alone(gen, row, **call), f"row {i}"
    assert len(out.tokens[1]) == 4 and len(out.tokens[0]) == 10


def test_seeded_rows_equal_each_prompt_alone(models):
    _, gen = models
    call = dict(max_new_tokens=12, eos_token_id=None, do_sample=True)
    out = gen.generate(MIXED_SAMPLED, **call)
    for i, row in enumerate(MIXED_SAMPLED):
        assert out.tokens[i] == _alone(gen, row, **call), f"row {i}"
    assert out.tokens[3] == out.tokens[4]
    assert len(out.tokens[1]) == 6
    # a row's seed matters: the same row with another seed draws differently
    other = {**MIXED_SAMPLED[0], "seed": 99}
    assert _alone(gen, other, **call) != out.tokens[0]


def test_rows_without_own_seed_get_distinct_streams(tiny_llama_gen):
    """With per-row settings, rows that set no seed draw from streams derived from the
    call's seed and their row, so two identical rows do not sample identically."""
    call = dict(max_new_tokens=12, eos_token_id=None, do_sample=True, seed=5)
    rows = [{"prompt": [5, 6, 7], "temperature": 1.5}, {"prompt": [5, 6, 7], "temperature": 1.5}]
    first = tiny_llama_gen.generate(rows, **call).tokens
    assert first == tiny_llama_gen.generate(rows, **call).tokens  # reproducible
    assert first[0] != first[1]


def test_start_and_step_follow_per_row_settings(tiny_llama_gen):
    call = dict(max_new_tokens=10, eos_token_id=None)
    state = tiny_llama_gen.start(MIXED_GREEDY, **call)
    while not state.is_done:
        state.step()
    expected = tiny_llama_gen.generate(MIXED_GREEDY, **call).tokens
    assert [state.generated(r) for r in range(len(MIXED_GREEDY))] == expected
    assert state.finish_reasons == ["length"] * 4


@pytest.mark.parametrize(
    ("prompts", "error", "message"),
    [
        ([{"seed": 1}], ortgen.InputError, 'exactly one of "prompt"'),
        ([{"prompt": [1, 2], "messages": []}], ortgen.InputError, 'exactly one of "prompt"'),
        ([{"prompt": [1, 2], "num_return_sequences": 2}], ortgen.InputError, "whole batch"),
        ([{"prompt": [1, 2], "cache": "dynamic"}], ortgen.InputError, "whole batch"),
        ([[3, 4], {"prompt": [1, 2], "top_p": 3.0}], ortgen.ConfigError, "prompt 1: .*top_p"),
        ([{"prompt": [1, 2], "tempreature": 0.5}], ortgen.ConfigError, "did you mean"),
        ([{"prompt": 5}], ortgen.InputError, "text or token ids"),
    ],
)
def test_bad_rows_are_named(tiny_llama_gen, prompts, error, message):
    with pytest.raises(error, match=message):
        tiny_llama_gen.generate(prompts, max_new_tokens=2)


@pytest.fixture(scope="module")
def text_gen(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = export_tiny("llama", tmp_path_factory.mktemp("per-row"), with_tokenizer=True)
    return ortgen.load(folder, threads=1)


def test_stop_strings_and_text_prompts_per_row(text_gen):
    call = dict(max_new_tokens=16, eos_token_id=None)
    free = text_gen.generate(["Hello there", "Once upon"], **call)
    stop = free.text[0][3:5]
    rows = [{"prompt": "Hello there", "stop_strings": [stop]}, {"prompt": "Once upon"}]
    out = text_gen.generate(rows, **call)
    assert out.finish_reasons[0] == "stop_string"
    assert out.text[0] == free.text[0][: free.text[0].index(stop)]
    assert out.text[1] == free.text[1] and out.finish_reasons[1] == "length"
    for i, row in enumerate(rows):
        assert out.tokens[i] == text_gen.generate(row, **call).tokens[0]


def test_a_messages_row_is_rendered_with_the_chat_template(text_gen):
    messages = [{"role": "user", "content": "Hi there"}]
    call = dict(max_new_tokens=8, eos_token_id=None)
    out = text_gen.generate([{"messages": messages, "seed": 3}, "plain"], do_sample=True, **call)
    assert out.tokens[0] == text_gen.chat(messages, do_sample=True, seed=3, **call).tokens[0]
