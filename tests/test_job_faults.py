"""A job's output under faults: one job per output (a lock), a full disk or a file-size
limit mid-job, an output that cannot be written, and SIGTERM or SIGINT while it runs.
Each ends in one clear error line, every line written before stays whole and durable,
and the same command run again completes the job with every id once.

Runs on the tiny random Llama (token-id prompts, greedy, EOS off: every row has a known
length), through real ``ortgen run`` processes where a signal or a limit is involved.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import ortgen
from ortgen.jobs import output_lock, run_job
from ortgen.jobs import results as results_mod
from ortgen.jobs.output_lock import OutputLock, lock_path
from tests.test_jobs import CLI, GREEDY, read_results, write_jsonl

#: 40 rows, as in the report of two jobs on one output (72 lines for 40 ids)
ROWS = [{"id": i, "prompt": [1 + i % 50, 2, 3 + i % 7, i % 200]} for i in range(40)]
TOKENS = 16


def job_args(
    tmp_path: Path, model: Path, source: Path, out: Path, *extra: str, tokens: int = TOKENS
) -> list[str]:
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{model}"\n')
    args = [*CLI, "run", str(pipeline), "--input", str(source), "--output", str(out)]
    args += ["--batch-size", "1", "--threads", "1", "--max-new-tokens", str(tokens)]
    return [*args, "--set", "eos_token_id=null", *extra]


def expected_tokens(gen) -> dict[int, list[int]]:
    requests = [{"prompt": r["prompt"]} for r in ROWS]
    out = gen.generate(requests, max_new_tokens=TOKENS, eos_token_id=None)
    return {r["id"]: out.tokens[i] for i, r in enumerate(ROWS)}


@pytest.fixture(scope="module")
def reference(tiny_llama_gen) -> dict[int, list[int]]:
    return expected_tokens(tiny_llama_gen)


def assert_complete(out: Path, reference: dict[int, list[int]]) -> None:
    """Every id once, whole lines, the tokens generate gives, no lock left behind."""
    results = read_results(out)
    assert sorted(results) == sorted(reference)
    assert {i: r["tokens"] for i, r in results.items()} == reference
    assert not lock_path(out).exists()


#: a job long enough to be caught running (400 rows, one at a time)
LONG = [{"id": i, "prompt": [1 + i % 50, 2, 3 + i % 7, i % 200]} for i in range(400)]


def rerun_completes(
    args: list[str], out: Path, gen, kept: int | None = None, tokens: int = TOKENS
) -> None:
    """The same command (in batches of 16: resume is by id) completes the long job: every
    id once, the tokens generate gives for the first rows, no lock left."""
    rerun = subprocess.run([*args, "--batch-size", "16"], capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    if kept is not None:
        assert f"{kept} skipped (already done)" in rerun.stderr
    results = read_results(out)  # fails on an id written twice or a torn line
    assert sorted(results) == list(range(len(LONG)))
    requests = [{"prompt": r["prompt"]} for r in LONG[:20]]
    expected = gen.generate(requests, max_new_tokens=tokens, eos_token_id=None)
    assert [results[i]["tokens"] for i in range(20)] == expected.tokens
    assert not lock_path(out).exists()


def wait_for_lines(job: subprocess.Popen, out: Path, lines: int, wait_s: float = 120) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and job.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= lines:
            return
        time.sleep(0.02)
    raise AssertionError(f"the job ended or stalled before {lines} lines: {job.poll()}")


# ---------------------------------------------------------------------- one job per output


def test_two_jobs_on_one_output_never_write_a_row_twice(tiny_model_dirs, tiny_llama_gen, tmp_path):
    """The report: two jobs a second apart on one output wrote 72 lines for 40 ids. Now
    the second stops with an error naming the first's pid while the first runs on; the
    first is stopped (SIGTERM) and the same command completes the job, every id once."""
    source = write_jsonl(tmp_path / "rows.jsonl", LONG)
    out = tmp_path / "out.jsonl"
    args = job_args(tmp_path, tiny_model_dirs["llama"][1], source, out)
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_lines(first, out, 1)
    second = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert first.poll() is None, "the first job ended before the second started: make it longer"
    assert second.returncode == 2, second.stderr
    assert second.stderr.count("\n") == 1, second.stderr
    said = f"is being written by another ortgen job (pid {first.pid})"
    assert said in second.stderr
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 143
    rerun_completes(args, out, tiny_llama_gen)


def test_a_held_output_is_refused_before_it_is_read(tiny_llama_gen, tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:2])
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 0, "tokens": []}\n{"id": 1, "tok')  # a torn line to repair
    holder = OutputLock(out)
    holder.acquire()
    try:
        with pytest.raises(ortgen.OutputError, match=f"another ortgen job \\(pid {os.getpid()}"):
            run_job(tiny_llama_gen, source, out, progress=None, settings=GREEDY)
        assert out.read_text().endswith('"tok')  # not repaired by the job that lost
    finally:
        holder.release()
    run_job(tiny_llama_gen, source, out, progress=None, settings=GREEDY)
    assert sorted(read_results(out)) == [0, 1]
    assert not lock_path(out).exists()


def test_a_killed_holder_leaves_no_held_lock(tiny_llama_gen, tmp_path):
    """SIGKILL cannot run cleanup: the lock file stays, but the OS let the lock go."""
    out = tmp_path / "out.jsonl"
    code = (
        "import sys, time; from pathlib import Path; from ortgen.jobs.output_lock import "
        "OutputLock; OutputLock(Path(sys.argv[1])).acquire(); print('held', flush=True); "
        "time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    with pytest.raises(ortgen.OutputError, match=f"pid {holder.pid}"):
        OutputLock(out).acquire()
    holder.kill()
    holder.wait()
    assert lock_path(out).exists()  # stale file, free lock
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:3])
    run_job(tiny_llama_gen, source, out, progress=None, settings=GREEDY)
    assert sorted(read_results(out)) == [0, 1, 2]
    assert not lock_path(out).exists()


def test_parquet_output_is_locked_by_its_own_name(tiny_llama_gen, tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:2])
    out = tmp_path / "out.parquet"
    holder = OutputLock(out)
    holder.acquire()
    try:
        with pytest.raises(ortgen.OutputError, match="being written by another ortgen job"):
            run_job(tiny_llama_gen, source, out, progress=None, settings=GREEDY)
    finally:
        holder.release()
    run_job(tiny_llama_gen, source, out, progress=None, settings=GREEDY)
    assert out.exists() and not lock_path(out).exists()


@pytest.mark.parametrize("taken", [False, True], ids=["new-file-free", "new-file-taken"])
def test_a_lock_file_removed_between_open_and_flock_is_not_held(tmp_path, monkeypatch, taken):
    """The race ``OutputLock.acquire`` checks for, made to happen: a second job opens
    OUT.lock, the holder releases it (removes the file, lets the lock go), and only then
    does the second job lock what it opened, a file no other job can find. A third job
    would create a new OUT.lock and lock it too, and both would write the output. So the
    second job must notice that the path no longer names the file it locked and try again:
    take the new file when it is free (and then hold the lock others see), or stop with an
    error naming the job that took it first. (flock conflicts between two opens of a file
    in one process as between processes, so the jobs here are OutputLocks of this one.)"""
    out = tmp_path / "out.jsonl"
    holder, second, third, later = (OutputLock(out) for _ in range(4))
    holder.acquire()
    locked: list[int] = []

    def flock(fd: int, operation: int) -> None:
        locked.append(fd)
        if len(locked) == 1:  # the second job has opened the holder's file: it lets go now
            holder.release()
            if taken:
                third.acquire()
        fcntl.flock(fd, operation)

    racing = SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB)
    monkeypatch.setattr(output_lock, "fcntl", racing)
    try:
        if taken:
            held_by = f"another ortgen job \\(pid {os.getpid()}\\)"
            with pytest.raises(ortgen.OutputError, match=held_by):
                second.acquire()
            assert third.held and not second.held
        else:
            second.acquire()
            with pytest.raises(ortgen.OutputError, match="another ortgen job"):
                later.acquire()  # a job that comes now finds the lock held
            assert len(locked) == 3  # the race happened: the second job locked twice
    finally:
        for lock in (second, third, later):
            lock.release()
    assert not lock_path(out).exists()


# ------------------------------------------------------------------- faults while writing


class FailingWrites:
    """``os.write`` to the result file ``target`` that writes the first ``after`` calls,
    then half of the next batch, then raises ``failure``: a disk that fills in the middle
    of a line. Writes to other files (the lock's pid) pass through."""

    def __init__(self, target: Path, after: int, failure: BaseException) -> None:
        self.target = str(target)
        self.after = after
        self.failure = failure
        self.calls = 0
        self.real = os.write

    def __call__(self, fd: int, data: bytes | memoryview) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != self.target:
            return self.real(fd, data)
        self.calls += 1
        if self.calls <= self.after:
            return self.real(fd, data)
        if self.calls == self.after + 1:
            return self.real(fd, bytes(data)[: len(data) // 2])
        raise self.failure


@pytest.mark.parametrize(
    "failure",
    [OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EROFS, "Read-only")],
    ids=["disk-full", "read-only"],
)
def test_a_write_that_fails_midway_keeps_every_line_before(
    tiny_llama_gen, reference, tmp_path, monkeypatch, failure
):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    monkeypatch.setattr(results_mod.os, "write", FailingWrites(out, 5, failure))
    options = {"batch_size": 1, "progress": None, "settings": {**GREEDY, "max_new_tokens": 16}}
    with pytest.raises(ortgen.OutputError) as raised:
        run_job(tiny_llama_gen, source, out, **options)
    said = str(raised.value)
    assert f"cannot write the output {out}: {failure.strerror}" in said
    assert "the 5 rows written before are kept; run the same command again" in said
    assert len(read_results(out)) == 5  # whole lines only: the half batch was cut back
    assert not lock_path(out).exists()
    monkeypatch.undo()
    run_job(tiny_llama_gen, source, out, **options)
    assert_complete(out, reference)


def test_a_signal_in_the_middle_of_a_write_drops_the_batch_whole(
    tiny_llama_gen, tmp_path, monkeypatch
):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:6])
    out = tmp_path / "out.jsonl"
    monkeypatch.setattr(results_mod.os, "write", FailingWrites(out, 2, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_job(tiny_llama_gen, source, out, batch_size=1, progress=None, settings=GREEDY)
    assert len(read_results(out)) == 2
    assert not lock_path(out).exists()


def test_a_signal_after_a_whole_write_keeps_the_batch(tiny_llama_gen, tmp_path, monkeypatch):
    """A reader may already have seen a batch that was written whole: a signal that
    arrives before its fsync returns keeps it (made durable) instead of cutting it."""
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:6])
    out = tmp_path / "out.jsonl"
    real_fsync = os.fsync
    syncs = []

    def interrupted(fd: int) -> None:
        real_fsync(fd)
        if os.readlink(f"/proc/self/fd/{fd}") == str(out):
            syncs.append(fd)
            if len(syncs) == 3:
                raise KeyboardInterrupt

    monkeypatch.setattr(results_mod.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_job(tiny_llama_gen, source, out, batch_size=1, progress=None, settings=GREEDY)
    assert sorted(read_results(out)) == [0, 1, 2]
    assert not lock_path(out).exists()


def test_a_file_size_limit_mid_job_is_one_error_then_a_rerun_resumes(
    tiny_model_dirs, reference, tmp_path
):
    """A real ``ulimit -f`` (RLIMIT_FSIZE): the write past it fails with EFBIG (Python
    ignores SIGXFSZ). One error line, whole lines kept, then the rerun completes."""
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    args = job_args(tmp_path, tiny_model_dirs["llama"][1], source, out)
    limit = 2000  # bytes: ~15 of the 40 result lines

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    failed = subprocess.run(args, capture_output=True, text=True, timeout=300, preexec_fn=limited)
    assert failed.returncode == 2, failed.stderr
    error = failed.stderr.splitlines()[-1]
    assert error.startswith(f"ortgen: error: cannot write the output {out}: File too large")
    assert "Traceback" not in failed.stderr
    kept = read_results(out)
    assert 0 < len(kept) < len(ROWS) and out.stat().st_size <= limit
    assert f"the {len(kept)} rows written before are kept" in error
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(kept)} skipped (already done)" in rerun.stderr
    assert_complete(out, reference)


