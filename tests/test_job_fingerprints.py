"""A job's output remembers what it was asked (``ortgen.jobs.fingerprint``): a rerun under
other settings stops before any row with one line naming what changed, ``--rerun-changed``
redoes exactly the rows done under other settings and keeps the rest, and a rerun under
the same settings resumes as before. JSONL and Parquet alike.

On the tiny random Llama (token-id prompts, greedy, EOS off: every row has a known
length), as tests/test_jobs.py runs it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ortgen
from ortgen.cli import main
from ortgen.jobs import run_job
from ortgen.jobs.fingerprint import SettingsChanged, model_identity, record_path
from tests.test_jobs import GREEDY, ROWS, read_results, request, write_jsonl

SHORTER = {**GREEDY, "max_new_tokens": 3}


def job(gen, tmp_path: Path, rows: list, settings: dict, out: str = "out.jsonl", **options):
    """``run_job`` over ``rows`` into ``tmp_path / out``: its summary."""
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    return run_job(gen, source, tmp_path / out, settings=settings, progress=None, **options)


def expected(gen, rows: list, settings: dict) -> dict:
    """id -> the tokens ``generate`` gives each row under ``settings``."""
    out = gen.generate([request(r) for r in rows], **settings)
    ids = [r.get("id", line) for line, r in enumerate(rows, start=1)]
    return dict(zip(ids, out.tokens, strict=True))


def test_a_rerun_under_other_settings_stops_naming_what_changed(tiny_llama_gen, tmp_path):
    """Nothing is run or written, the output and its record stay as they were."""
    job(tiny_llama_gen, tmp_path, ROWS, GREEDY)
    out = tmp_path / "out.jsonl"
    before, record = out.read_bytes(), record_path(out).read_bytes()
    with pytest.raises(SettingsChanged) as caught:
        job(tiny_llama_gen, tmp_path, ROWS, SHORTER)
    assert str(caught.value) == (
        "max_new_tokens changed from 6 to 3 since this output was written: rerun with "
        "--rerun-changed to redo the 5 rows done under the old settings, or write to a new "
        "--output"
    )
    assert caught.value.rows == 5
    assert out.read_bytes() == before and record_path(out).read_bytes() == record
    assert not out.with_name("out.jsonl.lock").exists()  # the lock let go


def test_the_same_settings_resume_and_each_line_says_what_it_was_done_under(
    tiny_llama_gen, tmp_path
):
    first = job(tiny_llama_gen, tmp_path, ROWS[:3], GREEDY)
    again = job(tiny_llama_gen, tmp_path, ROWS, dict(GREEDY))  # the input grew
    assert (first.rows_ok, again.rows_ok, again.skipped) == (3, 2, 3)
    results = read_results(tmp_path / "out.jsonl")
    prints = {row_id: line["fingerprint"] for row_id, line in results.items()}
    record = json.loads(record_path(tmp_path / "out.jsonl").read_text())
    plain = [4, 40]  # rows without settings of their own carry the job's own
    assert {prints[i] for i in plain} == {record["fingerprint"]}
    assert len(set(prints.values())) == 4  # lines 1-3 have settings of their own
    assert record["record"]["settings"]["max_new_tokens"] == 6


def test_rerun_changed_redoes_exactly_the_rows_done_under_other_settings(tiny_llama_gen, tmp_path):
    """A job's settings changed for some rows, then one row's own settings: each time only
    those rows run again, the other lines stay byte for byte, and every line is what
    ``generate`` gives under the settings asked for now."""
    job(tiny_llama_gen, tmp_path, ROWS[:3], GREEDY)
    summary = job(tiny_llama_gen, tmp_path, ROWS, SHORTER, rerun_changed=True)
    assert (summary.rows_ok, summary.skipped) == (5, 0)
    out = tmp_path / "out.jsonl"
    results = read_results(out)
    assert {k: r["tokens"] for k, r in results.items()} == expected(tiny_llama_gen, ROWS, SHORTER)
    lines = out.read_text().splitlines()
    rows = [*ROWS[:4], {**ROWS[4], "max_new_tokens": 2}]  # row 40's own settings changed
    with pytest.raises(SettingsChanged, match=r"^the row's own settings changed \(line 5, id 40\)"):
        job(tiny_llama_gen, tmp_path, rows, SHORTER)
    summary = job(tiny_llama_gen, tmp_path, rows, SHORTER, rerun_changed=True)
    assert (summary.rows_ok, summary.skipped) == (1, 4)
    kept = [line for line in lines if json.loads(line)["id"] != 40]
    assert out.read_text().splitlines()[:4] == kept  # the rest untouched, in place
    assert read_results(out)[40]["tokens"] == expected(tiny_llama_gen, rows, SHORTER)[40]


def test_an_output_without_fingerprints_resumes_as_before(tiny_llama_gen, tmp_path):
    """Lines written by an ortgen that kept no fingerprint, and no record beside them: the
    rows count as done (a rerun cannot know their settings), and the record is written."""
    out = tmp_path / "out.jsonl"
    job(tiny_llama_gen, tmp_path, ROWS, GREEDY)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    out.write_text("".join(json.dumps({**r, "fingerprint": None}) + "\n" for r in lines))
    record_path(out).unlink()
    summary = job(tiny_llama_gen, tmp_path, ROWS, SHORTER)
    assert (summary.rows_ok, summary.skipped) == (0, 5)
    assert json.loads(record_path(out).read_text())["record"]["settings"]["max_new_tokens"] == 3


def test_a_record_gone_still_stops_a_rerun_under_other_settings(tiny_llama_gen, tmp_path):
    job(tiny_llama_gen, tmp_path, ROWS, GREEDY)
    record_path(tmp_path / "out.jsonl").unlink()
    with pytest.raises(SettingsChanged, match=r"out\.jsonl\.run\.json, is missing"):
        job(tiny_llama_gen, tmp_path, ROWS, SHORTER)


def test_parquet_keeps_fingerprints_and_reruns_changed_rows(tiny_llama_gen, tmp_path):
    import pyarrow.parquet as pq

    job(tiny_llama_gen, tmp_path, ROWS, GREEDY, out="out.parquet")
    out = tmp_path / "out.parquet"
    first = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    assert all(r["fingerprint"] for r in first.values())
    assert record_path(out).name == "out.parquet.run.json"
    with pytest.raises(SettingsChanged, match="max_new_tokens changed from 6 to 3"):
        job(tiny_llama_gen, tmp_path, ROWS, SHORTER, out="out.parquet")
    summary = job(tiny_llama_gen, tmp_path, ROWS, SHORTER, out="out.parquet", rerun_changed=True)
    assert (summary.rows_ok, summary.skipped) == (5, 0)
    table = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    want = {str(k): v for k, v in expected(tiny_llama_gen, ROWS, SHORTER).items()}
    assert {str(k): r["tokens"] for k, r in table.items()} == want
    assert not (tmp_path / "out.parquet.partial.jsonl").exists()
    again = job(tiny_llama_gen, tmp_path, ROWS, SHORTER, out="out.parquet")
    assert (again.rows_ok, again.skipped) == (0, 5)


def test_the_model_is_part_of_the_fingerprint(tiny_model_dirs, tmp_path):
    """A model file that changes stops the rerun naming it; a copy of an exported folder
    (its manifest kept, every modification time new) is the same model."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dirs["llama"][1], folder)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, copy_function=shutil.copy)  # new modification times
    assert model_identity(copy) == model_identity(folder)
    gen = ortgen.load(folder, threads=1)
    job(gen, tmp_path, ROWS, GREEDY)
    assert job(ortgen.load(copy, threads=1), tmp_path, ROWS, GREEDY).skipped == 5
    config = folder / "generation_config.json"
    config.write_text(config.read_text() + "\n")  # the same settings, another file
    with pytest.raises(SettingsChanged, match=r"^the model changed \(generation_config\.json"):
        job(gen, tmp_path, ROWS, GREEDY)


