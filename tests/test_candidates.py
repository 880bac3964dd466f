"""Candidates: scores left as the few that are not -inf (after top-k) travel packed to
the components with a ``sparse`` method. Each ``sparse`` method must give exactly what
``__call__`` gives on the dense scores, and the loop must give the same tokens,
scores and logprobs either way."""

from __future__ import annotations

import numpy as np
import pytest

import ortgen
from ortgen import Candidates, ComponentError, hookimpl
from ortgen.plugins import constraints as C
from ortgen.plugins import llamacpp as L
from ortgen.plugins import processors as P
from ortgen.plugins import samplers as S
from ortgen.plugins import truncation as T
from ortgen.testing import make_context

IDS = np.zeros((1, 4), np.int64)


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)  # NaN == NaN here


def test_find_round_trips_and_maps_columns_to_ids():
    scores = np.full((3, 100), -np.inf, np.float32)
    scores[0, [3, 50]] = [1.0, 2.0]
    scores[1, 7] = 0.5
    scores[2, [0, 99]] = [np.nan, 3.0]  # NaN is present: it must reach the caller
    found = Candidates.find(scores)
    assert found is not None and found.packed.shape == (3, 2) and found.shape == (3, 100)
    assert_same(found.dense(), scores)
    np.testing.assert_array_equal(found.token_ids(np.array([1, 0, 1])), [50, 7, 99])
    empty = Candidates.find(np.full((2, 64), -np.inf, np.float32))  # no row has a score
    assert empty is not None and empty.packed.shape == (2, 1)
    assert Candidates.find(np.zeros((2, 32), np.float32)) is None  # dense: nothing to gain


def test_find_decides_on_the_exact_count_whatever_the_sample_says():
    # the sample (every 61st score) sees only -inf, but 1/8 of the scores are present
    scores = np.full((1, 4096), -np.inf, np.float32)
    ids = np.arange(4096)
    scores[0, ids[ids % 61 != 0][:512]] = 1.0
    assert Candidates.find(scores) is None
    # sparse, but every present score is a sampled one
    scores = np.full((2, 4096), -np.inf, np.float32)
    scores[1, ::61] = np.arange(68, dtype=np.float32)
    found = Candidates.find(scores)
    assert found is not None and found.packed.shape == (2, 68)
    assert_same(found.dense(), scores)


def test_keep_and_with_scores_leave_the_original_alone():
    scores = np.full((2, 50), -np.inf, np.float32)
    scores[0, [1, 2, 3]] = [1.0, 2.0, 3.0]
    scores[1, [10]] = [5.0]
    found = Candidates.find(scores)
    kept = found.keep(found.packed < 2.0)
    assert_same(found.dense(), scores)
    expected = scores.copy()
    expected[0, 1] = -np.inf
    assert_same(kept.dense(), expected)
    assert_same(found.dense_kept(found.packed < 2.0), expected)
    with pytest.raises(ValueError, match="shape"):
        found.with_scores(np.zeros((2, 7), np.float32))


def _logits(batch: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, vocab)) * 2.0).astype(np.float32)


def _candidate_inputs() -> list[Candidates]:
    """Candidates as top-k leaves them, and harder ones: ties, removed (-inf) candidates,
    a NaN row, an all -inf row, rows of different counts."""
    out = []
    for batch, vocab, k, seed in [(1, 4096, 50, 0), (3, 2048, 20, 1), (2, 1000, 3, 2)]:
        scores = _logits(batch, vocab, seed)
        found = P.TopKProcessor(k).sparse(IDS, scores)
        assert isinstance(found, Candidates)
        out.append(found)
    tied = _logits(2, 1024, 3)
    tied[:, 100:110] = 9.0  # ten equal best scores
    tied[1, 500:520] = 8.0
    out.append(P.TopKProcessor(30).sparse(IDS, tied))
    odd = np.full((4, 512), -np.inf, np.float32)
    odd[0, [5, 9, 400]] = [1.0, 1.0, 0.5]
    odd[1, [7]] = [2.0]
    odd[2, [1, 2]] = [np.nan, 1.0]  # invalid row: HF's warpers remove nothing there
    found = Candidates.find(odd)  # row 3 is all -inf
    out.append(found.keep(np.isclose(found.packed, 0.5)))  # a removed (-inf) candidate
    return out


