"""GGUF files as users bring them: the default GGUF re-quantised by llama.cpp's own quantiser.

Two steps, each run by ``benchmarks/setup_peers.sh`` in the interpreter that has its
library (this module imports neither at the top, so both can import it):

1. ``f32 SRC DST`` (main venv, gguf-py + numpy): an F32 GGUF with SRC's metadata and every
   tensor dequantised (``gguf.quants.dequantize``): the input llama.cpp's quantiser wants.
2. ``quantize SRC DST TYPE`` (peers venv, llama-cpp-python): ``llama_model_quantize`` with
   ``params.ftype`` set to TYPE's llama.cpp file type, no importance matrix, as
   ``llama-quantize SRC DST TYPE`` would.

llama.cpp chooses each tensor's type itself (its ``llama_tensor_get_type``): a ``_K_M`` file
mixes K types, and a tensor whose rows are not a multiple of 256 (SmolLM2's hidden size is
576) falls back to a legacy type (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). ``benchmarks/
gguf.py`` reports the mix each file ends up with.

    python benchmarks/gguf_files.py f32 model.Q4_1.gguf model.F32.gguf
    python benchmarks/gguf_files.py quantize model.F32.gguf model.Q4_K_M.gguf Q4_K_M
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, where benchmarks/gguf.py would answer
# ``import gguf`` in gguf-py's place: drop the folder.
_HERE = Path(__file__).resolve().parent
if __name__ == "__main__" and sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path.pop(0)

#: llama.cpp's ``enum llama_ftype`` values of the file types the issue names
FTYPES: dict[str, int] = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
#: the benchmark's files: the default GGUF as published (Q4_1) and llama.cpp's re-quantisations
ALL_TYPES: list[str] = ["Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0"]


def file_name(kind: str) -> str:
    """The file name of one type under ``benchmarks/.models/gguf/``."""
    return f"SmolLM2-135M-Instruct.{kind}.gguf"


def write_f32(src: Path, dst: Path) -> None:
    """``dst``: ``src``'s metadata and tensors, every tensor dequantised to float32.

    Written beside ``dst`` and renamed into place, so a ``dst`` that exists is complete.
    """
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(src)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    tmp = dst.with_name(dst.name + ".part")
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        # GGUF.* are the header's own; the writer adds general.architecture itself
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # numpy's order is GGUF's reversed: (rows, columns) for a matrix
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        writer.add_tensor(tensor.name, np.ascontiguousarray(values, np.float32).reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)


def quantize(src: Path, dst: Path, kind: str) -> None:
    """``dst``: ``src`` quantised by llama.cpp to the file type ``kind`` (see ``FTYPES``)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = os.cpu_count() or 1
    tmp = dst.with_name(dst.name + ".part")
    status = llama_cpp.llama_model_quantize(
        str(src).encode(), str(tmp).encode(), ctypes.byref(params)
    )
    if status != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize({src.name} -> {kind}) returned {status}")
    os.replace(tmp, dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    f32 = steps.add_parser("f32", help="dequantise every tensor to F32 (main venv)")
    f32.add_argument("src", type=Path)
    f32.add_argument("dst", type=Path)
    quant = steps.add_parser("quantize", help="llama.cpp's quantiser (peers venv)")
    quant.add_argument("src", type=Path)
    quant.add_argument("dst", type=Path)
    quant.add_argument("type", choices=sorted(FTYPES))
    args = parser.parse_args()
    if args.step == "f32":
        write_f32(args.src, args.dst)
    else:
        quantize(args.src, args.dst, args.type)


if __name__ == "__main__":
    main()
