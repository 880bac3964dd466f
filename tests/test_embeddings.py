"""Embeddings (issue 40, item 4): a decoder's last hidden state, pooled.

A tiny F32 llama GGUF (``tests/gguf_models.py``) built with ``BuildOptions(embeddings=True)``
at accuracy level 0, against transformers loading the same file: the graph's
``hidden_states`` output equals transformers' ``hidden_states[-1]`` (for Llama the state
after the final norm: ``LlamaModel`` replaces the last layer's output with the normed one),
``gen.embed`` last-token and mean pooling equal numpy pooling of transformers' states, a
batch of different lengths equals its texts one by one, and ``POST /v1/embeddings`` through
the official ``openai`` client (floats, base64, ``dimensions``). A folder built without the
option has no extra output and refuses to embed, naming how to build one.

Measured on this machine: max |hidden state - transformers'| 6.0e-6 over 3 prompts of 5-12
tokens (the states' std is ~1), so ``MAX_DIFF`` 1e-4 leaves float32 room while a wrong
norm, position or padded token moves them by whole units (including the padding in the
pooling fails four of these tests).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import ortgen
from ortgen.errors import InputError
from ortgen.gguf.build import build_folder
from ortgen.gguf.options import BuildOptions, variant_of
from tests.gguf_models import write_tiny_gguf
from tests.gguf_vocab import VOCAB_SIZE, tiny_vocab
from tests.server_helpers import ServerProcess, call

MAX_DIFF = 1e-4


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("embed") / "model.gguf", "llama")


@pytest.fixture(scope="module")
def embed_folder(gguf_file: Path) -> Path:
    options = BuildOptions(accuracy_level=0, embeddings=True)
    return build_folder(gguf_file, gguf_file.parent / "embeds", options=options)


@pytest.fixture(scope="module")
def plain_folder(gguf_file: Path) -> Path:
    options = BuildOptions(accuracy_level=0)
    return build_folder(gguf_file, gguf_file.parent / "plain", options=options)


@pytest.fixture(scope="module")
def gen(embed_folder: Path) -> Any:
    return ortgen.load(embed_folder, threads=1)


@pytest.fixture(scope="module")
def hf(gguf_file: Path) -> Iterator[Any]:
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name).eval()
    yield model
    torch.set_num_threads(threads)


def prompts() -> list[list[int]]:
    """Three token-id texts of different lengths."""
    bos = tiny_vocab("llama").special_ids["bos"]
    rng = np.random.default_rng(0)
    return [[bos, *rng.integers(3, VOCAB_SIZE, n).tolist()] for n in (11, 4, 7)]


def hf_states(hf: Any, ids: list[int]) -> np.ndarray:
    """transformers' last hidden state (T, hidden) for one text."""
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0].numpy()


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_graph_outputs_hidden_states_only_when_asked(embed_folder: Path, plain_folder: Path):
    def outputs(folder: Path) -> list[str]:
        graph = onnx.load(folder / "model.onnx", load_external_data=False).graph
        return [o.name for o in graph.output]

    assert "hidden_states" in outputs(embed_folder)
    assert "hidden_states" not in outputs(plain_folder)
    assert [n for n in outputs(embed_folder) if n != "hidden_states"] == outputs(plain_folder)
    # the manifest says whether a folder embeds; an ordinary build's variant is unchanged
    assert variant_of(BuildOptions(embeddings=True))["embeddings"] is True
    assert "embeddings" not in variant_of(BuildOptions())


def test_hidden_states_equal_transformers(gen: Any, hf: Any) -> None:
    from ortgen.loop.embedding import hidden_states

    worst = 0.0
    for ids in prompts():
        states, _ = hidden_states(gen.model, [ids])
        ref = hf_states(hf, ids)
        assert states[0].shape == ref.shape
        worst = max(worst, float(np.abs(states[0] - ref).max()))
    print(f"max |hidden state - transformers'| = {worst:.2e}")
    assert worst < MAX_DIFF


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embed_pools_as_numpy_does(gen: Any, hf: Any, pooling: str) -> None:
    rows = prompts()
    got = gen.embed(rows, pooling=pooling)
    refs = [hf_states(hf, ids) for ids in rows]
    want = unit(np.stack([r[-1] if pooling == "last" else r.mean(axis=0) for r in refs]))
    assert got.shape == (3, want.shape[1]) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert float(np.abs(got - want).max()) < MAX_DIFF
    raw = gen.embed(rows, pooling=pooling, normalize=False)
    want_raw = np.stack([r[-1] if pooling == "last" else r.mean(axis=0) for r in refs])
    assert float(np.abs(raw - want_raw).max()) < MAX_DIFF


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_a_batch_equals_its_texts_one_by_one(gen: Any, pooling: str) -> None:
    rows = prompts()
    batch = gen.embed(rows, pooling=pooling)
    alone = np.stack([gen.embed(ids, pooling=pooling)[0] for ids in rows])
    np.testing.assert_allclose(batch, alone, atol=1e-5)


