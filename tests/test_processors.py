"""The sampling warpers (ortgen.plugins.processors) against Hugging Face's own classes.

Every processor is compared with the transformers warper of the same name on
seeded random scores (batch > 1, -inf entries, NaN / +inf / all -inf rows),
then checked for invariants with hypothesis, for argument errors and for
registration.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers.generation.logits_process as hf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortgen import ConfigError
from ortgen.plugins import _cuts as cuts
from ortgen.plugins import _numeric as N
from ortgen.plugins import processors as P

IDS = np.zeros((1, 1), dtype=np.int64)  # warpers ignore input_ids


def hf_apply(warper, scores: np.ndarray) -> np.ndarray:
    ids = torch.zeros((scores.shape[0], 1), dtype=torch.long)
    return warper(ids, torch.from_numpy(scores.copy())).numpy()


def random_scores(rng, batch, vocab, *, scale=3.0, neg_inf=0.1, odd_rows=False):
    scores = (rng.standard_normal((batch, vocab)) * scale).astype(np.float32)
    scores[rng.random((batch, vocab)) < neg_inf] = -np.inf
    if odd_rows:  # HF's softmax is NaN on these rows and the warpers leave them alone
        scores[0] = -np.inf
        scores[1, 3] = np.nan
        scores[2, vocab // 2] = np.inf
    return scores


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    np.testing.assert_array_equal(ours, theirs)  # NaN == NaN here


# name -> (our factory, HF factory) taking the same parameters
PAIRS = {
    "top_k": (
        lambda v, keep: P.TopKProcessor(top_k=v, min_tokens_to_keep=keep),
        lambda v, keep: hf.TopKLogitsWarper(v, min_tokens_to_keep=keep),
    ),
    "top_p": (
        lambda v, keep: P.TopPProcessor(top_p=v, min_tokens_to_keep=keep),
        lambda v, keep: hf.TopPLogitsWarper(v, min_tokens_to_keep=keep),
    ),
    "min_p": (
        lambda v, keep: P.MinPProcessor(min_p=v, min_tokens_to_keep=keep),
        lambda v, keep: hf.MinPLogitsWarper(v, min_tokens_to_keep=keep),
    ),
    "typical_p": (
        lambda v, keep: P.TypicalPProcessor(typical_p=v, min_tokens_to_keep=keep),
        lambda v, keep: hf.TypicalLogitsWarper(v, min_tokens_to_keep=keep),
    ),
}
VALUES = {
    "top_k": [1, 2, 7, 50, 400],
    "top_p": [0.0, 0.1, 0.5, 0.9, 0.99],
    "min_p": [0.0, 0.01, 0.1, 0.5, 1.0],
    "typical_p": [0.05, 0.2, 0.5, 0.9, 0.99],
}
CASES = [(name, value) for name, values in VALUES.items() for value in values]


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 1.3, 2, 10.0])
def test_temperature_matches_hf(temperature):
    scores = random_scores(np.random.default_rng(0), 4, 1000)
    ours = P.TemperatureProcessor(temperature)(IDS, scores)
    assert_same(ours, hf_apply(hf.TemperatureLogitsWarper(float(temperature)), scores))


@pytest.mark.parametrize(("name", "value"), CASES)
@pytest.mark.parametrize("keep", [1, 3])
@pytest.mark.parametrize("vocab", [5, 300, 5000])
def test_warper_matches_hf(name, value, keep, vocab):
    ours_factory, hf_factory = PAIRS[name]
    rng = np.random.default_rng(vocab + keep)
    for scale, neg_inf in [(0.5, 0.0), (3.0, 0.1), (8.0, 0.5)]:
        scores = random_scores(rng, 4, vocab, scale=scale, neg_inf=neg_inf, odd_rows=True)
        ours = ours_factory(value, keep)(IDS, scores)
        assert_same(ours, hf_apply(hf_factory(value, keep), scores))


@pytest.mark.parametrize(("name", "value"), CASES)
def test_warper_matches_hf_after_top_k(name, value):
    """Mostly -inf rows (the usual top-k -> top-p chain) take the packed path."""
    rng = np.random.default_rng(1)
    scores = P.TopKProcessor(60)(IDS, random_scores(rng, 3, 49152, scale=2.0, neg_inf=0.0))
    ours_factory, hf_factory = PAIRS[name]
    assert_same(ours_factory(value, 2)(IDS, scores), hf_apply(hf_factory(value, 2), scores))


def nucleus_size(scores: np.ndarray, top_p: float) -> int:
    probs = np.sort(np.exp(scores - scores.max()))[::-1]
    return int(np.searchsorted(np.cumsum(probs) / probs.sum(), top_p) + 1)


@pytest.mark.parametrize(
    ("scale", "low", "high"),
    [(6.0, 1, 1023), (3.0, 1024, 8191), (0.7, 8192, 49152)],
    ids=["first-tier", "second-tier", "full-sort"],
)
def test_top_p_every_candidate_tier_matches_hf(scale, low, high):
    rng = np.random.default_rng(7)
    scores = (rng.standard_normal((2, 49152)) * scale).astype(np.float32)
    assert all(low < nucleus_size(row, 0.9) <= high for row in scores)  # the tier is exercised
    ours = P.TopPProcessor(0.9)(IDS, scores)
    assert_same(ours, hf_apply(hf.TopPLogitsWarper(0.9), scores))


@pytest.mark.parametrize(("scale", "mass"), [(6.0, 0.5), (2.5, 0.9), (0.3, 0.9)])
def test_typical_p_large_vocab_differs_from_hf_only_at_float32_noise(scale, mass):
    """With 20000 near-equal distances, float32 rounding of the entropy (HF and numpy
    sum in different orders) can move a token whose distance equals the cut to 1e-5."""
    rng = np.random.default_rng(3)
    scores = (rng.standard_normal((3, 20000)) * scale).astype(np.float32)
    ours = P.TypicalPProcessor(mass)(IDS, scores)
    theirs = hf_apply(hf.TypicalLogitsWarper(mass), scores)
    logp = torch.log_softmax(torch.from_numpy(scores), -1)
    entropy = -(logp * logp.exp()).nansum(-1, keepdim=True)
    distance = (-logp - entropy).abs().numpy()
    for row in range(3):
        differ = np.flatnonzero(np.isneginf(ours[row]) != np.isneginf(theirs[row]))
        assert differ.size <= 4
        kept = distance[row][np.isfinite(theirs[row])]
        assert np.all(np.abs(distance[row, differ] - kept.max()) < 1e-4)


def test_top_p_ties_at_the_cut_remove_the_lower_ids_first():
    """As a stable ascending sort does; torch's sort is stable on short rows like this."""
    # probabilities 0.1, 0.2 x4, 0.1 over 6 tokens: top_p=0.5 keeps 3 of the four 0.2s
    scores = np.log(np.array([[0.1, 0.2, 0.2, 0.1, 0.2, 0.2]], dtype=np.float32))
    ours = P.TopPProcessor(0.5)(IDS, scores)
    assert_same(ours, hf_apply(hf.TopPLogitsWarper(0.5), scores))
    assert np.flatnonzero(np.isfinite(ours[0])).tolist() == [2, 4, 5]


