"""A GGUF file, opened for building: its metadata and its tensors, read without copying.

The header is parsed here rather than with gguf-py's ``GGUFReader``, which makes a numpy
memory-map view per value: ~20 s for the default model's 49k-token vocabulary and merges
on a 2-core VM, against ~0.1 s for this reader (Python's ``struct`` over the header bytes,
``numpy.frombuffer`` for numeric arrays). Tensor data stays a read-only memory map.

What can go wrong with a file a user brings — not a GGUF, cut short, a tensor missing, an
unknown version — is one ``GGUFError`` naming the file and the cause.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError

__all__ = ["GGUFError", "GGUFFile", "GGUFTensor", "looks_like_gguf"]

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# GGUF value types: struct format of the scalars (8 string, 9 array are read apart)
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
          10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip
_STRING, _ARRAY = 8, 9


class GGUFError(ModelLoadError):
    """A GGUF file ortgen cannot build a model from (the message says why)."""


def looks_like_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: its GGML type, logical shape (rows first, GGUF's ne0 last: the
    (N, K) of a weight) and raw data (a read-only view into the file)."""

    name: str
    qtype: int
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def type_name(self) -> str:
        from gguf.constants import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type {self.qtype}"


class _Cursor:
    """Reads GGUF's little-endian values from a buffer; running past its end is a cut file."""

    def __init__(self, buffer: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buffer, 0, path

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise GGUFError(
                f"{self.path} ends inside its header (at byte {len(self.buf)}): "
                "is the file complete? (a download cut short ends like this)"
            )
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def scalar(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.scalar("Q"))).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("I"), self.scalar("Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item in _NUMPY:
                dtype = np.dtype(_NUMPY[item])
                return np.frombuffer(self.take(count * dtype.itemsize), dtype).tolist()
            if item == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            raise GGUFError(f"{self.path}: unknown GGUF array type {item}")
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        raise GGUFError(f"{self.path}: unknown GGUF value type {kind}")


class GGUFFile:
    """Metadata and tensors of one GGUF file (memory-mapped, read-only)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: no such file")
        if not looks_like_gguf(self.path):
            raise GGUFError(f"{self.path} is not a GGUF file (it does not start with 'GGUF')")
        mapped = np.memmap(self.path, dtype=np.uint8, mode="r")
        cursor = _Cursor(memoryview(mapped), self.path)  # type: ignore[arg-type]
        cursor.take(4)
        version = cursor.scalar("I")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} (ortgen reads versions 2 and 3)")
        n_tensors, n_values = cursor.scalar("Q"), cursor.scalar("Q")
        self._fields: dict[str, Any] = {}
        for _ in range(n_values):
            key = cursor.string()
            self._fields[key] = cursor.value(cursor.scalar("I"))
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = [cursor.scalar("Q") for _ in range(cursor.scalar("I"))]
            infos.append((name, dims, cursor.scalar("I"), cursor.scalar("Q")))
        alignment = int(self._fields.get("general.alignment", _DEFAULT_ALIGNMENT))
        start = -(-cursor.pos // alignment) * alignment
        self.tensors: dict[str, GGUFTensor] = {}
        for name, dims, qtype, offset in infos:
            size = _nbytes(qtype, dims, self.path, name)
            begin = start + offset
            if begin + size > mapped.size:
                raise GGUFError(
                    f"{self.path} is cut short: tensor {name!r} ends at byte {begin + size}, "
                    f"the file has {mapped.size} (is the download complete?)"
                )
            shape = tuple(int(d) for d in reversed(dims))
            self.tensors[name] = GGUFTensor(name, qtype, shape, mapped[begin : begin + size])
        self.architecture = str(self.get("general.architecture", ""))
        if not self.architecture:
            raise GGUFError(f"{self.path} has no general.architecture: not a model GGUF")

    @property
    def fields(self) -> dict[str, Any]:
        """Metadata values by key, as plain Python data (what ``tokenizer`` reads)."""
        return self._fields

    def has(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python data (str, int, float, bool, or a list), or default."""
        value = self._fields.get(key)
        return default if value is None else value

    def arch(self, key: str, default: Any = None) -> Any:
        """``{architecture}.key``, e.g. ``arch("block_count")``."""
        return self.get(f"{self.architecture}.{key}", default)

    def require(self, key: str) -> Any:
        """``{architecture}.key``, or a GGUFError naming the missing key."""
        value = self.arch(key)
        if value is None:
            raise GGUFError(f"{self.path}: metadata {self.architecture}.{key} is missing")
        return value

    def tensor(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(
                f"{self.path}: tensor {name!r} is missing ({self.architecture} needs it)"
            ) from None

    def keys(self) -> list[str]:
        return list(self._fields)


def _nbytes(qtype: int, dims: list[int], path: Path, name: str) -> int:
    """Bytes of a tensor of GGML type ``qtype`` and GGUF dims (ne0 first)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise GGUFError(f"{path}: tensor {name!r} has unknown GGML type {qtype}") from None
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if dims and dims[0] % block:
        raise GGUFError(f"{path}: tensor {name!r} rows of {dims[0]} are not whole blocks")
    return count // block * size
