"""Generation.fork(): a request copied as it stands, with its own copy of the KV cache,
continues exactly as the original would, on every built-in backend and both graph
families, even when the two are stepped in turn; branches that diverge stay apart."""

from __future__ import annotations

import numpy as np
import pytest

import ortgen
from ortgen import InputError, hookimpl
from ortgen.plugins.caches import DynamicCache

CACHES = [
    "dynamic",
    "static",
    "prefix",
    {"name": "sliding_window", "window": 6},
    {"name": "quantized", "bits": 8},
]
PROMPTS = [[5, 17, 42, 99, 3, 64], [7, 8, 9, 10, 11, 12]]


@pytest.fixture(scope="module", params=["optimum", "fused"])
def gen(request, tiny_model_dirs, fused_model_dirs):
    dirs = tiny_model_dirs if request.param == "optimum" else fused_model_dirs
    return ortgen.load(dirs["llama"][1], threads=1)


def _steps(state, count: int) -> list[list[int]]:
    return [state.step().ids.tolist() for _ in range(count)]


@pytest.mark.parametrize("cache", CACHES, ids=lambda c: c if isinstance(c, str) else c["name"])
def test_a_fork_continues_as_the_original_would(gen, cache):
    """The original goes on; the fork takes other tokens first. Stepped in turn, each
    equals the same request run without a fork, so neither read or overwrote the
    other's keys/values."""
    call = dict(max_new_tokens=30, eos_token_id=None, cache=cache, do_sample=False)
    prompts, other = PROMPTS, [[120, 121], [130, 131]]
    if cache == "dynamic" and gen.model.signature.shared_kv:
        # dynamic cannot feed a batch several tokens per row on a fused graph (an append
        # there goes row by row): one row
        prompts, other = PROMPTS[:1], other[:1]
    plain = gen.start(prompts, **call)
    _steps(plain, 4)
    expected = _steps(plain, 10)
    diverted = gen.start(prompts, **call)
    _steps(diverted, 4)
    diverted.append(other)
    expected_fork = _steps(diverted, 10)
    assert expected_fork != expected

    state = gen.start(prompts, **call)
    _steps(state, 4)
    twin = state.fork()
    assert twin.chain.cache is not state.chain.cache
    twin.append(other)
    mine, theirs = [], []
    for _ in range(10):
        mine.append(state.step().ids.tolist())
        theirs.append(twin.step().ids.tolist())
    assert mine == expected and theirs == expected_fork
    np.testing.assert_array_equal(state.sequences, plain.sequences)
    np.testing.assert_array_equal(twin.sequences, diverted.sequences)


def test_branches_that_diverge_stay_apart(gen):
    """One prefill, two branches: each equals a fresh request with its own history."""
    call = dict(max_new_tokens=20, eos_token_id=None, do_sample=False)
    state = gen.start([PROMPTS[0]], **call)
    _steps(state, 3)
    branch = state.fork()
    state.append([[101, 102]])
    branch.append([[150]])
    for current in (state, branch):
        history = current.sequences[0].tolist()
        continued = _steps(current, 5)
        fresh = gen.start([history], **call)
        assert continued == _steps(fresh, 5)


def test_a_fork_keeps_the_text_and_the_record(default_gen):
    state = default_gen.start(
        "Name three colours.", max_new_tokens=12, do_sample=False, logprobs=True
    )
    _steps(state, 4)
    twin = state.fork()
    assert twin.text() == state.text()
    while not state.is_done:
        state.step()
        twin.step()
    assert twin.text() == state.text() and twin.generated(0) == state.generated(0)
    assert twin.logprobs(0) == state.logprobs(0)


def test_sampling_forks_copy_the_random_stream_or_reseed_it(gen):
    call = dict(max_new_tokens=12, eos_token_id=None, do_sample=True, top_k=20, seed=3)
    state = gen.start(PROMPTS, **call)
    _steps(state, 2)
    same, first, second = state.fork(), state.fork(seed=11), state.fork(seed=11)
    original = _steps(state, 10)
    assert _steps(same, 10) == original  # the copied stream draws what the original draws
    reseeded = _steps(first, 10)
    assert _steps(second, 10) == reseeded  # one seed, one stream
    assert reseeded != original


class NoForkCache:
    """A backend without fork() (a dynamic cache's other methods): forking a request that
    uses it is refused."""

    def __init__(self, *, ctx) -> None:
        self._inner = DynamicCache(ctx=ctx)
        self.signature = self._inner.signature

    def inputs(self):
        return self._inner.inputs()

    def update(self, presents) -> None:
        self._inner.update(presents)

    def reorder(self, rows) -> None:
        self._inner.reorder(rows)

    def crop(self, length: int) -> None:
        self._inner.crop(length)

    @property
    def length(self) -> int:
        return self._inner.length

    @property
    def nbytes(self) -> int:
        return self._inner.nbytes


def test_what_cannot_be_forked_is_named(tiny_model_dirs):
    class Plugin:
        @hookimpl
        def register_kv_caches(self, register):
            register("no_fork", NoForkCache)

    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[Plugin()])
    state = gen.start(PROMPTS, max_new_tokens=4, cache="no_fork")
    state.step()
    with pytest.raises(InputError, match="kv cache 'no_fork' cannot be forked"):
        state.fork()
    greedy = gen.start(PROMPTS, max_new_tokens=4, do_sample=False)
    with pytest.raises(InputError, match="sampler 'greedy' cannot be reseeded"):
        greedy.fork(seed=1)