def test_top_p_ties_on_a_long_row_keep_as_many_as_hf():
    """On long rows torch's sort is not stable: only the number kept is defined."""
    rng = np.random.default_rng(4)
    scores = rng.integers(0, 6, (3, 3000)).astype(np.float32)
    ours = P.TopPProcessor(0.3)(IDS, scores)
    theirs = hf_apply(hf.TopPLogitsWarper(0.3), scores)
    np.testing.assert_array_equal(np.isfinite(ours).sum(-1), np.isfinite(theirs).sum(-1))
    for row, kept in zip(scores, np.isfinite(ours), strict=True):
        cut = row[kept].min()
        assert np.all(row[~kept] <= cut)
        ties = np.flatnonzero(row == cut)
        assert kept[ties].sum() < ties.size  # the cut falls inside a tie group here
        assert np.all(np.diff(kept[ties].astype(int)) >= 0)  # lower ids removed first


def test_top_p_removes_a_cumulative_probability_equal_to_the_limit():
    # four equal scores: probabilities exactly 0.25, cumulative 0.25, 0.5 (== 1 - top_p), ...
    scores = np.zeros((1, 4), np.float32)
    ours = P.TopPProcessor(0.5)(IDS, scores)
    assert_same(ours, hf_apply(hf.TopPLogitsWarper(0.5), scores))
    assert np.isfinite(ours).sum() == 2


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("n", [1, 300, 4096, 4097, 4352, 9000])  # direct, then block-wise
def test_count_prefix_matches_a_plain_cumsum(strict, n):
    """The block-wise prefix search, on exact binary fractions so that equality occurs."""
    rng = np.random.default_rng(n)
    weights = rng.integers(0, 4, (3, n)).astype(np.float32) / 8
    total = weights.sum(axis=-1, keepdims=True, dtype=np.float64)
    offset = np.array([[0.0], [0.125], [0.5]])
    cum = (offset + np.cumsum(weights.astype(np.float64), axis=-1) / total).astype(np.float32)
    for limit in np.float32([0.0, 0.125, 0.5, 0.625, 1.0, 2.0]):
        expected = (cum < limit if strict else cum <= limit).sum(axis=-1)
        got = N.count_prefix(weights, limit, offset=offset, total=total, strict=strict)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n", [1, 300, 4096, 4097, 9000])
