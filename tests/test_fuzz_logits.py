"""Fuzzing every built-in logits processor and sampler with random logits: NaN, ±inf,
huge values and ties, random batch and vocabulary sizes, random parameters.

Each component is built through the registry as a request builds it, and run through
the loop's own path (``ortgen.loop.scoring``: ``sparse`` methods on Candidates where a
component has one). The property everywhere: an ``OrtgenError`` (a sampler refuses a
row it cannot draw from with a ``ComponentError``), or a right-shaped answer: scores of
the input's shape, or one valid token id per row that the processed scores allow; and
a floor of examples that must end in such an answer (``answering``), so a component
that refuses everything fails. Bounded by the hypothesis profile (``tests/conftest.py``;
``make fuzz`` runs more).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ortgen import ComponentError, OrtgenError
from ortgen.loop.scoring import dense, pick, process, resolve, works_on_candidates
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
from ortgen.testing import make_context
from tests.fuzz_settings import ANSWERED, REFUSED, answering, fuzz, outcome

REGISTRY = build_registry(make_plugin_manager())
PROCESSORS = REGISTRY.names("logits_processor")
#: those that need no tokenizer (the grammar and the thinking budget read text: they run
#: on a text vocabulary)
PLAIN_PROCESSORS = [name for name in PROCESSORS if name not in ("grammar", "thinking_budget")]
SAMPLERS = REGISTRY.names("sampler")
NAN, INF = float("nan"), float("inf")
#: every processor that runs on text needs the model's tokenizer (the tiny one's ids)
TEXT_VOCAB = 256
#: examples per test in `make test` (`make fuzz`: 2000)
QUICK = 60
# The floors (``answering``): what share of the examples must end in a checked answer (a
# token picked, scores kept free of NaN) rather than a refusal. Each is about half the
# lowest share 5 runs of 60 gave a working build (the share of 2000 in parentheses), or
# 80% where nothing was refused.

# -- logits ----------------------------------------------------------------------------

#: scores: moderate floats, a few values that tie, the extremes, NaN and ±inf
SPECIAL = st.sampled_from([NAN, INF, -INF, 0.0, 1.0, -1.0, 3.0e38, -3.0e38, 1e-45])
TIES = st.sampled_from([0.0, 0.5, 2.0])
SCORE = st.one_of(st.floats(-30, 30, width=32), TIES, SPECIAL)
#: scores a model could give (finite or -inf, at least one finite per row)
PLAIN_SCORE = st.one_of(st.floats(-30, 30, width=32), TIES, st.just(-INF))


@st.composite
def logits(draw: st.DrawFn, score: st.SearchStrategy[float] = SCORE, vocab: int | None = None):
    """(input_ids, scores): a batch of 1-3 rows of 1-6 tokens, over a vocabulary of 1-40
    (or ``vocab``)."""
    batch = draw(st.integers(1, 3))
    # small vocabularies, and wide ones where top-k leaves Candidates (the sparse path)
    width = vocab or draw(st.one_of(st.integers(1, 40), st.integers(100, 600)))
    length = draw(st.integers(1, 6))
    ids = draw(hnp.arrays(np.int64, (batch, length), elements=st.integers(0, width - 1)))
    scores = draw(hnp.arrays(np.float32, (batch, width), elements=score))
    return ids, scores


def token_lists(vocab: int, *, min_size: int = 0) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, vocab - 1), min_size=min_size, max_size=4)


def unit(low_open: bool = False) -> st.SearchStrategy[float]:
    return st.floats(0.0, 1.0, exclude_min=low_open)


KEEP = st.integers(1, 3)
# -- parameters: per component, values a request could carry ---------------------------


def processor_params(name: str, vocab: int) -> st.SearchStrategy[dict[str, Any]]:
    eos = st.one_of(st.none(), st.integers(0, vocab - 1))
    table: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "bad_words_ids": st.fixed_dictionaries(
            {"bad_words_ids": st.lists(token_lists(vocab, min_size=1), min_size=1, max_size=3)},
            optional={"eos_token_id": eos},
        ),
        "begin_suppress_tokens": st.fixed_dictionaries(
            {"begin_suppress_tokens": token_lists(vocab)},
            optional={"begin_index": st.integers(0, 8)},
        ),
        "dry": st.fixed_dictionaries(
            {"multiplier": st.floats(0, 5)},
            optional={
                "base": st.floats(1, 3),
                "allowed_length": st.integers(0, 4),
                "penalty_last_n": st.integers(-1, 10),
                "sequence_breakers": st.just(()),
            },
        ).map(lambda p: {**p, "sequence_breakers": ()}),
        "epsilon_cutoff": st.fixed_dictionaries(
            {"epsilon": st.floats(0, 1, exclude_max=True)}, optional={"min_tokens_to_keep": KEEP}
        ),
        "eta_cutoff": st.fixed_dictionaries(
            {"epsilon": st.floats(0, 1, exclude_max=True)}, optional={"min_tokens_to_keep": KEEP}
        ),
        "exponential_decay_length_penalty": st.fixed_dictionaries(
            {"start_index": st.integers(0, 8), "decay_factor": st.floats(0.5, 3)},
            optional={"eos_token_id": eos},
        ),
        "forced_bos_token_id": st.fixed_dictionaries({"bos_token_id": st.integers(0, vocab - 1)}),
        "forced_eos_token_id": st.fixed_dictionaries(
            {
                "max_length": st.integers(1, 12),
                "eos_token_id": st.one_of(
                    st.integers(0, vocab - 1), token_lists(vocab, min_size=1)
                ),
            }
        ),
        "frequency_penalty": st.fixed_dictionaries({"frequency_penalty": st.floats(-2, 2)}),
        "presence_penalty": st.fixed_dictionaries({"presence_penalty": st.floats(-2, 2)}),
        "thinking_budget": st.fixed_dictionaries({"budget": st.integers(1, 8)}),
        "grammar": st.sampled_from(
            [
                {"json_object": True},
                {"regex": "[a-c]+x?"},
                {"choice": ["yes", "no"]},
                {"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
                {"grammar": 'start: "ab" | "c"'},
            ]
        ),
        "logit_bias": st.fixed_dictionaries(
            {
                "logit_bias": st.dictionaries(
                    st.integers(0, vocab - 1), st.floats(-100, 100), max_size=4
                )
            }
        ),
        "min_length": st.fixed_dictionaries(
            {"min_length": st.integers(0, 12)}, optional={"eos_token_id": eos}
        ),
        "min_new_tokens": st.fixed_dictionaries(
            {"min_new_tokens": st.integers(0, 8)}, optional={"eos_token_id": eos}
        ),
        "min_p": st.fixed_dictionaries({"min_p": unit()}, optional={"min_tokens_to_keep": KEEP}),
        "no_repeat_ngram_size": st.fixed_dictionaries({"no_repeat_ngram_size": st.integers(1, 4)}),
        "remove_invalid_values": st.just({}),
        "renormalize_logits": st.just({}),
        "repetition_penalty": st.fixed_dictionaries(
            {"repetition_penalty": st.floats(0.01, 5)},
            optional={"prompt_ignore_length": st.integers(0, 4)},
        ),
        "sequence_bias": st.fixed_dictionaries(
            {
                "sequence_bias": st.lists(
                    st.tuples(token_lists(vocab, min_size=1), st.floats(-10, 10)),
                    min_size=1,
                    max_size=3,
                ).map(lambda pairs: [[ids, bias] for ids, bias in pairs])
            }
        ),
        "suppress_tokens": st.fixed_dictionaries({"suppress_tokens": token_lists(vocab)}),
        "temperature": st.fixed_dictionaries({"temperature": st.floats(0.01, 10)}),
        "top_k": st.fixed_dictionaries(
            {"top_k": st.one_of(st.integers(0, 8), st.integers(0, vocab + 2))},
            optional={"min_tokens_to_keep": KEEP},
        ),
        "top_n_sigma": st.fixed_dictionaries({"n": st.floats(0.01, 5)}),
        "top_p": st.fixed_dictionaries({"top_p": unit()}, optional={"min_tokens_to_keep": KEEP}),
        "typical_p": st.fixed_dictionaries(
            {"typical_p": unit(low_open=True)}, optional={"min_tokens_to_keep": KEEP}
        ),
        "xtc": st.fixed_dictionaries(
            {"probability": unit()}, optional={"threshold": unit(), "min_tokens_to_keep": KEEP}
        ),
    }
    return table[name]


def test_every_built_in_component_has_a_strategy():
    """A new built-in processor or sampler must be fuzzed too: give it a strategy here."""
    for name in PROCESSORS:
        processor_params(name, 8)
    assert set(SAMPLERS) == {"beam_search", "greedy", "mirostat_v2", "multinomial"}


# -- the context a component is built with ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tiny models' character tokenizer (256 ids), for the processors on text."""
    from ortgen.text import load_tokenizer
    from tests.tiny_models import save_tiny_tokenizer

    folder = save_tiny_tokenizer(tmp_path_factory.mktemp("fuzz-tokenizer"))
    return load_tokenizer(Path(folder))