PROCESSORS = {
    "temperature": lambda: P.TemperatureProcessor(0.7),
    "temperature 1": lambda: P.TemperatureProcessor(1.0),
    "top_k": lambda: P.TopKProcessor(5),
    "top_k keep": lambda: P.TopKProcessor(2, min_tokens_to_keep=4),
    "top_p": lambda: P.TopPProcessor(0.9),
    "top_p low": lambda: P.TopPProcessor(0.3, min_tokens_to_keep=3),
    "min_p": lambda: P.MinPProcessor(0.05),
    "min_p keep": lambda: P.MinPProcessor(0.5, min_tokens_to_keep=3),
    "typical_p": lambda: P.TypicalPProcessor(0.9),
    "typical_p keep": lambda: P.TypicalPProcessor(0.5, min_tokens_to_keep=2),
    "epsilon_cutoff": lambda: T.EpsilonCutoffProcessor(0.02),
    "epsilon_cutoff keep": lambda: T.EpsilonCutoffProcessor(0.3, min_tokens_to_keep=3),
    "eta_cutoff": lambda: T.EtaCutoffProcessor(0.02),
    "eta_cutoff keep": lambda: T.EtaCutoffProcessor(0.3, min_tokens_to_keep=3),
    "top_n_sigma": lambda: L.TopNSigmaProcessor(1.0),
    "top_n_sigma wide": lambda: L.TopNSigmaProcessor(3.0),
}


@pytest.mark.parametrize("name", PROCESSORS)
def test_sparse_processors_equal_their_dense_call(name):
    processor = PROCESSORS[name]()
    for found in _candidate_inputs():
        dense = found.dense()
        with np.errstate(invalid="ignore", over="ignore"):
            expected = processor(IDS, dense)
            got = processor.sparse(IDS, found)
        assert isinstance(got, Candidates)
        assert_same(got.dense(), expected)
        assert_same(found.dense(), dense)  # the input is left alone


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.1, 0.3])
def test_sparse_xtc_draws_and_cuts_as_its_dense_call(threshold):
    """Two XTCs seeded alike, one called dense and one on candidates, call after call:
    the same draws (one per row and call) and the same cuts."""
    ctx = make_context(batch_size=3, seed=5)
    dense_xtc, sparse_xtc = (L.XtcProcessor(0.7, threshold, ctx=ctx) for _ in range(2))
    cut = 0
    for _ in range(3):
        for found in _candidate_inputs():
            dense = found.dense()
            with np.errstate(invalid="ignore", over="ignore"):
                expected = dense_xtc(IDS, dense)
            got = sparse_xtc.sparse(IDS, found)
            assert_same(got.dense(), expected)
            cut += int((np.isfinite(expected) != np.isfinite(dense)).any())
    assert cut  # some calls removed tokens


def test_top_k_leaves_candidates_from_dense_scores_only_when_few():
    scores = _logits(2, 4096, 5)
    found = P.TopKProcessor(50).sparse(IDS, scores)
    assert_same(found.dense(), P.TopKProcessor(50)(IDS, scores))
    assert found.packed.shape[1] <= 64  # ~50 per row, not the vocabulary
    assert P.TopKProcessor(600).sparse(IDS, scores) is None  # over 1/8 of the row
    assert P.TopKProcessor(0).sparse(IDS, scores) is None
    assert P.TopPProcessor(0.9).sparse(IDS, scores) is None  # dense in: be called dense


@pytest.mark.parametrize("sampler", ["multinomial", "greedy"])
def test_sparse_samplers_pick_what_they_pick_on_dense_scores(sampler):
    ctx = make_context(batch_size=3, vocab_size=2048, seed=7)
    make = {"multinomial": lambda: S.MultinomialSampler(ctx=ctx), "greedy": S.GreedySampler}
    dense_sampler, sparse_sampler = make[sampler](), make[sampler]()
    for seed in range(40):
        scores = _logits(3, 2048, 100 + seed)
        found = P.TopPProcessor(0.8).sparse(IDS, P.TopKProcessor(20).sparse(IDS, scores))
        dense = found.dense()
        np.testing.assert_array_equal(sparse_sampler.sparse(IDS, found), dense_sampler(IDS, dense))


def test_sparse_mirostat_picks_and_steers_as_its_dense_call():
    """Mirostat keeps a target surprise per row: the candidates give the same picks and
    the same ``mu``, bit for bit, step after step."""
    ctx = make_context(batch_size=3, vocab_size=2048, seed=7)
    dense_sampler, sparse_sampler = (L.MirostatV2Sampler(3.0, 0.3, ctx=ctx) for _ in range(2))
    for seed in range(40):
        found = P.TopKProcessor(30).sparse(IDS, _logits(3, 2048, 200 + seed))
        picked = sparse_sampler.sparse(IDS, found)
        np.testing.assert_array_equal(picked, dense_sampler(IDS, found.dense()))
        np.testing.assert_array_equal(sparse_sampler.mu, dense_sampler.mu)
    assert len(np.unique(sparse_sampler.mu)) == 3  # the rows steer apart


