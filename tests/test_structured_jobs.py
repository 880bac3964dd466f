"""Structured output in pipelines and batch jobs: a pipeline's ``[output]`` table makes
every request answer as JSON and every result line of ``ortgen run`` carry the parsed
value; a row that does not end as whole JSON is an error row that says why, and resume
stays exact around it. Bad ``[output]`` tables fail when the file loads, each problem
with its location.

On a tiny random Llama with a character tokenizer: the weights know nothing of JSON, so
only the constraint keeps the output in shape, and every parsed value is checked against
its schema with ``jsonschema``.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import jsonschema
import pytest

import ortgen
from ortgen.cli import main
from ortgen.config.pipeline import load_pipeline
from ortgen.jobs import run_job

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
          "required": ["colour"], "additionalProperties": False}  # fmt: skip
ROWS = [
    {"id": "maria", "prompt": "Maria, 34, Lisbon"},
    {"id": "joe", "messages": [{"role": "user", "content": "Joe is 5."}]},
    {"id": "ann", "prompt": "Ann, 71", "do_sample": True, "temperature": 0.9, "seed": 4},
    {"id": "cut", "prompt": "Too short", "max_new_tokens": 5},
    {"id": 7, "prompt": "Li, 20"},
]
JOB = {"max_new_tokens": 60}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


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


@pytest.fixture
def person_pipeline(tmp_path: Path) -> Path:
    """A pipeline whose schema file sits beside it, in a folder that is not the cwd."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "person.json").write_text(json.dumps(PERSON), encoding="utf-8")
    return write(tmp_path / "job" / "p.toml", '[output]\njson_schema = "person.json"\n')


@pytest.fixture(scope="module")
def gen(tiny_text_model: Path):
    return ortgen.load(tiny_text_model, threads=1)


