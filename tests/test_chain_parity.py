"""The whole chain against transformers: flat Hugging Face settings switch on the same
processors in the same order, and greedy ``generate`` with each of them gives the same
tokens as ``transformers``' ``model.generate`` on the same weights.

Tiny random models (llama, gpt2, qwen2) run every setting on a left-padded batch, so the
padding (which the penalties see in ``input_ids``, as in Hugging Face) is covered too;
the default model's weights (at fp32) run all of them at once on a chat prompt.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers import GenerationConfig as HFGenerationConfig
from transformers.generation import logits_process as hf_lp

import ortgen
from ortgen import config as config_mod
from ortgen.plugin_host.chains import build_chain, processor_specs
from ortgen.plugin_host.manager import build_registry, make_plugin_manager
from ortgen.testing import make_context
from tests.tiny_models import PAD_ID

PROMPTS = [[5, 17, 42, 99, 3, 64], [7, 8], [200, 13, 55, 1, 9, 9, 9, 31, 77]]
NEW = 16

#: transformers' class for each built-in processor name
HF_NAMES = {
    hf_lp.RepetitionPenaltyLogitsProcessor: "repetition_penalty",
    hf_lp.NoRepeatNGramLogitsProcessor: "no_repeat_ngram_size",
    hf_lp.NoBadWordsLogitsProcessor: "bad_words_ids",
    hf_lp.MinNewTokensLengthLogitsProcessor: "min_new_tokens",
    hf_lp.TemperatureLogitsWarper: "temperature",
    hf_lp.TopKLogitsWarper: "top_k",
    hf_lp.TopPLogitsWarper: "top_p",
    hf_lp.MinPLogitsWarper: "min_p",
    hf_lp.TypicalLogitsWarper: "typical_p",
}


# --------------------------------------------------------------------------- which processors


@pytest.fixture(scope="module")
def hf_llama(tiny_model_dirs):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"][0]).eval()


def hf_processors(hf, settings: dict[str, Any], prompt_length: int) -> list:
    """transformers' processor list for ``settings``, built the way ``generate`` builds it."""
    generation_config = HFGenerationConfig(**{"eos_token_id": 2, "pad_token_id": 0, **settings})
    hf._prepare_special_tokens(generation_config, kwargs_has_attention_mask=True, device="cpu")
    return list(
        hf._get_logits_processor(
            generation_config,
            input_ids_seq_length=prompt_length,
            encoder_input_ids=torch.zeros(1, prompt_length, dtype=torch.long),
            logits_processor=None,
            device="cpu",
            model_kwargs={},
        )
    )


def ortgen_config(settings: dict[str, Any]) -> config_mod.GenerationConfig:
    return config_mod.resolve([("call", {"eos_token_id": 2, "pad_token_id": 0, **settings})]).config