def test_sparse_samplers_refuse_rows_with_nothing_to_pick():
    scores = np.full((2, 300), -np.inf, np.float32)
    scores[0, 4] = 1.0
    found = Candidates.find(scores)
    ctx = make_context(batch_size=2)
    samplers = (S.GreedySampler(), S.MultinomialSampler(ctx=ctx), L.MirostatV2Sampler(ctx=ctx))
    for sampler in samplers:
        with pytest.raises(ComponentError, match="row 1 are all -inf"):
            sampler.sparse(IDS, found)


CHAT = dict(do_sample=True, repetition_penalty=1.1, temperature=0.7, top_k=5, top_p=0.9)


def _without_sparse(monkeypatch) -> None:
    """Every built-in component called dense, as a plugin without ``sparse`` is."""
    classes = [
        P.TemperatureProcessor,
        P.TopKProcessor,
        P.TopPProcessor,
        P.MinPProcessor,
        P.TypicalPProcessor,
        T.EpsilonCutoffProcessor,
        T.EtaCutoffProcessor,
        L.TopNSigmaProcessor,
        L.XtcProcessor,
        L.MirostatV2Sampler,
        S.GreedySampler,
        S.MultinomialSampler,
    ]
    for cls in classes:
        monkeypatch.setattr(cls, "sparse", None)


@pytest.mark.parametrize(
    "settings",
    [
        CHAT,
        dict(CHAT, top_p=1.0, min_p=0.1),
        dict(CHAT, typical_p=0.8),
        dict(CHAT, top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.05),
        dict(CHAT, epsilon_cutoff=0.02, eta_cutoff=0.02),
        dict(do_sample=True, top_k=5),
    ],
    ids=["chat", "min_p", "typical", "llama.cpp", "truncation", "top_k"],
)
def test_the_loop_gives_the_same_tokens_and_logprobs_either_way(
    tiny_llama_gen, monkeypatch, settings
):
    call = dict(
        settings, max_new_tokens=12, eos_token_id=None, seed=3, logprobs=True, top_logprobs=3
    )
    prompts = [[5, 17, 42, 99, 3, 64], [7, 8]]
    picked_among: list[tuple[int, int]] = []  # the sampler's sparse calls
    sparse_pick = S.MultinomialSampler.sparse

    def spy(self, input_ids, scores):
        picked_among.append(scores.packed.shape)
        return sparse_pick(self, input_ids, scores)

    with monkeypatch.context() as patch:
        patch.setattr(S.MultinomialSampler, "sparse", spy)
        sparse = tiny_llama_gen.generate(prompts, output_scores=True, **call)
    # every step drew among the few candidates, not the 256 scores
    assert len(picked_among) == 12 and all(width < 16 for _, width in picked_among)
    with monkeypatch.context() as patch:
        _without_sparse(patch)
        dense = tiny_llama_gen.generate(prompts, output_scores=True, **call)
    assert sparse.tokens == dense.tokens
    assert sparse.logprobs == dense.logprobs and sparse.top_logprobs == dense.top_logprobs
    for ours, theirs in zip(sparse.scores, dense.scores, strict=True):
        assert_same(ours, theirs)


class SeesScores:
    """A third-party processor without ``sparse``: records what it is given."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def __call__(self, input_ids, scores):
        self.seen.append(scores)
        return scores.copy()


class ReadsScores:
    """A stopping criterion that reads scores (no ``uses_scores``): it gets them dense."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def __call__(self, input_ids, scores):
        self.seen.append(scores)
        return np.zeros(input_ids.shape[0], dtype=bool)


def test_components_without_sparse_get_dense_scores(tiny_model_dirs):
    processor, criterion = SeesScores(), ReadsScores()

    class Plugin:
        @hookimpl
        def register_logits_processors(self, register):
            register("sees_scores", lambda: processor)

        @hookimpl
        def register_stopping_criteria(self, register):
            register("reads_scores", lambda: criterion)

    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[Plugin()])
    gen.generate(
        [[5, 6, 7]],
        max_new_tokens=3,
        eos_token_id=None,
        do_sample=True,
        top_k=5,
        seed=0,
        logits_processors=["sees_scores"],
        stopping_criteria=["reads_scores"],
    )
    # sees_scores runs before the warpers (where transformers merges a user's processors)
    assert all(isinstance(s, np.ndarray) and s.shape == (1, 256) for s in processor.seen)
    assert len(criterion.seen) == 3
    for scores in criterion.seen:  # after top-k(5): dense, -inf outside the five
        assert isinstance(scores, np.ndarray) and np.isfinite(scores).sum() == 5


