"""Convert a GGUF file to a transformers folder: transformers' weights, ortgen's tokenizer.

The weights are dequantised by transformers (``from_pretrained(..., gguf_file=...)``), so
the exporter can re-quantise them or trace them with optimum. The tokenizer is not
transformers' reading of the file: it is ortgen's GGUF builder's
(:func:`ortgen.gguf.tokenizer.write_tokenizer_files`), which follows the file as llama.cpp
reads it where transformers does not (special tokens, BOS/EOS insertion, the split named by
``tokenizer.ggml.pre``, Gemma's and Phi-3's vocabularies: see that module). One reading of a
GGUF's tokenizer then serves both ways of turning the file into a model folder, and an
export of a GGUF tokenizes exactly as ``ortgen.load("x.gguf")`` does.

transformers, torch and gguf are imported inside the functions: ``import ortgen`` stays
light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..gguf.tokenizer import TokenizerInfo, write_tokenizer_files
from .quiet import quiet

__all__ = ["gguf_to_hf_folder", "looks_like_gguf"]

_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def looks_like_gguf(path: Path) -> bool:
    """True if ``path`` is a file starting with the GGUF magic."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_to_hf_folder(gguf: str | Path, dest: str | Path) -> TokenizerInfo:
    """Write ``gguf`` as a transformers folder ``dest``: the dequantised weights and
    config (transformers'), the tokenizer files and special-token ids (ortgen's GGUF
    builder's). Returns the tokenizer's header facts.

    The tokenizer is written first: it is cheap next to dequantising the weights, so a file
    whose tokenizer ortgen cannot build is refused before transformers loads the model.
    """
    gguf, dest = Path(gguf), Path(dest)
    header = _read_header(gguf)
    if header.fields.get("tokenizer.ggml.model") is None:
        raise ExportError(
            f"export source {gguf} has no tokenizer (no tokenizer.ggml.* metadata): ortgen "
            "takes the tokenizer of a GGUF from the file itself. Convert the model again "
            "with its tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)"
        )
    try:
        info = write_tokenizer_files(header, dest)
    except ExportError as exc:
        raise ExportError(f"export source {gguf}: {exc}") from exc
    try:
        with quiet():
            import torch
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
    except Exception as exc:
        raise ExportError(
            f"export source {gguf}: transformers cannot load this GGUF file: {exc}"
        ) from exc
    _set_special_token_ids(model, info.generation_ids())
    with quiet():
        model.save_pretrained(dest)
    return info


def _read_header(gguf: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(gguf)
    except Exception as exc:  # gguf raises ValueError, OSError, struct errors...
        raise ExportError(f"export source {gguf}: cannot read the GGUF header: {exc}") from exc


def _set_special_token_ids(model: Any, ids: dict[str, int | list[int]]) -> None:
    """The header's ids (as ortgen's builder writes them) in config.json and
    generation_config.json, replacing transformers' guesses; a role the header names no
    token for gets none, so no guessed id stays behind."""
    configs = [model.config, getattr(model, "generation_config", None)]
    for config in (c for c in configs if c is not None):
        for key in _ID_KEYS:
            setattr(config, key, ids.get(key))