def context(ids: np.ndarray, vocab: int, seed: int, tokenizer: Any = None, **kwargs: Any):
    batch, length = ids.shape
    ctx = make_context(
        vocab_size=vocab,
        batch_size=batch,
        prompt_length=max(1, length - 1),
        eos_token_ids=(min(2, vocab - 1),),
        pad_token_id=0,
        max_length=length + 8,
        seed=seed,
        **kwargs,
    )
    return dataclasses.replace(ctx, tokenizer=tokenizer) if tokenizer is not None else ctx


def build(kind: str, name: str, params: dict[str, Any], ctx: Any) -> Any:
    """The component as a request gets it (the registry's checks included), or None when
    the registry refuses its parameters with a ConfigError (a clear error: fine)."""
    try:
        return REGISTRY.create(kind, name, params, ctx)
    except OrtgenError:
        return None


def draw_processor(data: Any, name: str, vocab: int, ctx: Any, label: str = "params") -> Any:
    """A processor with drawn parameters, or None when the registry refuses them."""
    params = data.draw(processor_params(name, vocab), label=label)
    return build("logits_processor", name, params, ctx)


# -- the properties --------------------------------------------------------------------


def check_processed(out: Any, shape: tuple[int, ...]) -> np.ndarray:
    scores = dense(out)
    assert isinstance(scores, np.ndarray), type(scores)
    assert scores.shape == shape, (scores.shape, shape)
    assert scores.dtype.kind == "f", scores.dtype
    return scores