def test_an_output_that_cannot_be_opened_is_one_error_before_any_row(
    tiny_llama_gen, tmp_path, monkeypatch
):
    """A read-only folder (simulated: the tests may run as root, which ignores modes)."""
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:2])
    out = tmp_path / "out.jsonl"
    real_open = os.open

    def read_only(path, flags, *rest):
        if str(path).startswith(str(tmp_path)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *rest)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ortgen.OutputError, match=r"cannot write the output .*Read-only file sys"):
        run_job(tiny_llama_gen, source, out, progress=None, settings=GREEDY)
    assert not out.exists()


def test_a_device_is_not_an_output(tiny_llama_gen, tmp_path):
    """/dev/zero as the output: resume read it for ever; now it is refused at once."""
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:2])
    with pytest.raises(ortgen.InputError, match="/dev/zero is not a regular file"):
        run_job(tiny_llama_gen, source, "/dev/zero", progress=None, settings=GREEDY)
    assert not Path("/dev/zero.lock").exists()


# ------------------------------------------------------------------------------ signals


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_job_stops_it_cleanly_and_a_rerun_resumes(
    tiny_model_dirs, tiny_llama_gen, tmp_path, sig, code
):
    """The job starts with SIGINT's default action whatever this test process inherited:
    a shell that starts a command in the background without job control (CI scripts,
    ``cmd &``) makes it ignore SIGINT, a child inherits that, and Python then installs no
    KeyboardInterrupt handler, so the job would run to its end (seen twice in CI runs).
    Rows of 64 tokens keep the job running well past the signal."""
    source = write_jsonl(tmp_path / "rows.jsonl", LONG)
    out = tmp_path / "out.jsonl"
    args = job_args(tmp_path, tiny_model_dirs["llama"][1], source, out, tokens=64)
    job = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    wait_for_lines(job, out, 5)
    job.send_signal(sig)
    _, stderr = job.communicate(timeout=60)
    assert job.returncode == code, stderr
    assert f"stopped by {sig.name}; the rows done are in the output" in stderr
    assert "Traceback" not in stderr
    kept = len(read_results(out))  # whole lines: the batch in flight was written or dropped
    assert 5 <= kept < len(LONG)
    assert not lock_path(out).exists()
    rerun_completes(args, out, tiny_llama_gen, kept, tokens=64)


def test_result_lines_are_json_objects_with_the_row_id(tmp_path, tiny_llama_gen):
    """The lock file never lands among the results, nor do results in the lock file; the
    output's record of its settings stays beside it (fingerprint.py)."""
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:2])
    out = tmp_path / "out.jsonl"
    run_job(tiny_llama_gen, source, out, progress=None, settings=GREEDY)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [0, 1]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["out.jsonl", "out.jsonl.run.json", "rows.jsonl"]
