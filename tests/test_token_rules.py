"""Token rules (ortgen.plugins.token_rules) and the epsilon/eta warpers
(ortgen.plugins.truncation) against transformers' own classes, one by one on seeded
random scores (batch > 1, -inf entries, ties, NaN / +inf / all -inf rows), then through
greedy ``generate`` on the tiny models. The chain the flat settings build is compared
with transformers' in tests/test_chain_parity.py ("token rules" section).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import transformers.generation.logits_process as hf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortgen import ConfigError
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
from ortgen.plugins import token_rules as T
from ortgen.plugins import truncation as R
from ortgen.testing import make_context
from tests.test_chain_parity import NEW, PROMPTS, hf_generate

SEEDS = range(6)
VOCAB = 40


def hf_apply(processor, ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    return processor(torch.from_numpy(ids), torch.from_numpy(scores.copy())).numpy()


def random_case(rng, *, batch=4, length=9, id_range=8, odd_rows=False, ties=False):
    """Scores with -inf entries (row 1 gets ties when asked); ids from few tokens so
    sequences repeat."""
    scores = (rng.standard_normal((batch, VOCAB)) * 3).astype(np.float32)
    scores[rng.random((batch, VOCAB)) < 0.15] = -np.inf
    if ties:
        scores[1] = np.round(scores[1])
    if odd_rows:  # softmax undefined: all -inf, NaN, +inf
        scores[0] = -np.inf
        scores[1, 3] = np.nan
        scores[2, 7] = np.inf
    ids = rng.integers(0, id_range, (batch, length)).astype(np.int64)
    return ids, scores


def assert_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    for where in (np.isneginf, np.isposinf, np.isnan):
        np.testing.assert_array_equal(where(ours), where(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- token rules

SEQUENCE_BIAS = [
    [[[3], 2.5]],
    [[[3], 2.5], [[4, 5], -1.0], [[5, 5], 0.75], [[1, 2, 5], 3.0], [[6, 5], -2.0], [[5], 1]],
    [[[0], 1.0], [[7] * 12, 4.0], [[2, 3], -math.inf]],  # id 0, longer than the row, -inf
    [[[3], 1.0], [[4, 4], 2.0], [[3], -1.0]],  # given twice: the last bias wins
]


@pytest.mark.parametrize("bias", SEQUENCE_BIAS)
@pytest.mark.parametrize("seed", SEEDS)
def test_sequence_bias_matches_hf(bias, seed):
    ids, scores = random_case(np.random.default_rng(seed), odd_rows=seed == 0)
    ids[0, -2:] = [4, 5]  # make sure longer sequences complete somewhere
    ids[1, -2:] = [1, 2]
    ids[2, -1] = 2
    hf_dict: dict[tuple[int, ...], float] = {}
    for seq, value in bias:
        hf_dict[tuple(seq)] = float(value)  # HF's dict form takes id 0 and keeps the last
    ours = T.SequenceBiasProcessor(bias)(ids, scores)
    assert_close(ours, hf_apply(hf.SequenceBiasLogitsProcessor(hf_dict), ids, scores))


def test_sequence_bias_biases_the_last_token_only_after_its_prefix():
    proc = T.SequenceBiasProcessor([[[4, 5], -3.0], [[9, 4, 5], 1.0]])
    ids, scores = np.array([[1, 9, 4], [1, 2, 4]]), np.zeros((2, 10), np.float32)
    assert np.flatnonzero(proc(ids, scores)[0]).tolist() == [5]
    assert proc(ids, scores)[:, 5].tolist() == [-2.0, -3.0]
    assert not proc(np.array([[4]]), scores[:1]).any()  # the row is shorter than the sequence
    np.testing.assert_array_equal(T.SequenceBiasProcessor([])(ids, scores), scores)  # "off"


@pytest.mark.parametrize("min_length", [0, 5, 9, 10, 30])
def test_min_length_matches_hf(min_length):
    ids, scores = random_case(np.random.default_rng(min_length), odd_rows=True)
    eos = [2, 5, 99]  # 99 is outside the vocabulary: ignored, as in HF
    ours = T.MinLengthProcessor(min_length, eos)(ids, scores)
    assert_close(ours, hf_apply(hf.MinLengthLogitsProcessor(min_length, eos), ids, scores))
    assert np.isneginf(ours[:, [2, 5]]).all() == (min_length > ids.shape[1])


def test_min_length_takes_eos_from_the_request():
    proc = T.MinLengthProcessor(5, ctx=make_context(eos_token_ids=(1, 3), vocab_size=8))
    out = proc(np.zeros((2, 4), np.int64), np.zeros((2, 8), np.float32))
    assert np.isneginf(out).sum(axis=-1).tolist() == [2, 2]


@pytest.mark.parametrize("length", [1, 2, 5])
def test_forced_bos_matches_hf(length):
    ids, scores = random_case(np.random.default_rng(length), length=length)
    ours = T.ForcedBOSTokenProcessor(3)(ids, scores)
    assert_close(ours, hf_apply(hf.ForcedBOSTokenLogitsProcessor(3), ids, scores))
    assert (np.argmax(ours, axis=-1) == 3).all() == (length == 1)


@pytest.mark.parametrize("eos", [2, [2, 5]])
@pytest.mark.parametrize("max_length", [8, 10, 11])
def test_forced_eos_matches_hf(eos, max_length):
    ids, scores = random_case(np.random.default_rng(max_length))
    ours = T.ForcedEOSTokenProcessor(max_length, eos)(ids, scores)
    assert_close(ours, hf_apply(hf.ForcedEOSTokenLogitsProcessor(max_length, eos), ids, scores))
    forced = max_length == ids.shape[1] + 1
    assert (np.isfinite(ours).sum(axis=-1) == len(np.atleast_1d(eos))).all() == forced


@pytest.mark.parametrize("seed", SEEDS)
def test_remove_invalid_values_matches_hf(seed):
    ids, scores = random_case(np.random.default_rng(seed), odd_rows=True)
    ours = T.RemoveInvalidValuesProcessor()(ids, scores)
    np.testing.assert_array_equal(ours, hf_apply(hf.InfNanRemoveLogitsProcessor(), ids, scores))
    assert np.isfinite(ours).all() and ours[0, 0] == np.finfo(np.float32).min


@pytest.mark.parametrize("start", [0, 3, 10])
@pytest.mark.parametrize("factor", [0.5, 1.0, 1.3, 2])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_exponential_decay_length_penalty_matches_hf(start, factor, seed):
    rng = np.random.default_rng(seed)
    eos, prompt = [2, 5], 4
    for length in (4, 7, 8, 15):
        ids, scores = random_case(rng, length=length)
        scores[:, eos] = rng.standard_normal((4, 2)).astype(np.float32) * 3  # finite, +/-
        ours = T.ExponentialDecayLengthPenaltyProcessor(start, factor, eos, prompt)(ids, scores)
        theirs = hf.ExponentialDecayLengthPenalty((start, float(factor)), eos, prompt)
        assert_close(ours, hf_apply(theirs, ids, scores))
        changed = not np.array_equal(ours, scores)
        assert changed == (length > start + prompt and factor != 1.0)


def test_exponential_decay_raises_negative_scores_and_leaves_infinite_ones():
    """HF turns a -inf EOS (e.g. min_length's) into NaN, which greedy then picks."""
    scores = np.array([[-2.0, 1.0, -np.inf, 4.0]], np.float32)
    proc = T.ExponentialDecayLengthPenaltyProcessor(0, 2.0, [0, 2], input_ids_seq_length=1)
    out = proc(np.zeros((1, 3), np.int64), scores)  # 2 steps: |s| * (2**2 - 1) added
    assert out.tolist() == [[4.0, 1.0, -np.inf, 4.0]]
    theirs = hf.ExponentialDecayLengthPenalty((0, 2.0), [0, 2], 1)
    assert np.isnan(hf_apply(theirs, np.zeros((1, 3), np.int64), scores)[0, 2])
    huge = proc(np.zeros((1, 5000), np.int64), scores)  # HF: OverflowError
    assert huge[0, 0] == np.inf and np.isneginf(huge[0, 2])


@pytest.mark.parametrize("tokens", [[], [3], [3, 3, 7, 99]])
def test_suppress_tokens_matches_hf(tokens):
    ids, scores = random_case(np.random.default_rng(len(tokens)), odd_rows=True)
    ours = T.SuppressTokensProcessor(tokens)(ids, scores)
    assert_close(ours, hf_apply(hf.SuppressTokensLogitsProcessor(tokens), ids, scores))


@pytest.mark.parametrize("tokens", [[], [3], [3, 3, 7, 99]])
@pytest.mark.parametrize("length", [8, 9, 10])
def test_begin_suppress_tokens_matches_hf(tokens, length):
    ids, scores = random_case(np.random.default_rng(length), length=length)
    ours = T.BeginSuppressTokensProcessor(tokens, 9)(ids, scores)
    theirs = hf.SuppressTokensAtBeginLogitsProcessor(tokens, 9)
    assert_close(ours, hf_apply(theirs, ids, scores))
    assert np.isneginf(ours[:, 3]).all() == (length == 9 and 3 in tokens)


def test_begin_index_defaults_to_the_prompt_length():
    proc = T.BeginSuppressTokensProcessor([1], ctx=make_context(prompt_length=3))
    assert proc.begin_index == 3


@pytest.mark.parametrize("seed", SEEDS)
def test_renormalize_logits_matches_hf(seed):
    ids, scores = random_case(np.random.default_rng(seed), odd_rows=seed % 2 == 0)
    ours = T.RenormalizeLogitsProcessor()(ids, scores)
    assert_close(ours, hf_apply(hf.LogitNormalization(), ids, scores))
    ok = np.isfinite(scores.max(axis=-1))
    np.testing.assert_allclose(np.exp(ours[ok]).sum(axis=-1), 1.0, rtol=1e-5)


# --------------------------------------------------------------------------- truncation

TRUNCATION = {
    "epsilon": (R.EpsilonCutoffProcessor, hf.EpsilonLogitsWarper),
    "eta": (R.EtaCutoffProcessor, hf.EtaLogitsWarper),
}


@pytest.mark.parametrize("name", TRUNCATION)
@pytest.mark.parametrize("epsilon", [1e-4, 3e-3, 0.02, 0.2, 0.9])
@pytest.mark.parametrize("keep", [1, 3, 45])
@pytest.mark.parametrize("seed", SEEDS)
def test_truncation_matches_hf(name, epsilon, keep, seed):
    ours_cls, hf_cls = TRUNCATION[name]
    ids, scores = random_case(np.random.default_rng(seed), ties=True, odd_rows=name == "epsilon")
    ours = ours_cls(epsilon, min_tokens_to_keep=keep)(ids, scores)
    assert_close(ours, hf_apply(hf_cls(epsilon, min_tokens_to_keep=keep), ids, scores))
    finite_rows = np.isfinite(scores.max(axis=-1))
    kept = np.count_nonzero(~np.isneginf(ours[finite_rows]), axis=-1)
    assert (kept >= np.minimum(keep, np.isfinite(scores[finite_rows]).sum(axis=-1))).all()


def test_truncation_keeps_every_score_tied_with_the_kth():
    scores = np.array([[5.0, 5.0, 5.0, 1.0, 0.0]], np.float32)
    for cls in (R.EpsilonCutoffProcessor, R.EtaCutoffProcessor):
        out = cls(0.9, min_tokens_to_keep=2)(np.zeros((1, 1), np.int64), scores)
        assert np.isneginf(out).tolist() == [[False, False, False, True, True]]


def test_eta_leaves_rows_without_a_softmax_where_hf_raises():
    ids, scores = random_case(np.random.default_rng(0), odd_rows=True)
    ours = R.EtaCutoffProcessor(0.02)(ids, scores)
    np.testing.assert_array_equal(ours[:3], scores[:3])
    assert_close(ours[3:], hf_apply(hf.EtaLogitsWarper(0.02), ids[3:], scores[3:]))
    with pytest.raises(ValueError):
        hf_apply(hf.EtaLogitsWarper(0.02), ids, scores)


def test_eta_threshold_falls_with_entropy():
    """The same low-probability token survives in a flat row and is cut in a peaked one."""
    flat = np.zeros((1, 1000), np.float32)
    flat[0, 0] = -3.0
    peaked = flat.copy()
    peaked[0, 1] = 12.0
    ids, proc = np.zeros((1, 1), np.int64), R.EtaCutoffProcessor(1e-3)
    assert not np.isneginf(proc(ids, flat)[0, 0]) and np.isneginf(proc(ids, peaked)[0, 0])


# --------------------------------------------------------------------------- invariants


def factories() -> list[Any]:
    return [
        lambda: T.SequenceBiasProcessor([[[1], -2.0], [[2, 3], 1.5]]),
        lambda: T.MinLengthProcessor(50, [1]),
        lambda: T.ForcedBOSTokenProcessor(2),
        lambda: T.ForcedEOSTokenProcessor(4, [1]),
        lambda: T.RemoveInvalidValuesProcessor(),
        lambda: T.ExponentialDecayLengthPenaltyProcessor(0, 1.5, [1], 1),
        lambda: T.SuppressTokensProcessor([0, 5]),
        lambda: T.BeginSuppressTokensProcessor([0], 2),
        lambda: T.RenormalizeLogitsProcessor(),
        lambda: R.EpsilonCutoffProcessor(0.05, min_tokens_to_keep=2),
        lambda: R.EtaCutoffProcessor(0.05),
    ]


score_values = st.one_of(st.floats(-30, 30, width=32), st.just(-math.inf))


@settings(max_examples=200, deadline=None)
@given(
    which=st.integers(0, 10),
    ids=hnp.arrays(np.int64, st.tuples(st.just(3), st.integers(1, 6)), elements=st.integers(0, 7)),
    scores=hnp.arrays(np.float32, (3, 8), elements=score_values),
)
def test_processors_keep_shape_and_dtype_and_never_mutate(which, ids, scores):
    ids_before, scores_before = ids.copy(), scores.copy()
    out = factories()[which]()(ids, scores)
    np.testing.assert_array_equal(ids, ids_before)
    np.testing.assert_array_equal(scores, scores_before)
    assert out is not scores and out.shape == scores.shape and out.dtype == np.float32
    nan_rows = np.isnan(out).any(axis=-1)
    if which == 8:  # log_softmax of an all -inf row is NaN, as in torch
        nan_rows &= np.isfinite(scores).any(axis=-1)
    assert not nan_rows.any()


BAD_ARGS = [
    (T.SequenceBiasProcessor, {"sequence_bias": 3}, "`sequence_bias` has to be a list"),
    (T.SequenceBiasProcessor, {"sequence_bias": [[[], 1.0]]}, "`sequence_bias`.*non-empty"),
    (T.SequenceBiasProcessor, {"sequence_bias": [[[1, -2], 1.0]]}, r"`sequence_bias`.*-2"),
    (T.SequenceBiasProcessor, {"sequence_bias": [[[1], "x"]]}, "`sequence_bias`.*numeric"),
    (T.SequenceBiasProcessor, {"sequence_bias": [[[1], math.nan]]}, "NaN and \\+inf refused"),
    (T.SequenceBiasProcessor, {"sequence_bias": [[[1, 60], 1.0]], "ctx": make_context(vocab_size=50)}, r"\[0, 50\).*\[60\]"),  # noqa: E501
    (T.MinLengthProcessor, {"min_length": -1, "eos_token_id": 2}, "`min_length`.*non-negative.*-1"),
    (T.MinLengthProcessor, {"min_length": 2.0, "eos_token_id": 2}, "`min_length`.*2.0"),
    (T.MinLengthProcessor, {"min_length": 2, "eos_token_id": [-1]}, r"`eos_token_id`.*\[-1\]"),
    (T.ForcedBOSTokenProcessor, {"bos_token_id": -1}, "`forced_bos_token_id`.*-1"),
    (T.ForcedBOSTokenProcessor, {"bos_token_id": 64, "ctx": make_context(vocab_size=32)}, r"\[0, 32\).*\[64\]"),  # noqa: E501
    (T.ForcedEOSTokenProcessor, {"max_length": 0, "eos_token_id": 2}, "`max_length`.*positive.*0"),
    (T.ForcedEOSTokenProcessor, {"max_length": 9, "eos_token_id": []}, "at least one token"),
    (T.ForcedEOSTokenProcessor, {"max_length": 9, "eos_token_id": [2.5]}, "`eos_token_id`"),
    (T.ExponentialDecayLengthPenaltyProcessor, {"start_index": -1, "decay_factor": 1.1, "eos_token_id": 2}, "`start_index`.*-1"),  # noqa: E501
    (T.ExponentialDecayLengthPenaltyProcessor, {"start_index": 1, "decay_factor": math.inf, "eos_token_id": 2}, "`decay_factor`.*finite"),  # noqa: E501
    (T.ExponentialDecayLengthPenaltyProcessor, {"start_index": 1, "decay_factor": 1.1, "eos_token_id": "2"}, "`eos_token_id`"),  # noqa: E501
    (T.SuppressTokensProcessor, {"suppress_tokens": [1, -1]}, r"`suppress_tokens`.*-1"),
    (T.BeginSuppressTokensProcessor, {"begin_suppress_tokens": "a"}, "`begin_suppress_tokens`"),
    (T.BeginSuppressTokensProcessor, {"begin_suppress_tokens": [1], "begin_index": -2}, "`begin_index`.*-2"),  # noqa: E501
    (R.EpsilonCutoffProcessor, {"epsilon": 1.0}, r"`epsilon_cutoff`.*> 0 and < 1.*1\.0"),
    (R.EpsilonCutoffProcessor, {"epsilon": -0.1}, "`epsilon_cutoff`.*-0.1"),
    (R.EpsilonCutoffProcessor, {"epsilon": 0.1, "min_tokens_to_keep": 0}, "`min_tokens_to_keep`"),
    (R.EtaCutoffProcessor, {"epsilon": math.nan}, "`eta_cutoff`.*nan"),
    (R.EtaCutoffProcessor, {"epsilon": "0.1"}, "`eta_cutoff`"),
]  # fmt: skip


@pytest.mark.parametrize(("factory", "kwargs", "message"), BAD_ARGS)
def test_bad_arguments_raise_config_error(factory, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        factory(**kwargs)


def test_ids_outside_the_scores_raise_config_error_at_the_call():
    scores, ids = np.zeros((1, 8), np.float32), np.zeros((1, 1), np.int64)
    for proc in (
        T.SequenceBiasProcessor([[[9], 1.0]]),
        T.ForcedBOSTokenProcessor(9),
        T.ForcedEOSTokenProcessor(2, 9),
        T.ExponentialDecayLengthPenaltyProcessor(0, 1.5, 9, 0),
    ):
        with pytest.raises(ConfigError, match=r"\[0, 8\).*\[9\]"):
            proc(ids, scores)


@pytest.mark.parametrize("zero", [0, 0.0])
def test_off_values_give_an_unchanged_copy(zero):
    ids, scores = random_case(np.random.default_rng(1))
    for proc in (
        R.EpsilonCutoffProcessor(zero),
        R.EtaCutoffProcessor(zero),
        T.MinLengthProcessor(zero if isinstance(zero, int) else 0, [2]),
        T.ExponentialDecayLengthPenaltyProcessor(0, 1, [2], 0),
        T.SuppressTokensProcessor([]),
    ):
        out = proc(ids, scores)
        assert out is not scores
        np.testing.assert_array_equal(out, scores)


def test_hookimpls_register_every_rule_under_its_field_name():
    registered: dict[str, Any] = {}
    for module in (T, R):
        module.register_logits_processors(lambda name, f, **kw: registered.setdefault(name, f))
    assert set(registered) == {
        "sequence_bias", "min_length", "forced_bos_token_id", "forced_eos_token_id",
        "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
        "begin_suppress_tokens", "renormalize_logits", "epsilon_cutoff", "eta_cutoff",
    }  # fmt: skip
    registry = build_registry(make_plugin_manager(load_entry_points=False))
    assert set(registered) <= set(registry.names("logits_processor"))


# --------------------------------------------------------------------------- generate


@pytest.fixture(scope="module")
def free(models) -> np.ndarray:
    """Plain greedy, no EOS: what each setting must change."""
    return hf_generate(models[0], PROMPTS, max_new_tokens=NEW, eos_token_id=None)


def rule_settings(case: str, free: np.ndarray) -> dict[str, Any]:
    """Settings that bite on this model: tokens picked from its free output."""
    width = max(map(len, PROMPTS))
    gen = free[:, width:]

    def t(row: int, step: int) -> int:
        return int(gen[row, step])

    return {
        "suppress_tokens": {"suppress_tokens": [t(0, 1), t(1, 0), t(2, 3)], "eos_token_id": None},
        "begin_suppress_tokens": {
            "begin_suppress_tokens": [t(0, 0), t(1, 0), t(2, 0)], "eos_token_id": None,
        },
        "sequence_bias": {
            "sequence_bias": [[[t(0, 1)], -4.0], [[t(1, 2), t(1, 3)], -20.0], [[t(2, 5)], 3.0]],
            "eos_token_id": None,
        },
        "min_length": {"min_length": width + 8, "eos_token_id": t(0, 2)},
        "forced_eos_token_id": {"forced_eos_token_id": t(1, 1), "eos_token_id": None},
        "exponential_decay_length_penalty": {
            "exponential_decay_length_penalty": (2, 2.5), "eos_token_id": t(0, 10),
        },
        "renormalize,remove_invalid": {
            "renormalize_logits": True, "remove_invalid_values": True, "eos_token_id": None,
        },
    }[case]  # fmt: skip


RULE_CASES = [
    "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "min_length",
    "forced_eos_token_id", "exponential_decay_length_penalty", "renormalize,remove_invalid",
]  # fmt: skip


@pytest.mark.parametrize("case", RULE_CASES)
def test_greedy_with_token_rules_equals_transformers(models, free, case):
    model, gen = models
    settings = rule_settings(case, free)
    hf_settings = dict(settings)
    if "sequence_bias" in settings:  # HF's list form refuses id 0; its dict form does not
        hf_settings["sequence_bias"] = {tuple(ids): b for ids, b in settings["sequence_bias"]}
    expected = hf_generate(model, PROMPTS, max_new_tokens=NEW, **hf_settings)
    out = gen.generate(PROMPTS, max_new_tokens=NEW, **settings)
    np.testing.assert_array_equal(out.sequences, expected)
    changed = expected.shape != free.shape or not np.array_equal(expected, free)
    assert changed == (case != "renormalize,remove_invalid"), case


def test_forced_bos_on_a_one_token_prompt_in_generate(models):
    model, gen = models
    expected = hf_generate(model, [[5]], max_new_tokens=4, eos_token_id=None, forced_bos_token_id=7)
    out = gen.generate([5], max_new_tokens=4, eos_token_id=None, forced_bos_token_id=7)
    np.testing.assert_array_equal(out.sequences, expected)
    assert out.tokens[0][0] == 7
