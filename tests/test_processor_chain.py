"""``ortgen.logits_processors(**settings)``: the chain the loop builds, as one callable,
against transformers' ``_get_logits_processor`` — including where components given
explicitly run (where transformers merges a user's ``logits_processor`` list: after the
penalties, before temperature/top-k/top-p)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers import GenerationConfig as HFGenerationConfig
from transformers.generation import logits_process as hf_lp

import ortgen


@pytest.fixture(scope="module")
def hf_llama(tiny_model_dirs):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"][0]).eval()


def hf_chain(hf, settings: dict[str, Any], prompt_length: int, user: list | None = None):
    config = HFGenerationConfig(**{"eos_token_id": 2, "pad_token_id": 0, **settings})
    hf._prepare_special_tokens(config, kwargs_has_attention_mask=True, device="cpu")
    return hf._get_logits_processor(
        config,
        input_ids_seq_length=prompt_length,
        encoder_input_ids=torch.zeros(1, prompt_length, dtype=torch.long),
        logits_processor=hf_lp.LogitsProcessorList(user or []),
        device="cpu",
        model_kwargs={},
    )


def _compare(ours_chain, hf, rng, batch=3, vocab=256, prompt_length=6) -> None:
    for length in (prompt_length, prompt_length + 7):
        ids = rng.integers(3, 12, (batch, length)).astype(np.int64)
        scores = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
        ours = ours_chain(ids, scores)
        theirs = hf(torch.from_numpy(ids), torch.from_numpy(scores.copy())).numpy()
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
        kept = ~np.isneginf(theirs)
        np.testing.assert_allclose(ours[kept], theirs[kept], rtol=1e-5, atol=1e-5)


SETTINGS = [
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
    {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.1},
    {"do_sample": True, "min_p": 0.05, "typical_p": 0.9, "bad_words_ids": [[5], [7, 8]]},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(s))
def test_logits_processors_equal_get_logits_processor(hf_llama, settings):
    chain = ortgen.logits_processors(eos_token_id=2, pad_token_id=0, **settings)
    _compare(chain, hf_chain(hf_llama, settings, 6), np.random.default_rng(0))


def test_explicit_processors_run_where_transformers_merges_them(hf_llama):
    """A penalty given explicitly runs before temperature, as transformers runs a user's
    processors; after top-k it would change only the kept tokens, and the test fails."""
    settings = {"do_sample": True, "temperature": 0.5, "top_k": 8}
    chain = ortgen.logits_processors(
        eos_token_id=2,
        pad_token_id=0,
        logits_processors=[{"name": "repetition_penalty", "repetition_penalty": 3.0}],
        **settings,
    )
    user = [hf_lp.RepetitionPenaltyLogitsProcessor(3.0)]
    _compare(chain, hf_chain(hf_llama, settings, 6, user), np.random.default_rng(1))
    assert chain.names == ["repetition_penalty", "temperature", "top_k"]


def test_logits_processors_reports_bad_settings():
    with pytest.raises(ortgen.ConfigError, match="top_p must be in"):
        ortgen.logits_processors(top_p=2.0)
    chain = ortgen.logits_processors(logits_processors=["no_such_processor"])
    with pytest.raises(ortgen.ConfigError, match="no_such_processor"):
        chain(np.zeros((1, 2), dtype=np.int64), np.zeros((1, 8), dtype=np.float32))
