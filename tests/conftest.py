"""Session fixtures: tiny random-weight models exported once per test session, and the
real default model (built on first use, kept in exported_models/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import TINY_ARCHS, export_backbone, export_tiny, export_without_past


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_model_dirs(tiny_root: Path) -> dict[str, tuple[Path, Path]]:
    """arch -> (Hugging Face folder, exported ONNX folder), built lazily and once."""
    return _LazyModels(tiny_root)


class _LazyModels(dict):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, arch: str) -> tuple[Path, Path]:
        onnx_dir = export_tiny(arch, self.root)
        self[arch] = (self.root / f"{arch}-hf", onnx_dir)
        return self[arch]


@pytest.fixture(scope="session", params=TINY_ARCHS)
def tiny_arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def backbone_dir(tiny_root: Path) -> Path:
    return export_backbone(tiny_root)


@pytest.fixture(scope="session")
def no_past_dir(tiny_root: Path) -> Path:
    return export_without_past(tiny_root)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from ortgen.api import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def default_gen(default_model_dir: Path):
    import ortgen

    return ortgen.load(default_model_dir)
