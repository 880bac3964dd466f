"""The built-in samplers (ortgen.plugins.samplers)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortgen import ComponentError, GenerationContext
from ortgen.plugins import samplers as S
from ortgen.testing import make_context

IDS = np.zeros((1, 1), dtype=np.int64)


def make_ctx(seed) -> GenerationContext:
    return make_context(vocab_size=10, seed=seed)


def softmax(scores: np.ndarray) -> np.ndarray:
    weights = np.exp(scores.astype(np.float64) - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


# --- greedy -------------------------------------------------------------------


def test_greedy_is_argmax_with_ties_to_the_lowest_id():
    import torch

    rng = np.random.default_rng(0)
    scores = rng.integers(-3, 4, (64, 12)).astype(np.float32)  # many ties
    scores[rng.random(scores.shape) < 0.2] = -np.inf
    scores[:, 0] = np.maximum(scores[:, 0], -1)  # no all -inf row
    picked = S.GreedySampler()(IDS, scores)
    assert picked.dtype == np.int64 and picked.shape == (64,)
    np.testing.assert_array_equal(picked, np.argmax(scores, axis=-1))
    np.testing.assert_array_equal(picked, torch.argmax(torch.from_numpy(scores), -1).numpy())
    for row, token in enumerate(picked):
        assert token == np.flatnonzero(scores[row] == scores[row].max())[0]


def test_greedy_takes_a_plus_inf_score():
    scores = np.array([[0.0, np.inf, 1.0]], np.float32)
    assert S.GreedySampler()(IDS, scores).tolist() == [1]


@pytest.mark.parametrize(
    ("bad_row", "message"), [([-np.inf] * 4, "all -inf"), ([0, np.nan, 1, 2], "NaN")]
)
def test_greedy_refuses_a_row_without_a_pick(bad_row, message):
    scores = np.array([[0, 1, 2, 3], bad_row], np.float32)
    with pytest.raises(ComponentError, match=f"'greedy'.*row 1.*{message}"):
        S.GreedySampler()(IDS, scores)


# --- multinomial --------------------------------------------------------------


def test_same_seed_reproduces_and_other_seeds_differ():
    scores = np.random.default_rng(0).standard_normal((4, 3000)).astype(np.float32)

    def draws(seed):
        sampler = S.MultinomialSampler(ctx=make_ctx(seed))
        return np.stack([sampler(IDS, scores) for _ in range(50)])

    np.testing.assert_array_equal(draws(1), draws(1))
    assert not np.array_equal(draws(1), draws(2))
    assert not np.array_equal(draws(None), draws(None))  # fresh entropy each time


@pytest.mark.parametrize("vocab", [6, 700, 6000])  # 6000: the block-wise CDF search
def test_frequencies_match_softmax(vocab):
    """Pearson chi-square over 60000 draws per row, seeded, so the test is deterministic;
    the bound is the 0.999 quantile (a wrong distribution exceeds it by far)."""
    rng = np.random.default_rng(vocab)
    scores = (rng.standard_normal((3, vocab)) * 1.5).astype(np.float32)
    scores[:, 1::4] = -np.inf
    probs = softmax(scores)
    sampler = S.MultinomialSampler(ctx=make_ctx(123))
    n = 60000
    draws = np.stack([sampler(IDS, scores) for _ in range(n)])
    for row in range(3):
        counts = np.bincount(draws[:, row], minlength=vocab)
        assert counts[1::4].sum() == 0  # -inf never drawn
        # merge rare tokens into one cell so every expected count is >= 5
        expected = probs[row] * n
        common = expected >= 5
        observed = np.append(counts[common], counts[~common].sum())
        wanted = np.append(expected[common], expected[~common].sum())
        observed, wanted = observed[wanted > 0], wanted[wanted > 0]
        chi2 = ((observed - wanted) ** 2 / wanted).sum()
        dof = observed.size - 1
        bound = dof + 3.1 * np.sqrt(2 * dof) + 10  # ~0.999 quantile for these dofs
        assert chi2 < bound, (row, chi2, dof)


@pytest.mark.parametrize(
    ("vocab", "impossible"),
    [(3000, 0.3), (20000, 0.3), (20000, 0.99)],
    ids=["direct", "block-wise", "finite-only"],
)
def test_inverts_the_cdf_with_one_uniform_per_row(vocab, impossible):
    """The pick is the reference inverse CDF of the same uniform numbers."""
    rng = np.random.default_rng(5)
    scores = (rng.standard_normal((5, vocab)) * 2).astype(np.float32)
    scores[rng.random(scores.shape) < impossible] = -np.inf
    scores[:, 7] = 1.0  # every row can draw something
    sampler = S.MultinomialSampler(ctx=make_ctx(9))
    uniforms = np.random.default_rng(9)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True)).astype(np.float64)
    cdf = np.cumsum(weights, axis=-1)
    for _ in range(300):
        target = uniforms.random(5) * cdf[:, -1]
        expected = [np.searchsorted(c, t, side="right") for c, t in zip(cdf, target, strict=True)]
        np.testing.assert_array_equal(sampler(IDS, scores), expected)


class FixedUniform:
    """Stands in for the sampler's Generator: every draw is ``u``."""

    def __init__(self, u):
        self.u = u

    def random(self, n=None):
        return self.u if n is None else np.full(n, self.u)


