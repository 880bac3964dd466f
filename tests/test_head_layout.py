"""The memory layout pass for fused graphs (``ortgen.export.head_layout``): the embedding
lookup gets its own copies of the LM head's initializers and the head is computed in
parts. It moves bytes, not numbers: the laid-out int4 graph must give exactly the logits
of the builder's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime_genai  # noqa: F401 - a dev dependency: missing fails, never skips
import pytest

import ortgen

PROMPTS = [[1, 5, 9, 33, 70, 12], [1, 44, 3]]


def _graph(folder: Path):  # type: ignore[no-untyped-def]
    return onnx.load(str(folder / "model.onnx"), load_external_data=False).graph


@pytest.fixture(scope="module")
def tied_hf(fused_model_dirs, tmp_path_factory) -> Path:
    """The tiny llama with its LM head tied to its embedding (as SmolLM2's is)."""
    hf_dir, _ = fused_model_dirs["llama"]
    tied = tmp_path_factory.mktemp("tied") / "llama-hf"
    shutil.copytree(hf_dir, tied)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    return tied


def _export(hf_dir: Path, out: Path, precision: str) -> Path:
    from ortgen.export import Variant, export_model

    variant = Variant(graph="fused", precision=precision)
    return export_model(hf_dir, out, variant=variant, progress=lambda _m: None, overwrite=True)


def _lookup(graph):  # type: ignore[no-untyped-def]
    kinds = ("Gather", "GatherBlockQuantized")
    (lookup,) = [n for n in graph.node if n.op_type in kinds and n.input[1] == "input_ids"]
    return lookup


@pytest.mark.parametrize("precision", ["int4", "int8", "fp32"])
def test_head_layout_moves_bytes_not_numbers(
    tied_hf: Path, tmp_path: Path, monkeypatch, precision: str
) -> None:
    """int4: the builder's shared embedding reads the head's weight through a Reshape and
    its scales as they are; int8 (onnxruntime's quantiser) and fp32: a Gather over a
    Transpose of the head's float weight (fp32: the head itself is a float MatMul, cut
    along its columns)."""
    from ortgen.export import head_layout

    with monkeypatch.context() as patch:  # the graph as it comes (pruned head)
        patch.setattr(head_layout, "lay_out_head", lambda *_args, **_kw: {})
        plain = _export(tied_hf, tmp_path / "plain", precision)
    graph = _graph(plain)
    producers = {out: node for node in graph.node for out in node.output}
    lookup = _lookup(graph)
    (head,) = [n for n in graph.node if "logits" in n.output]
    assert head.op_type == ("MatMul" if precision == "fp32" else "MatMulNBits")
    view = producers[lookup.input[0]]  # the case the pass is for
    assert view.op_type == {"int4": "Reshape", "int8": "Transpose", "fp32": "Transpose"}[precision]
    dims = {t.name: list(t.dims) for t in graph.initializer}
    if precision == "fp32":  # a (K, N) float weight
        vocab = dims[head.input[1]][1]
        part_bytes = dims[head.input[1]][0] * 4 * 64  # 64 columns a part
    else:  # packed bytes of N rows
        vocab = next(a.i for a in head.attribute if a.name == "N")
        part_bytes = int(np.prod(dims[head.input[1]])) // vocab * 64  # 64 rows a part

    laid = tmp_path / "laid"
    shutil.copytree(plain, laid)
    parts = -(-vocab // 64)
    assert head_layout.lay_out_head(laid, part_bytes) == {
        "head_parts": parts,
        "lookup_copied": True,
    }

    graph = _graph(laid)
    producers = {out: node for node in graph.node for out in node.output}
    lookup = _lookup(graph)
    heads = [producers[x] for x in producers["logits"].input]
    assert producers["logits"].op_type == "Concat" and len(heads) == parts
    read_by_head = {x for part in heads for x in part.input}
    inits = {t.name for t in graph.initializer}
    assert all(x in inits for x in lookup.input if x and x != lookup.input[1])  # no Reshape
    assert read_by_head.isdisjoint(lookup.input)

    before, after = ortgen.load(plain, threads=1), ortgen.load(laid, threads=1)
    for prompts in (PROMPTS[0], PROMPTS):
        want = before.generate(prompts, max_new_tokens=6, eos_token_id=None, output_logits=True)
        got = after.generate(prompts, max_new_tokens=6, eos_token_id=None, output_logits=True)
        assert got.tokens == want.tokens
        for mine, theirs in zip(got.logits, want.logits, strict=True):
            np.testing.assert_array_equal(mine, theirs)


def test_head_layout_leaves_a_small_untied_float_head_alone(fused_model_dirs, tmp_path: Path):
    """Nothing shared, nothing above the part size: the file is not rewritten."""
    from ortgen.export.head_layout import lay_out_head

    _hf, fp32 = fused_model_dirs["llama"]
    copy = tmp_path / "fp32"
    shutil.copytree(fp32, copy)
    stamp = (copy / "model.onnx").stat().st_mtime_ns
    assert lay_out_head(copy) == {"head_parts": 1, "lookup_copied": False}
    assert (copy / "model.onnx").stat().st_mtime_ns == stamp


def test_an_untied_int4_model_looks_up_its_own_embedding(fused_model_dirs, tmp_path: Path):
    """The builder shares the LM head with the embedding whenever it is told to; an
    untied model's tokens must be looked up in its own embedding (exactly: it stays fp32)."""
    from transformers import AutoModelForCausalLM

    hf_dir, _ = fused_model_dirs["llama"]
    out = _export(hf_dir, tmp_path / "int4", "int4")
    graph = onnx.load(str(out / "model.onnx"))
    lookup = _lookup(graph.graph)
    head_inputs = {x for n in graph.graph.node if n.op_type == "MatMulNBits" for x in n.input}
    assert lookup.op_type == "Gather" and lookup.input[0] not in head_inputs
    table = next(t for t in graph.graph.initializer if t.name == lookup.input[0])
    want = AutoModelForCausalLM.from_pretrained(hf_dir).get_input_embeddings().weight
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(table), want.detach().numpy())