SWITCHES = [
    {},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 1.0},  # 1.0 disables it
    {"no_repeat_ngram_size": 3},
    {"bad_words_ids": [[4], [9, 10]]},
    {"min_new_tokens": 5},
    {"min_new_tokens": 5, "eos_token_id": None},  # no EOS: nothing to hold back
    {"repetition_penalty": 0.8, "no_repeat_ngram_size": 2, "bad_words_ids": [[3]]},
    {"repetition_penalty": 1.2, "min_new_tokens": 4, "bad_words_ids": [[7]]},
    {"do_sample": True},
    {"do_sample": True, "temperature": 0.7, "top_k": 0},
    {"do_sample": True, "temperature": 0.5, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
    {"do_sample": True, "typical_p": 0.8, "top_p": 0.95, "repetition_penalty": 1.1},
    {
        "do_sample": True, "temperature": 1.3, "top_k": 40, "top_p": 0.8, "min_p": 0.1,
        "typical_p": 0.9, "repetition_penalty": 1.5, "no_repeat_ngram_size": 4,
        "bad_words_ids": [[6]], "min_new_tokens": 2,
    },
    {"temperature": 0.5, "top_k": 3, "top_p": 0.5},  # sampling-only settings, greedy: off
]  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("settings", SWITCHES, ids=lambda s: ",".join(s) or "defaults")
def test_flat_settings_switch_on_hugging_face_processors_in_order(hf_llama, settings):
    expected = [HF_NAMES[type(p)] for p in hf_processors(hf_llama, settings, 6)]
    specs = processor_specs(ortgen_config(settings))
    assert [name for name, _ in specs] == expected


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_processor_parameters_match_hugging_face(hf_llama):
    settings = SWITCHES[-2]
    hf = hf_processors(hf_llama, settings, 6)
    params = dict(processor_specs(ortgen_config(settings)))
    by_name = {HF_NAMES[type(p)]: p for p in hf}
    assert (
        params["repetition_penalty"]["repetition_penalty"] == by_name["repetition_penalty"].penalty
    )
    assert (
        params["no_repeat_ngram_size"]["no_repeat_ngram_size"]
        == by_name["no_repeat_ngram_size"].ngram_size
    )
    assert params["min_new_tokens"]["min_new_tokens"] == by_name["min_new_tokens"].min_new_tokens
    assert params["temperature"]["temperature"] == by_name["temperature"].temperature
    assert params["top_k"]["top_k"] == by_name["top_k"].top_k
    assert params["top_p"]["top_p"] == pytest.approx(by_name["top_p"].top_p)
    assert params["min_p"]["min_p"] == pytest.approx(by_name["min_p"].min_p)
    assert params["typical_p"]["typical_p"] == pytest.approx(by_name["typical_p"].mass)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "settings", [SWITCHES[i] for i in (7, 8, 11, 12, 13)], ids=lambda s: ",".join(s)
)
def test_built_chain_transforms_scores_like_hugging_face(hf_llama, settings):
    """The chain ``build_chain`` creates (the real components, in their order) turns the
    same scores into the same distribution as transformers' processor list. Order
    matters here (top-k before top-p is not top-p before top-k), so a swap fails."""
    rng = np.random.default_rng(0)
    batch, vocab, prompt_length = 3, 256, 6
    config = ortgen_config(settings)
    registry = build_registry(make_plugin_manager())
    ctx = make_context(
        config=config, batch_size=batch, vocab_size=vocab, prompt_length=prompt_length,
        eos_token_ids=config.eos_token_ids, pad_token_id=0, max_length=prompt_length + 20,
    )  # fmt: skip
    chain = build_chain(registry, ctx, cache=("unused", None))  # no graph: no cache needed
    hf = hf_processors(hf_llama, settings, prompt_length)
    for length in (prompt_length + 1, prompt_length + 9):
        ids = rng.integers(3, 12, (batch, length)).astype(np.int64)  # repeats: penalties bite
        scores = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
        ours = scores
        for _, processor in chain.processors:
            ours = processor(ids, ours)
        theirs = torch.from_numpy(scores.copy())
        for processor in hf:
            theirs = processor(torch.from_numpy(ids), theirs)
        theirs = theirs.numpy()
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
        kept = ~np.isneginf(theirs)
        np.testing.assert_allclose(ours[kept], theirs[kept], rtol=1e-5, atol=1e-5)
        assert kept.sum() < kept.size, "no token was removed: the test would prove little"


# --------------------------------------------------------------------------- tokens: tiny models


def hf_generate(hf, prompts: list[list[int]], **settings) -> np.ndarray:
    """transformers' greedy generate on the left-padded batch: (B, T) sequences."""
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(
            ids, attention_mask=mask, do_sample=False, pad_token_id=PAD_ID, **settings
        )
    return out.numpy()


@pytest.fixture(scope="module")
def free(models) -> np.ndarray:
    """Plain greedy, no EOS: what each setting must change."""
    hf, _ = models
    return hf_generate(hf, PROMPTS, max_new_tokens=NEW, eos_token_id=None)


def settings_for(name: str, free: np.ndarray) -> dict[str, Any]:
    """Settings that bite on this model: bad words and EOS picked from its free output."""
    width = max(map(len, PROMPTS))
    gen = free[:, width:]
    eos = int(gen[0, 2])  # row 0 reaches it at step 3: min_new_tokens must hold it back
    return {
        "repetition_penalty": {"repetition_penalty": 1.5, "eos_token_id": None},
        "repetition_penalty<1": {"repetition_penalty": 0.7, "eos_token_id": None},
        "no_repeat_ngram_size": {"no_repeat_ngram_size": 1, "eos_token_id": None},
        "no_repeat_ngram_size=3": {"no_repeat_ngram_size": 3, "eos_token_id": None},
        "bad_words_ids": {
            "bad_words_ids": [[int(gen[0, 1])], [int(gen[1, 3]), int(gen[1, 4])]],
            "eos_token_id": None,
        },
        "min_new_tokens": {"min_new_tokens": 8, "eos_token_id": eos},
        "eos": {"eos_token_id": eos},
        "combined": {
            "repetition_penalty": 1.3, "no_repeat_ngram_size": 3,
            "bad_words_ids": [[int(gen[2, 0])]], "min_new_tokens": 5, "eos_token_id": eos,
        },
        "combined<1": {
            "repetition_penalty": 0.9, "no_repeat_ngram_size": 2,
            "bad_words_ids": [[int(gen[1, 0]), int(gen[1, 1])]], "eos_token_id": None,
        },
    }[name]  # fmt: skip


