"""Tests of ortgen.export: HF folder -> ONNX folder, its checks and its atomic output."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

import ortgen
from ortgen import ExportError
from ortgen.export import MANIFEST_NAME, Variant, export_model, is_complete_model_folder
from ortgen.export.manifest import MANIFEST_FORMAT, TASK
from tests import tiny_models

OPTIMUM_FP32 = Variant(graph="optimum", precision="fp32")


def _quiet_progress(_msg: str) -> None:
    """A progress callback that keeps test output clean."""


def _leftovers(parent: Path) -> list[str]:
    """Hidden staging folders an export left behind next to its output."""
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def export_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's own tiny models (it checks and re-exports them, so no sharing)."""
    return tmp_path_factory.mktemp("export-tiny")


@pytest.fixture(scope="module")
def llama_onnx(export_root: Path) -> Path:
    """A tiny llama exported once for the module (no tokenizer)."""
    return tiny_models.export_tiny("llama", export_root)


@pytest.fixture(scope="module")
def llama_hf(llama_onnx: Path, export_root: Path) -> Path:
    return export_root / "llama-hf"


# --------------------------------------------------------------------------- folder export


def test_export_writes_graph_configs_and_manifest(llama_onnx: Path, llama_hf: Path) -> None:
    names = {p.name for p in llama_onnx.iterdir()}
    assert names == {"model.onnx", "config.json", "generation_config.json", MANIFEST_NAME}
    assert is_complete_model_folder(llama_onnx)
    assert _leftovers(llama_onnx.parent) == []

    manifest = json.loads((llama_onnx / MANIFEST_NAME).read_text())
    assert manifest["format"] == MANIFEST_FORMAT == 8
    assert manifest["ortgen"] == ortgen.__version__
    assert manifest["variant"] == OPTIMUM_FP32.to_dict()
    assert manifest["source"] == str(llama_hf.absolute())
    assert manifest["source_sha256"] is None
    assert manifest["task"] == TASK == "text-generation-with-past"
    created = dt.datetime.fromisoformat(manifest["created"])
    assert created.tzinfo is not None
    assert abs((dt.datetime.now(dt.UTC) - created).total_seconds()) < 3600
    assert set(manifest["tools"]) == {
        "torch", "transformers", "optimum", "optimum-onnx", "onnxruntime", "onnxruntime-genai",
        "onnx", "onnx-ir",
    }  # fmt: skip
    assert manifest["tools"]["transformers"] == metadata.version("transformers")
    assert manifest["files"] == sorted(names - {MANIFEST_NAME})

    config = json.loads((llama_onnx / "config.json").read_text())
    assert config["model_type"] == "llama"
    generation = json.loads((llama_onnx / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tiny_models.EOS_ID
    assert generation["pad_token_id"] == tiny_models.PAD_ID


def test_graph_has_kv_cache_io_and_matches_pytorch(llama_onnx: Path, llama_hf: Path) -> None:
    """The graph has the past/present I/O and its prefill + one decode step equal PyTorch."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM

    session = ort.InferenceSession(
        str(llama_onnx / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    layers = range(2)
    past_names = [f"past_key_values.{i}.{kind}" for i in layers for kind in ("key", "value")]
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    assert set(inputs) == {"input_ids", "attention_mask", "position_ids", *past_names}
    assert set(outputs) == {
        "logits",
        *(n.replace("past_key_values", "present") for n in past_names),
    }
    assert inputs["input_ids"].type == "tensor(int64)"
    assert inputs["past_key_values.0.key"].type == "tensor(float)"
    assert inputs["past_key_values.0.key"].shape == ["batch_size", 2, "past_sequence_length", 16]
    assert outputs["logits"].shape == ["batch_size", "sequence_length", tiny_models.VOCAB_SIZE]

    prompt = [5, 17, 200, 33, 64, 9]
    # Prefill: zero-length past tensors.
    feeds = {
        "input_ids": np.array([prompt], dtype=np.int64),
        "attention_mask": np.ones((1, len(prompt)), dtype=np.int64),
        "position_ids": np.arange(len(prompt), dtype=np.int64)[None],
        **{name: np.zeros((1, 2, 0, 16), dtype=np.float32) for name in past_names},
    }
    names = [o.name for o in session.get_outputs()]
    first = dict(zip(names, session.run(None, feeds), strict=True))
    assert first["present.1.value"].shape == (1, 2, len(prompt), 16)
    nxt = int(first["logits"][0, -1].argmax())
    # One decode step fed with the presents.
    feeds = {
        "input_ids": np.array([[nxt]], dtype=np.int64),
        "attention_mask": np.ones((1, len(prompt) + 1), dtype=np.int64),
        "position_ids": np.array([[len(prompt)]], dtype=np.int64),
        **{name: first[name.replace("past_key_values", "present")] for name in past_names},
    }
    second = dict(zip(names, session.run(None, feeds), strict=True))

    model = AutoModelForCausalLM.from_pretrained(llama_hf).eval()
    with torch.no_grad():
        reference = model(torch.tensor([[*prompt, nxt]])).logits[0].numpy()
    np.testing.assert_allclose(first["logits"][0], reference[:-1], atol=1e-3, rtol=0)
    np.testing.assert_allclose(second["logits"][0, 0], reference[-1], atol=1e-3, rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_other_tiny_archs_export(arch: str, tmp_path: Path) -> None:
    out = tiny_models.export_tiny(arch, tmp_path)
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    assert {"input_ids", "attention_mask", "past_key_values.1.value"} <= inputs
    assert {"logits", "present.0.key", "present.1.value"} <= outputs
    assert is_complete_model_folder(out)


def test_export_copies_tokenizer_and_chat_template(tmp_path: Path) -> None:
    hf = tiny_models.build_tiny_hf("llama", tmp_path / "hf", with_tokenizer=True)
    messages: list[str] = []
    out = export_model(hf, tmp_path / "onnx", variant=OPTIMUM_FP32, progress=messages.append)
    for name in (
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "chat_template.jinja", "ortgen_tokenizer.json",
    ):  # fmt: skip
        assert (out / name).is_file(), name
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert {"tokenizer.json", "ortgen_tokenizer.json"} <= set(manifest["files"])
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tokenizer.decode(tokenizer.encode("Hi,\n you!").ids) == "Hi,\n you!"
    assert messages[0] == "exporting to ONNX (optimum-fp32)…"
    assert messages[-1].startswith(f"done: {out} (") and messages[-1].endswith(" MB)")


def test_import_ortgen_does_not_import_the_export_stack() -> None:
    code = (
        "import sys, ortgen, ortgen.export, ortgen.export.gguf, ortgen.gguf.default_model\n"
        "heavy = [m for m in ('torch', 'transformers', 'optimum', 'onnx', 'gguf')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_is_complete_model_folder_needs_all_three_files(tmp_path: Path) -> None:
    assert not is_complete_model_folder(tmp_path / "missing")
    for name in ("model.onnx", "config.json"):
        (tmp_path / name).write_text("{}")
    assert not is_complete_model_folder(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{}")
    assert is_complete_model_folder(tmp_path)


# --------------------------------------------------------------------------- bad input


def test_missing_source_is_an_export_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ExportError, match="does not exist") as info:
        export_model(missing, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)
    assert str(missing) in str(info.value)
    assert not (tmp_path / "out").exists()


def test_folder_without_config_is_an_export_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ExportError, match=r"without config\.json") as info:
        export_model(src, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)
    assert str(src) in str(info.value)
    (src / "model.Q4.gguf").write_bytes(b"GGUF")
    with pytest.raises(ExportError, match=r"model\.Q4\.gguf: pass that \.gguf file instead"):
        export_model(src, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)


def test_non_gguf_file_is_an_export_error(tmp_path: Path) -> None:
    wrong_suffix = tmp_path / "weights.bin"
    wrong_suffix.write_bytes(b"GGUF")
    with pytest.raises(ExportError, match=r"not a \.gguf file"):
        export_model(wrong_suffix, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf")
    with pytest.raises(ExportError, match="GGUF magic"):
        export_model(fake, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)


def test_the_removed_gguf_precision_points_to_the_gguf_builder(tmp_path: Path) -> None:
    """Precision "gguf" (the export extra's rewrite with a GGUF's own blocks) is gone:
    asking for it says where a GGUF file's own weights are kept now, and a manifest that
    recorded it names no variant rather than failing."""
    from ortgen.export.variant import variant_name

    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    with pytest.raises(ExportError, match="precision 'gguf'") as info:
        export_model(source, tmp_path / "out", variant=Variant(precision="gguf"))
    assert "ortgen export FILE.gguf OUT" in str(info.value)
    assert "ortgen.load('FILE.gguf')" in str(info.value)
    assert not (tmp_path / "out").exists()
    old = {"graph": "fused", "precision": "gguf", "block_size": 32, "accuracy_level": 4}
    assert variant_name(old) is None


def test_unsupported_architecture_is_an_export_error(tmp_path: Path) -> None:
    src = tmp_path / "bert"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (src / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ExportError, match=r"model_type 'bert' for text-generation-with-past"):
        export_model(src, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)
    (src / "config.json").write_text(json.dumps({"model_type": "no_such_arch"}))
    with pytest.raises(ExportError, match="no_such_arch"):
        export_model(src, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)


def test_refuses_to_export_over_its_own_source(llama_hf: Path) -> None:
    with pytest.raises(ExportError, match="would replace its own source"):
        export_model(
            llama_hf, llama_hf, variant=OPTIMUM_FP32, progress=_quiet_progress, overwrite=True
        )
    with pytest.raises(ExportError, match="would replace its own source"):
        export_model(
            llama_hf,
            llama_hf.parent,
            variant=OPTIMUM_FP32,
            progress=_quiet_progress,
            overwrite=True,
        )
    assert (llama_hf / "config.json").is_file()


def test_config_without_weights_is_an_export_error(tmp_path: Path, llama_hf: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_bytes((llama_hf / "config.json").read_bytes())
    with pytest.raises(ExportError, match="no weights"):
        export_model(src, tmp_path / "out", variant=OPTIMUM_FP32, progress=_quiet_progress)


# --------------------------------------------------------------------------- destination


def test_refuses_to_overwrite_a_complete_folder(llama_onnx: Path, llama_hf: Path) -> None:
    before = (llama_onnx / MANIFEST_NAME).read_bytes()
    with pytest.raises(ExportError, match="already holds a complete exported model"):
        export_model(llama_hf, llama_onnx, variant=OPTIMUM_FP32, progress=_quiet_progress)
    assert (llama_onnx / MANIFEST_NAME).read_bytes() == before


def test_refuses_to_replace_a_foreign_folder(tmp_path: Path, llama_hf: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not an ortgen model folder"):
        export_model(llama_hf, out, variant=OPTIMUM_FP32, progress=_quiet_progress)
    assert (out / "notes.txt").read_text() == "keep me"


def test_overwrite_replaces_the_whole_folder(tmp_path: Path, llama_hf: Path) -> None:
    out = tmp_path / "out"
    export_model(llama_hf, out, variant=OPTIMUM_FP32, progress=_quiet_progress)
    (out / "stale.txt").write_text("from the old export")
    export_model(llama_hf, out, variant=OPTIMUM_FP32, progress=_quiet_progress, overwrite=True)
    assert is_complete_model_folder(out)
    assert not (out / "stale.txt").exists()
    assert _leftovers(tmp_path) == []


def _broken_source(tmp_path: Path, llama_hf: Path) -> Path:
    """A folder that passes the up-front checks but whose weights cannot be loaded."""
    src = tmp_path / "broken"
    src.mkdir()
    (src / "config.json").write_bytes((llama_hf / "config.json").read_bytes())
    (src / "model.safetensors").write_bytes(b"this is not a safetensors file")
    return src


def test_failed_export_leaves_no_output_folder(tmp_path: Path, llama_hf: Path) -> None:
    src = _broken_source(tmp_path, llama_hf)
    out = tmp_path / "models" / "out"
    with pytest.raises(ExportError, match=r"export of .*broken to ONNX failed") as info:
        export_model(src, out, variant=OPTIMUM_FP32, progress=_quiet_progress)
    assert info.value.__cause__ is not None
    assert not out.exists()
    assert _leftovers(out.parent) == []


def test_interrupted_export_leaves_no_output_folder(
    tmp_path: Path, llama_hf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted after optimum wrote model.onnx + config.json: still nothing at ``out``."""
    import ortgen.export.exporter as export

    written: list[set[str]] = []

    def run_then_interrupt(hf_dir: Path, dest: Path, source: Path) -> None:
        real_run(hf_dir, dest, source)
        written.append({p.name for p in dest.iterdir()})
        raise KeyboardInterrupt

    real_run = export._run_optimum_export
    monkeypatch.setattr(export, "_run_optimum_export", run_then_interrupt)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        export_model(llama_hf, out, variant=OPTIMUM_FP32, progress=_quiet_progress)
    assert {"model.onnx", "config.json"} <= written[0]
    assert not out.exists()
    assert _leftovers(tmp_path) == []


def test_failed_overwrite_keeps_the_old_model(tmp_path: Path, llama_hf: Path) -> None:
    out = tmp_path / "out"
    export_model(llama_hf, out, variant=OPTIMUM_FP32, progress=_quiet_progress)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ExportError):
        export_model(_broken_source(tmp_path, llama_hf), out, progress=_quiet_progress,
                     overwrite=True)  # fmt: skip
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path) == []
