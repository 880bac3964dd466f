"""Batch jobs (``ortgen run``): every row gives what ``generate`` gives it, bad rows
become error lines without stopping the job, and a job killed at any moment resumes with
no row lost, none twice and no torn line.

Runs on the tiny random Llama (no tokenizer: token-id prompts), greedy with EOS off so
every row has a known length; text and chat rows use a tiny model with a tokenizer.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ortgen
from ortgen.jobs import run_job
from tests.test_per_row import ONE_EACH, ONE_EACH_CALL, PLAIN_GREEDY, PLAIN_SAMPLED, hf_greedy
from tests.tiny_models import export_tiny

CLI = [sys.executable, "-m", "ortgen.cli"]
GREEDY = {"max_new_tokens": 6, "eos_token_id": None}
ROWS = [
    {"prompt": [5, 17, 42, 99, 3, 64], "repetition_penalty": 1.4},
    {"id": "short", "prompt": [7, 8], "max_new_tokens": 4},
    {"prompt": [200, 13, 55, 1, 9, 9, 9, 31, 77], "no_repeat_ngram_size": 2},
    {"prompt": [11, 12, 13]},
    {"id": 40, "prompt": [1, 2, 3, 4, 5]},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_results(path: Path) -> dict:
    """id -> result line; fails on a torn line or an id written twice."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n"), "torn last line"
    lines = [json.loads(line) for line in text.splitlines()]
    ids = [json.dumps(r["id"]) for r in lines]
    assert len(ids) == len(set(ids)), "an id written twice"
    return {r["id"]: r for r in lines}


def request(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "id"}


def run(gen, tmp_path: Path, rows: list, **options) -> tuple[dict, ortgen.jobs.JobSummary]:
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out.jsonl"
    options.setdefault("settings", GREEDY)
    summary = run_job(gen, source, out, progress=None, **options)
    return read_results(out), summary


