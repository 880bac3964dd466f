"""The ``ortgen`` command in subprocesses, as a user runs it: output, exit status, errors.

docs/cli.md promises: status 0 on success; 2 with one line ``ortgen: error: MESSAGE``
for any ortgen error and for argparse usage errors; 1 with a traceback for a bug;
warnings as ``ortgen: warning: MESSAGE`` on stderr without changing the status.
Commands run on a tiny random model with a character-level tokenizer (fast to load),
and the output is compared with the Python API on the same folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ortgen
from tests.tiny_models import build_tiny_hf, export_tiny

CLI = [sys.executable, "-m", "ortgen.cli"]


def run(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one ``ortgen: error:`` line a failed command must print (and nothing else)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ortgen: error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-tiny")


@pytest.fixture(scope="module")
def model(tiny_root: Path) -> Path:
    """A tiny llama with a tokenizer and a chat template, exported with ortgen."""
    return export_tiny("llama", tiny_root, with_tokenizer=True)


@pytest.fixture(scope="module")
def gen(model: Path):
    return ortgen.load(model, threads=1)


# --------------------------------------------------------------------------- generate / chat

# eos_token_id=null: the random model must not stop early, so the output has a known length
LONG = ["--set", "eos_token_id=null"]


def test_generate_streams_what_the_api_generates(model: Path, gen) -> None:
    result = run("generate", "Hello", "-m", str(model), "--max-new-tokens", "12", *LONG)
    assert result.returncode == 0, result.stderr
    expected = gen.generate("Hello", max_new_tokens=12, eos_token_id=None)
    assert len(expected.tokens[0]) == 12 and expected.text
    assert result.stdout == expected.text + "\n"
    assert result.stderr == ""


def test_generate_flags_reach_the_request(model: Path, gen) -> None:
    """Sampling flags and --set form the call layer (--set after the flags)."""
    args = ["--do-sample", "--temperature", "0.7", "--top-k", "20", "--seed", "3"]
    result = run(
        "generate", "Hi", "-m", str(model), *args, "--max-new-tokens", "20",
        "--set", "max_new_tokens=9", *LONG, "--threads", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    settings = dict(do_sample=True, temperature=0.7, top_k=20, seed=3, eos_token_id=None)
    expected = gen.generate("Hi", max_new_tokens=9, **settings)
    assert result.stdout == expected.text + "\n"
    other_seed = gen.generate("Hi", max_new_tokens=9, **{**settings, "seed": 4})
    assert other_seed.text != expected.text, "seed would not be tested"


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_beam_search_prints_the_chosen_text(model: Path, gen, command: str) -> None:
    """A search has no text until it has chosen: the CLI prints the best sequence (it
    used to fail asking for a tokenizer), the same text as the API's."""
    args = ["--set", "num_beams=3", "--max-new-tokens", "10", *LONG]
    result = run(command, "Hi there", "-m", str(model), *args)
    assert result.returncode == 0, result.stderr
    call = dict(num_beams=3, max_new_tokens=10, eos_token_id=None)
    if command == "chat":
        expected = gen.chat([{"role": "user", "content": "Hi there"}], **call).text
    else:
        expected = gen.generate("Hi there", **call).text
    assert expected and result.stdout == expected + "\n"
    greedy = gen.generate("Hi there", max_new_tokens=10, eos_token_id=None).text
    assert command == "chat" or greedy != expected, "beams would not be tested"


def test_chat_with_system_prompt_answers_like_the_api(model: Path, gen) -> None:
    system, question = "Answer briefly.", "What is 2 + 2?"
    result = run(
        "chat", question, "--system", system, "-m", str(model), "--max-new-tokens", "10", *LONG
    )
    assert result.returncode == 0, result.stderr
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    expected = gen.chat(messages, max_new_tokens=10, eos_token_id=None).text
    assert result.stdout == expected + "\n"
    without = gen.chat(messages[1:], max_new_tokens=10, eos_token_id=None).text
    assert without != expected, "the system prompt would not be tested"


