"""Embedding jobs (issue 40, item 4): ``ortgen run`` with ``task = "embed"``, and OpenAI
batch lines with the ``/v1/embeddings`` url.

On the tiny F32 llama GGUF of tests/test_embeddings.py, built with ``embeddings=True``
(it has a tokenizer): each row's ``embedding`` equals ``gen.embed`` of that row alone
(batched rows are right-padded in one forward, so equal to float rounding: 1e-5 on
unit vectors whose components are ~0.1), in JSONL and in Parquet (a list of float32); a
row's own options, error rows, resume, and a rerun under other pooling options (refused,
then redone with ``rerun_changed``). An OpenAI batch line's body is answered with what
the server's ``/v1/embeddings`` answers the same body (``embeddings_answer``, the route's
own function), floats and base64, and its errors name the same field.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ortgen
from ortgen.errors import ConfigError, InputError
from ortgen.gguf.build import build_folder
from ortgen.gguf.options import BuildOptions
from ortgen.jobs import run_job
from ortgen.jobs.embedding import EmbedOptions
from ortgen.jobs.fingerprint import SettingsChanged
from tests.gguf_models import write_tiny_gguf
from tests.test_jobs_ray import ray_address  # noqa: F401 (fixture)

ROUNDING = 1e-5
TEXTS = ["hello world", "a", "a somewhat longer text of several words", "xyz", "hello"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    gguf = write_tiny_gguf(tmp_path_factory.mktemp("embed-jobs") / "model.gguf", "llama")
    return {
        name: build_folder(gguf, gguf.parent / name, options=BuildOptions(accuracy_level=0, **kw))
        for name, kw in (("embeds", {"embeddings": True}), ("plain", {}))
    }


@pytest.fixture(scope="module")
def gen(folders: dict[str, Path]) -> Any:
    return ortgen.load(folders["embeds"], threads=1)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rows() -> list[dict[str, Any]]:
    ids = [1, 40, 41, 42, 43]
    return [
        *({"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)),
        {"id": "ids", "input": ids},
        {"id": "own", "text": TEXTS[2], "pooling": "mean", "dimensions": 6},
        {"id": "raw", "text": TEXTS[0], "normalize": False},
    ]


def alone(gen: Any, row: dict[str, Any], options: EmbedOptions) -> np.ndarray:
    """What ``gen.embed`` gives the row alone, with its own options over the job's."""
    merged = {**options.to_dict(), **{k: row[k] for k in options.to_dict() if k in row}}
    return gen.embed(row.get("text", row.get("input")), **merged)[0]


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_each_row_equals_gen_embed_of_it_alone(gen: Any, tmp_path: Path, pooling: str) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", rows())
    options = EmbedOptions(pooling=pooling)
    summary = run_job(
        gen, source, tmp_path / "out.jsonl", task="embed", embedding=options, batch_size=3,
        progress=None,
    )  # fmt: skip
    assert (summary.rows_ok, summary.errors) == (len(rows()), 0)
    got = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    for row in rows():
        line = got[row["id"]]
        want = alone(gen, row, options)
        assert len(line["embedding"]) == want.shape[0], row
        np.testing.assert_allclose(line["embedding"], want, atol=ROUNDING, err_msg=row["id"])
        text = row.get("text", row.get("input"))
        n = len(gen.tokenizer.encode(text)) if isinstance(text, str) else len(text)
        assert line["usage"] == {"prompt_tokens": n}
    assert len(got["own"]["embedding"]) == 6
    assert abs(np.linalg.norm(got["raw"]["embedding"]) - 1.0) > 0.1  # not normalised


