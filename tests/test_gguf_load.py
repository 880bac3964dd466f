"""A GGUF file as a user brings it: ``ortgen.load("x.gguf")``, ``-m x.gguf`` on the command
line and the server, ``model = "x.gguf"`` in a pipeline file; the build cache (reused,
rebuilt when the file changes, shared by two processes at once); what is refused and why;
and no torch, transformers, optimum or onnxruntime-genai anywhere on that path.

Each test builds into its own models folder (``ORTGEN_MODELS_DIR``), from a tiny Llama
GGUF with a tokenizer and chat template (tests/gguf_models.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ortgen
from ortgen.errors import ModelLoadError
from tests.gguf_models import write_tiny_gguf
from tests.server_helpers import ServerProcess

EXPORT_STACK = ("torch", "transformers", "optimum", "onnxruntime_genai")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", "llama")


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "models"
    monkeypatch.setenv("ORTGEN_MODELS_DIR", str(folder))
    return folder


def _run(*argv: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "ortgen.cli", *argv], capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=timeout, check=False,
    )  # fmt: skip


def test_load_builds_once_then_loads_from_the_cache(tiny_gguf, models_dir, capsys):
    gen = ortgen.load(tiny_gguf, threads=1)
    built = capsys.readouterr().err
    assert "building tiny-llama.gguf" in built and "(first use)" in built
    assert gen.path.parent == models_dir / ".gguf" and gen.path.name.startswith("tiny-llama-")
    out = gen.chat([{"role": "user", "content": "hi"}], max_new_tokens=6)
    assert len(out.tokens[0]) == 6 and out.text is not None
    again = ortgen.load(tiny_gguf, threads=1)
    assert again.path == gen.path and capsys.readouterr().err == ""  # no rebuild
    assert again.chat([{"role": "user", "content": "hi"}], max_new_tokens=6).tokens == out.tokens


def test_a_changed_file_is_built_again_saying_why(tmp_path, models_dir, capsys):
    path = write_tiny_gguf(tmp_path / "m.gguf", "llama", seed=1)
    first = ortgen.load(path, threads=1).path
    capsys.readouterr()
    write_tiny_gguf(path, "llama", seed=2)  # other weights, same path
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    second = ortgen.load(path, threads=1).path
    assert second != first and "building m.gguf" in capsys.readouterr().err
    assert not first.exists()  # the old contents' build is gone


def test_two_processes_loading_one_file_build_it_once(tiny_gguf, models_dir):
    code = (
        "import ortgen, sys\n"
        f"gen = ortgen.load({str(tiny_gguf)!r}, threads=1)\n"
        "print(gen.generate([1, 5, 9], max_new_tokens=4, eos_token_id=None).tokens[0])\n"
    )
    env = {**os.environ, "ORTGEN_MODELS_DIR": str(models_dir)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert results[0][0] == results[1][0]  # the same tokens from the same build
    builds = sum("ortgen: built in" in err for _, err in results)
    waited = sum("waiting for another process" in err for _, err in results)
    assert builds == 1 and (waited == 1 or results[1][1] == "" or results[0][1] == "")
    assert len([p for p in (models_dir / ".gguf").iterdir() if p.is_dir()]) == 1


def test_the_command_line_takes_a_gguf(tiny_gguf, models_dir, tmp_path):
    env = {"ORTGEN_MODELS_DIR": str(models_dir)}
    gen = ortgen.load(tiny_gguf, threads=1)
    want = gen.generate("ab", max_new_tokens=5, eos_token_id=None).text
    got = _run("generate", "ab", "-m", str(tiny_gguf), "--max-new-tokens", "5",
               "--threads", "1", "--set", "eos_token_id=null", env=env)  # fmt: skip
    assert got.returncode == 0 and got.stdout == want + "\n", got.stderr
    out = tmp_path / "built"
    done = _run("export", str(tiny_gguf), str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert (
        ortgen.load(out, threads=1).generate("ab", max_new_tokens=5, eos_token_id=None).text == want
    )
    again = _run("export", str(tiny_gguf), str(out), env=env)
    assert again.returncode != 0 and "exists; pass --overwrite" in again.stderr
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{tiny_gguf.name}"\n[generation]\nmax_new_tokens = 5\n')
    (tmp_path / tiny_gguf.name).symlink_to(tiny_gguf)  # relative to the pipeline file
    loaded = ortgen.load(pipeline=pipeline, threads=1)
    assert loaded.path == gen.path


def test_the_server_serves_a_gguf_by_its_stem(tiny_gguf, models_dir):
    gen = ortgen.load(tiny_gguf, threads=1)
    server = ServerProcess("-m", str(tiny_gguf), "--threads", "1").ready()  # fmt: skip
    try:
        client = server.client()
        assert [m.id for m in client.models.list().data] == ["tiny-llama"]
        got = client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
            temperature=0,
        )  # fmt: skip
        want = gen.chat([{"role": "user", "content": "hi"}], max_new_tokens=6).text
        assert got.choices[0].message.content == want
    finally:
        server.stop()


def test_a_gguf_loads_and_generates_without_the_export_stack(tiny_gguf, models_dir):
    """Embedded use: building and generating import none of the export stack (checked
    in a fresh process: these tests' own imports would hide it)."""
    code = (
        "import sys, ortgen\n"
        f"gen = ortgen.load({str(tiny_gguf)!r}, threads=1)\n"
        "out = gen.chat([{'role': 'user', 'content': 'hi'}], max_new_tokens=3)\n"
        f"print(len(out.tokens[0]), sorted(m for m in {EXPORT_STACK!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "ORTGEN_MODELS_DIR": str(models_dir)},
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "3 []", done.stderr


def test_what_cannot_be_loaded_says_what_to_do(tmp_path, models_dir, tiny_gguf):
    with pytest.raises(ModelLoadError, match="downloads nothing from a model hub"):
        ortgen.load("Qwen/Qwen2.5-0.5B-Instruct-GGUF")
    with pytest.raises(ModelLoadError, match="no such model folder or GGUF file"):
        ortgen.load(tmp_path / "missing.gguf")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelLoadError, match="is a file but not a GGUF file"):
        ortgen.load(text)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size - 5000])
    with pytest.raises(ModelLoadError, match="cut short"):
        ortgen.load(cut)
    bare = write_tiny_gguf(tmp_path / "bare.gguf", "llama", tokenizer=False)
    with pytest.raises(ortgen.OrtgenError, match="tokenizer"):
        ortgen.load(bare)
    assert not list((models_dir / ".gguf").glob("bare-*/model.onnx"))  # nothing half-built


def test_a_read_only_cache_is_one_clear_error(tiny_gguf, tmp_path, monkeypatch):
    if os.geteuid() == 0:  # root writes anywhere: make the cache a file instead
        blocked = tmp_path / "models"
        blocked.mkdir()
        (blocked / ".gguf").write_text("not a folder")
    else:
        blocked = tmp_path / "models"
        blocked.mkdir(mode=0o500)
    monkeypatch.setenv("ORTGEN_MODELS_DIR", str(blocked))
    with pytest.raises(ModelLoadError, match=r"is not writable.*ORTGEN_MODELS_DIR"):
        ortgen.load(tiny_gguf)


def test_the_manifest_records_the_file(tiny_gguf, models_dir):
    from ortgen.gguf.cache import file_sha256

    folder = ortgen.load(tiny_gguf, threads=1).path
    manifest = json.loads((folder / "ortgen_manifest.json").read_text())
    assert manifest["source_sha256"] == file_sha256(tiny_gguf)
    assert manifest["variant"]["builder"] == "ortgen.gguf"
    assert folder.name.startswith(f"tiny-llama-{manifest['source_sha256'][:16]}")
