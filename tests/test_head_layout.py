"""The memory layout pass for fused graphs (``ortgen.export.head_layout``): the embedding
lookup gets its own copies of the LM head's initializers and the head is computed in
parts. It moves bytes, not numbers: the laid-out int4 graph must give exactly the logits
of the builder's own."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import ortgen

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime_genai")

PROMPTS = [[1, 5, 9, 33, 70, 12], [1, 44, 3]]


def _graph(folder: Path):  # type: ignore[no-untyped-def]
    return onnx.load(str(folder / "model.onnx"), load_external_data=False).graph


def test_head_layout_moves_bytes_not_numbers(fused_model_dirs, tmp_path: Path, monkeypatch):
    from ortgen.export import Variant, export_model, head_layout

    hf_dir, _ = fused_model_dirs["llama"]
    with monkeypatch.context() as patch:  # the builder's graph as it comes (pruned head)
        patch.setattr(head_layout, "lay_out_head", lambda *_args, **_kw: {})
        plain = export_model(
            hf_dir,
            tmp_path / "plain",
            variant=Variant(graph="fused", precision="int4"),
            progress=lambda _msg: None,
            overwrite=True,
        )
    graph = _graph(plain)
    (lookup,) = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    (head,) = [n for n in graph.node if "logits" in n.output]
    assert head.op_type == "MatMulNBits"
    assert set(lookup.input[2:]) <= set(head.input)  # shares the head's scales: the case
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.initializer}
    vocab = next(a.i for a in head.attribute if a.name == "N")
    part_bytes = sizes[head.input[1]] // vocab * 64  # 64 rows a part

    laid = tmp_path / "laid"
    shutil.copytree(plain, laid)
    parts = -(-vocab // 64)
    assert head_layout.lay_out_head(laid, part_bytes) == {
        "head_parts": parts,
        "lookup_copied": True,
    }

    graph = _graph(laid)
    producers = {out: node for node in graph.node for out in node.output}
    (lookup,) = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
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


def test_head_layout_leaves_a_float_head_alone(fused_model_dirs, tmp_path: Path) -> None:
    from ortgen.export.head_layout import lay_out_head

    _hf, fp32 = fused_model_dirs["llama"]
    copy = tmp_path / "fp32"
    shutil.copytree(fp32, copy)
    stamp = (copy / "model.onnx").stat().st_mtime_ns
    assert lay_out_head(copy, part_bytes=1) == {"head_parts": 1, "lookup_copied": False}
    assert (copy / "model.onnx").stat().st_mtime_ns == stamp