CASES = [
    "repetition_penalty",
    "repetition_penalty<1",
    "no_repeat_ngram_size",
    "no_repeat_ngram_size=3",
    "bad_words_ids",
    "min_new_tokens",
    "eos",
    "combined",
    "combined<1",
]


@pytest.mark.parametrize("case", CASES)
def test_greedy_with_flat_settings_equals_transformers(models, free, case):
    hf, gen = models
    settings = settings_for(case, free)
    expected = hf_generate(hf, PROMPTS, max_new_tokens=NEW, **settings)
    out = gen.generate(PROMPTS, max_new_tokens=NEW, **settings)
    np.testing.assert_array_equal(out.sequences, expected)
    if case not in ("eos", "no_repeat_ngram_size=3"):  # (3-grams rarely repeat in 16 tokens)
        changed = expected.shape != free.shape or not np.array_equal(expected, free)
        assert changed, f"{case} changed nothing on this model: the test would prove little"


def test_min_new_tokens_holds_eos_back(models, free):
    """The EOS greedy reaches at step 3 only ends row 0 from step 8 on."""
    _, gen = models
    settings = settings_for("min_new_tokens", free)
    without = gen.generate(PROMPTS[0], max_new_tokens=NEW, eos_token_id=settings["eos_token_id"])
    held = gen.generate(PROMPTS[0], max_new_tokens=NEW, **settings)
    assert len(without.tokens[0]) <= 3 and without.finish_reasons == ["eos"]
    assert len(held.tokens[0]) >= 8
    assert settings["eos_token_id"] not in held.tokens[0][:7]


@pytest.mark.parametrize(
    ("ortgen_settings", "hf_settings"),
    [
        # max_length counts the prompt (the padded prompt, in a batch)
        ({"max_length": 14, "max_new_tokens": None}, {"max_length": 14}),
        # both given in one call: max_new_tokens wins, as in transformers
        ({"max_length": 12, "max_new_tokens": 5}, {"max_length": 12, "max_new_tokens": 5}),
        ({"max_new_tokens": 3}, {"max_new_tokens": 3}),
    ],
)
def test_max_length_and_max_new_tokens_like_transformers(models, ortgen_settings, hf_settings):
    hf, gen = models
    expected = hf_generate(hf, PROMPTS, eos_token_id=None, **hf_settings)
    out = gen.generate(PROMPTS, eos_token_id=None, **ortgen_settings)
    np.testing.assert_array_equal(out.sequences, expected)
    assert out.finish_reasons == ["length"] * len(PROMPTS)


def test_max_length_from_generation_config_applies_when_max_new_tokens_is_not_set(
    models, tmp_path, tiny_arch, tiny_model_dirs
):
    """A model's generation_config.json ``max_length`` beats the library default
    ``max_new_tokens`` (a later layer); a call's ``max_new_tokens`` beats it again."""
    import json
    import shutil

    hf, _ = models
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dirs[tiny_arch][1], folder)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_length": 13}))
    gen = ortgen.load(folder, threads=1)
    out = gen.generate(PROMPTS[0], eos_token_id=None)
    assert out.sequences.shape[1] == 13
    expected = hf_generate(hf, [PROMPTS[0]], eos_token_id=None, max_length=13)
    np.testing.assert_array_equal(out.sequences, expected)
    assert len(gen.generate(PROMPTS[0], eos_token_id=None, max_new_tokens=9).tokens[0]) == 9


# --------------------------------------------------------------------------- tokens: default model


@pytest.mark.default_model
def test_default_model_greedy_with_flat_settings_equals_transformers(reference_gen, default_hf):
    """The default model's weights as an fp32 graph (the quantised default variant is not
    token-exact by design), one generation with every flat constraint at once
    (transformers' generate is slow here)."""
    settings = {
        "repetition_penalty": 1.3,
        "no_repeat_ngram_size": 3,
        "bad_words_ids": [[28], [30]],  # "," and "."
        "min_new_tokens": 12,
        "eos_token_id": 2,
    }
    prompt = reference_gen.chat_prompt([{"role": "user", "content": "Describe a city, briefly."}])
    new = 16
    with torch.no_grad():
        expected = default_hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=2,
            **settings,
        )[0, len(prompt) :].tolist()
    out = reference_gen.generate(prompt, max_new_tokens=new, **settings)
    assert out.tokens[0] == expected
    free = reference_gen.generate(prompt, max_new_tokens=new, eos_token_id=2)
    assert out.tokens[0] != free.tokens[0], "the settings changed nothing"