def test_prefix_sums_in_float64_match_a_plain_cumsum(n):
    """The sampler's search: unscaled float64 sums against a per-row limit, and the row total."""
    rng = np.random.default_rng(n)
    weights = rng.random((4, n)).astype(np.float32)
    weights[:, rng.random(n) < 0.3] = 0
    cum = np.cumsum(weights.astype(np.float64), axis=-1)
    sums = N.PrefixSums(weights)
    np.testing.assert_allclose(sums.total, cum[:, -1], rtol=1e-12)
    limit = rng.random(4)[:, None] * sums.total[:, None]
    got = sums.count(limit, in_float32=False)
    # the block-wise sums may differ from cum in the last bits, so allow a neighbour
    assert np.all(np.abs(got - (cum <= limit).sum(axis=-1)) <= 1)


def test_top_k_keeps_every_score_tied_with_the_kth():
    scores = np.array([[1, 3, 3, 3, 0, 2]], dtype=np.float32)
    ours = P.TopKProcessor(2)(IDS, scores)
    assert np.isfinite(ours).sum() == 3  # the three 3s
    assert_same(ours, hf_apply(hf.TopKLogitsWarper(2), scores))


def top_k_reference(scores: np.ndarray, k: int) -> np.ndarray:
    """HF's rule on the whole row: keep every score >= the k-th highest (NaN ranks highest)."""
    kth = np.partition(scores, scores.shape[-1] - k, axis=-1)[:, -k, None]
    return np.where(scores < kth, np.float32(-np.inf), scores)


def logit_rows(rng, batch: int, vocab: int) -> np.ndarray:
    """Rows shaped like a model's logits, where top-k takes its few-candidate path."""
    return (rng.standard_normal((batch, vocab)) * 2.5).astype(np.float32)


@pytest.mark.parametrize("vocab", [1000, 2048, 4099, 49152])  # with and without a tail
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("k", [1, 5, 50, 120])
def test_top_k_few_candidates_path_matches_hf(vocab, batch, k):
    rng = np.random.default_rng(vocab + k)
    scores = logit_rows(rng, batch, vocab)
    if vocab >= 4096:  # on short rows the path may decline (too many candidates)
        assert cuts.top_k_few(scores, k) is not None  # the path under test is taken
    ours = P.TopKProcessor(k)(IDS, scores)
    assert_same(ours, hf_apply(hf.TopKLogitsWarper(k), scores))


def test_top_k_few_candidates_keep_every_tie_at_the_kth_value():
    rng = np.random.default_rng(5)
    scores = logit_rows(rng, 2, 8192)
    for row in range(2):  # 7 scores tied at the 50th highest value, some of them below it in id
        order = np.argsort(scores[row])[::-1]
        scores[row, order[44:51]] = scores[row, order[47]]
    ours = P.TopKProcessor(50)(IDS, scores)
    assert cuts.top_k_few(scores, 50) is not None
    assert (np.isfinite(ours).sum(axis=-1) == 51).all()  # 44 above + 7 tied
    assert_same(ours, hf_apply(hf.TopKLogitsWarper(50), scores))


