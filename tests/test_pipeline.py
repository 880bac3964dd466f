"""Pipeline files: the pipeline layer of the config as a TOML file, checked at load with
every problem and its location in one error."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import ortgen
from ortgen.config.pipeline import load_pipeline

PROMPT = [5, 17, 42, 99]

GOOD = """
[generation]
max_new_tokens = 6
do_sample = true
seed = 3
temperature = 0.8
eos_token_id = []

[sampler]
name = "multinomial"

[[logits_processors]]
name = "top_k"
top_k = 20

[run]
batch_size = 4
"""


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_pipeline_file_is_the_pipeline_layer(tiny_llama_gen, tmp_path):
    path = write(tmp_path, GOOD.replace("eos_token_id = []\n", ""))
    pipeline = load_pipeline(path)
    assert pipeline.run.batch_size == 4 and pipeline.settings["max_new_tokens"] == 6
    ray = load_pipeline(
        write(tmp_path, "[run]\nengine = 'ray'\naddress = 'h:6379'\nworkers = 3\n", "r.toml")
    )
    assert (ray.run.engine, ray.run.address, ray.run.workers) == ("ray", "h:6379", 3)
    by_file = tiny_llama_gen.generate(PROMPT, pipeline=path, eos_token_id=None)
    settings = dict(max_new_tokens=6, do_sample=True, seed=3, temperature=0.8)
    by_call = tiny_llama_gen.generate(
        PROMPT, eos_token_id=None, logits_processors=[{"name": "top_k", "top_k": 20}], **settings
    )
    assert by_file.tokens == by_call.tokens
    resolved = tiny_llama_gen.resolve_config({"seed": 4}, pipeline=path)
    sources = {name: layer for name, _, layer in resolved.describe()}
    assert sources["temperature"] == "pipeline" and sources["seed"] == "call"


def test_a_drafter_table_is_a_component_like_the_others(tiny_llama_gen, tmp_path):
    """``[drafter]`` (every setting that names a component is a table of its own): the
    request drafts with it, and a parameter the drafter does not take is named."""
    from tests.test_speculative import PROMPTS as REPEATING

    text = '[generation]\nmax_new_tokens = 40\n[drafter]\nname = "prompt_lookup"\n'
    path = write(tmp_path, text + "num_tokens = 3\n")
    assert load_pipeline(path).settings["drafter"] == {"name": "prompt_lookup", "num_tokens": 3}
    drafted = 0
    for prompt in REPEATING:
        out = tiny_llama_gen.generate(prompt, pipeline=path, eos_token_id=None)
        plain = tiny_llama_gen.generate(prompt, max_new_tokens=40, eos_token_id=None)
        assert out.tokens == plain.tokens
        drafted += int(out.stats["drafted"])
    assert drafted > 0
    with pytest.raises(ortgen.ConfigError, match=r"drafter \(prompt_lookup\): unexpected 'bogus'"):
        load_pipeline(write(tmp_path, text + "bogus = 3\n", "bad.toml"))


def test_load_with_a_pipeline_takes_its_model_and_layer(tiny_model_dirs, tmp_path):
    onnx_dir = tiny_model_dirs["llama"][1]
    path = write(tmp_path, f'model = "{onnx_dir}"\n' + GOOD.replace("eos_token_id = []\n", ""))
    gen = ortgen.load(pipeline=path, threads=1)
    assert gen.path == onnx_dir
    alone = gen.generate(PROMPT, eos_token_id=None)
    assert alone.tokens == gen.generate(PROMPT, pipeline=path, eos_token_id=None).tokens
    assert len(alone.tokens[0]) == 6


TWO_PROCESSORS = """
[[logits_processors]]
name = 'top_k'
top_k = 5
[[logits_processors]]
name = 'top_p'
k = 1
"""
CASES = [
    ("[generation\nx = 1\n", [r"TOML syntax error: .*line 1"]),
    ("temperature = 0.5\n", [r"unknown key 'temperature' \(generation settings go under"]),
    ("modle = 'x'\n", [r"unknown key 'modle' \(did you mean 'model'\?\)"]),
    (
        "[generation]\ntempreature = 0.5\n",
        [r"\[generation\] tempreature: unknown setting \(did you mean 'temperature'\?\)"],
    ),
    ("[generation]\ntop_p = 2.0\n", [r"\[generation\] top_p must be in \[0, 1\], got 2.0"]),
    ("[generation]\npenalty_alpha = 0.5\n", [r"penalty_alpha=0.5 \(pipeline\): contrastive"]),
    (
        TWO_PROCESSORS,
        [r"logits_processors\[1\] \(top_p\): unexpected 'k'; accepts top_p, min_tokens_to_keep"],
    ),
    (
        "[[logits_processors]]\nname = 'top_kk'\n",
        [r"logits_processors\[0\] \(top_kk\): unknown logits_processor 'top_kk' \(did you"],
    ),
    (
        "[[logits_processors]]\ntop_k = 3\n",
        [r'logits_processors\[0\]: a logits_processor needs name = "..."'],
    ),
    ("[sampler]\nname = 'greedy'\nseed = 1\n", [r"sampler \(greedy\): unexpected 'seed'"]),
    (
        "[run]\nbatch_size = 0\nengine = 'spark'\n",
        [r"\[run\] batch_size must be an integer >= 1", r"\[run\] engine must be one of local"],
    ),
    ("[plugins]\ndisable = 'example'\n", [r"\[plugins\] disable must be a list"]),
    ("[run]\nworkers = 2\n", [r"\[run\] address and workers are for the ray engine"]),
    ("[run]\nengine = 'ray'\nworkers = 0\n", [r"\[run\] workers must be an integer >= 1"]),
    ("[run]\nbatch = 3\n", [r"\[run\] batch: unknown option \(did you mean 'batch_size'\?\)"]),
    (
        "[generation]\ntop_k = -1\ntop_p = 3\n",
        [r"\[generation\] top_k must be >= 0", r"\[generation\] top_p must be in"],
    ),
]


@pytest.mark.parametrize(("text", "messages"), CASES)
def test_every_problem_is_reported_with_its_location(tmp_path, text, messages):
    path = write(tmp_path, text)
    with pytest.raises(ortgen.ConfigError) as caught:
        load_pipeline(path)
    message = str(caught.value)
    assert str(path) in message
    for expected in messages:
        assert re.search(expected, message), (expected, message)


def test_several_problems_come_in_one_error(tmp_path):
    text = "modle = 1\n[generation]\ntempreature = 1\n[run]\nengine = 'x'\n"
    with pytest.raises(ortgen.ConfigError) as caught:
        load_pipeline(write(tmp_path, text))
    lines = str(caught.value).splitlines()
    assert len(lines) == 4 and lines[0].startswith("invalid pipeline")


def test_a_missing_pipeline_file_is_named(tmp_path):
    with pytest.raises(ortgen.ConfigError, match="does not exist"):
        load_pipeline(tmp_path / "nope.toml")


def test_cli_takes_a_pipeline_file(tiny_model_dirs, tmp_path, capsys):
    """``ortgen config show --pipeline`` shows the layer; ``generate --pipeline`` uses the
    file's model (the tiny model has no tokenizer, so generate says it needs one)."""
    from ortgen.cli import main

    onnx_dir = tiny_model_dirs["llama"][1]
    path = write(tmp_path, f'model = "{onnx_dir}"\n[generation]\ntop_k = 7\n')
    assert main(["config", "show", "--pipeline", str(path)]) == 0
    out = capsys.readouterr().out
    assert any(line.split()[:3] == ["top_k", "7", "pipeline"] for line in out.splitlines())
    assert main(["generate", "Hi", "--pipeline", str(path)]) == 2
    assert "needs a tokenizer" in capsys.readouterr().err
    bad = write(tmp_path, "[generation]\ntop_k = -1\n", "bad.toml")
    assert main(["config", "show", "--pipeline", str(bad)]) == 2
    assert "[generation] top_k must be >= 0" in capsys.readouterr().err


