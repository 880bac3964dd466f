"""ortgen.testing's KV-cache check: every built-in cache passes it on the graph families it
serves, and caches with the bugs a backend author makes (a crop that keeps the wrong end,
a reorder that moves nothing, a fork that shares memory, a crop that forgets to shrink)
fail it, naming the scenario. No export stack: the model is ``FakeModel``."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import ortgen
from ortgen.plugins.caches import DynamicCache, StaticCache
from ortgen.plugins.kv_prefix import PrefixCache
from ortgen.plugins.kv_quantized import QuantizedCache
from ortgen.plugins.kv_window import SlidingWindowFactory
from ortgen.testing import FakeModel, check_kv_cache

SCENARIOS = {"batch", "sampled", "rewind", "append", "fork", "beams"}


@pytest.mark.parametrize("layout", ["concat", "shared"])
@pytest.mark.parametrize("factory", [StaticCache, PrefixCache], ids=["static", "prefix"])
def test_built_in_caches_pass_every_scenario(factory, layout) -> None:
    report = check_kv_cache(factory, layout=layout)
    assert set(report) == SCENARIOS
    assert all(result.startswith("same as") for result in report.values()), report


def test_dynamic_passes_on_concat_graphs_and_says_why_it_skips_shared_ones() -> None:
    assert all(r == "same as 'dynamic'" for r in check_kv_cache(DynamicCache).values())
    shared = check_kv_cache(DynamicCache, layout="shared")
    assert all("cannot hold prompts of different lengths" in r for r in shared.values())


def test_a_window_as_long_as_the_sequence_is_exact() -> None:
    with pytest.warns(UserWarning, match="approximates full attention"):  # not once past 64
        report = check_kv_cache(SlidingWindowFactory(), {"window": 64})
    assert report["batch"] == "same as 'dynamic'" and report["beams"] == "same as 'dynamic'"


def test_an_approximate_cache_runs_without_comparison() -> None:
    report = check_kv_cache(QuantizedCache, exact=False)
    assert set(report.values()) <= {"ran"} | {r for r in report.values() if "skipped" in r}
    with pytest.raises(ortgen.ComponentError, match="differs from the 'dynamic' cache"):
        check_kv_cache(QuantizedCache)  # its int8 values change the logits: caught


class BufferCache:
    """A concat-graph cache in preallocated numpy buffers, written against the public
    contract only; ``bug`` switches in one mistake."""

    def __init__(self, *, ctx: ortgen.GenerationContext, bug: str = "") -> None:
        signature = ctx.signature
        assert signature is not None
        self.signature = signature
        self._names = signature.past_inputs
        shape = (ctx.batch_size, signature.num_kv_heads, ctx.max_length + 64, signature.head_dim)
        self._buffers = [np.zeros(shape, np.float32) for _ in self._names]
        self._length = 0
        self.bug = bug

    def inputs(self) -> dict[str, Any]:
        return {n: b[:, :, : self._length] for n, b in zip(self._names, self._buffers, strict=True)}

    def update(self, presents: list[Any]) -> None:
        arrays = [p if isinstance(p, np.ndarray) else p.numpy() for p in presents]
        total = arrays[0].shape[2]
        for buffer, array in zip(self._buffers, arrays, strict=True):
            buffer[:, :, :total] = array
        self._length = total

    def reorder(self, rows: np.ndarray) -> None:
        if self.bug != "reorder_ignored":
            self._buffers = [b[rows] for b in self._buffers]

    def crop(self, length: int) -> None:
        if self.bug == "crop_wrong_end":
            for b in self._buffers:
                b[:, :, :length] = b[:, :, self._length - length : self._length].copy()
        if self.bug != "crop_keeps_length":
            self._length = length

    def fork(self) -> BufferCache:
        twin = copy.copy(self)
        if self.bug != "fork_shares":
            twin._buffers = [b.copy() for b in self._buffers]
        return twin

    @property
    def length(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)


def test_a_correct_third_party_cache_passes() -> None:
    assert all(r == "same as 'dynamic'" for r in check_kv_cache(BufferCache).values())


@pytest.mark.parametrize(
    ("bug", "scenario", "message"),
    [
        ("crop_wrong_end", "rewind", "differs from the 'dynamic' cache"),
        ("crop_keeps_length", "rewind", "attention_mask shape"),
        ("reorder_ignored", "beams", "differs from the 'dynamic' cache"),
        ("fork_shares", "fork", "differs from the 'dynamic' cache"),
    ],
)
def test_a_broken_cache_fails_naming_the_scenario(bug, scenario, message) -> None:
    with pytest.raises(ortgen.ComponentError, match=f"scenario '{scenario}'") as caught:
        check_kv_cache(BufferCache, {"bug": bug})
    assert message in str(caught.value)


def test_the_fake_model_refuses_what_onnxruntime_would() -> None:
    binding = FakeModel().binding()
    past = {n: np.zeros((1, 2, 3, 8), np.float32) for n in FakeModel().signature.past_inputs}
    ids, positions = np.array([[1]]), np.array([[3]])
    logits, _ = binding.forward(ids, np.ones((1, 4), np.int64), positions, past)
    assert logits.shape == (1, 1, 48)
    with pytest.raises(ValueError, match=r"attention_mask shape \(1, 3\)"):
        binding.forward(ids, np.ones((1, 3), np.int64), positions, past)
    wrong = {**past, "past_key_values.0.key": np.zeros((1, 2, 3, 4), np.float32)}
    with pytest.raises(ValueError, match=r"past_key_values\.0\.key: shape"):
        binding.forward(ids, np.ones((1, 4), np.int64), positions, wrong)


def test_static_keeps_the_selected_row_when_it_grows(fused_model_dirs) -> None:
    """Found by the check's ``append`` scenario on a shared graph: a continued batch of
    prompts of different lengths grows the static cache while one row is selected, and
    growing used to expose every row again (the graph then got a 2-row past for a
    1-row feed). On the real fused graph: each row continues as it would alone."""
    gen = ortgen.load(fused_model_dirs["llama"][1], threads=1)
    prompts = [[5, 9, 14, 3], [7, 1, 22, 8, 30, 11, 2]]
    state = gen.start(prompts, max_new_tokens=3, do_sample=False)
    while not state.is_done:
        state.step()
    state.append([[4, 6, 10, 12]] * 2)
    picked = state.step()
    for row, prompt in enumerate(prompts):
        alone = gen.generate([[*prompt, *state.generated(row)[:3], 4, 6, 10, 12]],
                             max_new_tokens=1, do_sample=False)  # fmt: skip
        assert int(picked[row]) == alone.tokens[0][0]
