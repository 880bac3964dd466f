"""``ortgen run --engine ray`` on a real Ray cluster started here: the same result lines
and error lines as the local engine, and a job killed at any moment resumes with every
row once.

One cluster for the module (a head node on 127.0.0.1, 2 CPUs, its own temp folder),
started with ``ray start --head --block`` in a session of its own and ended by that
session's process group (never ``ray stop``, which would end every Ray on the machine).
Jobs run as ``python -m ortgen.cli run --engine ray --address ...`` subprocesses.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ortgen.jobs import run_job
from tests.sockets import LOOPBACK
from tests.test_jobs import CLI, GREEDY, ROWS, kill_then_rerun, read_results, write_jsonl

pytestmark = pytest.mark.ray

#: the ray CLI: its console script beside this Python, else its module (a venv that
#: shares another's packages may have no script of its own)
_RAY_SCRIPT = Path(sys.executable).with_name("ray")
RAY = [str(_RAY_SCRIPT)] if _RAY_SCRIPT.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
_TOKEN = secrets.token_hex(32)
#: the local engine's GREEDY settings, as flags
GREEDY_FLAGS = ["--max-new-tokens", str(GREEDY["max_new_tokens"]), "--set", "eos_token_id=null"]
BAD_LINES = [
    "{oops",
    json.dumps({"id": "no-prompt", "top_k": 3}),
    json.dumps({"id": "vocab", "prompt": [1, 10**7]}),
    json.dumps({"id": "setting", "prompt": [1, 2], "top_p": 3}),
    json.dumps({"id": "wide", "prompt": [1, 2], "num_beams": 2}),
    json.dumps({"id": "text", "prompt": "no tokenizer here"}),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-node Ray cluster of this module's own, ended with its process group."""
    port = _free_port()
    temp = tmp_path_factory.mktemp("ray")
    log = temp / "head.log"
    # Ray's sockets live under --temp-dir, and a Unix socket path may not pass 107 bytes:
    # pytest's temp path (longer under pytest-xdist: popen-gwN) plus Ray's session folder
    # does, so the cluster gets a short folder of its own, removed with it
    short = Path(tempfile.mkdtemp(prefix="ortgen-ray-"))
    args = [*RAY, "start", "--head", "--block", "--port", str(port)]
    args += ["--node-ip-address", "127.0.0.1", "--num-cpus", "2", "--include-dashboard=false"]
    args += ["--temp-dir", str(short), "--disable-usage-stats"]
    env = _env()
    with log.open("wb") as out:
        head = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while b"Ray runtime started" not in log.read_bytes():
            assert head.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        # --block: on SIGTERM the head ends the processes it started; a graceful end can
        # take half a minute, so after a few seconds its whole session is killed
        head.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(short, ignore_errors=True)


def _pipeline(tmp_path: Path, model: Path, **run: int) -> Path:
    pipeline = tmp_path / "p.toml"
    lines = [f'model = "{model}"', "[run]", *(f"{k} = {v}" for k, v in run.items())]
    pipeline.write_text("\n".join(lines) + "\n")
    return pipeline


def _ray_args(pipeline: Path, source: Path, out: Path, address: str, *extra: str) -> list[str]:
    args = [*CLI, "run", str(pipeline), "--input", str(source), "--output", str(out)]
    return [*args, "--engine", "ray", "--address", address, "--threads", "1", *extra]


