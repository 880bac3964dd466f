"""Config layering and provenance: defaults < model config.json < generation_config.json <
pipeline < call, each layer overriding the ones before it, and ``resolve_config``
naming the layer that set each value. Checked on a loaded tiny model whose two config
files are edited, and through ``generate`` where a value decides the output length."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

import ortgen
from ortgen import config as config_mod

PROMPT = [5, 17, 42, 99, 3, 64]

CONFIG_JSON = {"eos_token_id": 2, "pad_token_id": 0, "bos_token_id": 1}
GENERATION_JSON = {
    "eos_token_id": [2, 5],
    "bos_token_id": 3,
    "temperature": 0.6,
    "top_k": 20,
    "max_new_tokens": 11,
    "transformers_version": "4.57.6",  # a known Hugging Face field ortgen ignores
}


def make_model(src: Path, dest: Path, config: dict, generation: dict | None) -> Path:
    """A copy of the tiny model: ``config`` updates its config.json (which describes the
    graph too), ``generation`` replaces its generation_config.json (None: no file)."""
    shutil.copytree(src, dest)
    path = dest / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    path = dest / "generation_config.json"
    if generation is None:
        path.unlink()
    else:
        path.write_text(json.dumps(generation))
    return dest


@pytest.fixture(scope="module")
def gen(tiny_model_dirs, tmp_path_factory):
    src = tiny_model_dirs["llama"][1]
    root = tmp_path_factory.mktemp("layers")
    return ortgen.load(make_model(src, root / "m", CONFIG_JSON, GENERATION_JSON), threads=1)


def sources(resolved: config_mod.Resolved) -> dict[str, tuple]:
    return {name: (value, layer) for name, value, layer in resolved.describe()}


def test_layer_names_and_order():
    assert config_mod.LAYERS == (
        "defaults",
        "model config.json",
        "generation_config.json",
        "pipeline",
        "call",
    )


def test_model_files_override_defaults(gen):
    got = sources(gen.resolve_config())
    assert got["pad_token_id"] == (0, "model config.json")  # only config.json sets it
    assert got["eos_token_id"] == ([2, 5], "generation_config.json")  # both set it
    assert got["bos_token_id"] == (3, "generation_config.json")
    assert got["temperature"] == (0.6, "generation_config.json")
    assert got["top_k"] == (20, "generation_config.json")
    assert got["max_new_tokens"] == (11, "generation_config.json")
    assert got["top_p"] == (1.0, "defaults")
    assert got["repetition_penalty"] == (1.0, "defaults")
    assert got["cache"][1] == "defaults"
    assert set(got) == set(config_mod.FIELDS)


@pytest.mark.parametrize(
    ("pipeline", "call", "value", "layer"),
    [
        ({}, {}, 0.6, "generation_config.json"),
        ({"temperature": 0.7}, {}, 0.7, "pipeline"),
        ({}, {"temperature": 0.8}, 0.8, "call"),
        ({"temperature": 0.7}, {"temperature": 0.9}, 0.9, "call"),
    ],
)
def test_each_layer_overrides_the_ones_before(gen, pipeline, call, value, layer):
    resolved = gen.resolve_config({"do_sample": True, **call}, pipeline=pipeline)
    assert resolved.config.temperature == value
    assert sources(resolved)["temperature"] == (value, layer)
    assert sources(resolved)["do_sample"] == (True, "call")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_all_five_layers_at_once(gen):
    pipeline = {"eos_token_id": 7, "repetition_penalty": 1.2, "top_k": 5}
    call = {"eos_token_id": 9, "seed": 4}
    got = sources(gen.resolve_config(call, pipeline=pipeline))
    assert got["typical_p"] == (1.0, "defaults")
    assert got["pad_token_id"] == (0, "model config.json")
    assert got["temperature"] == (0.6, "generation_config.json")
    assert got["repetition_penalty"] == (1.2, "pipeline")
    assert got["top_k"] == (5, "pipeline")
    assert got["eos_token_id"] == (9, "call")
    assert got["seed"] == (4, "call")


def test_a_later_layer_can_unset_a_value(gen):
    resolved = gen.resolve_config({"eos_token_id": None}, pipeline={"eos_token_id": 7})
    assert resolved.config.eos_token_id is None and resolved.config.eos_token_ids == ()
    assert sources(resolved)["eos_token_id"] == (None, "call")


def test_layers_decide_what_generate_does(gen):
    """The winning layer's max_new_tokens is the number of tokens generated."""
    no_eos = {"eos_token_id": None}
    assert len(gen.generate(PROMPT, **no_eos).tokens[0]) == 11  # generation_config.json
    piped = gen.generate(PROMPT, pipeline={"max_new_tokens": 4}, **no_eos)
    assert len(piped.tokens[0]) == 4
    called = gen.generate(PROMPT, pipeline={"max_new_tokens": 4}, max_new_tokens=6, **no_eos)
    assert len(called.tokens[0]) == 6
    # the pipeline's EOS beats the model's: a token the free run reaches ends the row
    free = gen.generate(PROMPT, max_new_tokens=8, **no_eos).tokens[0]
    stop = free[3]
    out = gen.generate(PROMPT, pipeline={"eos_token_id": stop}, max_new_tokens=8)
    assert out.tokens[0] == free[: free.index(stop) + 1] and out.finish_reasons == ["eos"]


