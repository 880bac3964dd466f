"""GGUF files built on first use: a cache of model folders keyed by the file's sha256.

``ortgen.load("model.gguf")`` builds the file once into ``<models dir>/.gguf/<stem>-<sha>``
and loads that folder from then on. A folder is reused while its manifest names the same
file contents (sha256), the same build options and the same build format; a file that
changed since, or a newer ortgen whose builder writes another format, builds again and says
why. Hashing a 1 GB file takes ~1 s, so the hash is remembered per (path, size, mtime) in
the cache's ``hashes.json``.

Two processes loading the same file at once: one builds under an exclusive ``flock`` on the
folder's lock file, the other waits (saying so) and then loads what the first built. Lock
files stay in place, so there is no window where two processes hold locks on different
files of one name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from ..model.manifest import read_manifest
from ..model.paths import models_dir
from .options import BUILD_FORMAT, BuildOptions, variant_of
from .reader import GGUFError, looks_like_gguf

__all__ = ["build_lock", "built_model", "cache_root", "file_sha256", "stderr_progress"]

_HASHES = "hashes.json"


def stderr_progress(message: str) -> None:
    print(f"ortgen: {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """Where GGUF builds live: ``<models dir>/.gguf`` (``$ORTGEN_MODELS_DIR`` moves it)."""
    return models_dir() / ".gguf"


def built_model(
    gguf: str | Path,
    *,
    options: BuildOptions | None = None,
    progress: Callable[[str], None] = stderr_progress,
) -> Path:
    """The model folder built from ``gguf``: from the cache, or built now."""
    from .build import build_folder

    options = options or BuildOptions()
    source = Path(gguf).expanduser().absolute()
    if not looks_like_gguf(source):
        raise GGUFError(f"{source} is not a GGUF file (it does not start with 'GGUF')")
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        sha = _remembered_sha(root, source)
    except OSError as exc:
        raise _unwritable(root, source, exc) from exc
    folder = root / f"{_stem(source)}-{sha[:16]}{_suffix(options)}"
    if _current(folder, sha, options) is None:
        return folder
    try:
        with build_lock(folder, source.name, progress):
            reason = _current(folder, sha, options)
            if reason is None:  # built by the process we waited for
                return folder
            progress(f"building {source.name} into {folder} ({reason})")
            started = time.perf_counter()
            build_folder(source, folder, options=options, sha256=sha, progress=progress)
            progress(f"built in {time.perf_counter() - started:.1f} s")
    except OSError as exc:
        raise _unwritable(root, source, exc) from exc
    _forget_older_builds(root, source, folder)
    return folder


def file_sha256(path: Path) -> str:
    """The sha256 of a file's contents, read in 4 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(4 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def _current(folder: Path, sha: str, options: BuildOptions) -> str | None:
    """Why ``folder`` must be built (None: it is current)."""
    manifest = read_manifest(folder)
    if manifest is None or not (folder / "model.onnx").is_file():
        return "first use" if not folder.exists() else "no finished build there"
    variant = manifest.get("variant") or {}
    if variant.get("build_format") != BUILD_FORMAT:
        return (
            f"it was built by build format {variant.get('build_format')}, "
            f"this ortgen writes format {BUILD_FORMAT}"
        )
    if variant != variant_of(options):
        return "it was built with other options"
    if manifest.get("source_sha256") != sha:
        return "the file changed since it was built"
    return None


def _remembered_sha(root: Path, source: Path) -> str:
    """The file's sha256, hashed again only when its size or mtime changed."""
    stat = source.stat()
    key = str(source)
    stamp = [stat.st_size, stat.st_mtime_ns]
    hashes = _read_hashes(root)
    entry = hashes.get(key)
    if (
        isinstance(entry, dict)
        and entry.get("stamp") == stamp
        and isinstance(entry.get("sha256"), str)
    ):
        return str(entry["sha256"])
    sha = file_sha256(source)
    previous = entry.get("sha256") if isinstance(entry, dict) else None
    hashes[key] = {"stamp": stamp, "sha256": sha, "previous": previous if previous != sha else None}
    tmp = root / f".{_HASHES}.{os.getpid()}"
    tmp.write_text(json.dumps(hashes, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, root / _HASHES)
    return sha


def _read_hashes(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / _HASHES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _forget_older_builds(root: Path, source: Path, keep: Path) -> None:
    """Remove the build of this path's previous contents (a file that changed), unless
    another remembered path still has those contents."""
    hashes = _read_hashes(root)
    previous = (hashes.get(str(source)) or {}).get("previous")
    if not previous or any(
        isinstance(e, dict) and e.get("sha256") == previous for e in hashes.values()
    ):
        return
    for old in root.glob(f"{_stem(source)}-{previous[:16]}*"):
        if old.is_dir() and old != keep:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def build_lock(folder: Path, what: str, progress: Callable[[str], None]) -> Iterator[None]:
    """Hold ``folder``'s build lock (waiting, and saying so, while another process
    builds it): ``FOLDER.lock`` beside it, never removed."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder.parent / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process that is building {what}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _stem(source: Path) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in source.stem)[:80]


def _suffix(options: BuildOptions) -> str:
    parts: list[str] = []
    if options.precision != "exact":
        parts.append(options.precision)
    if options.accuracy_level != 4:
        parts.append(f"a{options.accuracy_level}")
    if options.max_context:
        parts.append(f"ctx{options.max_context}")
    if options.embeddings:
        parts.append("emb")
    return "".join(f"-{p}" for p in parts)


def _unwritable(root: Path, source: Path, exc: OSError) -> ModelLoadError:
    return ModelLoadError(
        f"cannot build {source.name}: the model cache {root} is not writable "
        f"({exc.strerror or exc}); set ORTGEN_MODELS_DIR to a writable folder, or build it "
        f"once with `ortgen export {source} FOLDER` and load FOLDER"
    )