def test_top_k_few_candidates_in_the_tail_past_the_columns():
    scores = np.zeros((1, 4099), np.float32)
    scores[0, -3:] = [5.0, 6.0, 7.0]  # the highest scores sit in the 3 ids past 4 * 1024
    ours = P.TopKProcessor(2)(IDS, scores)
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(ours)), [4097, 4098])
    assert_same(ours, top_k_reference(scores, 2))


@pytest.mark.parametrize("n_nan", [1, 3, 50])  # below k: kept; k or more: HF keeps the row
def test_top_k_few_candidates_with_nan(n_nan):
    rng = np.random.default_rng(n_nan)
    scores = logit_rows(rng, 2, 8192)
    scores[1, rng.choice(8192, n_nan, replace=False)] = np.nan
    ours = P.TopKProcessor(3)(IDS, scores)
    assert_same(ours, top_k_reference(scores, 3))
    assert_same(ours, hf_apply(hf.TopKLogitsWarper(3), scores))


@pytest.mark.parametrize(
    "make",
    [
        lambda v: np.zeros((2, v), np.float32),  # every score tied
        lambda v: np.tile(np.arange(v, dtype=np.float32), (2, 1)),  # sorted
        lambda v: np.full((2, v), -np.inf, np.float32),  # nothing left
    ],
    ids=["ties", "sorted", "all -inf"],
)
def test_top_k_rows_the_few_candidates_path_declines_match_hf(make):
    scores = make(8192)
    ours = P.TopKProcessor(10)(IDS, scores)
    assert_same(ours, top_k_reference(scores, 10))
    assert_same(ours, hf_apply(hf.TopKLogitsWarper(10), scores))


def test_top_p_after_top_k_keeps_as_many_as_hf_with_ties_at_the_cut():
    """Top-p on the few scores top-k leaves (packed), with ties straddling the cut.

    torch sorts the whole 49152-wide row, not stably, so only the number kept is
    defined there; ours removes the lower ids of a tie first.
    """
    rng = np.random.default_rng(11)
    straddled = 0
    for batch in (1, 4):
        scores = np.round(logit_rows(rng, batch, 49152)).astype(np.float32)  # many ties
        kept_k = P.TopKProcessor(50)(IDS, scores)
        for top_p in (0.3, 0.9):
            ours = P.TopPProcessor(top_p)(IDS, kept_k)
            theirs = hf_apply(hf.TopPLogitsWarper(top_p), kept_k)
            np.testing.assert_array_equal(np.isfinite(ours).sum(-1), np.isfinite(theirs).sum(-1))
            for row, kept in zip(kept_k, np.isfinite(ours), strict=True):
                cut = row[kept].min()
                assert np.all(row[~kept] <= cut)
                ties = np.flatnonzero(row == cut)
                straddled += kept[ties].sum() < ties.size
                assert np.all(np.diff(kept[ties].astype(int)) >= 0)  # lower ids removed first
            np.testing.assert_array_equal(ours[np.isfinite(ours)], kept_k[np.isfinite(ours)])
    assert straddled  # the case under test occurred


@pytest.mark.parametrize(
    "processor",
    [
        P.TemperatureProcessor(1.0),
        P.TopKProcessor(0),
        P.TopPProcessor(1.0),
        P.MinPProcessor(0.0),
        P.TypicalPProcessor(1.0),
    ],
    ids=["temperature=1", "top_k=0", "top_p=1", "min_p=0", "typical_p=1"],
)
def test_off_values_return_an_unchanged_copy(processor):
    scores = random_scores(np.random.default_rng(2), 2, 100)
    out = processor(IDS, scores)
    assert out is not scores
    np.testing.assert_array_equal(out, scores)


# --- invariants ---------------------------------------------------------------

finite_or_neg_inf = st.one_of(
    st.floats(-30, 30, width=32), st.just(float("-inf")), st.sampled_from([0.0, 1.0, 2.0])
)
score_arrays = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 4), st.integers(1, 60)),
    elements=finite_or_neg_inf,
)
ALL = [
    lambda k: P.TopKProcessor(top_k=3, min_tokens_to_keep=k),
    lambda k: P.TopPProcessor(top_p=0.7, min_tokens_to_keep=k),
    lambda k: P.MinPProcessor(min_p=0.2, min_tokens_to_keep=k),
    lambda k: P.TypicalPProcessor(typical_p=0.6, min_tokens_to_keep=k),
]