@pytest.mark.parametrize(
    ("generation", "pipeline", "call", "new_tokens", "source"),
    [
        # max_length in the model file beats the library default max_new_tokens
        ({"max_length": 13}, {}, {}, 13 - len(PROMPT), "generation_config.json"),
        # ... and a later max_new_tokens beats that max_length
        ({"max_length": 13}, {"max_new_tokens": 3}, {}, 3, "pipeline"),
        ({"max_length": 13}, {}, {"max_new_tokens": 2}, 2, "call"),
        # a later max_length beats an earlier max_new_tokens
        ({"max_new_tokens": 11}, {"max_length": 10}, {}, 10 - len(PROMPT), "pipeline"),
        ({"max_new_tokens": 11}, {"max_new_tokens": 3}, {"max_length": 9}, 9 - len(PROMPT), "call"),
    ],
)
def test_max_length_and_max_new_tokens_the_later_layer_wins(
    tiny_model_dirs, tmp_path, generation, pipeline, call, new_tokens, source
):
    folder = make_model(tiny_model_dirs["llama"][1], tmp_path / "m", {}, generation)
    gen = ortgen.load(folder, threads=1)
    resolved = gen.resolve_config(call, pipeline=pipeline)
    assert sources(resolved)["max_new_tokens"][1] == source
    out = gen.generate(PROMPT, pipeline=pipeline, eos_token_id=None, **call)
    assert len(out.tokens[0]) == new_tokens


def test_config_json_only_contributes_token_ids(tiny_model_dirs, tmp_path):
    """transformers keeps generation settings in generation_config.json; config.json
    gives ortgen its token ids and nothing else."""
    config = {"eos_token_id": 4, "pad_token_id": 6, "bos_token_id": 5, "max_length": 7}
    folder = make_model(tiny_model_dirs["llama"][1], tmp_path / "m", config, None)
    got = sources(ortgen.load(folder, threads=1).resolve_config())
    assert got["eos_token_id"] == (4, "model config.json")
    assert got["pad_token_id"] == (6, "model config.json")
    assert got["bos_token_id"] == (5, "model config.json")
    assert got["max_length"] == (None, "defaults")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_unknown_keys_warn_in_model_files_and_fail_in_pipeline_and_call(tiny_model_dirs, tmp_path):
    folder = make_model(
        tiny_model_dirs["llama"][1], tmp_path / "m", {}, {"tempreature": 0.5, "top_k": 9}
    )
    gen = ortgen.load(folder, threads=1)
    with pytest.warns(UserWarning, match="tempreature"):
        resolved = gen.resolve_config()
    assert resolved.config.top_k == 9
    for layer in ("pipeline", "call"):
        kwargs = {"pipeline": {"tempreature": 0.5}} if layer == "pipeline" else {}
        settings = {"tempreature": 0.5} if layer == "call" else {}
        with pytest.raises(ortgen.ConfigError, match="did you mean 'temperature'"):
            gen.resolve_config(settings, **kwargs)


def test_ignored_hugging_face_fields(gen):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers_version in the model file: silent
        gen.resolve_config()
    with pytest.warns(UserWarning, match="'output_attentions' only shapes what transformers"):
        gen.resolve_config({"output_attentions": True})


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("penalty_alpha", 0.6, "contrastive search needs the model's hidden states"),
        ("encoder_repetition_penalty", 1.2, "encoder-decoder setting"),
        ("num_assistant_tokens", 5, "assisted \\(speculative\\) decoding"),
        ("watermarking_config", {"greenlist_ratio": 0.25}, "watermarking"),
    ],
)
def test_hugging_face_fields_that_cannot_apply_are_errors_unless_default(gen, key, value, why):
    from ortgen.config import UNSUPPORTED_HF_FIELDS

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen.resolve_config({key: UNSUPPORTED_HF_FIELDS[key][0]})  # the default: accepted
    for layers in ({"settings": {key: value}}, {"pipeline": {key: value}}):
        settings = layers.get("settings", {})
        with pytest.raises(ortgen.ConfigError, match=f"{key}=.*{why}"):
            gen.resolve_config(settings, pipeline=layers.get("pipeline"))


def test_sampling_warning_only_for_settings_a_caller_gave(gen):
    """The model file's temperature/top_k are not the caller's doing: no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen.resolve_config()
        gen.resolve_config({"top_p": 0.5, "do_sample": True})
    with pytest.warns(UserWarning, match="top_p"):
        gen.resolve_config(pipeline={"top_p": 0.5})


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_bad_value_in_any_layer_names_the_setting(tiny_model_dirs, tmp_path):
    folder = make_model(tiny_model_dirs["llama"][1], tmp_path / "m", {}, {"top_k": "many"})
    gen = ortgen.load(folder, threads=1)
    with pytest.raises(ortgen.ConfigError, match="top_k must be an integer, got 'many'"):
        gen.resolve_config()
    # a later layer that sets it fixes it
    assert sources(gen.resolve_config({"top_k": 4}))["top_k"] == (4, "call")
    with pytest.raises(ortgen.ConfigError, match="top_p must be in"):
        gen.resolve_config(pipeline={"top_p": 2.0}, settings={"top_k": 4})


def test_broken_generation_config_json(tiny_model_dirs, tmp_path):
    folder = make_model(tiny_model_dirs["llama"][1], tmp_path / "m", {}, {})
    (folder / "generation_config.json").write_text("{not json")
    with pytest.raises(ortgen.ConfigError, match=r"generation_config\.json is not valid JSON"):
        ortgen.load(folder, threads=1)


@pytest.mark.default_model
def test_provenance_of_default_model_matches_its_files(default_model_dir):
    """On the real model: every value a model file sets is reported as set by that file."""
    resolved = config_mod.resolve(config_mod.model_layers(default_model_dir))
    generation = json.loads((default_model_dir / "generation_config.json").read_text())
    got = sources(resolved)
    for key in generation:
        if key in config_mod.FIELDS:
            assert got[key][1] == "generation_config.json", key
    assert all(
        layer in ("defaults", "model config.json", "generation_config.json")
        for _, layer in got.values()
    )
