"""Plugins that fail alone (issue 38), through the ``ortgen`` command as a user runs it.

A site folder on ``PYTHONPATH`` holds three installed plugins (``tests/plugin_sites.py``):
``broken`` (its import fails), ``hooks`` (a hook raises) and ``good`` (a ``force``
processor that leaves one token possible, so its effect on the text is exact). Every
command runs on the tiny Llama with a tokenizer. ``--plugin`` is checked on each command
that takes it by the same ``force`` processor, from a file or a module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ortgen
from tests.plugin_sites import BROKEN, FORCE, HOOK_FAILS, add_module, add_plugin

CLI = [sys.executable, "-m", "ortgen.cli"]
NEW = ["--max-new-tokens", "3", "--set", "eos_token_id=null"]


def ortgen_cli(
    *args: str, path: Path | None = None, disable: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ORTGEN_DISABLE_PLUGINS")}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    if disable is not None:
        env["ORTGEN_DISABLE_PLUGINS"] = disable
    return subprocess.run(
        [*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plugin-site")
    for dist, name, module, source in (
        ("broken-dist", "broken", "pl_test_broken", BROKEN),
        ("hook-dist", "hooks", "pl_test_hooks", HOOK_FAILS),
        ("good-dist", "good", "pl_test_good", FORCE),
    ):
        add_module(folder, module, source)
        add_plugin(folder, dist, "1.0", {name: module})
    return folder


@pytest.fixture(scope="module")
def token(tiny_text_model: Path) -> int:
    return ortgen.load(tiny_text_model, threads=1).tokenizer.token_to_id("a")


def force(token: int) -> list[str]:
    return ["--set", f'logits_processors=[{{"name": "force", "token": {token}}}]']


# -- installed plugins that fail ------------------------------------------------------


def test_plugins_lists_the_broken_ones_with_their_cause(site: Path) -> None:
    text = ortgen_cli("plugins", path=site)
    as_json = ortgen_cli("plugins", "--json", path=site)
    assert text.returncode == as_json.returncode == 0, text.stderr + as_json.stderr
    assert text.stderr == as_json.stderr == ""  # the listing says it: no warning as well
    lines = text.stdout.splitlines()
    plugins = lines[lines.index("plugins:") + 1 :]
    width = len("ortgen.plugins.*")
    assert plugins[0] == f"  {'ortgen.plugins.*':<{width}} loaded   built-in (19 modules)"
    rows = {line.split()[0]: line for line in plugins if not line.startswith("   ")}
    assert rows["broken"].split(None, 2)[1:] == [
        "broken", "broken-dist 1.0, entry point broken = pl_test_broken"
    ]  # fmt: skip
    cause = plugins[plugins.index(rows["broken"]) + 1].strip()
    assert cause == (
        "importing it failed: ModuleNotFoundError: No module named "
        f"'pl_test_dependency_that_is_not_installed' (at {site}/pl_test_broken/__init__.py:5)"
    )
    assert rows["hooks"].split()[1] == "broken" and rows["good"].split()[1] == "loaded"
    report = json.loads(as_json.stdout)
    status = {p["name"]: (p["status"], p["cause"]) for p in report["plugins"]}
    assert status["broken"] == ("broken", cause)
    assert status["hooks"][0] == "broken"
    assert status["hooks"][1].startswith("register_stopping_criteria raised RuntimeError")
    assert status["good"] == ("loaded", None)
    owners = {
        e["name"]: e["plugin"] for kind in ("logits_processor", "sampler") for e in report[kind]
    }
    assert owners["force"] == "good" and "half_registered" not in owners


def test_generate_works_with_one_warning_per_broken_plugin(
    site: Path, tiny_text_model: Path, token: int
) -> None:
    """Exit 0; the installed ``good`` plugin's processor works beside the broken ones;
    each broken plugin is one warning line naming it, and nothing else is on stderr."""
    model = ["-m", str(tiny_text_model), "--threads", "1"]
    result = ortgen_cli("generate", "Hi", *model, *NEW, *force(token), path=site)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "aaa\n"
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(
        "ortgen: warning: skipped installed plugin 'broken' (broken-dist 1.0, entry point "
        "broken = pl_test_broken): importing it failed: ModuleNotFoundError"
    )
    assert lines[1].startswith(
        "ortgen: warning: skipped installed plugin 'hooks' (hook-dist 1.0, entry point hooks "
        "= pl_test_hooks): register_stopping_criteria raised RuntimeError: cannot read"
    )
    # a pipeline file builds the registry twice from one manager: still one warning each
    pipeline = site.parent / "plain.toml"
    pipeline.write_text("[generation]\nmax_new_tokens = 3\n")
    again = ortgen_cli("generate", "Hi", *model, "--pipeline", str(pipeline), path=site)
    assert again.returncode == 0 and again.stderr.splitlines() == lines


def test_disabled_plugins_are_not_imported_and_listed_as_disabled(
    site: Path, tiny_text_model: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "imported"
    os.environ["PL_TEST_MARKER"] = str(marker)  # inherited by the subprocess below
    try:
        result = ortgen_cli(
            "generate", "Hi", "-m", str(tiny_text_model), *NEW, path=site, disable="broken,hooks"
        )
        listed = ortgen_cli("plugins", "--json", path=site, disable="hooks, broken")
    finally:
        del os.environ["PL_TEST_MARKER"]
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert not marker.exists()
    status = {p["name"]: (p["status"], p["cause"]) for p in json.loads(listed.stdout)["plugins"]}
    assert status["broken"] == status["hooks"] == ("disabled", "ORTGEN_DISABLE_PLUGINS")
    assert status["good"] == ("loaded", None)


def test_the_environment_cannot_disable_a_builtin(tiny_text_model: Path) -> None:
    result = ortgen_cli(
        "generate", "Hi", "-m", str(tiny_text_model), *NEW, disable="ortgen.plugins.samplers"
    )
    assert result.returncode == 0, result.stderr  # greedy is still there
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "ortgen: warning: ORTGEN_DISABLE_PLUGINS names 'ortgen.plugins.samplers', a built-in "
        "module, which it does not disable"
    )


# -- registered twice -------------------------------------------------------------------


def test_an_installed_module_passed_again_is_registered_once(
    site: Path, tiny_text_model: Path, token: int
) -> None:
    result = ortgen_cli(
        "generate", "Hi", "-m", str(tiny_text_model), *NEW, *force(token),
        "--plugin", "pl_test_good", path=site, disable="broken,hooks",
    )  # fmt: skip
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == "aaa\n"


def test_a_component_claimed_twice_is_one_error_line_naming_both(
    site: Path, tiny_text_model: Path, tmp_path: Path
) -> None:
    other = tmp_path / "pl_test_other.py"
    other.write_text(FORCE)
    result = ortgen_cli(
        "generate", "Hi", "-m", str(tiny_text_model), "--plugin", str(other),
        path=site, disable="broken,hooks",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "ortgen: error: logits_processor 'force' is registered twice: by plugin 'good' and by "
        "plugin 'pl_test_other'; pass replace=True to register() to override it on purpose, "
        "or disable one plugin"
    ]


# -- --plugin on every command that loads plugins ---------------------------------------


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plugin-file") / "pl_test_force.py"
    path.write_text(FORCE)
    return path


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_plugin_flag_on_generate_and_chat(
    command: str, tiny_text_model: Path, plugin_file: Path, site: Path, token: int
) -> None:
    args = [command, "Hi", "-m", str(tiny_text_model), *NEW, *force(token)]
    assert ortgen_cli(*args).returncode == 2  # no force without the plugin
    by_file = ortgen_cli(*args, "--plugin", str(plugin_file))
    assert by_file.returncode == 0, by_file.stderr
    assert by_file.stdout == "aaa\n"
    by_module = ortgen_cli(
        *args, "--plugin", "pl_test_good", path=site, disable="good,broken,hooks"
    )
    assert by_module.returncode == 0 and by_module.stdout == "aaa\n", by_module.stderr


def test_plugin_flag_on_run(tiny_text_model: Path, plugin_file: Path, tmp_path: Path, token):
    """The pipeline file names the plugin's component: checked against a registry that
    has it (the dry run too), then used for every row."""
    pipeline = tmp_path / "force.toml"
    pipeline.write_text(
        f"model = {json.dumps(str(tiny_text_model))}\n"
        "[generation]\nmax_new_tokens = 3\n"
        f'[[logits_processors]]\nname = "force"\ntoken = {token}\n'
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "r", "prompt": "Hi"}\n')
    out = tmp_path / "out.jsonl"
    base = ["run", str(pipeline), "--input", str(rows)]
    without = ortgen_cli(*base, "--dry-run")
    assert without.returncode == 2 and "unknown logits_processor 'force'" in without.stderr
    dry = ortgen_cli(*base, "--dry-run", "--plugin", str(plugin_file))
    assert dry.returncode == 0, dry.stderr
    result = ortgen_cli(*base, "--output", str(out), "--plugin", str(plugin_file))
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["text"], record["tokens"]) == ("aaa", [token] * 3)
    ray = ortgen_cli(*base, "--output", str(out), "--engine", "ray", "--plugin", str(plugin_file))
    assert ray.returncode == 2 and "--plugin is for the local engine" in ray.stderr


def test_plugin_flag_on_bench(tiny_text_model: Path, plugin_file: Path, token: int) -> None:
    args = ["bench", "-m", str(tiny_text_model), "--prompt-tokens", "4", "--new-tokens", "3"]
    args += ["--no-quality", "--json", *force(token), "--plugin", str(plugin_file)]
    result = ortgen_cli(*args)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["greedy_tokens"] == [token] * 3


def test_plugin_flag_on_plugins(plugin_file: Path) -> None:
    result = ortgen_cli("plugins", "--json", "--plugin", str(plugin_file))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"name": "force", "plugin": "pl_test_force", "parameters": ["token"]} in report[
        "logits_processor"
    ]
    assert report["plugins"][-1] == {
        "name": "pl_test_force", "origin": "in-process", "status": "loaded", "source": None,
        "cause": None,
    }  # fmt: skip


@pytest.mark.parametrize("command", ["generate", "chat", "run", "bench", "serve", "plugins"])
def test_every_command_reads_plugin_the_same_way(command: str, tmp_path: Path) -> None:
    """One implementation: the same error, before any model loads, on every command."""
    args = {"generate": ["Hi"], "chat": ["Hi"], "run": ["p.toml", "--input", "x"]}
    missing = tmp_path / "missing.py"
    if command == "run":
        (tmp_path / "p.toml").write_text("[generation]\n")
    result = ortgen_cli(command, *args.get(command, []), "--plugin", str(missing), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"ortgen: error: --plugin {missing}: no such file"]