def test_parquet_output_is_a_float32_list_column(gen: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = write_jsonl(tmp_path / "in.jsonl", [*rows(), {"id": "bad", "txt": "x"}])
    run_job(gen, source, tmp_path / "out.parquet", task="embed", progress=None)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    assert table.column_names[:3] == ["id", "embedding", "usage"]
    by_id = {r["id"]: r for r in table.to_pylist()}
    for row in rows():
        want = alone(gen, row, EmbedOptions())
        np.testing.assert_allclose(by_id[row["id"]]["embedding"], want, atol=ROUNDING)
    assert by_id["bad"]["embedding"] is None and "no text" in by_id["bad"]["error"]
    only_bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "bad", "txt": "x"}])
    run_job(gen, only_bad, tmp_path / "bad.parquet", task="embed", progress=None)
    schema = pq.read_table(tmp_path / "bad.parquet").schema  # an embed job's, rows or not
    assert schema.field("embedding").type == pa.list_(pa.float32())


def test_bad_rows_are_error_rows_and_the_job_goes_on(gen: Any, tmp_path: Path) -> None:
    bad = [
        {"id": "none", "prompt": "x"},
        {"id": "both", "text": "x", "input": "y"},
        {"id": "empty", "text": ""},
        {"id": "pool", "text": "x", "pooling": "max"},
        {"id": "dims", "text": "x", "dimensions": 0},
        {"id": "norm", "text": "x", "normalize": "yes"},
        {"id": "key", "text": "x", "temperature": 0.5},
        {"id": "vocab", "input": [1, 10**6]},
    ]
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "ok", "text": "fine"}, *bad])
    summary = run_job(gen, source, tmp_path / "out.jsonl", task="embed", progress=None)
    assert (summary.rows_ok, summary.errors) == (1, len(bad))
    got = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    expected = {
        "none": "no text",
        "both": "both text and input",
        "empty": '"text" must be a non-empty text',
        "pool": "pooling must be one of last, mean",
        "dims": "dimensions must be a positive integer",
        "norm": "normalize must be true or false",
        "key": "unknown key 'temperature'",
        "vocab": "token ids outside",
    }
    for key, words in expected.items():
        assert words in got[key]["error"] and "embedding" not in got[key], got[key]
    assert got["none"]["error"].startswith("line 2: ")