def check_picked(picked: Any, scores: np.ndarray, *, search: bool = False) -> None:
    """One id per row (beam search: per beam) inside the vocabulary; a plain sampler
    never picks a token its scores rule out (-inf) nor one scored NaN."""
    rows, vocab = scores.shape
    picked = np.asarray(picked)
    assert picked.shape == (rows,), (picked.shape, rows)
    assert picked.dtype.kind in "iu", picked.dtype
    assert np.all((picked >= 0) & (picked < vocab)), picked
    if not search:
        chosen = scores[np.arange(rows), picked]
        assert not np.any(np.isnan(chosen)), (picked, scores)
        assert not np.any(chosen == -INF), (picked, scores)


def run_chain(processors: list[tuple[str, Any]], sampler: tuple[str, Any], ids, scores) -> None:
    shape = scores.shape
    try:
        out = process(resolve(processors), ids, scores.copy())
    except OrtgenError:
        event("a processor refused")
        outcome(REFUSED)
        return
    processed = check_processed(out, shape)
    try:
        picked = pick(sampler, works_on_candidates(sampler[1]), ids, out)
    except OrtgenError:
        event("the sampler refused")
        outcome(REFUSED)
        return
    check_picked(picked, processed)
    outcome(ANSWERED)  # a token picked


GREEDY = ("greedy", REGISTRY.create("sampler", "greedy", {}, None))


