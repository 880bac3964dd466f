"""ortgen.testing: the contract checks a plugin author runs catch what the loop would reject."""

from __future__ import annotations

import numpy as np
import pytest

import ortgen
from ortgen.plugins.processors import TopKProcessor
from ortgen.plugins.samplers import MultinomialSampler
from ortgen.plugins.stopping import EosCriterion
from ortgen.testing import (
    check_logits_processor,
    check_sampler,
    check_stopping_criterion,
    make_context,
    sample_inputs,
)


def test_builtins_pass_the_checks():
    out = check_logits_processor(TopKProcessor(top_k=3))
    assert (np.isfinite(out).sum(axis=1) == 3).all()
    ids = check_sampler(MultinomialSampler(ctx=make_context(seed=1)))
    assert ids.shape == (2,)
    input_ids, scores = sample_inputs()
    input_ids[0, -1] = 5
    done = check_stopping_criterion(EosCriterion(5), input_ids, scores)
    assert done[0]


def test_a_mutating_processor_is_caught():
    def mutating(input_ids, scores):
        scores[:, 0] = -np.inf
        return scores

    with pytest.raises(ortgen.ComponentError, match="modified its scores argument in place"):
        check_logits_processor(mutating)


def test_wrong_shapes_and_types_are_caught():
    with pytest.raises(ortgen.ComponentError, match="returned"):
        check_logits_processor(lambda ids, scores: scores[:, :-1])
    with pytest.raises(ortgen.ComponentError, match="integer token ids"):
        check_sampler(lambda ids, scores: scores.argmax(-1).astype(np.float32))
    with pytest.raises(ortgen.ComponentError, match="outside"):
        check_sampler(lambda ids, scores: np.full(scores.shape[0], scores.shape[1]))
    with pytest.raises(ortgen.ComponentError, match="expected bool"):
        check_stopping_criterion(lambda ids, scores: np.zeros(ids.shape[0], dtype=np.int64))


def test_make_context_defaults_and_overrides():
    ctx = make_context(
        vocab_size=100, eos_token_ids=[2, 3], seed=7, prompt_length=10, extras={"note": "x"}
    )
    assert (ctx.vocab_size, ctx.eos_token_ids, ctx.seed, ctx.config.seed) == (100, (2, 3), 7, 7)
    assert ctx.max_length == 26 and ctx.extras == {"note": "x"}