class _HalveLogits:
    """An in-process plugin's processor, for a pipeline file that names it."""

    def __init__(self, *, ctx) -> None:
        self.calls = 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        return scores * 0.5


class _InProcessPlugin:
    @ortgen.hookimpl
    def register_logits_processors(self, register):
        register("halve_logits", _HalveLogits)


def test_a_pipeline_names_an_in_process_plugins_component_with_one_plugin_manager(
    tmp_path, tiny_llama_gen, monkeypatch
) -> None:
    """``load(pipeline=..., plugins=[...])`` checks the file against the generator's own
    registry (which knows the in-process plugin), built once."""
    from ortgen import api

    path = write(
        tmp_path,
        """
        [generation]
        max_new_tokens = 3
        [[logits_processors]]
        name = "halve_logits"
        """,
    )
    with pytest.raises(ortgen.ConfigError, match="halve_logits"):  # unknown without it
        load_pipeline(path)
    made = []
    original = api.make_plugin_manager
    monkeypatch.setattr(api, "make_plugin_manager", lambda **kw: made.append(kw) or original(**kw))
    gen = ortgen.load(tiny_llama_gen.path, pipeline=path, plugins=[_InProcessPlugin()], threads=1)
    assert len(made) == 1
    out = gen.generate([1, 2, 3], eos_token_id=None)
    assert len(out.tokens[0]) == 3
    assert gen.resolve_config({}).config.logits_processors[0]["name"] == "halve_logits"