@pytest.mark.parametrize(("u", "token"), [(0.0, 1), (0.25, 2), (0.5, 3), (0.75, 4), (0.99, 4)])
def test_a_uniform_on_a_cdf_step_picks_the_token_above_it(u, token):
    """cdf[i - 1] <= u * total < cdf[i]: weights 0, 1, 1, 1, 1 give cdf 0, 1, 2, 3, 4."""
    sampler = S.MultinomialSampler(ctx=make_ctx(0))
    sampler._rng = FixedUniform(u)
    scores = np.array([[-np.inf, 0, 0, 0, 0]], np.float32)
    assert sampler(IDS, scores).tolist() == [token]


def test_rounding_at_the_top_picks_the_last_possible_token():
    sampler = S.MultinomialSampler(ctx=make_ctx(0))
    sampler._rng = FixedUniform(1.0)  # beyond what a Generator returns: the worst rounding case
    scores = np.full((2, 600), -np.inf, np.float32)
    scores[0, [3, 10]] = 0.0
    scores[1, [0, 599]] = [1.0, 2.0]
    assert sampler(IDS, scores).tolist() == [10, 599]
    scores = np.zeros((1, 10000), np.float32)  # the block-wise search
    scores[0, 9900:] = -np.inf
    assert sampler(IDS, scores).tolist() == [9899]


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [([-np.inf] * 4, "all -inf"), ([0, np.nan, 1, 2], "NaN"), ([0, np.inf, 1, 2], r"\+inf")],
)
def test_multinomial_refuses_a_row_without_a_distribution(bad_row, message):
    scores = np.array([[0, 1, 2, 3], [0, 1, 2, 3], bad_row], np.float32)
    with pytest.raises(ComponentError, match=f"'multinomial'.*row 2.*{message}"):
        S.MultinomialSampler(ctx=make_ctx(0))(IDS, scores)


@pytest.mark.parametrize(
    ("bad", "message"), [(None, "all -inf"), (np.nan, "NaN"), (np.inf, r"\+inf")]
)
def test_multinomial_refuses_a_bad_row_among_few_finite_scores(bad, message):
    """After top-k the rows are packed first; the check on the packed rows says the same."""
    scores = np.full((3, 1000), -np.inf, np.float32)
    scores[:, [5, 500]] = [1.0, 2.0]
    scores[2] = -np.inf
    if bad is not None:
        scores[2, [7, 900]] = [0.0, bad]
    with pytest.raises(ComponentError, match=f"'multinomial'.*row 2.*{message}.*1 of 3 rows"):
        S.MultinomialSampler(ctx=make_ctx(0))(IDS, scores)


@settings(max_examples=150, deadline=None)
@given(
    scores=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.integers(1, 700)),
        elements=st.one_of(st.floats(-20, 20, width=32), st.just(float("-inf"))),
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_multinomial_only_draws_possible_tokens(scores, seed):
    scores[:, 0] = np.maximum(scores[:, 0], 0.0)  # every row has a finite score
    before = scores.copy()
    picked = S.MultinomialSampler(ctx=make_ctx(seed))(IDS, scores)
    np.testing.assert_array_equal(scores, before)
    assert picked.dtype == np.int64 and picked.shape == (scores.shape[0],)
    assert np.all(np.isfinite(scores[np.arange(scores.shape[0]), picked]))


def test_hookimpl_registers_the_samplers():
    registered = {}
    S.register_samplers(lambda name, factory, **kw: registered.setdefault(name, factory))
    assert registered == {"greedy": S.GreedySampler, "multinomial": S.MultinomialSampler}