def test_a_folder_without_a_manifest_is_known_by_its_files_times(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"x")
    first = model_identity(folder)
    assert set(first["files"]) == {"model.onnx"} and len(first["files"]["model.onnx"]) == 2
    (folder / "model.onnx").touch()
    import os

    os.utime(folder / "model.onnx", ns=(1, 1))
    assert model_identity(folder) != first


def test_ortgen_run_stops_in_one_line_then_reruns_changed(tiny_model_dirs, tmp_path, capsys):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'model = "{tiny_model_dirs["llama"][1]}"\n[run]\nbatch_size = 2\n')
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    args = ["run", str(pipeline), "--input", str(source), "--output", str(out), "--threads", "1"]
    args += ["--set", "eos_token_id=null"]
    assert main([*args, "--max-new-tokens", "6"]) == 0
    capsys.readouterr()
    assert main([*args, "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "ortgen: error: max_new_tokens changed from 6 to 3 since this output was written"
    )
    assert main([*args, "--max-new-tokens", "3", "--rerun-changed"]) == 0
    assert "5 rows ok, 0 errors, 0 skipped" in capsys.readouterr().err
    assert main([*args, "--max-new-tokens", "3"]) == 0  # the same settings: resumed
    assert "0 rows ok, 0 errors, 5 skipped" in capsys.readouterr().err
    lengths = {k: len(r["tokens"]) for k, r in read_results(out).items()}
    assert lengths == {1: 3, "short": 4, 3: 3, 4: 3, 40: 3}  # "short" says 4 itself