# --------------------------------------------------------------------------- token rules
# (ortgen.plugins.token_rules and .truncation; their unit tests are tests/test_token_rules.py)

HF_NAMES.update(
    {
        hf_lp.SequenceBiasLogitsProcessor: "sequence_bias",
        hf_lp.MinLengthLogitsProcessor: "min_length",
        hf_lp.ForcedBOSTokenLogitsProcessor: "forced_bos_token_id",
        hf_lp.ForcedEOSTokenLogitsProcessor: "forced_eos_token_id",
        hf_lp.InfNanRemoveLogitsProcessor: "remove_invalid_values",
        hf_lp.ExponentialDecayLengthPenalty: "exponential_decay_length_penalty",
        hf_lp.SuppressTokensLogitsProcessor: "suppress_tokens",
        hf_lp.SuppressTokensAtBeginLogitsProcessor: "begin_suppress_tokens",
        hf_lp.LogitNormalization: "renormalize_logits",
        hf_lp.EpsilonLogitsWarper: "epsilon_cutoff",
        hf_lp.EtaLogitsWarper: "eta_cutoff",
    }
)
SEQUENCE_BIAS = [[[5], 2.0], [[7, 8], -3.0], [[8], 0.5]]
TOKEN_RULE_SETTINGS = [
    {"sequence_bias": SEQUENCE_BIAS, "min_length": 12, "suppress_tokens": [4, 9]},
    {"begin_suppress_tokens": [3, 5], "exponential_decay_length_penalty": (2, 1.4)},
    {"forced_eos_token_id": [2, 6], "max_length": 14, "remove_invalid_values": True},
    {"forced_bos_token_id": 1, "repetition_penalty": 1.2, "renormalize_logits": True},
    {"do_sample": True, "epsilon_cutoff": 3e-3, "top_k": 0},
    {"do_sample": True, "eta_cutoff": 2e-3, "temperature": 0.8},
    {
        "do_sample": True, "epsilon_cutoff": 0.01, "eta_cutoff": 0.01, "top_p": 0.95,
        "renormalize_logits": True, "sequence_bias": SEQUENCE_BIAS, "min_length": 10,
    },
    {"epsilon_cutoff": 0.01, "eta_cutoff": 0.01, "renormalize_logits": True},  # greedy: no cut
]  # fmt: skip


def token_rule_steps(model, settings, prompt_length, steps=9, seed=0):
    """Both chains over ``steps`` growing rows (one chain per request, as generate builds)."""
    rng = np.random.default_rng(seed)
    ours = ortgen.logits_processors(eos_token_id=2, pad_token_id=0, **settings)
    theirs = hf_processors(model, settings, prompt_length)
    ids = rng.integers(3, 12, (3, prompt_length)).astype(np.int64)
    ids[0, -1] = 7  # completes [7, 8] at once
    for _ in range(steps):
        scores = (rng.standard_normal((3, 256)) * 3).astype(np.float32)
        expected = torch.from_numpy(scores.copy())
        for processor in theirs:
            expected = processor(torch.from_numpy(ids), expected)
        yield ours(ids, scores), expected.numpy()
        ids = np.concatenate([ids, rng.integers(3, 12, (3, 1))], axis=1)
    assert ours.names == [HF_NAMES[type(p)] for p in theirs]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("settings", TOKEN_RULE_SETTINGS, ids=lambda s: ",".join(s))
def test_token_rule_settings_build_hugging_faces_chain(hf_llama, settings):
    """Same processors in the same order (names checked at the end), same scores at every
    step: the begin step, min_length's end, the decay's start and forced EOS all fall in."""
    for ours, theirs in token_rule_steps(hf_llama, settings, prompt_length=6):
        assert_scores_close(ours, theirs)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "settings",
    [
        {"forced_bos_token_id": 9},
        {"forced_bos_token_id": 9, "begin_suppress_tokens": [3, 4]},
    ],
    ids=lambda s: ",".join(s),
)
def test_token_rules_on_a_one_token_prompt_like_hugging_face(hf_llama, settings):
    for ours, theirs in token_rule_steps(hf_llama, settings, prompt_length=1, steps=3):
        assert_scores_close(ours, theirs)


def assert_scores_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    for where in (np.isneginf, np.isposinf, np.isnan):
        np.testing.assert_array_equal(where(ours), where(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-5, atol=1e-5)