@settings(max_examples=150, deadline=None)
@given(scores=score_arrays, keep=st.integers(1, 5), which=st.integers(0, 3))
def test_cutoffs_only_remove_keep_enough_and_never_mutate(scores, keep, which):
    before = scores.copy()
    out = ALL[which](keep)(IDS, scores)
    np.testing.assert_array_equal(scores, before)  # input untouched
    assert out.shape == scores.shape and out.dtype == np.float32
    kept = ~np.isneginf(out)
    np.testing.assert_array_equal(out[kept], scores[kept])  # values kept as they were
    available = (~np.isneginf(scores)).sum(axis=-1)
    assert np.all(kept.sum(axis=-1) >= np.minimum(keep, available))
    if which < 3:  # top-k, top-p and min-p keep an upper set of the scores
        lowest_kept = np.where(kept, scores, np.inf).min(axis=-1)
        highest_removed = np.where(kept, -np.inf, scores).max(axis=-1)
        assert np.all(highest_removed <= lowest_kept)


@settings(max_examples=100, deadline=None)
@given(scores=score_arrays, top_k=st.integers(1, 70))
def test_top_k_keeps_at_least_k(scores, top_k):
    out = P.TopKProcessor(top_k)(IDS, scores)
    available = (~np.isneginf(scores)).sum(axis=-1)
    assert np.all((~np.isneginf(out)).sum(axis=-1) >= np.minimum(top_k, available))


@settings(max_examples=100, deadline=None)
@given(scores=score_arrays, top_p=st.floats(0.0, 0.999))
def test_top_p_keeps_at_least_top_p_of_the_mass(scores, top_p):
    out = P.TopPProcessor(top_p)(IDS, scores)
    for row_in, row_out in zip(scores, out, strict=True):
        if np.isneginf(row_in).all():
            continue
        probs = np.exp(row_in.astype(np.float64) - row_in.max())
        probs /= probs.sum()
        assert probs[~np.isneginf(row_out)].sum() >= top_p - 1e-6


# --- arguments and registration -------------------------------------------------

BAD_ARGS = [
    (P.TemperatureProcessor, {"temperature": 0.0}, "`temperature`.*strictly positive.*0.0"),
    (P.TemperatureProcessor, {"temperature": -1.0}, "`temperature`.*-1.0"),
    (P.TemperatureProcessor, {"temperature": float("nan")}, "`temperature`.*nan"),
    (P.TemperatureProcessor, {"temperature": "hot"}, "`temperature`.*'hot'"),
    (P.TemperatureProcessor, {"temperature": True}, "`temperature`.*True"),
    (P.TopKProcessor, {"top_k": -1}, "`top_k`.*strictly positive integer.*-1"),
    (P.TopKProcessor, {"top_k": 2.5}, "`top_k`.*2.5"),
    (P.TopKProcessor, {"top_k": 5, "min_tokens_to_keep": 0}, "`min_tokens_to_keep`.*0"),
    (P.TopPProcessor, {"top_p": 1.5}, r"`top_p`.*\[0, 1\].*1.5"),
    (P.TopPProcessor, {"top_p": -0.1}, "`top_p`.*-0.1"),
    (P.TopPProcessor, {"top_p": 0.9, "min_tokens_to_keep": 1.0}, "`min_tokens_to_keep`"),
    (P.MinPProcessor, {"min_p": 1.01}, r"`min_p`.*\[0, 1\].*1.01"),
    (P.MinPProcessor, {"min_p": None}, "`min_p`.*None"),
    (P.TypicalPProcessor, {"typical_p": 0.0}, r"`typical_p`.*\(0, 1\].*0.0"),
    (P.TypicalPProcessor, {"typical_p": 1.2}, "`typical_p`.*1.2"),
]


@pytest.mark.parametrize(("factory", "kwargs", "message"), BAD_ARGS)
def test_bad_arguments_raise_config_error(factory, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        factory(**kwargs)


def test_hookimpl_registers_the_warpers():
    registered = {}
    P.register_logits_processors(lambda name, factory, **kw: registered.setdefault(name, factory))
    assert registered == {
        "temperature": P.TemperatureProcessor,
        "top_k": P.TopKProcessor,
        "top_p": P.TopPProcessor,
        "min_p": P.MinPProcessor,
        "typical_p": P.TypicalPProcessor,
    }