def test_resume_and_a_rerun_under_other_pooling(gen: Any, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", rows()[:3])
    out = tmp_path / "out.jsonl"
    run_job(gen, source, out, task="embed", progress=None)
    write_jsonl(source, rows())  # three more rows: only they run
    summary = run_job(gen, source, out, task="embed", progress=None)
    assert (summary.rows_ok, summary.skipped) == (len(rows()) - 3, 3)
    lines = read_jsonl(out)
    assert sorted(r["id"] for r in lines) == sorted(r["id"] for r in rows())
    # a row's text is its input, not a setting: rows without options share the job's print
    shared = {r["fingerprint"] for r in lines if r["id"] not in ("own", "raw")}
    assert len(shared) == 1 and len({r["fingerprint"] for r in lines}) == 3
    mean = EmbedOptions(pooling="mean")
    with pytest.raises(SettingsChanged, match='pooling changed from "last" to "mean"'):
        run_job(gen, source, out, task="embed", embedding=mean, progress=None)
    run_job(gen, source, out, task="embed", embedding=mean, rerun_changed=True, progress=None)
    got = {r["id"]: r["embedding"] for r in read_jsonl(out)}
    assert len(got) == len(rows())
    np.testing.assert_allclose(got["t0"], alone(gen, rows()[0], mean), atol=ROUNDING)
    with pytest.raises(SettingsChanged, match="the task changed from embed to generate"):
        run_job(gen, source, out, progress=None)


def test_a_model_that_cannot_embed_stops_the_job_first(folders: dict[str, Path], tmp_path):
    plain = ortgen.load(folders["plain"], threads=1)
    source = write_jsonl(tmp_path / "in.jsonl", rows())
    with pytest.raises(InputError, match=r"hidden_states.*--embeddings"):
        run_job(plain, source, tmp_path / "out.jsonl", task="embed", progress=None)
    assert not (tmp_path / "out.jsonl").exists()
    with pytest.raises(ConfigError, match="task must be one of generate, embed"):
        run_job(plain, source, tmp_path / "out.jsonl", task="embedding", progress=None)


def test_cli_pipeline_task_and_flags(folders: dict[str, Path], gen: Any, tmp_path: Path, capsys):
    from ortgen.cli import main

    pipeline = tmp_path / "embed.toml"
    pipeline.write_text(f'model = "{folders["embeds"]}"\n[run]\ntask = "embed"\npooling = "mean"\n')
    source = write_jsonl(tmp_path / "in.jsonl", rows()[:4])
    out = tmp_path / "out.jsonl"
    argv = ["run", str(pipeline), "--input", str(source), "--output", str(out), "--threads", "1"]
    assert main([*argv, "--dimensions", "8"]) == 0
    got = {line["id"]: line["embedding"] for line in read_jsonl(out)}  # by length, not order
    for row in rows()[:4]:
        want = gen.embed(row["text"], pooling="mean", dimensions=8)[0]
        np.testing.assert_allclose(got[row["id"]], want, atol=ROUNDING)
    assert main([*argv, "--dry-run"]) == 0
    assert "4 rows, none bad" in capsys.readouterr().out
    generate = tmp_path / "generate.toml"
    generate.write_text(f'model = "{folders["embeds"]}"\n')
    argv[1] = str(generate)
    assert main([*argv, "--pooling", "mean"]) == 2
    assert "--pooling is for --task embed" in capsys.readouterr().err
    assert main([*argv, "--task", "embed", "--dimensions", "0"]) == 2
    assert "dimensions must be a positive integer" in capsys.readouterr().err
    generate.write_text('[run]\npooling = "max"\n')
    assert main([*argv, "--task", "embed"]) == 2
    assert "[run] pooling must be one of last, mean" in capsys.readouterr().err
    generate.write_text(f'model = "{folders["embeds"]}"\n[run]\ndimensions = 4\n')
    assert main(argv) == 2
    assert "[run] dimensions is for --task embed" in capsys.readouterr().err
    argv[-3] = str(tmp_path / "four.jsonl")  # --output
    assert main([*argv, "--task", "embed"]) == 0  # the flag makes the file's option the job's
    assert all(len(line["embedding"]) == 4 for line in read_jsonl(tmp_path / "four.jsonl"))


# -- OpenAI batch lines: /v1/embeddings -----------------------------------------------------


def batch_line(custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


BODIES = {
    "one": {"model": "m", "input": "hello world", "encoding_format": "float"},
    "many": {"model": "m", "input": TEXTS},
    "b64": {"model": "m", "input": TEXTS[:2], "encoding_format": "base64", "dimensions": 5},
    "mean": {"model": "m", "input": [[1, 40, 41], [1, 42]], "pooling": "mean", "user": "u"},
}


def vectors(body: dict[str, Any]) -> np.ndarray:
    """The floats of an embeddings answer, decoding base64 as OpenAI's client does."""
    out = []
    for item in body["data"]:
        value = item["embedding"]
        if isinstance(value, str):
            value = np.frombuffer(base64.b64decode(value), dtype="<f4")
        out.append(np.asarray(value, dtype=np.float32))
    return np.stack(out)


def test_batch_lines_answer_as_the_server_does(gen: Any, tmp_path: Path) -> None:
    from ortgen.serve.embeddings_route import embeddings_answer

    completion = {"model": "m", "prompt": "hello", "max_tokens": 3, "temperature": 0}
    lines = [batch_line(k, b) for k, b in BODIES.items()]
    lines.append({**batch_line("gen", completion), "url": "/v1/completions"})
    source = write_jsonl(tmp_path / "batch.jsonl", lines)
    summary = run_job(gen, source, tmp_path / "out.jsonl", batch_size=2, progress=None)
    assert (summary.rows_ok, summary.errors) == (len(lines), 0)
    got = {line["custom_id"]: line for line in read_jsonl(tmp_path / "out.jsonl")}
    model = gen.path.name
    for key, body in BODIES.items():
        line = got[key]
        assert line["error"] is None and line["response"]["status_code"] == 200
        answer = line["response"]["body"]
        server = embeddings_answer(gen, body, model)
        assert {k: v for k, v in answer.items() if k != "data"} == {
            k: v for k, v in server.items() if k != "data"
        }
        assert [d["index"] for d in answer["data"]] == [d["index"] for d in server["data"]]
        kinds = {type(d["embedding"]) for d in answer["data"] + server["data"]}
        assert kinds == ({str} if key == "b64" else {list})
        np.testing.assert_allclose(vectors(answer), vectors(server), atol=ROUNDING)
    assert got["gen"]["response"]["body"]["object"] == "text_completion"


def test_bad_embedding_lines_name_the_servers_field(folders: dict[str, Path], gen, tmp_path):
    from ortgen.request.openai_errors import RequestError
    from ortgen.serve.embeddings_route import embeddings_answer

    bad = {
        "pool": {"input": "a", "pooling": "max"},
        "dims": {"input": "a", "dimensions": 0},
        "enc": {"input": "a", "encoding_format": "int8"},
        "key": {"input": "a", "colour": 1},
        "mix": {"input": ["a", 3]},
        "vocab": {"input": [10**6]},
    }
    source = write_jsonl(tmp_path / "in.jsonl", [batch_line(k, b) for k, b in bad.items()])
    run_job(gen, source, tmp_path / "out.jsonl", progress=None)
    got = {line["custom_id"]: line for line in read_jsonl(tmp_path / "out.jsonl")}
    for key, body in bad.items():
        with pytest.raises(RequestError) as server:
            embeddings_answer(gen, body, "m")
        response = got[key]["response"]
        assert response["status_code"] == server.value.status == 400, key
        assert response["body"]["error"]["param"] == server.value.param, key
    plain = ortgen.load(folders["plain"], threads=1)
    source = write_jsonl(tmp_path / "plain.jsonl", [batch_line("p", BODIES["one"])])
    run_job(plain, source, tmp_path / "plain-out.jsonl", progress=None)
    (line,) = read_jsonl(tmp_path / "plain-out.jsonl")
    assert line["response"]["status_code"] == 400
    assert line["response"]["body"]["error"]["param"] == "model"
    assert "--embeddings" in line["response"]["body"]["error"]["message"]


@pytest.mark.ray
def test_ray_gives_the_local_engines_lines(folders, gen, ray_address, tmp_path):  # noqa: F811
    """An embed job on Ray: the same lines as locally, error rows too, then resume."""
    import subprocess

    from tests.test_jobs_ray import _env, _pipeline, _ray_args

    data = [*rows(), {"id": "bad", "txt": "x"}, {"id": "mean", "text": "hello", "pooling": "mean"}]
    source = write_jsonl(tmp_path / "in.jsonl", data)
    local = tmp_path / "local.jsonl"
    run_job(gen, source, local, task="embed", batch_size=2, window=4, progress=None)
    pipeline = _pipeline(tmp_path, folders["embeds"], batch_size=2, window=4)
    out = tmp_path / "ray.jsonl"
    args = _ray_args(pipeline, source, out, ray_address, "--task", "embed")
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert result.returncode == 0, result.stderr
    assert f"{len(data) - 1} rows ok, 1 errors, 0 skipped" in result.stderr
    want = {r["id"]: r for r in read_jsonl(local)}
    got = {r["id"]: r for r in read_jsonl(out)}
    assert got.keys() == want.keys() and got["bad"] == want["bad"]
    for key, line in want.items():
        assert got[key].get("fingerprint") == line.get("fingerprint"), key
        if "embedding" in line:
            np.testing.assert_allclose(got[key]["embedding"], line["embedding"], atol=ROUNDING)
    again = subprocess.run(args, capture_output=True, text=True, timeout=300, env=_env())
    assert again.returncode == 0 and f"0 errors, {len(data)} skipped" in again.stderr
