"""The built-in stopping criteria (ortgen.plugins.stopping) against Hugging Face's."""

from __future__ import annotations

import inspect
import time

import numpy as np
import pytest
import torch
import transformers.generation.stopping_criteria as hf

from ortgen import ConfigError, GenerationContext
from ortgen.plugins import stopping as S
from ortgen.testing import make_context

SCORES = np.zeros((1, 1), np.float32)  # criteria here ignore the scores


def make_ctx(eos) -> GenerationContext:
    return make_context(vocab_size=10, eos_token_ids=eos)


def hf_done(criterion, input_ids: np.ndarray) -> np.ndarray:
    return criterion(torch.from_numpy(input_ids), torch.zeros(1)).numpy()


@pytest.mark.parametrize("eos", [0, 3, [3], [1, 4], [2, 3, 5, 7]])
def test_eos_matches_hf(eos):
    ids = np.random.default_rng(0).integers(0, 8, (64, 5))
    done = S.EosCriterion(eos)(ids, SCORES)
    assert done.dtype == np.bool_ and done.shape == (64,)
    np.testing.assert_array_equal(done, hf_done(hf.EosTokenCriteria(eos), ids))
    assert done.any() and not done.all()
    assert S.EosCriterion.finish_reason == "eos"


def test_eos_looks_only_at_the_last_token():
    ids = np.array([[3, 1], [1, 3]])
    assert S.EosCriterion(3)(ids, SCORES).tolist() == [False, True]


def test_eos_defaults_to_the_request_eos_ids():
    crit = S.EosCriterion(ctx=make_ctx((4, 6)))
    assert crit.eos_token_id == (4, 6)
    assert crit(np.array([[1, 6], [6, 1]]), SCORES).tolist() == [True, False]


@pytest.mark.parametrize("max_length", [1, 4, 5, 6, 100])
def test_max_length_matches_hf(max_length):
    ids = np.zeros((3, 5), np.int64)
    done = S.MaxLengthCriterion(max_length)(ids, SCORES)
    assert done.dtype == np.bool_ and done.shape == (3,)
    np.testing.assert_array_equal(done, hf_done(hf.MaxLengthCriteria(max_length), ids))
    assert done.all() == (max_length <= 5)
    assert S.MaxLengthCriterion.finish_reason == "length"


class FakeClock:
    """A clock that only moves when the test moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fake_clocked(clock: FakeClock) -> type[S.MaxTimeCriterion]:
    class Clocked(S.MaxTimeCriterion):
        pass

    Clocked.clock = staticmethod(clock)
    return Clocked


def test_max_time_counts_from_construction():
    clock = FakeClock()
    ids = np.zeros((2, 3), np.int64)
    clock.now = 1000.0
    crit = fake_clocked(clock)(0.5)
    clock.now = 5000.0  # time before construction does not count; only time since
    later = fake_clocked(clock)(0.5)
    assert crit.finish_reason == "time"
    assert later(ids, SCORES).tolist() == [False, False]
    assert crit(ids, SCORES).tolist() == [True, True]
    clock.now = 5000.5  # exactly max_time elapsed: not finished yet (strictly greater)
    assert later(ids, SCORES).tolist() == [False, False]
    clock.now = 5000.5001
    assert later(ids, SCORES).tolist() == [True, True]


def test_max_time_matches_hf_on_the_same_elapsed_times(monkeypatch):
    """HF's MaxTimeCriteria reads time.time(); ortgen's reads the injected clock. With
    both clocks driven by the same fake, they agree at every elapsed time, the boundary
    included."""
    clock = FakeClock()
    monkeypatch.setattr(hf.time, "time", clock)
    ids = np.zeros((3, 4), np.int64)
    for max_time in (0.0, 0.25, 2.0):
        clock.now = 1000.0
        ours, theirs = fake_clocked(clock)(max_time), hf.MaxTimeCriteria(max_time)
        seen = set()
        for elapsed in (0.0, 0.1, 0.25, 0.26, 1.0, 2.0, 2.5):
            clock.now = 1000.0 + elapsed
            done = ours(ids, SCORES)
            assert done.dtype == np.bool_ and done.shape == (3,)
            assert done.tolist() == hf_done(theirs, ids).tolist(), (max_time, elapsed)
            seen.add(bool(done[0]))
        assert seen == {False, True}, max_time


def test_max_time_default_clock_is_monotonic():
    assert S.MaxTimeCriterion.clock is time.monotonic
    crit = S.MaxTimeCriterion(3600)
    assert crit(np.zeros((2, 3), np.int64), SCORES).tolist() == [False, False]
    assert "clock" not in inspect.signature(S.MaxTimeCriterion).parameters  # not a setting


BAD_ARGS = [
    (S.EosCriterion, {"eos_token_id": []}, r"`eos_token_id`.*at least one.*\[\]"),
    (S.EosCriterion, {"eos_token_id": None}, "`eos_token_id`.*None"),
    (S.EosCriterion, {"eos_token_id": None, "ctx": make_ctx(())}, "no EOS ids"),
    (S.EosCriterion, {"eos_token_id": -1}, "`eos_token_id`.*non-negative.*-1"),
    (S.EosCriterion, {"eos_token_id": [2, "3"]}, r"`eos_token_id`.*\[2, '3'\]"),
    (S.EosCriterion, {"eos_token_id": "2"}, "`eos_token_id`.*'2'"),
    (S.MaxLengthCriterion, {"max_length": 0}, "`max_length`.*positive.*0"),
    (S.MaxLengthCriterion, {"max_length": 10.0}, "`max_length`.*10.0"),
    (S.MaxTimeCriterion, {"max_time": -1}, "`max_time`.*non-negative.*-1"),
    (S.MaxTimeCriterion, {"max_time": float("inf")}, "`max_time`.*inf"),
    (S.MaxTimeCriterion, {"max_time": "1s"}, "`max_time`.*'1s'"),
]


@pytest.mark.parametrize(("factory", "kwargs", "message"), BAD_ARGS)
def test_bad_arguments_raise_config_error(factory, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        factory(**kwargs)


def test_hookimpl_registers_the_criteria():
    registered = {}
    S.register_stopping_criteria(lambda name, factory, **kw: registered.setdefault(name, factory))
    assert registered == {
        "eos": S.EosCriterion,
        "max_length": S.MaxLengthCriterion,
        "max_time": S.MaxTimeCriterion,
    }


def test_an_end_token_in_the_last_place_allowed_is_eos(tiny_text_model) -> None:
    """A row whose last allowed token is its end token ended its answer: ``eos`` (what
    vLLM and OpenAI report), not ``length``. Here a regex of exactly ``n - 1`` letters
    makes the end token the ``n``-th; it was reported as ``length``."""
    import ortgen

    gen = ortgen.load(tiny_text_model, threads=1)
    for n in (3, 7):
        out = gen.generate("ab", max_new_tokens=n, regex=f"[a-z]{{{n - 1}}}", seed=0,
                                       do_sample=True)  # fmt: skip
        assert len(out.tokens[0]) == n and out.finish_reasons == ["eos"], out
        cut = gen.generate("ab", max_new_tokens=n - 1, regex=f"[a-z]{{{n - 1}}}",
                                       seed=0, do_sample=True)  # fmt: skip
        assert cut.finish_reasons == ["length"]