def test_output_table_gives_each_row_its_parsed_json(
    tiny_text_model, person_pipeline, tmp_path, monkeypatch
):
    """The schema path is read from the pipeline file's folder (the job runs elsewhere);
    each line keeps its text and carries the parsed value, valid against the schema,
    the same as generate() gives under the same pipeline; the cut row is an error row."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    pipeline = load_pipeline(person_pipeline)
    assert pipeline.output == {"json_schema": PERSON}
    assert pipeline.settings["json_schema"] == PERSON
    gen = ortgen.load(tiny_text_model, pipeline=pipeline, threads=1)
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    summary = run_job(gen, source, out, batch_size=3, settings=JOB, progress=None)
    results = read_results(out)
    assert set(results) == {"maria", "joe", "ann", "cut", 7}
    assert (summary.rows_ok, summary.errors) == (4, 1)
    expected = gen.generate([{k: v for k, v in r.items() if k != "id"} for r in ROWS], **JOB)
    for i, row in enumerate(ROWS):
        got = results[row["id"]]
        if row["id"] == "cut":
            continue
        jsonschema.validate(got["parsed"], PERSON)
        assert got["parsed"] == json.loads(got["text"]) == expected.parsed[i], row["id"]
        assert got["text"] == expected.text[i] and got["finish_reason"] == "eos"
    prompt_tokens = len(gen.prompts.encode_row({"prompt": ROWS[3]["prompt"]}, 0)[0])
    cut = dict(results["cut"])
    assert cut.pop("fingerprint")  # an error line says what it was done under, too
    assert cut == {
        "id": "cut",
        "error": "line 4: the output is not whole JSON: it stopped at max_new_tokens before "
        "the JSON was complete",
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5},  # tokens made
    }
    assert summary.tokens == sum(len(t) for t in expected.tokens)


def test_resume_after_an_error_row_is_exact(tiny_text_model, person_pipeline, tmp_path):
    """The error row counts as done: a rerun does not redo it, a grown input runs only
    the new rows, and every id is in the output once."""
    gen = ortgen.load(tiny_text_model, pipeline=person_pipeline, threads=1)
    out = tmp_path / "out.jsonl"
    first = run_job(
        gen, write_jsonl(tmp_path / "a.jsonl", ROWS[2:4]), out, settings=JOB, progress=None
    )
    assert (first.rows_ok, first.errors) == (1, 1)
    before = read_results(out)
    source = write_jsonl(tmp_path / "b.jsonl", ROWS)
    grown = run_job(gen, source, out, settings=JOB, progress=None)
    assert (grown.rows_ok, grown.errors, grown.skipped) == (3, 0, 2)
    results = read_results(out)
    assert {k: results[k] for k in before} == before
    assert set(results) == {"maria", "joe", "ann", "cut", 7}
    again = run_job(gen, source, out, settings=JOB, progress=None)
    assert (again.rows_ok, again.errors, again.skipped) == (0, 0, 5)
    assert read_results(out) == results


def test_rows_may_ask_for_another_schema_or_none(tiny_text_model, person_pipeline, tmp_path):
    """A row's own json_schema wins over [output]'s; "json_schema": null makes it a plain
    text row (no "parsed"); a row's own regex replaces [output]'s schema (a plain text row,
    matching the regex). Batched together, each row gets what it gets alone."""
    gen = ortgen.load(tiny_text_model, pipeline=person_pipeline, threads=1)
    rows = [
        {"id": "own", "prompt": "Sky", "json_schema": COLOUR},
        {"id": "free", "prompt": "Hello", "json_schema": None, "max_new_tokens": 8},
        {"id": "both", "prompt": "Hi", "regex": "[a-z]+"},
        {"id": "person", "prompt": "Bo, 9"},
    ]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    run_job(gen, source, tmp_path / "out.jsonl", settings=JOB, progress=None)
    results = read_results(tmp_path / "out.jsonl")
    jsonschema.validate(results["own"]["parsed"], COLOUR)
    jsonschema.validate(results["person"]["parsed"], PERSON)
    free = gen.generate("Hello", json_schema=None, max_new_tokens=8)
    assert "parsed" not in results["free"] and results["free"]["text"] == free.text
    assert "parsed" not in results["both"] and re.fullmatch("[a-z]+", results["both"]["text"])
    alone = gen.generate("Sky", json_schema=COLOUR, max_new_tokens=60)
    assert results["own"]["text"] == alone.text


def test_a_call_schema_and_a_row_regex_give_what_generate_gives(
    tiny_text_model, gen, tmp_path, capsys
):
    """One constraint rule (``ortgen.request.row_settings``) for the library and jobs: the
    job's json_schema (the call layer: a flag) and a row's own regex are not "set
    together": the row's replaces the job's, in ``generate()``, in ``ortgen run`` and in
    its dry run alike."""
    schema = write(tmp_path / "colour.json", json.dumps(COLOUR))
    rows = [
        {"id": "word", "prompt": "Hi", "regex": "[a-z]+", "max_new_tokens": 8},
        {"id": "json", "prompt": "Sky"},
    ]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    pipeline = write(tmp_path / "p.toml", "[generation]\nmax_new_tokens = 60\n")
    out = tmp_path / "out.jsonl"
    args = ["run", str(pipeline), "--input", str(source), "-m", str(tiny_text_model)]
    args += ["--json-schema", str(schema)]
    assert main([*args, "--dry-run"]) == 0, capsys.readouterr()
    assert main([*args, "--output", str(out), "--threads", "1"]) == 0, capsys.readouterr().err
    results = read_results(out)
    requests = [{k: v for k, v in row.items() if k != "id"} for row in rows]
    expected = gen.generate(requests, json_schema=COLOUR, max_new_tokens=60)
    assert [results["word"]["text"], results["json"]["text"]] == expected.text
    assert re.fullmatch("[a-z]+", results["word"]["text"]) and "parsed" not in results["word"]
    assert results["json"]["parsed"] == expected.parsed[1]
    jsonschema.validate(results["json"]["parsed"], COLOUR)


def test_dry_run_warns_of_a_cut_before_the_constraint(person_pipeline, tmp_path, capsys):
    """A top_k given in logits_processors runs before [output]'s constraint (and may cut
    away every token it allows): a warning, not a bad job; as a setting it runs after."""
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS[:2])
    args = ["run", str(person_pipeline), "--input", str(source), "--dry-run"]
    cut = ["--set", 'logits_processors=[{"name": "top_k", "top_k": 40}]']
    assert main([*args, *cut]) == 0
    report = capsys.readouterr().out.splitlines()
    assert report[1] == (
        "  warning: logits_processors[0] (top_k) runs before the json_schema constraint and "
        "may remove every token it allows (such a row fails at that step): give top_k as a "
        "setting, which runs after the constraint, or drop it"
    )
    assert main([*args, "--top-k", "40", "--do-sample"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_inline_schema_and_json_object(tiny_text_model, tmp_path):
    inline = write(
        tmp_path / "inline.toml",
        """
        [output.json_schema]
        type = "object"
        required = ["colour"]
        additionalProperties = false
        properties.colour.enum = ["red", "blue"]
        """,
    )
    assert load_pipeline(inline).settings["json_schema"] == {
        "type": "object",
        "required": ["colour"],
        "additionalProperties": False,
        "properties": {"colour": {"enum": ["red", "blue"]}},
    }
    any_object = write(tmp_path / "object.toml", "[output]\njson_object = true\n")
    assert load_pipeline(any_object).output == {"json_object": True}
    source = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "a"}, {"prompt": "bb"}])
    for pipeline in (inline, any_object):
        out = tmp_path / f"{pipeline.stem}.jsonl"
        job = ortgen.load(tiny_text_model, pipeline=pipeline, threads=1)
        run_job(job, source, out, settings={"max_new_tokens": 80}, progress=None)
        for line in read_results(out).values():
            assert isinstance(line["parsed"], dict), line
            if pipeline is inline:
                jsonschema.validate(line["parsed"], COLOUR)


def test_parquet_keeps_parsed_as_json_text(tiny_text_model, person_pipeline, tmp_path):
    """A Parquet output has a "parsed" column of JSON text; a rerun over the finished
    file (its rows read back as result lines) keeps the values, not JSON of JSON."""
    import pyarrow.parquet as pq

    gen = ortgen.load(tiny_text_model, pipeline=person_pipeline, threads=1)
    out = tmp_path / "out.parquet"
    run_job(gen, write_jsonl(tmp_path / "a.jsonl", ROWS[:4]), out, settings=JOB, progress=None)
    first = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    assert pq.read_table(out).schema.field("parsed").type == "string"
    maria = json.loads(first["maria"]["parsed"])
    jsonschema.validate(maria, PERSON)
    assert maria == json.loads(first["maria"]["text"])
    assert first["cut"]["parsed"] is None and "max_new_tokens" in first["cut"]["error"]
    assert first["cut"]["usage"]["completion_tokens"] == 5
    grown = run_job(gen, write_jsonl(tmp_path / "b.jsonl", ROWS), out, settings=JOB, progress=None)
    assert (grown.rows_ok, grown.skipped) == (1, 4)
    table = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    assert {k: table[k] for k in first} == first
    jsonschema.validate(json.loads(table["7"]["parsed"]), PERSON)  # mixed ids: text


def test_a_job_without_json_has_no_parsed(gen, tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "Hi"}])
    run_job(gen, source, tmp_path / "out.jsonl", settings={"max_new_tokens": 4}, progress=None)
    (line,) = read_results(tmp_path / "out.jsonl").values()
    assert set(line) == {"id", "text", "tokens", "finish_reason", "usage", "fingerprint"}


# ------------------------------------------------------------------- [output] at load


@pytest.mark.parametrize(
    ("table", "files", "problems"),
    [
        (
            '[output]\njson_shema = "s.json"\n',
            {},
            ["[output] json_shema: unknown key (did you mean 'json_schema'?)"],
        ),
        (
            '[output]\njson_schema = "nope.json"\nregex = "a+"\n',
            {},
            [
                "[output] regex: unknown key (regex is a generation setting: [generation] "
                "regex = ...)",
                "[output] json_schema: no file {dir}/nope.json (a relative path is read from "
                "the pipeline file's folder)",
            ],
        ),
        ("[output]\n", {}, ["[output] is empty: give exactly one of json_schema"]),
        (
            '[output]\njson_schema = "s.json"\njson_object = true\n',
            {"s.json": "{}"},
            ["[output] has both json_schema and json_object"],
        ),
        (
            '[output]\njson_schema = "s.json"\n',
            {"s.json": "{not json"},
            ["[output] json_schema: {dir}/s.json is not JSON: Expecting property name"],
        ),
        (
            '[output]\njson_schema = "s.json"\n',
            {"s.json": "[1, 2]"},
            ["[output] json_schema: {dir}/s.json holds a JSON list; a JSON Schema is an object"],
        ),
        (
            '[output]\njson_schema = { type = "strin" }\n',
            {},
            ["[output] json_schema: llguidance cannot compile this JSON Schema: Invalid type"],
        ),
        (
            '[generation]\nregex = "[0-9]+"\n[output]\njson_object = true\n',
            {},
            ["[output] json_object and [generation] regex both constrain the answer"],
        ),
        ("[output]\njson_object = false\n", {}, ["[output] json_object must be true"]),
        ("[output]\njson_schema = 3\n", {}, ["[output] json_schema must be a .json file's path"]),
        ("output = 1\n", {}, ["[output] must be a table"]),
    ],
)
def test_bad_output_tables_fail_at_load(tmp_path, table, files, problems):
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    path = write(tmp_path / "p.toml", table)
    with pytest.raises(ortgen.ConfigError) as caught:
        load_pipeline(path)
    message = str(caught.value)
    assert message.startswith(f"invalid pipeline {path}")
    for problem in problems:
        assert problem.format(dir=tmp_path) in message, message


def test_a_broken_generation_constraint_fails_at_load(tmp_path):
    """Not only [output]: any constraint the pipeline sets is compiled when it loads."""
    path = write(tmp_path / "p.toml", '[generation]\nregex = "[0-9"\n')
    with pytest.raises(ortgen.ConfigError, match=r"\[generation\] regex: llguidance cannot"):
        load_pipeline(path)


# ------------------------------------------------------------------------- CLI


def test_ortgen_run_and_dry_run(tiny_text_model, person_pipeline, tmp_path, capsys):
    """``ortgen run`` writes parsed lines; ``--dry-run`` names a row whose own regex does
    not compile and a pipeline whose schema file is gone, before any model loads."""
    rows = [*ROWS[:2], {"id": "bad", "prompt": "x", "json_schema": None, "regex": "[a-"}]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = ["run", str(person_pipeline), "--input", str(source), "-m", str(tiny_text_model)]
    assert main([*args, "--dry-run"]) == 2
    report = capsys.readouterr().out.splitlines()
    assert report[0] == f"pipeline {person_pipeline}: ok"
    assert report[1] == f"input {source}: 3 rows, 1 bad"
    assert report[2].startswith("  line 3: regex: llguidance cannot compile")
    assert main([*args, "--output", str(out), "--threads", "1", "--max-new-tokens", "60"]) == 0
    assert "2 rows ok, 1 errors" in capsys.readouterr().err
    results = read_results(out)
    for key in ("maria", "joe"):
        jsonschema.validate(results[key]["parsed"], PERSON)
    assert "regex" in results["bad"]["error"]
    (person_pipeline.parent / "person.json").unlink()
    assert main([*args, "--dry-run"]) == 2
    assert "[output] json_schema: no file" in capsys.readouterr().err


@pytest.mark.ray
def test_the_ray_engine_writes_the_same_lines(tiny_text_model, person_pipeline, tmp_path):
    """Ray's workers run the local engine's RowRunner on the pipeline the driver loaded
    (the schema in it, not a path their folder cannot see): the same lines, parsed values
    and error line, in any order. A local Ray instance, started and stopped by the job."""
    from ortgen.jobs.ray_engine import run_ray_job

    pipeline = load_pipeline(person_pipeline)
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    local = tmp_path / "local.jsonl"
    gen = ortgen.load(tiny_text_model, pipeline=pipeline, threads=1)
    run_job(gen, source, local, settings=JOB, progress=None)
    on_ray = tmp_path / "ray.jsonl"
    summary = run_ray_job(
        pipeline, source, on_ray, model=tiny_text_model, threads=1, settings=JOB, progress=None
    )
    assert (summary.rows_ok, summary.errors) == (4, 1)
    assert read_results(on_ray) == read_results(local)