def test_dimensions_truncate_then_renormalise(gen: Any) -> None:
    rows = prompts()
    full = gen.embed(rows, normalize=False)
    short = gen.embed(rows, dimensions=5)
    assert short.shape == (3, 5)
    np.testing.assert_allclose(short, unit(full[:, :5]), atol=1e-6)


def test_text_input_and_bad_options(gen: Any) -> None:
    one = gen.embed("hello world")
    assert one.shape[0] == 1
    np.testing.assert_allclose(gen.embed(["hello world", "a"])[0], one[0], atol=1e-5)
    with pytest.raises(InputError, match="pooling"):
        gen.embed("hello", pooling="max")
    with pytest.raises(InputError, match="dimensions"):
        gen.embed("hello", dimensions=0)


def test_model_without_the_output_says_how_to_build_one(plain_folder: Path) -> None:
    plain = ortgen.load(plain_folder, threads=1)
    with pytest.raises(InputError, match=r"hidden_states.*--embeddings") as info:
        plain.embed("hello")
    assert info.value.field == "model"


# -- POST /v1/embeddings --------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(embed_folder: Path, plain_folder: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        "-m", f"emb={embed_folder}", "-m", f"plain={plain_folder}", "--threads", "1", "--no-web"
    ).ready()
    yield process
    process.stop()


def test_openai_client_floats_base64_and_dimensions(server: ServerProcess, gen: Any) -> None:
    client = server.client()
    texts = ["hello world", "a longer text of several words", "x"]
    want = gen.embed(texts)
    got = client.embeddings.create(model="emb", input=texts, encoding_format="float")
    assert got.object == "list" and got.model == "emb"
    assert [d.index for d in got.data] == [0, 1, 2]
    assert all(d.object == "embedding" for d in got.data)
    floats = np.asarray([d.embedding for d in got.data], dtype=np.float32)
    np.testing.assert_allclose(floats, want, atol=1e-6)
    tokens = sum(len(gen.tokenizer.encode(t)) for t in texts)
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens
    # base64 (the client's default): little-endian float32, decoded by the client itself
    b64 = client.embeddings.create(model="emb", input=texts)
    np.testing.assert_array_equal(np.asarray([d.embedding for d in b64.data], np.float32), floats)
    short = client.embeddings.create(model="emb", input=texts, dimensions=6, user="u1")
    np.testing.assert_allclose(
        np.asarray([d.embedding for d in short.data]), gen.embed(texts, dimensions=6), atol=1e-6
    )


def test_token_ids_and_mean_pooling(server: ServerProcess, gen: Any) -> None:
    rows = prompts()
    status, body = call(server, "/v1/embeddings", {"model": "emb", "input": rows[0]})
    assert status == 200, body
    np.testing.assert_allclose(body["data"][0]["embedding"], gen.embed(rows[0])[0], atol=1e-6)
    status, body = call(
        server, "/v1/embeddings", {"model": "emb", "input": rows, "pooling": "mean"}
    )
    assert status == 200, body
    got = np.asarray([d["embedding"] for d in body["data"]])
    np.testing.assert_allclose(got, gen.embed(rows, pooling="mean"), atol=1e-6)
    assert body["usage"]["prompt_tokens"] == sum(map(len, rows))


def test_bad_requests_name_their_field(server: ServerProcess) -> None:
    status, body = call(server, "/v1/embeddings", {"model": "plain", "input": "hello"})
    assert status == 400 and body["error"]["param"] == "model", body
    assert "--embeddings" in body["error"]["message"]
    for request, param in [
        ({"input": []}, "input"),
        ({"input": ["a", 3]}, "input"),
        ({"input": [VOCAB_SIZE]}, "input"),
        ({"input": "a", "pooling": "max"}, "pooling"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "colour": 1}, "colour"),
    ]:
        status, body = call(server, "/v1/embeddings", {"model": "emb", **request})
        assert status == 400 and body["error"]["param"] == param, (request, body)


def test_export_flag_builds_a_folder_that_embeds(gguf_file: Path, tmp_path: Path, capsys) -> None:
    from ortgen.cli import main

    out = tmp_path / "cli-embeds"
    assert main(["export", str(gguf_file), str(out), "--embeddings"]) == 0
    manifest = json.loads((out / "ortgen_manifest.json").read_text())
    assert manifest["variant"]["embeddings"] is True
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    assert "hidden_states" in [o.name for o in graph.output]
    assert main(["export", "--default", "--embeddings"]) == 2
    assert "--embeddings" in capsys.readouterr().err