@pytest.fixture(scope="module")
def text_gen(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Llama with a tokenizer and a chat template."""
    return ortgen.load(
        export_tiny("llama", tmp_path_factory.mktemp("jobs-text"), with_tokenizer=True), threads=1
    )


# ------------------------------------------------------------------------ results


@pytest.mark.parametrize(("batch_size", "window"), [(2, 3), (8, 256), (1, 1)])
def test_each_row_gives_what_generate_gives(tiny_llama_gen, tmp_path, batch_size, window):
    """Sorting by length and batching change nothing in a row's result; per-row
    settings are honoured; the id is the row's own or its line number."""
    results, summary = run(tiny_llama_gen, tmp_path, ROWS, batch_size=batch_size, window=window)
    expected = tiny_llama_gen.generate([request(r) for r in ROWS], **GREEDY)
    ids = [r.get("id", line) for line, r in enumerate(ROWS, start=1)]
    assert sorted(map(str, results)) == sorted(map(str, ids))
    for i, (row_id, row) in enumerate(zip(ids, ROWS, strict=True)):
        got = results[row_id]
        assert got["tokens"] == expected.tokens[i], row_id
        assert got["finish_reason"] == expected.finish_reasons[i] == "length"
        assert got["usage"] == {
            "prompt_tokens": len(row["prompt"]),
            "completion_tokens": len(expected.tokens[i]),
        }
        assert got["text"] is None  # no tokenizer
    assert len(results["short"]["tokens"]) == 4
    assert (summary.rows_ok, summary.errors, summary.skipped) == (5, 0, 0)
    assert summary.tokens == sum(len(t) for t in expected.tokens)


@pytest.mark.parametrize("batch_size", [3, 16])
def test_each_row_equals_its_settings_given_flat(
    tiny_llama_gen, tiny_model_dirs, tmp_path, batch_size
):
    """Each line's settings against the same settings given flat to ``generate`` (not
    against the same dict, which goes through the same row encoding): one row per
    setting, each of which changes its row (tests/test_per_row.py checks that on this
    model); the greedy rows also against transformers' own greedy ``generate``."""
    from transformers import AutoModelForCausalLM

    gen = tiny_llama_gen
    results, summary = run(gen, tmp_path, ONE_EACH, batch_size=batch_size, settings=ONE_EACH_CALL)
    assert summary.rows_ok == len(ONE_EACH)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"][0]).eval()
    for line, row in enumerate(ONE_EACH, start=1):
        settings = request(row)
        prompt = settings.pop("prompt")
        flat = gen.generate([prompt], **ONE_EACH_CALL, **settings).tokens[0]
        assert results[line]["tokens"] == flat, f"line {line}: {settings}"
        if not settings.get("do_sample"):
            assert flat == hf_greedy(hf, prompt, ONE_EACH_CALL["max_new_tokens"], **settings)
    for line in range(1, PLAIN_SAMPLED + 1):
        plain = PLAIN_SAMPLED if ONE_EACH[line - 1].get("do_sample") else PLAIN_GREEDY
        assert results[line]["tokens"] != results[plain + 1]["tokens"], f"line {line}"


def test_text_and_chat_rows(text_gen, tmp_path):
    rows = [
        {"prompt": "Hello there"},
        {"messages": [{"role": "user", "content": "Hi!"}], "max_new_tokens": 3},
        {"prompt": "Once upon a time, far away", "temperature": 0.5, "do_sample": True, "seed": 3},
    ]
    results, _ = run(text_gen, tmp_path, rows, batch_size=3)
    expected = text_gen.generate([request(r) for r in rows], **GREEDY)
    for i in range(3):
        assert results[i + 1]["text"] == expected.text[i]
        assert results[i + 1]["tokens"] == expected.tokens[i]
    chat_ids = text_gen.chat_prompt(rows[1]["messages"])
    assert results[2]["usage"]["prompt_tokens"] == len(chat_ids)


def test_job_settings_and_pipeline_layer(tiny_llama_gen, tmp_path, tiny_model_dirs):
    """The generator's pipeline is the layer under the job's settings, as in generate."""
    pipeline = tmp_path / "p.toml"
    pipeline.write_text("[generation]\nmax_new_tokens = 3\nrepetition_penalty = 1.3\n")
    gen = ortgen.load(tiny_model_dirs["llama"][1], pipeline=pipeline, threads=1)
    results, _ = run(gen, tmp_path, ROWS[3:], settings={"eos_token_id": None})
    expected = gen.generate([request(r) for r in ROWS[3:]], eos_token_id=None)
    assert results[1]["tokens"] == expected.tokens[0] and len(expected.tokens[0]) == 3
    assert results[40]["tokens"] == expected.tokens[1]


# --------------------------------------------------------------------- error rows


def test_bad_rows_become_error_rows_and_the_job_goes_on(tiny_llama_gen, tmp_path):
    lines = [
        json.dumps(ROWS[3]),
        "{not json",
        json.dumps({"prompt": [3, 1_000_000]}),  # outside the vocabulary
        json.dumps({"prompt": [4, 5], "tempreature": 0.5}),  # an unknown setting
        json.dumps({"prompt": [6, 7], "logits_processors": [{"name": "nope"}]}),  # fails in
        json.dumps(ROWS[4]),  # the batch, with these two good rows
        json.dumps({"text": "no prompt"}),
        json.dumps({"prompt": [1], "num_beams": 2}),  # a batch-wide setting
        json.dumps([1, 2]),
        json.dumps({"id": [1], "prompt": [1]}),
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    summary = run_job(tiny_llama_gen, source, out, batch_size=8, settings=GREEDY, progress=None)
    results = read_results(out)
    assert set(results) == {1, 2, 3, 4, 5, 40, 7, 8, 9, 10}
    expected = tiny_llama_gen.generate([request(ROWS[3]), request(ROWS[4])], **GREEDY)
    assert results[1]["tokens"] == expected.tokens[0]
    assert results[40]["tokens"] == expected.tokens[1]
    errors = {k: v["error"] for k, v in results.items() if "error" in v}
    assert set(errors) == {2, 3, 4, 5, 7, 8, 9, 10}
    assert errors[2].startswith("line 2: not valid JSON")
    assert errors[3] == "line 3: the prompt has token ids outside [0, 256): [1000000]"
    assert "unknown setting 'tempreature' (did you mean 'temperature'?)" in errors[4]
    assert errors[5].startswith("line 5: unknown logits_processor 'nope'")
    assert '"prompt"' in errors[7] and '"messages"' in errors[7]
    assert "num_beams" in errors[8]
    assert "JSON object" in errors[9]
    assert '"id" must be a string or an integer' in errors[10]
    assert (summary.rows_ok, summary.errors) == (2, 8)


def test_a_line_separator_in_a_row_never_splits_its_result_line(tiny_llama_gen, tmp_path):
    """JSON keeps U+2028, U+2029 and U+0085 raw inside strings, and str.splitlines() (and
    JavaScript's line readers) split on them: an id or an error message holding one must
    still be one line (fuzzing found an error message that split a row in two)."""
    odd = "a\u2028b\u2029c\x85d"
    rows = [
        {"id": f"id{odd}", "prompt": [1, 2, 3]},
        {"id": "bad", "messages": [{"content": odd}]},  # an error naming the message
    ]
    source, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    run_job(tiny_llama_gen, source, out, settings=GREEDY, progress=None)
    results = read_results(out)  # splitlines(): one line per row, each JSON
    assert set(results) == {f"id{odd}", "bad"} and "error" in results["bad"]


def test_duplicate_ids_stop_the_job_before_it_starts(tiny_llama_gen, tmp_path):
    rows = [{"id": "a", "prompt": [1]}, {"prompt": [2]}, {"id": "a", "prompt": [3]}]
    with pytest.raises(ortgen.InputError, match="line 3: id 'a' is also the id of line 1"):
        run(tiny_llama_gen, tmp_path, rows)
    assert not (tmp_path / "out.jsonl").exists()


def test_job_wide_problems_raise(tiny_llama_gen, tmp_path):
    with pytest.raises(ortgen.ConfigError, match="num_return_sequences must be 1"):
        run(tiny_llama_gen, tmp_path, ROWS, settings={"num_return_sequences": 2, "num_beams": 2})
    with pytest.raises(ortgen.ConfigError, match=r"for the ray engine use .*run_ray_job"):
        run(tiny_llama_gen, tmp_path, ROWS, engine="ray")
    with pytest.raises(ortgen.InputError, match="does not exist"):
        run_job(tiny_llama_gen, tmp_path / "nope.jsonl", tmp_path / "o.jsonl", progress=None)


# ------------------------------------------------------------------------- resume


def test_a_rerun_skips_what_is_done(tiny_llama_gen, tmp_path):
    first, _ = run(tiny_llama_gen, tmp_path, ROWS[:2])
    results, summary = run(tiny_llama_gen, tmp_path, ROWS)  # the input grew
    assert (summary.rows_ok, summary.skipped) == (3, 2)
    assert {k: results[k] for k in first} == first
    again, summary = run(tiny_llama_gen, tmp_path, ROWS)
    assert again == results and (summary.rows_ok, summary.skipped) == (0, 5)


def test_a_torn_last_line_is_cut_and_its_row_redone(tiny_llama_gen, tmp_path):
    complete, _ = run(tiny_llama_gen, tmp_path, ROWS)
    out = tmp_path / "out.jsonl"
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    last = lines[-1]
    out.write_text("".join(lines[:-1]) + last[: len(last) // 2], encoding="utf-8")
    results, summary = run(tiny_llama_gen, tmp_path, ROWS)
    assert results == complete
    assert (summary.rows_ok, summary.skipped) == (1, 4)


def test_an_output_that_is_not_a_job_output_is_refused(tiny_llama_gen, tmp_path):
    (tmp_path / "out.jsonl").write_text("hello\n")
    with pytest.raises(ortgen.InputError, match="line 1 is not a result line"):
        run(tiny_llama_gen, tmp_path, ROWS)


def test_sigkill_mid_job_then_rerun_gives_every_row_once(tiny_model_dirs, tiny_llama_gen, tmp_path):
    """A real ``ortgen run`` killed with SIGKILL while it writes, then run again with the
    same arguments: every id exactly once, whole lines, the same tokens as generate."""
    rows = [{"prompt": [1 + i % 50, 2, 3 + i % 7, i % 200]} for i in range(400)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{tiny_model_dirs["llama"][1]}"\n[run]\nbatch_size = 8\n')
    out = tmp_path / "out.jsonl"
    args = [*CLI, "run", str(pipeline), "--input", str(source), "--output", str(out)]
    args += ["--batch-size", "1", "--threads", "1", "--max-new-tokens", "16"]
    args += ["--set", "eos_token_id=null"]
    kill_then_rerun(args, out, rows, tiny_llama_gen, after_lines=10, checked=40)


def kill_then_rerun(
    args: list[str],
    out: Path,
    rows: list[dict],
    gen,
    *,
    after_lines: int,
    checked: int,
    env: dict[str, str] | None = None,
    wait_s: float = 120,
    sig: signal.Signals = signal.SIGKILL,
) -> None:
    """Start the job ``args``, send it ``sig`` once ``out`` holds ``after_lines`` lines, run
    the same command again, and check: every row's id exactly once, the rerun skipped what
    the stopped job wrote, and the first ``checked`` rows have the tokens ``generate``
    gives. A signal the job can handle (SIGTERM, SIGINT) must stop it cleanly: exit
    128 + the signal, its message, and its output's lock let go."""
    job = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # see test_job_faults
    )  # fmt: skip
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and job.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= after_lines:
            break
        time.sleep(0.02)
    assert job.poll() is None, "the job ended before it could be killed; make it longer"
    os.kill(job.pid, sig)
    _, stderr = job.communicate()
    if sig != signal.SIGKILL:
        assert job.returncode == 128 + sig, stderr
        assert f"stopped by {sig.name}; the rows done are in the output".encode() in stderr
        assert not out.with_name(out.name + ".lock").exists()
    killed = out.read_bytes().count(b"\n")
    assert after_lines <= killed < len(rows)
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert rerun.returncode == 0, rerun.stderr
    results = read_results(out)
    assert sorted(results) == list(range(1, len(rows) + 1))
    assert f"{killed} skipped (already done)" in rerun.stderr
    expected = gen.generate(rows[:checked], max_new_tokens=16, eos_token_id=None)
    for i in range(checked):
        assert results[i + 1]["tokens"] == expected.tokens[i]


# ------------------------------------------------------------- progress, summary


def test_summary_line_and_no_progress_line_off_a_terminal(tiny_llama_gen, tmp_path):
    stream = io.StringIO()
    source = write_jsonl(tmp_path / "rows.jsonl", [*ROWS, {"prompt": []}])
    run_job(tiny_llama_gen, source, tmp_path / "o.jsonl", settings=GREEDY, progress=stream)
    text = stream.getvalue()
    assert "\r" not in text and text.count("\n") == 1
    assert text.startswith("ortgen run: 5 rows ok, 1 errors, 0 skipped (already done), 28 tokens")
    assert "tok/s" in text


def test_progress_line_on_a_terminal(tiny_llama_gen, tmp_path, monkeypatch):
    from ortgen.jobs import progress

    monkeypatch.setattr(progress, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(progress, "_clock", iter(range(1000)).__next__)  # 1 s a call
    stream = io.StringIO()
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    run_job(
        tiny_llama_gen, source, tmp_path / "o.jsonl", batch_size=2, settings=GREEDY, progress=stream
    )
    text = stream.getvalue()
    assert "\r\x1b[K2/5 rows (0 errors)" in text and "ETA" in text
    assert "5/5 rows" in text
    assert text.endswith("\n") and text.count("\n") == 1
    assert text.rsplit("\r\x1b[K", 1)[1].startswith("ortgen run: 5 rows ok")


# ------------------------------------------------------------------------- Parquet


def test_parquet_in_and_out(tiny_llama_gen, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"id": "a", "prompt": [5, 17, 42], "max_new_tokens": 3},
        {"id": "b", "prompt": [7, 8], "max_new_tokens": None},  # null: not set
        {"id": "c", "prompt": [1, 300], "max_new_tokens": None},  # outside the vocabulary
    ]
    source = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    out = tmp_path / "out.parquet"
    summary = run_job(tiny_llama_gen, source, out, settings=GREEDY, progress=None)
    assert (summary.rows_ok, summary.errors) == (2, 1)
    assert not (tmp_path / "out.parquet.partial.jsonl").exists()
    table = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    expected = tiny_llama_gen.generate(
        [{"prompt": [5, 17, 42], "max_new_tokens": 3}, [7, 8]], **GREEDY
    )
    assert table["a"]["tokens"] == expected.tokens[0] and len(expected.tokens[0]) == 3
    assert table["b"]["tokens"] == expected.tokens[1]
    assert table["b"]["usage"] == {"prompt_tokens": 2, "completion_tokens": 6}
    assert table["a"]["error"] is None
    assert table["c"]["error"].startswith("row 3: the prompt has token ids outside")
    again = run_job(tiny_llama_gen, source, out, settings=GREEDY, progress=None)
    assert (again.rows_ok, again.skipped) == (0, 3)
    assert {r["id"]: r for r in pq.read_table(out).to_pylist()} == table


def test_parquet_resumes_from_its_progress_file(tiny_llama_gen, tmp_path):
    import pyarrow.parquet as pq

    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    progress_file = tmp_path / "out.parquet.partial.jsonl"
    progress_file.write_text(
        json.dumps({"id": 1, "text": None, "tokens": [1], "finish_reason": "length",
                    "usage": {"prompt_tokens": 6, "completion_tokens": 1}}) + "\n" + '{"id": 2,'
    )  # fmt: skip
    summary = run_job(
        tiny_llama_gen, source, tmp_path / "out.parquet", settings=GREEDY, progress=None
    )
    assert (summary.rows_ok, summary.skipped) == (4, 1)
    ids = [r["id"] for r in pq.read_table(tmp_path / "out.parquet").to_pylist()]
    assert sorted(map(str, ids)) == sorted(["1", "short", "3", "4", "40"])


def test_parquet_without_pyarrow_says_how_to_get_it(tiny_llama_gen, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(ortgen.OrtgenError, match="pip install pyarrow"):
        run_job(tiny_llama_gen, source, tmp_path / "out.parquet", progress=None)
    parquet = tmp_path / "rows.parquet"
    parquet.write_bytes(b"PAR1")
    with pytest.raises(ortgen.OrtgenError, match="pip install pyarrow"):
        run_job(tiny_llama_gen, parquet, tmp_path / "o.jsonl", progress=None)


# --------------------------------------------------------------------------- CLI


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def test_dry_run_reports_each_bad_line_without_the_model(tmp_path):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('model = "does/not/matter"\n[generation]\nmax_new_tokens = 4\n')
    source = tmp_path / "rows.jsonl"
    source.write_text(
        "\n".join(
            [
                json.dumps({"prompt": [1, 2]}),
                "{oops",
                json.dumps({"messages": [{"role": "user", "content": "hi"}], "top_p": 3}),
                "",
                json.dumps({"id": 1, "prompt": "text"}),
            ]
        )
        + "\n"
    )
    result = cli("run", str(pipeline), "--input", str(source), "--dry-run")
    assert result.returncode == 2, result.stderr
    lines = result.stdout.splitlines()
    no_model = (
        "model does/not/matter is not a model folder (it has no config.json or genai_config.json)"
    )
    assert lines[0] == f"pipeline {pipeline}: {no_model}"
    assert lines[1] == f"input {source}: 4 rows, 3 bad"
    assert lines[2].startswith("  line 2: not valid JSON")
    assert lines[3].startswith("  line 3: ") and "top_p" in lines[3]
    assert lines[4].startswith("  line 5: id 1 is also the id of line 1")


def test_dry_run_of_a_good_job_exits_0(tmp_path, tiny_model_dirs):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{tiny_model_dirs["llama"][1]}"\n')
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    result = cli("run", str(pipeline), "--input", str(source), "--dry-run", "--batch-size", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"pipeline {pipeline}: ok",
        f"input {source}: 5 rows, none bad",
    ]


def test_cli_errors(tmp_path, tiny_model_dirs):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{tiny_model_dirs["llama"][1]}"\n')
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    base = ["run", str(pipeline), "--input", str(source)]
    result = cli(*base, "--output", str(tmp_path / "o.jsonl"), "--workers", "2")
    assert result.returncode == 2
    assert "--address and --workers are for the ray engine" in result.stderr
    result = cli(*base, "--output", "o.jsonl", "--engine", "ray", "--workers", "0")
    assert result.returncode == 2 and "--workers must be at least 1" in result.stderr
    result = cli(*base)
    assert result.returncode == 2 and "needs --output" in result.stderr
    result = cli(*base, "--output", "o.jsonl", "--batch-size", "0")
    assert result.returncode == 2 and "--batch-size must be at least 1" in result.stderr
    result = cli(
        "run", str(pipeline), "--input", str(tmp_path / "nope.jsonl"), "--output", "o.jsonl"
    )
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_an_output_that_is_a_folder_is_a_clear_error(text_gen, tmp_path):
    """It ended in a Python traceback (IsADirectoryError); now the job refuses before it
    runs a row, and through the CLI that is one error line and exit status 2."""
    gen = text_gen
    source = write_jsonl(tmp_path / "rows.jsonl", [{"id": 1, "prompt": [1, 2]}])
    folder = tmp_path / "results"
    folder.mkdir()
    with pytest.raises(ortgen.InputError, match="is a folder; give a file path"):
        run_job(gen, source, folder, progress=None, settings=GREEDY)
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{gen.path}"\n[generation]\nmax_new_tokens = 2\n')
    result = cli("run", str(pipeline), "--input", str(source), "--output", str(folder))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "is a folder" in result.stderr
    assert list(folder.iterdir()) == []