EVERYWHERE = """
[generation]
tempreature = 1
top_p = 2.0
regex = "[a-"

[[logits_processors]]
name = "top_p"
top_p = 0.9
k = 1

[run]
engine = "spark"

[output]
json_shema = "x.json"
"""


def test_a_generation_typo_hides_no_other_problem(tmp_path):
    """A [generation] typo used to stop the check there: the values, the constraint and
    the components went unchecked. Now each part is checked whatever the others hold,
    every problem in one error, in the file's order, each with its field."""
    path = write(tmp_path, EVERYWHERE)
    with pytest.raises(ortgen.ConfigError) as caught:
        load_pipeline(path)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"invalid pipeline {path}:"
    assert lines[1] == "  - [generation] tempreature: unknown setting (did you mean 'temperature'?)"
    assert lines[2] == "  - [generation] top_p must be in [0, 1], got 2.0"
    assert lines[3].startswith("  - [generation] regex: llguidance cannot compile")
    fields = [field for field, _ in caught.value.problems]
    assert fields == [
        "generation.tempreature", "generation.top_p", "generation.regex",
        "logits_processors[0]", "run.engine", "output.json_shema",
    ]  # fmt: skip


def test_ortgen_run_reports_the_file_and_its_command_line_in_one_error(tmp_path, capsys):
    """The pipeline's problems and the command line's (flags, the job's settings over the
    pipeline, a missing input), in one error, before any model loads."""
    from ortgen.cli import build_parser, main
    from ortgen.cli.run import _checked_job

    path = write(tmp_path, EVERYWHERE)
    missing = tmp_path / "nope.jsonl"
    argv = ["run", str(path), "--input", str(missing), "--output", str(tmp_path / "o.jsonl")]
    argv += ["--batch-size", "0", "--workers", "2", "--set", "top_k=-3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"ortgen: error: invalid pipeline {path} and command line:"
    assert err[-4:] == [
        "  - command line: top_k must be >= 0 (0 disables it), got -3",
        "  - --batch-size must be at least 1, got 0",
        "  - --address and --workers are for the ray engine (--engine ray)",
        f"  - input file {missing} does not exist",
    ]
    with pytest.raises(ortgen.ConfigError) as caught:
        _checked_job(build_parser().parse_args(argv))
    fields = [field for field, _ in caught.value.problems]
    assert fields[:6] == [
        "generation.tempreature", "generation.top_p", "generation.regex",
        "logits_processors[0]", "run.engine", "output.json_shema",
    ]  # fmt: skip
    assert fields[6:] == ["top_k", "--batch-size", "--engine", "--input"]
    good = write(tmp_path, "[generation]\nmax_new_tokens = 4\n", "good.toml")
    argv = ["run", str(good), "--input", str(missing), "--dry-run", "--set", "top_p=3"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "ortgen: error: invalid command line:",
        "  - command line: top_p must be in [0, 1], got 3.0",
        f"  - input file {missing} does not exist",
    ]


@pytest.mark.parametrize("name", ["~nosuchuser_ortgen/s.json", "~\x00/s.json", "a\x00b.json"])
def test_an_output_schema_name_the_system_refuses_is_a_problem(name) -> None:
    """Found by the fuzzer: ``~user`` of no user and a NUL byte raised from the path
    calls instead of being one problem naming ``[output] json_schema``."""
    from ortgen.config.pipeline import check_pipeline

    _, problems = check_pipeline({"output": {"json_schema": name}})
    assert [key for key, _ in problems] == ["output.json_schema"]
