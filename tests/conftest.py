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


@pytest.fixture(scope="session")
def fused_model_dirs(tiny_root: Path) -> dict[str, tuple[Path, Path]]:
    """arch -> (Hugging Face folder, fused fp32 export): onnxruntime-genai's builder's
    shared-buffer graph family (llama and qwen2), built lazily and once."""
    return _LazyModels(tiny_root / "fused", graph="fused")


class _LazyModels(dict):
    def __init__(self, root: Path, graph: str = "optimum") -> None:
        super().__init__()
        self.root = root
        self.graph = graph

    def __missing__(self, arch: str) -> tuple[Path, Path]:
        onnx_dir = export_tiny(arch, self.root, graph=self.graph)
        self[arch] = (self.root / f"{arch}-hf", onnx_dir)
        return self[arch]


@pytest.fixture(scope="session", params=TINY_ARCHS)
def tiny_arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def models(tiny_model_dirs, tiny_arch):
    """(transformers model, ortgen generator) on the same tiny random weights, per arch."""
    from transformers import AutoModelForCausalLM

    import ortgen

    hf_dir, onnx_dir = tiny_model_dirs[tiny_arch]
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    return hf, ortgen.load(onnx_dir, threads=1)


@pytest.fixture(scope="session")
def tiny_llama_gen(tiny_model_dirs):
    """The tiny Llama (no tokenizer), loaded once for tests that only need a generator."""
    import ortgen

    return ortgen.load(tiny_model_dirs["llama"][1], threads=1)


@pytest.fixture(scope="session")
def tiny_text_model(tiny_root: Path) -> Path:
    """A tiny Llama with a character tokenizer and a chat template, exported once for the
    tests that need text (structured output from the CLI and in jobs)."""
    return export_tiny("llama", tiny_root / "text", with_tokenizer=True)


@pytest.fixture(scope="session")
def backbone_dir(tiny_root: Path) -> Path:
    return export_backbone(tiny_root)


@pytest.fixture(scope="session")
def no_past_dir(tiny_root: Path) -> Path:
    return export_without_past(tiny_root)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from ortgen.export.default_model import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def default_gen(default_model_dir: Path):
    import ortgen

    return ortgen.load(default_model_dir)


@pytest.fixture(scope="session")
def reference_model_dir(default_model_dir: Path) -> Path:
    """The default model's GGUF exported at fp32 as a fused graph: the quality reference,
    kept (git-ignored) next to the default model and rebuilt when out of date."""
    from ortgen.export import Variant, export_model, is_complete_model_folder
    from ortgen.export.default_model import DEFAULT_GGUF_SHA256, download_default_gguf
    from ortgen.export.manifest import stale_reason

    out = default_model_dir.parent / ".reference" / "smollm2-135m-instruct-fused-fp32"
    variant = Variant(graph="fused", precision="fp32")
    current = is_complete_model_folder(out) and (
        stale_reason(out, variant=variant.to_dict(), source_sha256=DEFAULT_GGUF_SHA256) is None
    )
    if not current:
        gguf = download_default_gguf(default_model_dir.parent / ".cache")
        export_model(gguf, out, variant=variant, progress=lambda _msg: None, overwrite=True)
    return out


@pytest.fixture(scope="session")
def reference_gen(reference_model_dir: Path):
    import ortgen

    return ortgen.load(reference_model_dir)


@pytest.fixture(scope="session")
def default_hf(default_model_dir: Path):
    """The default model's GGUF weights in transformers (PyTorch), loaded once: the
    reference the fp32 fused graph is compared with token for token."""
    from transformers import AutoModelForCausalLM

    from ortgen.export.default_model import download_default_gguf

    gguf = download_default_gguf(default_model_dir.parent / ".cache")
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
