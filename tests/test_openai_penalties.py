"""OpenAI's presence/frequency penalties and logit_bias (ortgen.plugins.openai_penalties).

The reference is OpenAI's definition ("Frequency and presence penalties" in its parameter
guide): ``mu[j] -= c[j] * alpha_frequency + float(c[j] > 0) * alpha_presence`` with ``c[j]``
the count of ``j`` among the tokens sampled so far, in float32 as vLLM's ``apply_penalties``
(vllm/model_executor/layers/utils.py) computes it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortgen import ConfigError
from ortgen.plugins import openai_penalties as O
from ortgen.testing import check_logits_processor, make_context

F32 = np.float32


def ref_penalties(ids, prompt_length, logits, presence, frequency):
    """Plain loops: counts over the generated tokens only, then OpenAI's formula."""
    out = [F32(x) for x in logits]
    counts: dict[int, int] = {}
    for token in ids[prompt_length:]:
        counts[token] = counts.get(token, 0) + 1
    for token, c in counts.items():
        if frequency:
            out[token] = F32(out[token] - F32(F32(frequency) * F32(c)))
        if presence:
            out[token] = F32(out[token] - F32(presence))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_penalties_equal_openai_definition(seed):
    rng = np.random.default_rng(seed)
    batch, vocab, length = 4, 16, int(rng.integers(1, 30))
    prompt_length = int(rng.integers(0, length + 1))
    ids = rng.integers(0, 6, (batch, length)).astype(np.int64)
    scores = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
    scores[rng.random(scores.shape) < 0.2] = -np.inf
    presence, frequency = (float(x) for x in rng.uniform(-2, 2, 2))
    ctx = make_context(vocab_size=vocab, batch_size=batch, prompt_length=prompt_length)
    by_frequency = check_logits_processor(
        O.FrequencyPenaltyProcessor(frequency, ctx=ctx), ids, scores
    )
    both = check_logits_processor(O.PresencePenaltyProcessor(presence, ctx=ctx), ids, by_frequency)
    for row in range(batch):
        want = ref_penalties(ids[row].tolist(), prompt_length, scores[row], presence, frequency)
        np.testing.assert_array_equal(both[row], want)
        only_f = ref_penalties(ids[row].tolist(), prompt_length, scores[row], 0.0, frequency)
        np.testing.assert_array_equal(by_frequency[row], only_f)


def test_prompt_tokens_are_not_counted():
    ctx = make_context(vocab_size=5, prompt_length=3)
    ids = np.array([[1, 1, 1, 2, 2]])
    zeros = np.zeros((1, 5), np.float32)
    np.testing.assert_array_equal(
        O.FrequencyPenaltyProcessor(0.5, ctx=ctx)(ids, zeros), [[0, 0, -1.0, 0, 0]]
    )
    np.testing.assert_array_equal(
        O.PresencePenaltyProcessor(0.5, ctx=ctx)(ids, zeros), [[0, 0, -0.5, 0, 0]]
    )
    nothing_yet = ids[:, :3]
    np.testing.assert_array_equal(O.PresencePenaltyProcessor(2, ctx=ctx)(nothing_yet, zeros), zeros)


def test_zero_is_off_and_gives_a_copy():
    ctx = make_context(vocab_size=4, prompt_length=0)
    scores = np.arange(4, dtype=np.float32)[None]
    for proc in (O.PresencePenaltyProcessor(0, ctx=ctx), O.FrequencyPenaltyProcessor(0.0, ctx=ctx)):
        out = proc(np.array([[1, 2]]), scores)
        assert out is not scores and np.array_equal(out, scores)


@pytest.mark.parametrize("value", [2.5, -2.01, float("nan"), float("inf"), True, "1"])
@pytest.mark.parametrize("cls", [O.PresencePenaltyProcessor, O.FrequencyPenaltyProcessor])
def test_penalty_outside_openai_range_is_refused(cls, value):
    with pytest.raises(ConfigError, match=r"\[-2, 2\]"):
        cls(value, ctx=make_context())


# --- logit_bias --------------------------------------------------------------------------


def test_logit_bias_adds_to_the_chosen_tokens():
    ctx = make_context(vocab_size=6, batch_size=2)
    scores = np.array([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, -np.inf]], np.float32)
    proc = O.LogitBiasProcessor({"1": -100, 5: 2.5, 0: 0.0}, ctx=ctx)
    out = check_logits_processor(proc, np.zeros((2, 3), np.int64), scores)
    want = scores.copy()
    want[:, 1] -= 100
    want[:, 5] += 2.5
    np.testing.assert_array_equal(out, want)
    assert proc.logit_bias == {0: 0.0, 1: -100.0, 5: 2.5}