@answering(0.4)  # 77-95% (82%)
@fuzz(QUICK, long=2000)
@given(
    name=st.sampled_from(PLAIN_PROCESSORS),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_processor_on_random_logits(name, data, seed):
    """Any logits through any processor: an OrtgenError or right-shaped scores, and the
    greedy sampler after it picks an allowed token or refuses the row by name."""
    ids, scores = data.draw(logits(), label="logits")
    vocab = scores.shape[1]
    processor = draw_processor(data, name, vocab, context(ids, vocab, seed))
    if processor is None:
        outcome(REFUSED)
        return
    run_chain([(name, processor)], GREEDY, ids, scores)


@answering(0.8)  # 100% (100%): none refused
@fuzz(QUICK, long=2000)
@given(
    name=st.sampled_from(PLAIN_PROCESSORS),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_processor_keeps_plain_logits_free_of_nan(name, data, seed):
    """Scores a model gives (finite, or -inf, with a finite one per row) never come out
    NaN: a NaN a processor made would make the sampler fail a request that was fine."""
    ids, scores = data.draw(logits(PLAIN_SCORE), label="logits")
    scores[:, 0] = np.where(np.isfinite(scores[:, 0]), scores[:, 0], 0.0)
    vocab = scores.shape[1]
    processor = draw_processor(data, name, vocab, context(ids, vocab, seed))
    if processor is None:
        outcome(REFUSED)
        return
    try:
        out = process(resolve([(name, processor)]), ids, scores.copy())
    except OrtgenError:
        outcome(REFUSED)
        return
    processed = check_processed(out, scores.shape)
    assert not np.isnan(processed).any(), (scores, processed)
    outcome(ANSWERED)


@answering(0.5)  # 88-100% (94%)
@fuzz(QUICK, long=2000)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_grammar_on_random_logits(tiny_tokenizer, data, seed):
    """The structured-output processor (it needs the tokenizer) on any logits."""
    ids, scores = data.draw(logits(vocab=TEXT_VOCAB), label="logits")
    params = data.draw(processor_params("grammar", TEXT_VOCAB), label="params")
    ctx = context(ids, TEXT_VOCAB, seed, tokenizer=tiny_tokenizer)
    processor = build("logits_processor", "grammar", params, ctx)
    assert processor is not None, params  # every one of these schemas compiles
    run_chain([("grammar", processor)], GREEDY, ids, scores)


@answering(0.35)  # 65-83% (73%)
@fuzz(QUICK, long=2000)
@given(
    names=st.lists(st.sampled_from(PLAIN_PROCESSORS), max_size=4).map(
        lambda names: ["top_k", *names] if len(names) % 2 else names  # Candidates next
    ),
    sampler=st.sampled_from(["greedy", "multinomial", "mirostat_v2"]),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_chain_of_processors_then_sampler(names, sampler, data, seed):
    """Several processors in a row (top-k's Candidates reach the next one), then a
    sampler: an OrtgenError or a valid, allowed token per row."""
    ids, scores = data.draw(logits(), label="logits")
    vocab = scores.shape[1]
    ctx = context(ids, vocab, seed)
    chain = []
    for name in names:
        processor = draw_processor(data, name, vocab, ctx, label=name)
        if processor is not None:
            chain.append((name, processor))
    params: dict[str, Any] = {}
    if sampler == "mirostat_v2":
        params = data.draw(
            st.fixed_dictionaries({}, optional={"tau": st.floats(0.01, 10), "eta": unit(True)}),
            label="mirostat",
        )
    built = build("sampler", sampler, params, ctx)
    assert built is not None, params
    run_chain(chain, (sampler, built), ids, scores)


@answering(0.4)  # 80-85% (80%)
@fuzz(QUICK, long=2000)
@given(
    beams=st.integers(2, 4),
    items=st.integers(1, 2),
    vocab=st.integers(1, 30),
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_beam_search_on_random_logits(beams, items, vocab, data, seed):
    """Beam search's step on any log-probabilities: an OrtgenError or one valid id per
    beam, and parents inside the item's beams."""
    rows = beams * items
    length = data.draw(st.integers(1, 5), label="length")
    ids = data.draw(hnp.arrays(np.int64, (rows, length), elements=st.integers(0, vocab - 1)))
    scores = data.draw(hnp.arrays(np.float32, (rows, vocab), elements=SCORE), label="scores")
    params = data.draw(
        st.fixed_dictionaries(
            {"num_beams": st.just(beams)},
            optional={
                "length_penalty": st.floats(-2, 2),
                "early_stopping": st.sampled_from([True, False, "never"]),
                "num_return_sequences": st.integers(1, beams),
                "do_sample": st.booleans(),
            },
        ),
        label="params",
    )
    search = build("sampler", "beam_search", params, context(ids, vocab, seed))
    assert search is not None, params
    try:
        picked = search(ids, scores.copy())
    except OrtgenError:
        outcome(REFUSED)
        return
    check_picked(picked, scores, search=True)
    assert not np.isnan(search.running_scores).any(), search.running_scores
    parents = np.asarray(search.parents)
    assert parents.shape == (rows,)
    assert np.all((parents >= 0) & (parents < rows)), parents
    assert np.all(parents // beams == np.arange(rows) // beams), parents
    outcome(ANSWERED)


@pytest.mark.parametrize(("bad", "what"), [(NAN, "NaN"), (INF, r"\+inf")])
def test_beam_search_refuses_nan_and_plus_inf(bad, what):
    """Found by fuzzing: beam search ranked beams by NaN (and +inf, which becomes NaN a
    step later) without a word, and its sequence scores came out NaN."""
    ctx = make_context(vocab_size=5, batch_size=2, prompt_length=1, eos_token_ids=(2,), seed=0)
    search = REGISTRY.create("sampler", "beam_search", {"num_beams": 2}, ctx)
    scores = np.log(np.full((2, 5), 0.2, np.float32))
    scores[1, 3] = bad
    with pytest.raises(ComponentError, match=f"'beam_search'.*row 1.*{what}"):
        search(np.zeros((2, 1), np.int64), scores)


def test_grammar_leaves_a_nan_row_to_the_sampler(tiny_tokenizer):
    """Found by fuzzing: the grammar processor raised a bare ValueError blaming an
    earlier processor for a row of NaN scores (or +inf ones, which greedy takes)."""
    ids = np.zeros((1, 1), np.int64)
    ctx = context(ids, TEXT_VOCAB, 0, tokenizer=tiny_tokenizer)
    grammar = REGISTRY.create("logits_processor", "grammar", {"choice": ["yes", "no"]}, ctx)
    out = process(resolve([("grammar", grammar)]), ids, np.full((1, TEXT_VOCAB), NAN, np.float32))
    with pytest.raises(ComponentError, match=r"'greedy'.*NaN"):
        pick(GREEDY, works_on_candidates(GREEDY[1]), ids, out)
    ctx = context(ids, TEXT_VOCAB, 0, tokenizer=tiny_tokenizer)
    grammar = REGISTRY.create("logits_processor", "grammar", {"choice": ["yes", "no"]}, ctx)
    scores = np.zeros((1, TEXT_VOCAB), np.float32)
    scores[0, tiny_tokenizer.encode("y")[0]] = INF
    out = process(resolve([("grammar", grammar)]), ids, scores)
    assert pick(GREEDY, works_on_candidates(GREEDY[1]), ids, out).tolist() == tiny_tokenizer.encode(
        "y"
    )
    ctx = context(ids, TEXT_VOCAB, 0, tokenizer=tiny_tokenizer)
    grammar = REGISTRY.create("logits_processor", "grammar", {"choice": ["yes", "no"]}, ctx)
    with pytest.raises(ComponentError, match=r"'grammar'.*removed by an earlier processor"):
        process(resolve([("grammar", grammar)]), ids, np.full((1, TEXT_VOCAB), -INF, np.float32))
