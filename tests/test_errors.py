"""Bad input gets a clear error that names the problem (and a non-zero CLI exit)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import ortgen
from ortgen.cli import main


@pytest.fixture(scope="module")
def gen(tiny_llama_gen):
    return tiny_llama_gen


def test_backbone_is_refused(backbone_dir):
    with pytest.raises(ortgen.ModelLoadError, match="backbone and cannot generate"):
        ortgen.load(backbone_dir)


def test_graph_without_past_is_refused(no_past_dir):
    with pytest.raises(ortgen.ModelLoadError, match="no past-key-value inputs"):
        ortgen.load(no_past_dir)


def test_missing_folder(tmp_path):
    with pytest.raises(ortgen.ModelLoadError, match="no such model folder or GGUF file"):
        ortgen.load(tmp_path / "nope")


def test_incomplete_folder(tmp_path, tiny_model_dirs):
    folder = tmp_path / "partial"
    shutil.copytree(tiny_model_dirs["llama"][1], folder)
    (folder / "config.json").unlink()
    with pytest.raises(ortgen.ModelLoadError, match=r"no config\.json"):
        ortgen.load(folder)
    (folder / "model.onnx").unlink()
    with pytest.raises(ortgen.ModelLoadError, match=r"no model\.onnx"):
        ortgen.load(folder)


@pytest.mark.parametrize("prompt", [[], np.zeros((1, 0), np.int64), [[1, 2], []]])
def test_empty_prompt(gen, prompt):
    with pytest.raises(ortgen.InputError, match="empty"):
        gen.generate(prompt, max_new_tokens=2)


def test_text_prompt_without_tokenizer(gen):
    with pytest.raises(ortgen.InputError, match="needs a tokenizer"):
        gen.generate("hello", max_new_tokens=2)


def test_prompt_longer_than_context(gen):
    context = gen.model.max_context
    with pytest.raises(ortgen.InputError, match=f"context is {context} tokens"):
        gen.generate([1] * (context + 5), max_new_tokens=2)


def test_token_ids_out_of_range(gen):
    with pytest.raises(ortgen.InputError, match="outside"):
        gen.generate([1, 2, 10**6], max_new_tokens=2)


@pytest.mark.parametrize("value", [0, -3])
def test_max_new_tokens_must_be_positive(gen, value):
    with pytest.raises(ortgen.ConfigError, match="max_new_tokens must be > 0"):
        gen.generate([1, 2], max_new_tokens=value)


def test_unknown_setting_did_you_mean(gen):
    with pytest.raises(ortgen.ConfigError, match=r"unknown setting 'temprature'.*'temperature'"):
        gen.generate([1, 2], temprature=0.5)


def test_every_problem_listed_at_once(gen):
    with pytest.raises(ortgen.ConfigError) as info:
        gen.generate([1, 2], top_p=3.0, top_k=-1, max_new_tokens=0)
    message = str(info.value)
    assert "top_p" in message and "top_k" in message and "max_new_tokens" in message


def test_generation_stops_at_context(gen):
    context = gen.model.max_context
    out = gen.generate([1] * (context - 3), max_new_tokens=50, eos_token_id=None)
    assert len(out.tokens[0]) == 3 and out.finish_reasons == ["length"]


def test_cli_errors_exit_non_zero(tmp_path, capsys, tiny_model_dirs):
    assert main(["generate", "hi", "--model", str(tmp_path / "missing")]) == 2
    assert "no such model folder or GGUF file" in capsys.readouterr().err
    model = str(tiny_model_dirs["llama"][1])
    assert main(["config", "show", "--model", model, "--set", "bogus=1"]) == 2
    assert "unknown setting 'bogus'" in capsys.readouterr().err
    assert main(["config", "show", "--model", str(tmp_path)]) == 2
    assert "not a model folder" in capsys.readouterr().err


def test_null_for_a_required_setting_is_a_config_error(gen):
    with pytest.raises(ortgen.ConfigError, match=r"top_k must be set \(it cannot be null"):
        gen.generate([1, 2], top_k=None, do_sample=True)


def test_unknown_key_type_and_range_problems_reported_together(gen):
    with pytest.raises(ortgen.ConfigError) as info:
        gen.generate([1, 2], tempreature=0.5, top_p=2.0, num_beams="two", stop_strings=5)
    message = str(info.value)
    for expected in (
        "'tempreature'",
        "top_p must be in [0, 1]",
        "num_beams must be an integer",
        "stop_strings must be",
    ):
        assert expected in message, expected


def test_a_single_component_name_is_not_split_into_letters(gen):
    resolved = gen.resolve_config({"stopping_criteria": "eos", "sampler": "greedy"})
    assert resolved.config.stopping_criteria == ({"name": "eos"},)
    assert resolved.config.sampler == {"name": "greedy"}
    with pytest.raises(ortgen.ConfigError, match="logits_processors must be"):
        gen.resolve_config({"logits_processors": 5})


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        (b"hello", "not bytes"),  # bytes are ints when iterated: they were taken as ids
        ([[1.5, 2.0]], "token ids must be integers, got 1.5"),  # were cut to 1 and 2
        ([True, 5], "got True"),
        ({"prompt": [1.0, 2.0]}, "got 1.0"),
        (np.array([1.0, 2.0]), "array of float64"),
        ([[1, 2], b"ab"], "got bytes"),
    ],
)
def test_prompts_that_are_not_token_ids_are_refused(gen, prompt, match):
    with pytest.raises(ortgen.InputError, match=match):
        gen.generate(prompt, max_new_tokens=2)


@pytest.mark.parametrize("threads", [-1, 0, 1.5, True])
def test_threads_must_be_a_positive_integer(tiny_model_dirs, threads):
    with pytest.raises(ortgen.InputError, match="threads must be a positive integer"):
        ortgen.load(tiny_model_dirs["llama"][1], threads=threads)


@pytest.mark.parametrize("key", ["temperature", "max_time", "presence_penalty", "dry_base"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_float_settings_must_be_finite(gen, key, value):
    """NaN fails every range check by comparing False, so temperature=nan was taken (and
    inf as well): every float setting must be finite."""
    with pytest.raises(ortgen.ConfigError, match=f"{key} must be a finite number"):
        gen.generate([1, 2], max_new_tokens=2, do_sample=True, **{key: value})


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"pad_token_id": 10**9}, "pad_token_id"),
        ({"pad_token_id": None, "eos_token_id": 300}, "eos_token_id"),
    ],
)
def test_a_padding_id_outside_the_vocabulary_is_a_config_error(gen, settings, named):
    """It was fed to the model's embedding for the shorter row: onnxruntime's Gather
    failed mid-request ("indices element out of data bounds"), as a ComponentError."""
    vocab = gen.model.signature.vocab_size
    said = f"{named}=.* is outside the vocabulary \\[0, {vocab}\\)"
    with pytest.raises(ortgen.ConfigError, match=said):
        gen.generate([[5, 6, 7], [5]], max_new_tokens=2, **settings)
