"""Penalties and constraints (ortgen.plugins.constraints) against Hugging Face's own classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers.generation.logits_process as hf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortgen import ConfigError, GenerationContext
from ortgen.plugins import constraints as C
from ortgen.testing import make_context


def make_ctx(prompt_length=4, eos=(2,), vocab=50) -> GenerationContext:
    return make_context(
        prompt_length=prompt_length, eos_token_ids=eos, vocab_size=vocab, max_length=100
    )


def hf_apply(processor, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    return processor(torch.from_numpy(input_ids), torch.from_numpy(scores.copy())).numpy()


def random_case(rng, *, batch=3, vocab=30, length=20, id_range=8):
    """Scores with -inf entries and a NaN; ids drawn from few tokens so n-grams repeat."""
    scores = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
    scores[rng.random((batch, vocab)) < 0.1] = -np.inf
    scores[0, -1] = np.nan
    ids = rng.integers(0, id_range, (batch, length)).astype(np.int64)
    return ids, scores


def assert_same(ours, theirs):
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs)  # -inf masks included, NaN == NaN


SEEDS = range(8)


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_repetition_penalty_matches_hf(penalty, seed):
    ids, scores = random_case(np.random.default_rng(seed), length=int(seed) * 5 + 1)
    ours = C.RepetitionPenaltyProcessor(penalty)(ids, scores)
    assert_same(ours, hf_apply(hf.RepetitionPenaltyLogitsProcessor(float(penalty)), ids, scores))


@pytest.mark.parametrize("layout", ["fortran", "strided"])
def test_repetition_penalty_on_non_contiguous_scores_matches_hf(layout):
    """The penalty is scattered through a flat view, which needs a C-ordered copy."""
    ids, scores = random_case(np.random.default_rng(3), batch=4, vocab=60, id_range=60)
    wide = np.repeat(scores, 2, axis=1)
    view = np.asfortranarray(scores) if layout == "fortran" else wide[:, ::2]
    ours = C.RepetitionPenaltyProcessor(1.3)(ids, view)
    assert_same(ours, hf_apply(hf.RepetitionPenaltyLogitsProcessor(1.3), ids, scores))


def test_repetition_penalty_prompt_ignore_length_matches_hf():
    ids, scores = random_case(np.random.default_rng(0), vocab=400, id_range=400)
    ours = C.RepetitionPenaltyProcessor(1.5, prompt_ignore_length=12)(ids, scores)
    theirs = hf.RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=12)
    assert_same(ours, hf_apply(theirs, ids, scores))
    assert not np.array_equal(ours, C.RepetitionPenaltyProcessor(1.5)(ids, scores))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_no_repeat_ngram_matches_hf(size, seed):
    rng = np.random.default_rng(seed)
    for length in (1, size - 1, size, size + 1, 40):
        if length < 1:
            continue
        ids, scores = random_case(rng, length=length, id_range=4)
        ours = C.NoRepeatNGramProcessor(size)(ids, scores)
        assert_same(ours, hf_apply(hf.NoRepeatNGramLogitsProcessor(size), ids, scores))


def test_no_repeat_ngram_bans_the_completing_token():
    ids = np.array([[5, 6, 7, 5, 6]])
    out = C.NoRepeatNGramProcessor(3)(ids, np.zeros((1, 10), np.float32))
    assert np.flatnonzero(np.isneginf(out[0])).tolist() == [7]


@pytest.mark.parametrize("min_new", [0, 1, 5, 30])
@pytest.mark.parametrize("prompt_length", [0, 7, 20])
def test_min_new_tokens_matches_hf(min_new, prompt_length):
    ids, scores = random_case(np.random.default_rng(min_new + prompt_length), length=20)
    eos = [2, 5, 99]  # 99 is outside the vocabulary: ignored, as in HF
    ours = C.MinNewTokensProcessor(min_new, eos, ctx=make_ctx(prompt_length))(ids, scores)
    theirs = hf.MinNewTokensLengthLogitsProcessor(prompt_length, min_new, eos)
    assert_same(ours, hf_apply(theirs, ids, scores))


def test_min_new_tokens_defaults_to_the_request_eos_ids():
    scores = np.zeros((2, 10), np.float32)
    proc = C.MinNewTokensProcessor(3, ctx=make_ctx(prompt_length=4, eos=(1, 7)))
    assert np.isneginf(proc(np.zeros((2, 6), np.int64), scores)).sum(axis=-1).tolist() == [2, 2]
    assert not np.isneginf(proc(np.zeros((2, 7), np.int64), scores)).any()


BAD_WORDS = [
    [[3]],
    [[3], [4, 5], [4, 5]],
    [[1, 2], [2, 3, 4], [0, 0, 0, 0], [6]],
    [[2], [7, 2], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]],
]


@pytest.mark.parametrize("words", BAD_WORDS)
@pytest.mark.parametrize("eos", [None, 2, [2, 6]])
@pytest.mark.parametrize("seed", SEEDS)
def test_bad_words_match_hf(words, eos, seed):
    ids, scores = random_case(np.random.default_rng(seed), length=21, id_range=5)
    ids[0, -3:] = [2, 3, 4]  # make sure a longer word completes somewhere
    ours = C.BadWordsProcessor(words, eos)(ids, scores)
    assert_same(ours, hf_apply(hf.NoBadWordsLogitsProcessor(words, eos), ids, scores))


def test_bad_words_as_long_as_the_row_apply_and_longer_ones_do_not():
    ids, scores = np.array([[1, 2]]), np.zeros((1, 10), np.float32)
    for words, banned in [([[2, 3]], [3]), ([[1, 2, 4]], []), ([[9, 2, 5], [2, 5]], [5])]:
        ours = C.BadWordsProcessor(words)(ids, scores)
        assert_same(ours, hf_apply(hf.NoBadWordsLogitsProcessor(words), ids, scores))
        assert np.flatnonzero(np.isneginf(ours[0])).tolist() == banned


def test_bad_words_that_are_all_eos_change_nothing():
    ids, scores = np.zeros((1, 3), np.int64), np.ones((1, 5), np.float32)
    ours = C.BadWordsProcessor([[2]], 2)(ids, scores)
    assert_same(ours, hf_apply(hf.NoBadWordsLogitsProcessor([[2]], 2), ids, scores))
    np.testing.assert_array_equal(ours, scores)


def test_bad_words_take_eos_from_the_request():
    proc = C.BadWordsProcessor([[2], [3]], ctx=make_ctx(eos=(2,)))
    assert proc.bad_words_ids == [(3,)]


def test_bad_words_outside_the_vocabulary_are_refused():
    with pytest.raises(ConfigError, match=r"\[0, 50\).*\[70\]"):
        C.BadWordsProcessor([[3], [70]], ctx=make_ctx(vocab=50))
    with pytest.raises(ConfigError, match=r"\[0, 10\).*\[12\]"):
        C.BadWordsProcessor([[12]])(np.zeros((1, 2), np.int64), np.zeros((1, 10), np.float32))


# --- invariants ---------------------------------------------------------------

ids_arrays = hnp.arrays(
    np.int64, st.tuples(st.just(2), st.integers(1, 12)), elements=st.integers(0, 5)
)


@settings(max_examples=100, deadline=None)
@given(ids=ids_arrays, which=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_processors_never_mutate_their_inputs(ids, which, seed):
    scores = np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)
    processor = [
        C.RepetitionPenaltyProcessor(1.3),
        C.NoRepeatNGramProcessor(2),
        C.MinNewTokensProcessor(50, ctx=make_ctx(eos=(1,))),
        C.BadWordsProcessor([[1], [2, 3]]),
    ][which]
    ids_before, scores_before = ids.copy(), scores.copy()
    out = processor(ids, scores)
    np.testing.assert_array_equal(ids, ids_before)
    np.testing.assert_array_equal(scores, scores_before)
    assert out is not scores and out.shape == scores.shape and out.dtype == np.float32
    assert_same(out, hf_apply(hf_twin(which), ids, scores))


def hf_twin(which):
    return [
        hf.RepetitionPenaltyLogitsProcessor(1.3),
        hf.NoRepeatNGramLogitsProcessor(2),
        hf.MinNewTokensLengthLogitsProcessor(4, 50, 1),
        hf.NoBadWordsLogitsProcessor([[1], [2, 3]]),
    ][which]


# --- arguments and registration -------------------------------------------------

BAD_ARGS = [
    (C.RepetitionPenaltyProcessor, {"repetition_penalty": 0.0}, "`repetition_penalty`.*> 0.*0.0"),
    (C.RepetitionPenaltyProcessor, {"repetition_penalty": -2}, "`repetition_penalty`.*-2"),
    (C.RepetitionPenaltyProcessor, {"repetition_penalty": "x"}, "`repetition_penalty`.*'x'"),
    (
        C.RepetitionPenaltyProcessor,
        {"repetition_penalty": 1.1, "prompt_ignore_length": -1},
        "`prompt_ignore_length`.*-1",
    ),
    (C.NoRepeatNGramProcessor, {"no_repeat_ngram_size": -1}, "`no_repeat_ngram_size`.*-1"),
    (C.NoRepeatNGramProcessor, {"no_repeat_ngram_size": 2.0}, "`no_repeat_ngram_size`.*2.0"),
    (
        C.MinNewTokensProcessor,
        {"min_new_tokens": -3, "ctx": make_ctx()},
        "`min_new_tokens`.*non-negative.*-3",
    ),
    (
        C.MinNewTokensProcessor,
        {"min_new_tokens": 3, "eos_token_id": [-1], "ctx": make_ctx()},
        r"`eos_token_id`.*\[-1\]",
    ),
    (C.BadWordsProcessor, {"bad_words_ids": []}, "`bad_words_ids`.*non-empty list.*\\[\\]"),
    (C.BadWordsProcessor, {"bad_words_ids": [3, 4]}, "`bad_words_ids`.*list of lists"),
    (C.BadWordsProcessor, {"bad_words_ids": [[3], []]}, "`bad_words_ids`.*non-empty list of"),
    (C.BadWordsProcessor, {"bad_words_ids": [[3, -4]]}, "`bad_words_ids`.*-4"),
    (C.BadWordsProcessor, {"bad_words_ids": [[3]], "eos_token_id": "2"}, "`eos_token_id`"),
]


@pytest.mark.parametrize(("factory", "kwargs", "message"), BAD_ARGS)
def test_bad_arguments_raise_config_error(factory, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        factory(**kwargs)


def test_hookimpl_registers_the_constraints():
    registered = {}
    C.register_logits_processors(lambda name, factory, **kw: registered.setdefault(name, factory))
    assert registered == {
        "repetition_penalty": C.RepetitionPenaltyProcessor,
        "no_repeat_ngram_size": C.NoRepeatNGramProcessor,
        "min_new_tokens": C.MinNewTokensProcessor,
        "bad_words_ids": C.BadWordsProcessor,
    }