class BadSparse:
    def __call__(self, input_ids, scores):
        return scores.copy()

    def sparse(self, input_ids, scores):
        return scores  # dense scores are not Candidates


def test_a_sparse_method_returning_the_wrong_type_is_named(tiny_model_dirs):
    class Plugin:
        @hookimpl
        def register_logits_processors(self, register):
            register("bad_sparse", BadSparse)

    gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1, plugins=[Plugin()])
    with pytest.raises(ComponentError, match="'bad_sparse': its sparse method returned"):
        gen.generate([[5, 6]], max_new_tokens=2, logits_processors=["bad_sparse"])


def test_repetition_penalty_has_no_sparse_path_and_still_composes():
    # a dense-only processor after a sparse one gets the dense scores it stands for
    scores = _logits(1, 4096, 9)
    found = P.TopKProcessor(50).sparse(IDS, scores)
    ids = np.array([[int(found.cols[0]), 3]], np.int64)
    penalised = C.RepetitionPenaltyProcessor(1.3)(ids, found.dense())
    expected = C.RepetitionPenaltyProcessor(1.3)(ids, P.TopKProcessor(50)(IDS, scores))
    assert_same(penalised, expected)


def test_float32_limit_comparison_equals_rounding_each_value():
    rng = np.random.default_rng(0)
    for top_p in [0.9, 0.5, 0.95, 0.3, 1e-3, 0.0]:
        limit = np.float32(1.0 - top_p)
        at_most = P._at_most_in_float32(1.0 - top_p)
        nearby = np.nextafter(limit, [np.float32(-1), np.float32(2)]).astype(np.float64)
        # values around the limit, its float32 neighbours and the midpoints between them
        points = [float(limit), *nearby, *(float(limit) + nearby) / 2]
        points += list(float(limit) + rng.standard_normal(200) * 1e-7)
        for x in points:
            assert at_most(x) == (np.float32(x) <= limit), (top_p, x)


@pytest.mark.parametrize("top_p", [0.9, 0.5, 0.99])
@pytest.mark.parametrize("keep", [1, 3])
def test_top_p_on_a_short_row_equals_the_general_path(top_p, keep):
    """One short row takes the Python-float path; the same row twice in a batch the
    numpy one. Ties at the cut fall back to the general path."""
    processor = P.TopPProcessor(top_p, min_tokens_to_keep=keep)
    rng = np.random.default_rng(1)
    for width in [1, 2, 5, 50, 128]:
        for _ in range(50):
            row = (rng.standard_normal(width) * rng.uniform(0.1, 4)).astype(np.float32)
            if width > 4 and rng.random() < 0.3:
                row[rng.integers(0, width, 3)] = row[0]  # ties
            if width > 4 and rng.random() < 0.3:
                row[rng.integers(0, width, 2)] = -np.inf  # removed candidates
            alone = processor._cut(row[None, :])[0]
            general = processor._cut(np.stack([row, row]))[0][:1]
            np.testing.assert_array_equal(alone, general)


def test_a_draw_from_a_short_row_equals_the_general_draw():
    ctx = make_context(seed=11)
    few, rows = S.MultinomialSampler(ctx=ctx), S.MultinomialSampler(ctx=ctx)
    rng = np.random.default_rng(2)
    for width in [1, 3, 50, 128]:
        for _ in range(200):
            row = (rng.standard_normal((1, width)) * 3).astype(np.float32)
            row[0, rng.random(width) < 0.2] = -np.inf
            row[0, rng.integers(0, width)] = 0.0  # at least one finite score
            np.testing.assert_array_equal(few.draw_columns(row), rows._draw_rows(row))
    # the streams stayed in step: the next draws agree too
    assert few._rng.random() == rows._rng.random()


def test_check_sparse_passes_the_built_ins_and_catches_a_wrong_one():
    from ortgen.testing import check_sparse, sample_inputs

    ids, scores = sample_inputs(batch_size=3, vocab_size=64)
    for make in PROCESSORS.values():
        check_sparse(make(), ids, scores)
    check_sparse(S.MultinomialSampler(ctx=make_context(batch_size=3, seed=1)), ids, scores)
    check_sparse(S.GreedySampler(), ids, scores, keep=1)

    class OffByOne(P.TemperatureProcessor):
        def sparse(self, input_ids, scores):
            return scores.with_scores(scores.packed / self.temperature + 1e-3)

    with pytest.raises(ComponentError, match=r"OffByOne\.sparse differs from its dense call"):
        check_sparse(OffByOne(0.7), ids, scores)
    with pytest.raises(ComponentError, match="has no sparse method"):
        check_sparse(C.RepetitionPenaltyProcessor(1.2), ids, scores)
