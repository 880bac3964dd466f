"""ortgen.testing's KV-cache check: every built-in cache passes it on the graph families it
serves, and caches with the bugs a backend author makes (a crop that keeps the wrong end,
a crop that does nothing, a reorder that moves nothing, a fork that shares memory) fail
it on both families, naming the layout and the scenario. No export stack: the model is
``FakeModel``."""

from __future__ import annotations

import copy
import re
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
LAYOUTS = {"concat", "shared"}


@pytest.mark.parametrize("factory", [StaticCache, PrefixCache], ids=["static", "prefix"])
def test_built_in_caches_pass_every_scenario_on_both_layouts(factory) -> None:
    report = check_kv_cache(factory)  # both layouts unless one is asked for
    assert set(report) == LAYOUTS
    assert all(set(scenarios) == SCENARIOS for scenarios in report.values())
    assert all(r == "same as 'dynamic'" for r in report["concat"].values()), report
    assert all(r == "same as 'static'" for r in report["shared"].values()), report


def test_a_layout_argument_restricts_the_check_to_it() -> None:
    assert set(check_kv_cache(StaticCache, layout="shared")) == {"shared"}
    assert set(check_kv_cache(StaticCache, model=FakeModel(layout="concat"))) == {"concat"}
    with pytest.raises(ValueError, match="layout must be one of"):
        check_kv_cache(StaticCache, layout="fused")


def test_dynamic_is_checked_on_shared_graphs_with_prompts_of_one_length() -> None:
    """It has no select(row), so the loop refuses it prompts of different lengths on a
    shared graph; it used to skip every scenario there, and now runs them all on
    prompts it can serve, and says what went unchecked."""
    report = check_kv_cache(DynamicCache)
    assert all(r == "same as 'dynamic'" for r in report["concat"].values())
    for result in report["shared"].values():
        assert result.startswith("same as 'static' (prompts of one length"), result
        assert "select(row)" in result


def test_a_window_as_long_as_the_sequence_is_exact() -> None:
    with pytest.warns(UserWarning, match="approximates full attention"):  # not once past 64
        report = check_kv_cache(SlidingWindowFactory(), {"window": 64}, layout="concat")
    assert report["concat"]["batch"] == "same as 'dynamic'"
    assert report["concat"]["beams"] == "same as 'dynamic'"


def test_an_approximate_cache_runs_without_comparison() -> None:
    report = check_kv_cache(QuantizedCache, exact=False)
    assert {r for scenarios in report.values() for r in scenarios.values()} == {"ran"}
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
    report = check_kv_cache(BufferCache)
    assert all(r == "same as 'dynamic'" for r in report["concat"].values())
    assert all(r.startswith("same as 'static'") for r in report["shared"].values())


@pytest.mark.parametrize("layout", ["concat", "shared"])
@pytest.mark.parametrize(
    ("bug", "scenario", "message"),
    [
        ("crop_wrong_end", "rewind", "differs from the"),
        # on a shared graph the stale positions are past each row's length and never
        # read: only the cache's length gives the no-op away
        ("crop_keeps_length", "rewind", "after rewind(3) the cache's length is"),
        ("reorder_ignored", "beams", "differs from the"),
        ("fork_shares", "fork", "differs from the"),
    ],
)
def test_a_broken_cache_fails_on_both_layouts_naming_the_scenario(
    bug, scenario, message, layout
) -> None:
    where = f"scenario '{scenario}' ({layout} graph)"
    with pytest.raises(ortgen.ComponentError, match=re.escape(where)) as caught:
        check_kv_cache(BufferCache, {"bug": bug}, layout=layout)
    assert message in str(caught.value)


class ForeignCache(BufferCache):
    """Claims the graph of another model, so the loop refuses it every request."""

    def __init__(self, *, ctx: ortgen.GenerationContext) -> None:
        super().__init__(ctx=ctx)
        self.signature = FakeModel(num_layers=3).signature


def test_a_layout_where_every_scenario_was_skipped_fails_saying_what_to_do() -> None:
    """A skip is a capability the cache lacks; when the loop refused every scenario,
    nothing was checked, which is no pass."""
    with pytest.raises(ortgen.ComponentError, match="every scenario on the concat graph was "
                       "skipped") as caught:  # fmt: skip
        check_kv_cache(ForeignCache, layout="concat")
    assert "set the cache's signature to ctx.signature" in str(caught.value)


class NoFork(BufferCache):
    fork = None  # type: ignore[assignment]


def test_a_missing_capability_is_a_skip_that_names_it() -> None:
    report = check_kv_cache(NoFork, layout="concat")
    assert report["concat"]["fork"] == (
        "skipped: the cache has no fork() (ForksCache) -> implement fork()"
    )
    assert report["concat"]["beams"] == "same as 'dynamic'"


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


def test_the_fake_shared_graph_reads_a_row_up_to_its_length_only() -> None:
    """As GroupQueryAttention: a buffer's positions past a row's length are never read,
    so what a cache leaves there (the quantized cache's uninitialised memory made the
    check fail at random with NaN scores) changes nothing, and a NaN a row may see does."""
    model = FakeModel(layout="shared")
    names = model.signature.past_inputs
    ids, mask = np.array([[1], [2]]), np.array([[1, 1, 1, 1], [1, 1, 0, 0]])  # lengths 4, 2

    def logits(fill: float, at: int) -> np.ndarray:
        past = {n: np.zeros((2, 2, 6, 8), np.float32) for n in names}
        for buffer in past.values():
            buffer[1, :, at:] = fill  # row 1 from position ``at`` on
        out, _ = model.binding().forward(ids, mask, None, past)
        return out

    clean = logits(0.0, 6)
    assert np.array_equal(logits(np.nan, 2), clean)  # past row 1's length 2: unread
    assert np.isnan(logits(np.nan, 0)[1]).all()  # inside it: read


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
    picked = state.step().ids
    for row, prompt in enumerate(prompts):
        alone = gen.generate([[*prompt, *state.generated(row)[:3], 4, 6, 10, 12]],
                             max_new_tokens=1, do_sample=False)  # fmt: skip
        assert int(picked[row]) == alone.tokens[0][0]