def _env() -> dict[str, str]:
    """No RAY_ADDRESS from outside, and the module's own auth token: Ray 2.60 turns token
    auth on, and the default token (~/.ray/auth_token) is shared with any other Ray here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.pop("RAY_ADDRESS", None)
    return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _TOKEN}


def test_ray_gives_the_local_engines_lines(ray_address, tiny_model_dirs, tiny_llama_gen, tmp_path):
    """Good rows and every kind of error row: line for line what the local engine writes."""
    source = tmp_path / "rows.jsonl"
    good = [json.dumps(r) for r in ROWS]
    source.write_text("\n".join([*good[:2], *BAD_LINES, "", *good[2:]]) + "\n")
    local_out = tmp_path / "local.jsonl"
    options = {"batch_size": 2, "window": 3, "settings": GREEDY, "progress": None}
    run_job(tiny_llama_gen, source, local_out, **options)
    local = read_results(local_out)
    pipeline = _pipeline(tmp_path, tiny_model_dirs["llama"][1], batch_size=2, window=3)
    out = tmp_path / "ray.jsonl"
    args = _ray_args(pipeline, source, out, ray_address, "--workers", "2", *GREEDY_FLAGS)
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert result.returncode == 0, result.stderr
    assert read_results(out) == local
    assert sum("error" in r for r in local.values()) == len(BAD_LINES)
    assert f"{len(ROWS)} rows ok, {len(BAD_LINES)} errors, 0 skipped" in result.stderr
    again = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 0, again.stderr
    assert f"0 rows ok, 0 errors, {len(ROWS) + len(BAD_LINES)} skipped" in again.stderr
    assert read_results(out) == local


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_ray_job_stopped_mid_way_then_rerun_gives_every_row_once(
    ray_address, tiny_model_dirs, tiny_llama_gen, tmp_path, sig
):
    """The driver stopped while lines come back, then the same command: every id exactly
    once, whole lines, the tokens the local engine gives. SIGTERM is a clean stop, as on
    the local engine (exit 143, its message, no lock left): ``ray.init`` installs its own
    SIGTERM handler (``sys.exit``), and the job puts the CLI's back."""
    rows = [{"prompt": [1 + i % 50, 2, 3 + i % 7, i % 200]} for i in range(160)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    pipeline = _pipeline(tmp_path, tiny_model_dirs["llama"][1], batch_size=1, window=4)
    out = tmp_path / "out.jsonl"
    args = _ray_args(pipeline, source, out, ray_address, "--max-new-tokens", "16")
    args += ["--set", "eos_token_id=null"]
    kill_then_rerun(
        args, out, rows, tiny_llama_gen, after_lines=8, checked=20, env=_env(), wait_s=180, sig=sig
    )


def test_a_model_a_worker_cannot_load_is_one_clear_error(ray_address, tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:2])
    pipeline = _pipeline(tmp_path, tmp_path / "no-model")
    out = tmp_path / "out.jsonl"
    args = _ray_args(pipeline, source, out, ray_address)
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert result.returncode == 2, result.stderr
    missing = tmp_path / "no-model"
    assert f"ortgen: error: on a Ray worker: {missing}: no such model folder" in result.stderr
    assert out.read_text() == ""  # nothing written, so nothing to redo wrong


def test_both_engines_keep_one_fingerprint_and_rerun_changed_works_on_ray(
    ray_address, tiny_model_dirs, tiny_llama_gen, tmp_path
):
    """Lines the ray driver stamps carry the fingerprints the local engine gives (its bad
    rows' too), so the engines take turns; a rerun on Ray under other settings stops in
    one line, and ``--rerun-changed`` redoes every row as the local engine would."""
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join([*map(json.dumps, ROWS), *BAD_LINES]) + "\n")
    pipeline = _pipeline(tmp_path, tiny_model_dirs["llama"][1], batch_size=2, window=3)
    out = tmp_path / "out.jsonl"
    args = _ray_args(pipeline, source, out, ray_address, *GREEDY_FLAGS)
    first = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert first.returncode == 0, first.stderr
    turn = run_job(tiny_llama_gen, source, out, settings=GREEDY, progress=None)
    assert turn.skipped == len(ROWS) + len(BAD_LINES)  # the local engine agrees: all done
    shorter = [*args, "--max-new-tokens", "3"]
    stopped = subprocess.run(shorter, capture_output=True, text=True, timeout=300, env=_env())
    assert stopped.returncode == 2 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert stopped.stderr.startswith("ortgen: error: max_new_tokens changed from 6 to 3 since")
    redo = [*shorter, "--rerun-changed"]
    again = subprocess.run(redo, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 0, again.stderr
    assert f"{len(ROWS)} rows ok, {len(BAD_LINES)} errors, 0 skipped" in again.stderr
    local = tmp_path / "local.jsonl"
    run_job(tiny_llama_gen, source, local, settings={**GREEDY, "max_new_tokens": 3}, progress=None)
    assert read_results(out) == read_results(local)  # fingerprints included


def test_a_ray_instance_the_job_starts_listens_on_the_loopback_address_only(tmp_path):
    """Without --address the job starts Ray for this machine: its node's address is
    127.0.0.1 (Ray would take the interface address) and every process of it listens
    there and nowhere else."""
    script = tmp_path / "start.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, sys
            sys.path.insert(0, os.environ["ORTGEN_TESTS_ROOT"])
            from ortgen.jobs.ray_engine import _connect, require_ray
            from tests.sockets import listening_addresses

            ray = require_ray()
            assert _connect(ray, None, 1, 1)
            nodes = [node["NodeManagerAddress"] for node in ray.nodes()]
            listening = listening_addresses(os.getpid())
            ray.shutdown()
            print(json.dumps({"nodes": nodes, "listening": sorted(listening)}))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "ORTGEN_TESTS_ROOT": str(Path(__file__).parent.parent)},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["nodes"] == ["127.0.0.1"]
    assert found["listening"] and set(found["listening"]) <= LOOPBACK