def test_interactive_chat_keeps_the_history(model: Path, gen) -> None:
    result = run(
        "chat", "-m", str(model), "--max-new-tokens", "6", *LONG, stdin="Hi there\nAnd now?\n\n"
    )
    assert result.returncode == 0, result.stderr
    session = gen.chat_session(max_new_tokens=6, eos_token_id=None)
    first = "".join(session.send("Hi there"))
    second = "".join(session.send("And now?"))
    assert result.stdout == f"> {first}\n> {second}\n> "


def test_threads_flag_reaches_the_session_options(model: Path, monkeypatch, capsys) -> None:
    """In-process, to read the session the command built."""
    import ortgen.api
    from ortgen.cli import main

    seen = []
    real_load = ortgen.api.load

    def spy(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        seen.append(loaded.model.session.get_session_options())
        return loaded

    monkeypatch.setattr(ortgen.api, "load", spy)
    for threads in (1, 2):
        args = ["generate", "Hi", "-m", str(model), "--max-new-tokens", "2", "--threads"]
        assert main([*args, str(threads)]) == 0
    capsys.readouterr()
    assert [o.intra_op_num_threads for o in seen] == [1, 2]


# --------------------------------------------------------------------------- export


def test_export_a_hf_folder(tiny_root: Path) -> None:
    hf = build_tiny_hf("llama", tiny_root / "llama-src")
    out = tiny_root / "llama-cli"
    result = run("export", str(hf), str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() and all(
        line.startswith("[ortgen] ") for line in result.stderr.strip().splitlines()
    ), result.stderr
    assert {"model.onnx", "config.json", "generation_config.json", "ortgen_manifest.json"} <= {
        p.name for p in out.iterdir()
    }
    exported = ortgen.load(out, threads=1)
    out_tokens = exported.generate([5, 6, 7], max_new_tokens=4, eos_token_id=None).tokens
    assert len(out_tokens[0]) == 4

    again = run("export", str(hf), str(out))  # an existing export needs --overwrite
    assert again.returncode == 2
    assert "overwrite" in error_line(again)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/missing-folder", "{tmp}/out"], "missing-folder"),
        (["{tmp}/not-a-model", "{tmp}/out"], "not-a-model"),
        (["{tmp}/not-a-model"], "needs SOURCE and OUT"),
    ],
)
def test_export_bad_source_is_a_clean_error(tmp_path: Path, args, message) -> None:
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "notes.txt").write_text("no config.json here")
    result = run("export", *[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == 2
    assert message in error_line(result)
    assert not (tmp_path / "out").exists()


def test_export_has_no_gguf_precision(tmp_path: Path) -> None:
    """The export extra's former GGUF rewrite (``--precision gguf``) is gone: argparse
    refuses it (``exact``, ortgen's GGUF builder, keeps a GGUF file's own weights)."""
    from ortgen.cli.export import BUILDER_PRECISIONS
    from ortgen.export.variant import PRECISIONS

    assert "gguf" not in (*BUILDER_PRECISIONS, *PRECISIONS)
    result = run("export", str(tmp_path / "m.gguf"), str(tmp_path / "out"), "--precision", "gguf")
    assert result.returncode == 2
    assert "--precision: invalid choice" in result.stderr and "'gguf'" in result.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- bad input


def test_set_without_equals(model: Path) -> None:
    result = run("config", "show", "-m", str(model), "--set", "foo")
    assert result.returncode == 2
    assert error_line(result) == "ortgen: error: --set takes KEY=VALUE, got 'foo'"
    assert result.stdout == ""


def test_set_unknown_key_suggests_the_right_one(model: Path) -> None:
    for command in (["config", "show"], ["generate", "Hi"]):
        result = run(*command, "-m", str(model), "--set", "tempreature=0.5")
        assert result.returncode == 2
        assert error_line(result) == (
            "ortgen: error: invalid generation config: unknown setting 'tempreature' "
            "(did you mean 'temperature'?)"
        )


def test_set_bad_value_before_the_model_loads(tmp_path: Path, model: Path) -> None:
    result = run("generate", "Hi", "-m", str(model), "--set", "max_new_tokens=-1")
    assert result.returncode == 2
    assert "max_new_tokens must be > 0, got -1" in error_line(result)


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],  # unknown subcommand
        [],  # no subcommand
        ["generate"],  # missing PROMPT
        ["generate", "Hi", "--max-new-tokens", "many"],  # not an int
        ["generate", "Hi", "--bogus-flag"],  # unknown flag
        ["config"],  # `config` alone needs `show`
        ["plugins", "extra"],
    ],
)
def test_usage_errors_exit_2(args) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert "usage: ortgen" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_missing_model_folder(tmp_path: Path) -> None:
    result = run("generate", "Hi", "-m", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "nope" in error_line(result)


def test_a_bug_exits_1_with_a_traceback() -> None:
    """An exception that is not an OrtgenError is a bug: not hidden behind status 2."""
    code = (
        "import sys, ortgen.plugin_host.manager as plugin_manager\n"
        "from ortgen.cli import main\n"
        "def broken(*args, **kwargs):\n"
        "    raise KeyError('a bug')\n"
        "plugin_manager.make_plugin_manager = broken\n"
        "sys.exit(main(['plugins']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "KeyError: 'a bug'" in result.stderr
    assert "ortgen: error" not in result.stderr


def test_help_exits_0() -> None:
    result = run("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: ortgen")
    for command in ("generate", "chat", "export", "plugins", "config"):
        assert command in result.stdout
    sub = run("config", "show", "-h")
    assert sub.returncode == 0 and "--set KEY=VALUE" in sub.stdout


def test_console_script_is_installed() -> None:
    """The install (`pip install -e .`, as `make test` does) puts the `ortgen` script next
    to this interpreter, pointing at the CLI's entry: missing, it is a failure, not a skip."""
    from importlib.metadata import entry_points

    (entry,) = entry_points(group="console_scripts", name="ortgen")
    assert entry.value == "ortgen.cli:entry"
    script = Path(sys.executable).parent / "ortgen"
    assert script.exists(), f"no ortgen console script next to {sys.executable}"
    result = subprocess.run(
        [str(script), "config", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "show" in result.stdout


def test_the_suite_fails_on_an_unexpected_skip_and_marks_default_model_tests(
    tmp_path: Path,
) -> None:
    """tests/conftest.py's rules, on a throwaway suite: a skip whose reason is not on the
    allow-list (a module-level importorskip, a pytest.skip) fails the session although
    every test passed, an xfail does not, ORTGEN_ALLOW_SKIPS=1 relaxes it; a test that
    requests a default-model fixture without the marker gets it (deselected by
    -m "not default_model"); a misspelt marker is an error (--strict-markers)."""
    import os

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "test_a.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_skipped(): pytest.skip('no widget here')\n"
        "@pytest.mark.xfail(strict=True, reason='known')\n"
        "def test_known(): assert False\n"
        "def test_uses_the_default_model(default_model_dir): raise AssertionError\n"
    )
    (tmp_path / "test_b.py").write_text("import pytest\npytest.importorskip('no_such_module_x')\n")
    (tmp_path / "test_c.py").write_text(
        "import pytest\n@pytest.mark.defualt_model\ndef test_typo(): pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("ORTGEN_ALLOW_SKIPS", None)

    def pytest_run(*args: str, **extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c",
                   str(root / "pyproject.toml"), "--rootdir", str(tmp_path), "-q",
                   "-p", "no:cacheprovider", *args]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env={**env, **extra})  # fmt: skip

    plain = ["-m", "not default_model", "test_a.py", "test_b.py"]
    failed = pytest_run(*plain)
    assert failed.returncode == 1, failed.stdout
    assert "1 passed, 2 skipped, 1 deselected, 1 xfailed" in failed.stdout
    assert "unexpected skips" in failed.stdout and "no widget here" in failed.stdout
    assert "no_such_module_x" in failed.stdout
    assert pytest_run(*plain, ORTGEN_ALLOW_SKIPS="1").returncode == 0
    clean = pytest_run("-m", "not default_model", "test_a.py", "-k", "not skipped")
    assert clean.returncode == 0, clean.stdout
    marked = pytest_run("--collect-only", "-m", "default_model", "test_a.py")
    assert "test_uses_the_default_model" in marked.stdout and "test_ok" not in marked.stdout
    typo = pytest_run("test_c.py")
    assert typo.returncode != 0 and "'defualt_model' not found" in typo.stdout + typo.stderr


def test_one_shot_commands_exit_without_teardown_but_lose_nothing() -> None:
    """`python -m ortgen.cli` runs the console script's entry, which ends a one-shot
    command with os._exit (no interpreter teardown): everything written must still arrive,
    through a pipe, with the command's own exit code; main() itself returns in-process."""
    from ortgen.cli import main

    shown = run("config", "show", "--set", "top_k=7", "--set", "do_sample=true")
    assert shown.returncode == 0
    assert shown.stdout.rstrip().endswith("defaults")  # the table's last line arrived
    assert "top_k" in shown.stdout and " 7 " in shown.stdout
    failed = run("config", "show", "--set", "top_k=-1")
    assert failed.returncode == 2 and "top_k must be >= 0" in failed.stderr
    assert main(["config", "show", "--set", "top_k=7"]) == 0  # still here: no os._exit
    # atexit handlers (a plugin's, say) still run before the fast exit
    code = (
        "import atexit, sys; atexit.register(print, 'handler ran', file=sys.stderr); "
        "sys.argv = ['ortgen', 'config', 'show']; from ortgen.cli import entry; entry()"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert ran.returncode == 0 and "handler ran" in ran.stderr


# --------------------------------------------------------------------------- broken pipe


@pytest.mark.default_model
def test_broken_pipe_is_quiet(default_model_dir: Path) -> None:
    """`ortgen generate ... | head -c 1`: the reader leaves after one byte; the writer
    must stop without a traceback or an 'Exception ignored' message. The default model
    decodes slowly enough that most of the output is written after the reader left."""
    proc = subprocess.Popen(
        [
            *CLI, "generate", "Once upon a time", "-m", str(default_model_dir),
            "--max-new-tokens", "48", "--set", "eos_token_id=null", "--threads", "1",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = os.read(proc.stdout.fileno(), 1)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert first
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert "BrokenPipe" not in stderr
    assert proc.returncode == 0


# --------------------------------------------------------------------------- plugins


def test_plugins_text_lists_every_component_with_its_plugin() -> None:
    text = run("plugins")
    as_json = run("plugins", "--json")
    assert text.returncode == as_json.returncode == 0
    report = json.loads(as_json.stdout)
    kinds = ["logits_processor", "sampler", "stopping_criterion", "kv_cache", "drafter",
             "chat_format"]  # fmt: skip
    assert list(report) == [*kinds, "plugins"]
    expected = []
    for kind in kinds:
        expected.append(f"{kind}:")
        for e in report[kind]:
            params = ", ".join(e["parameters"])
            expected.append(f"  {e['name']:<22} {e['plugin']:<28} ({params})")
    # then the plugins: here only the built-ins, every one loaded, folded into one line
    assert {(p["origin"], p["status"]) for p in report["plugins"]} == {("built-in", "loaded")}
    expected += [
        "plugins:",
        f"  ortgen.plugins.* loaded   built-in ({len(report['plugins'])} modules)",
    ]
    assert text.stdout.splitlines() == expected
    # the lines docs/cli.md and docs/plugins.md show, verbatim
    lines = text.stdout.splitlines()
    for line in (
        "  bad_words_ids          ortgen.plugins.constraints   (bad_words_ids, eos_token_id)",
        "  min_new_tokens         ortgen.plugins.constraints   (min_new_tokens, eos_token_id)",
        "  max_time               ortgen.plugins.stopping      (max_time)",
        "  dynamic                ortgen.plugins.caches        ()",
    ):
        assert line in lines
    builtins = {
        "logits_processor": {
            "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_new_tokens",
            "temperature", "top_k", "top_p", "min_p", "typical_p",
        },
        "sampler": {"greedy", "multinomial"},
        "stopping_criterion": {"eos", "max_length", "max_time"},
        "kv_cache": {"dynamic"},
        "chat_format": {"hermes", "llama3_json", "mistral", "pythonic", "phi4_mini", "generic"},
    }  # fmt: skip
    for kind, names in builtins.items():
        assert names <= {e["name"] for e in report[kind]}, kind
        plugins = {e["plugin"] for e in report[kind] if e["name"] in names}
        assert all(p.startswith("ortgen.plugins.") for p in plugins), plugins


# --------------------------------------------------------------------------- config show


@pytest.fixture
def config_folder(tmp_path: Path) -> Path:
    """A folder with only the two config files: `config show` reads nothing else."""
    (tmp_path / "config.json").write_text(
        json.dumps({"eos_token_id": 7, "pad_token_id": 0, "bos_token_id": 1, "vocab_size": 9})
    )
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, 3], "temperature": 0.6, "transformers_version": "4"})
    )
    return tmp_path


def test_config_show_text_names_the_layer_of_each_value(config_folder: Path) -> None:
    result = run(
        "config", "show", "-m", str(config_folder), "--do-sample", "--top-p", "0.9",
        "--max-new-tokens", "20", "--set", "max_new_tokens=10", "--set", "cache=dynamic",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert rows["do_sample"] == f"{'do_sample':<22} {'true':<28} call"
    assert rows["top_p"] == f"{'top_p':<22} {'0.9':<28} call"
    assert rows["max_new_tokens"] == f"{'max_new_tokens':<22} {'10':<28} call"
    assert rows["temperature"] == f"{'temperature':<22} {'0.6':<28} generation_config.json"
    assert rows["eos_token_id"] == f"{'eos_token_id':<22} {'[2, 3]':<28} generation_config.json"
    assert rows["pad_token_id"] == f"{'pad_token_id':<22} {'0':<28} model config.json"
    assert rows["top_k"] == f"{'top_k':<22} {'50':<28} defaults"
    assert rows["max_length"] == f"{'max_length':<22} {'null':<28} defaults"
    assert rows["cache"] == f"{'cache':<22} {json.dumps({'name': 'dynamic'}):<28} call"
    fields = [f for f in ortgen.GenerationConfig.__dataclass_fields__]
    assert list(rows) == fields  # every setting, in declaration order


def test_config_show_json_matches_the_text(config_folder: Path) -> None:
    args = ["config", "show", "-m", str(config_folder), "--set", "repetition_penalty=1.3"]
    text, as_json = run(*args), run(*args, "--json")
    assert text.returncode == as_json.returncode == 0
    report = json.loads(as_json.stdout)
    assert report["repetition_penalty"] == {"value": 1.3, "set_by": "call"}
    assert report["bos_token_id"] == {"value": 1, "set_by": "model config.json"}
    lines = [
        f"{name:<22} {json.dumps(entry['value']):<28} {entry['set_by']}"
        for name, entry in report.items()
    ]
    assert text.stdout.splitlines() == lines


def test_config_show_refuses_a_folder_without_config(tmp_path: Path) -> None:
    result = run("config", "show", "-m", str(tmp_path))
    assert result.returncode == 2
    assert "no config.json" in error_line(result)


# --------------------------------------------------------------------------- warnings


def warning_lines(stderr: str) -> list[str]:
    lines = stderr.strip().splitlines()
    assert lines, "expected a warning"
    for line in lines:
        assert line.startswith("ortgen: warning: "), stderr
    assert ".py" not in stderr and "UserWarning" not in stderr and "warnings.warn" not in stderr
    assert len(set(lines)) == len(lines), f"a warning printed twice: {stderr}"
    return lines


def test_config_show_warning_is_one_clean_line(config_folder: Path) -> None:
    result = run("config", "show", "-m", str(config_folder), "--set", "top_p=0.9")
    assert result.returncode == 0
    [line] = warning_lines(result.stderr)
    assert "top_p" in line and "do_sample" in line


def test_chat_warning_is_printed_once(model: Path) -> None:
    """A chat session resolves its settings when it starts and again for the turn; the
    same warning must still appear once."""
    result = run("chat", "Hi", "-m", str(model), "--top-p", "0.5", "--max-new-tokens", "2")
    assert result.returncode == 0, result.stderr
    [line] = warning_lines(result.stderr)
    assert "top_p" in line


def test_warning_grammar_agrees_with_the_number_of_settings(config_folder: Path) -> None:
    one = run("config", "show", "-m", str(config_folder), "--set", "top_p=0.9")
    two = run("config", "show", "-m", str(config_folder), "--top-p", "0.9", "--top-k", "3")
    [single] = warning_lines(one.stderr)
    [plural] = warning_lines(two.stderr)
    assert "top_p only applies when sampling and is ignored" in single, single
    assert "top_k, top_p only apply when sampling and are ignored" in plural, plural


# --------------------------------------------------------------------------- CLI manners


def test_misspelt_flag_gets_a_did_you_mean(model: Path) -> None:
    result = run("generate", "Hi", "-m", str(model), "--temprature", "0.5")
    assert result.returncode == 2
    assert "unrecognized arguments: --temprature (did you mean '--temperature'?)" in result.stderr


def _interrupt_at_step(monkeypatch, at: int) -> None:
    """Make the step object raise KeyboardInterrupt (Ctrl-C) on its ``at``-th step."""
    from ortgen.loop.generate import Generation

    real_step = Generation.step
    calls = {"n": 0}

    def step(self):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Generation, "step", step)


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_ctrl_c_in_a_one_shot_command_keeps_the_text_and_exits_130(
    model: Path, gen, monkeypatch, capsys, command
) -> None:
    from ortgen.cli import main

    full = run(command, "Hello", "-m", str(model), "--max-new-tokens", "12", *LONG).stdout
    _interrupt_at_step(monkeypatch, 7)
    status = main([command, "Hello", "-m", str(model), "--max-new-tokens", "12", *LONG])
    out, err = capsys.readouterr()
    assert status == 130
    assert "[interrupted]" in err
    assert out.strip() and full.startswith(out.strip()) and len(out.strip()) < len(full.strip())


def test_generate_that_ends_at_once_says_so(model: Path, gen) -> None:
    eos = gen.tokenizer.eos_token_id
    bias = json.dumps({str(eos): 100})
    result = run(
        "generate", "Hello", "-m", str(model), "--set", f"eos_token_id={eos}",
        "--set", f"logit_bias={bias}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n"
    assert "the model ended at once without any text (finish reason: eos)" in result.stderr
    assert "ortgen chat" in result.stderr


def test_speculation_flags_are_the_config_settings(model: Path) -> None:
    """--prompt-lookup and --drafter are the call layer's prompt_lookup_num_tokens and
    drafter; a generate with them prints what it prints without."""
    import json

    shown = run("config", "show", "--json", "--prompt-lookup", "4")
    assert json.loads(shown.stdout)["prompt_lookup_num_tokens"] == {"value": 4, "set_by": "call"}
    shown = run("config", "show", "--json", "--drafter", "draft_model:model=x,num_tokens=3")
    drafter = json.loads(shown.stdout)["drafter"]["value"]
    assert drafter == {"name": "draft_model", "model": "x", "num_tokens": 3}
    prompt, flags = "abcabcabcabc", ["-m", str(model), "--max-new-tokens", "20", *LONG]
    plain = run("generate", prompt, *flags)
    fast = run("generate", prompt, *flags, "--prompt-lookup", "5")
    assert plain.returncode == fast.returncode == 0, fast.stderr
    assert fast.stdout == plain.stdout
    failed = run("generate", prompt, *flags, "--drafter", "draft_model")
    assert failed.returncode == 2 and "needs model" in failed.stderr


def test_negative_threads_are_refused(model: Path) -> None:
    """--threads -1 used to run (onnxruntime took it); now it is one error line."""
    result = run("generate", "Hi", "-m", str(model), "--threads", "-1", "--max-new-tokens", "2")
    assert result.returncode == 2
    assert "threads must be a positive integer (or unset: every core), got -1" in error_line(result)