@pytest.mark.parametrize(
    ("bias", "message"),
    [
        ({7: 1.0}, r"\[0, 6\).*\[7\]"),
        ({"x": 1.0}, "token ids"),
        ({-1: 1.0}, "token ids"),
        ({True: 1.0}, "token ids"),
        ({1: 101.0}, r"logit_bias\[1\].*\[-100, 100\]"),
        ({1: float("nan")}, r"logit_bias\[1\]"),
        ([1, 2], "mapping"),
    ],
)
def test_logit_bias_bad_values(bias, message):
    with pytest.raises(ConfigError, match=message):
        O.LogitBiasProcessor(bias, ctx=make_context(vocab_size=6))


# --- properties -------------------------------------------------------------------------

FLOATS = st.one_of(st.floats(-1e4, 1e4, width=32), st.just(float("-inf")))


@settings(max_examples=60, deadline=None)
@given(
    scores=hnp.arrays(
        np.float32, hnp.array_shapes(min_dims=2, max_dims=2, max_side=9), elements=FLOATS
    ),
    data=st.data(),
)
def test_processors_keep_shape_dtype_inputs_and_add_no_nan(scores, data):
    batch, vocab = scores.shape
    length = data.draw(st.integers(0, 10))
    ids = data.draw(hnp.arrays(np.int64, (batch, length), elements=st.integers(0, vocab - 1)))
    ctx = make_context(
        vocab_size=vocab, batch_size=batch, prompt_length=data.draw(st.integers(0, 5))
    )
    penalty = st.floats(-2, 2)
    bias = data.draw(st.dictionaries(st.integers(0, vocab - 1), st.floats(-100, 100), max_size=4))
    procs = [
        O.PresencePenaltyProcessor(data.draw(penalty), ctx=ctx),
        O.FrequencyPenaltyProcessor(data.draw(penalty), ctx=ctx),
        O.LogitBiasProcessor(bias, ctx=ctx),
    ]
    for proc in procs:
        out = check_logits_processor(proc, ids, scores)
        assert out.dtype == np.float32 and out.shape == scores.shape
        assert not np.isnan(out).any()
        np.testing.assert_array_equal(out == -np.inf, scores == -np.inf)


# --- through the flat settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    "flat",
    [
        {"presence_penalty": 1.0},
        {"frequency_penalty": 1.5},
        {"presence_penalty": -0.5, "frequency_penalty": 0.7, "logit_bias": {"3": 5.0}},
    ],
)
def test_flat_settings_run_and_reproduce(tiny_llama_gen, flat):
    def run(seed):
        out = tiny_llama_gen.generate(
            [5, 6, 7], do_sample=True, seed=seed, max_new_tokens=12, **flat
        )
        return out.tokens

    first = run(1)
    assert first[0] and run(1) == first  # (a row may stop at EOS before 12)


def test_logit_bias_steers_greedy_decoding(tiny_llama_gen):
    out = tiny_llama_gen.generate([5, 6, 7], max_new_tokens=6, logit_bias={9: 100.0})
    assert out.tokens[0] == [9] * 6


def test_frequency_penalty_breaks_a_biased_repeat(tiny_llama_gen):
    # token 9 leads token 10 by the bias gap of 5; 2 per repeat of 9 soon closes it
    bias = {9: 100.0, 10: 95.0}
    plain = tiny_llama_gen.generate([5, 6, 7], max_new_tokens=8, logit_bias=bias).tokens[0]
    tokens = tiny_llama_gen.generate(
        [5, 6, 7], max_new_tokens=8, logit_bias=bias, frequency_penalty=2.0
    ).tokens[0]
    assert plain == [9] * 8
    assert set(tokens) == {9, 10} and tokens[0] == 9


@pytest.mark.parametrize(
    ("flat", "message"),
    [
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"logit_bias": {"1": 500}}, "logit_bias"),
        ({"logit_bias": {"10000000": 1}}, "10000000"),
        ({"logit_bias": {"a": 1}}, "logit_bias"),
    ],
)
def test_bad_flat_settings_raise_config_error(tiny_llama_gen, flat, message):
    with pytest.raises(ConfigError, match=message):
        tiny_llama_gen.generate([5, 6, 7], do_sample=True, max_new_tokens=2, **flat)
