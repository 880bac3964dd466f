"""Scores, logits and logprobs against transformers' ``generate(output_scores=True,
output_logits=True)`` and ``compute_transition_scores`` on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ortgen.errors import InputError
from tests.tiny_models import PAD_ID

PROMPTS = [[5, 17, 42, 99, 3, 64], [7, 8, 200, 13]]


def hf_generate(hf, prompt: list[int], **settings):
    with torch.no_grad():
        return hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            output_scores=True,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=PAD_ID,
            **settings,
        )


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_scores_logits_and_logprobs_equal_transformers(models, prompt):
    hf, gen = models
    settings = dict(max_new_tokens=8, eos_token_id=None, repetition_penalty=1.3)
    expected = hf_generate(hf, prompt, do_sample=False, **settings)
    out = gen.generate(
        prompt, logprobs=True, top_logprobs=3, output_scores=True, output_logits=True, **settings
    )
    assert out.tokens[0] == expected.sequences[0, len(prompt) :].tolist()
    assert len(out.scores) == len(out.logits) == len(expected.scores) == 8
    for ours, theirs in zip(out.logits, expected.logits, strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4)
    for ours, theirs in zip(out.scores, expected.scores, strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4)
    assert not np.allclose(out.scores[3], out.logits[3])  # the penalty changed the scores
    transition = hf.compute_transition_scores(
        expected.sequences, expected.scores, normalize_logits=True
    )
    np.testing.assert_allclose(out.logprobs[0], transition[0].numpy(), atol=1e-4)
    # the chosen token is the best alternative under greedy, with the same value
    for step, alternatives in enumerate(out.top_logprobs[0]):
        assert len(alternatives) == 3
        assert alternatives[0][0] == out.tokens[0][step]
        assert alternatives[0][1] == pytest.approx(out.logprobs[0][step], abs=1e-6)
        values = [v for _, v in alternatives]
        assert values == sorted(values, reverse=True)
        log_probs = torch.log_softmax(expected.scores[step][0], dim=-1)
        top = torch.topk(log_probs, 3)
        assert [t for t, _ in alternatives] == top.indices.tolist()


def test_sampled_first_step_scores_are_the_processed_distribution(models):
    """Sampling draws differ between torch and numpy; the first step's processed scores
    (temperature, top-k, top-p) do not."""
    hf, gen = models
    settings = dict(max_new_tokens=1, eos_token_id=None, temperature=0.7, top_k=20, top_p=0.9)
    expected = hf_generate(hf, PROMPTS[0], do_sample=True, **settings)
    out = gen.generate(PROMPTS[0], do_sample=True, seed=1, output_scores=True, **settings)
    ours, theirs = out.scores[0], expected.scores[0].numpy()
    assert np.array_equal(np.isneginf(ours), np.isneginf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-5, atol=1e-5)
    log_probs = torch.log_softmax(expected.scores[0][0], dim=-1)
    token = out.tokens[0][0]
    lp = gen.generate(PROMPTS[0], do_sample=True, seed=1, logprobs=True, **settings).logprobs
    assert lp[0][0] == pytest.approx(float(log_probs[token]), abs=1e-4)


def test_batch_logprobs_are_trimmed_per_row_and_equal_single_prompts(tiny_llama_gen):
    gen = tiny_llama_gen
    alone = [gen.generate(p, max_new_tokens=6, logprobs=True, eos_token_id=None) for p in PROMPTS]
    batch = gen.generate(PROMPTS, max_new_tokens=6, logprobs=True, eos_token_id=None)
    for row, single in enumerate(alone):
        assert len(batch.logprobs[row]) == len(batch.tokens[row]) == 6
        np.testing.assert_allclose(batch.logprobs[row], single.logprobs[0], atol=1e-4)
    free = gen.generate(PROMPTS, max_new_tokens=6, eos_token_id=None)
    eos = free.tokens[1][2]  # row 1 ends at its third token, row 0 runs on (if it differs)
    ended = gen.generate(PROMPTS, max_new_tokens=6, logprobs=True, eos_token_id=eos)
    for row in range(2):
        assert len(ended.logprobs[row]) == len(ended.tokens[row])


def test_logprobs_follow_rewind_and_are_refused_when_not_asked(tiny_llama_gen):
    gen = tiny_llama_gen
    state = gen.start(PROMPTS[0], max_new_tokens=6, logprobs=True, eos_token_id=None)
    for _ in range(4):
        state.step()
    first = state.logprobs(0)
    state.rewind(2)
    assert state.logprobs(0) == first[:2]
    while not state.is_done:
        state.step()
    assert len(state.logprobs(0)) == 6 and state.logprobs(0)[:4] == pytest.approx(first, abs=1e-5)
    plain = gen.start(PROMPTS[0], max_new_tokens=2)
    plain.step()
    with pytest.raises(InputError, match="logprobs were not recorded"):
        plain.logprobs(0)
    out = gen.generate(PROMPTS[0], max_new_tokens=2)
    assert out.logprobs is out.top_logprobs is out.scores is out.logits is None
