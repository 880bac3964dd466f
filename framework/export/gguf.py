"""Convert a GGUF file to a transformers folder whose tokenizer agrees with the file.

transformers, torch and gguf are imported inside the functions: ``import ortgen`` stays
light.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ..errors import ExportError
from .quiet import quiet

__all__ = ["gguf_to_hf_folder", "looks_like_gguf"]

_ROLES = ("bos", "eos", "pad")
# What to read from the GGUF header: our name -> GGUF key.
_META_KEYS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
    "add_bos_token": "tokenizer.ggml.add_bos_token",
    "add_eos_token": "tokenizer.ggml.add_eos_token",
    "model": "tokenizer.ggml.model",
}
# Text used to check that a converted tokenizer decodes back to exactly what it encoded.
_ROUND_TRIP_TEXT = "Hello, world!\nÜber 東京 🙂  two  spaces\tand a tab , don 't ."


def looks_like_gguf(path: Path) -> bool:
    """True if ``path`` is a file starting with the GGUF magic."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_to_hf_folder(gguf: str | Path, dest: str | Path) -> None:
    """Dequantize ``gguf`` into a transformers folder, with the special tokens fixed."""
    gguf, dest = Path(gguf), Path(dest)
    meta = _gguf_tokenizer_metadata(gguf)
    try:
        with quiet():
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:
        raise ExportError(
            f"export source {gguf}: transformers cannot load this GGUF file: {exc}"
        ) from exc
    with quiet():
        _fix_gguf_tokenizer(tokenizer, meta, gguf)
        _fix_special_token_ids(model, meta)
        model.save_pretrained(dest)
        tokenizer.save_pretrained(dest)
        # The export resolves the tokenizer again from ``dest`` (AutoTokenizer, then
        # ortgen_tokenizer.json): check the saved folder, not just the object, carries the fix.
        _verify_tokenizer(AutoTokenizer.from_pretrained(dest), meta, gguf)


def _gguf_tokenizer_metadata(gguf: Path) -> dict[str, Any]:
    """Read the tokenizer facts from the GGUF header (the file's word, not transformers')."""
    from gguf import GGUFReader

    try:
        fields = GGUFReader(gguf).fields
    except Exception as exc:
        raise ExportError(f"export source {gguf}: cannot read the GGUF header: {exc}") from exc
    return {
        name: field.contents() if (field := fields.get(key)) is not None else None
        for name, key in _META_KEYS.items()
    }


def _ids_in_vocab(tokenizer: Any, meta: dict[str, Any]) -> dict[str, int]:
    """The GGUF's bos/eos/pad ids (by role) that exist in the tokenizer's vocabulary."""
    ids = {}
    for role in _ROLES:
        token_id = meta.get(f"{role}_token_id")
        if token_id is not None and 0 <= int(token_id) < len(tokenizer):
            ids[role] = int(token_id)
    return ids


def _fix_gguf_tokenizer(tokenizer: Any, meta: dict[str, Any], gguf: Path) -> None:
    """Make the tokenizer agree with the GGUF metadata.

    transformers 4.57 guesses the special tokens of a GGUF tokenizer (for SmolLM2 it
    picks eos=<|im_start|>, no pad, and prepends a BOS), which makes chat prompts start
    with a doubled <|im_start|> and the model babble. The GGUF header states the truth,
    so the special tokens and the BOS/EOS insertion are taken from it.
    """
    for role, token_id in _ids_in_vocab(tokenizer, meta).items():
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    _set_special_insertion(tokenizer, meta.get("add_bos_token"), meta.get("add_eos_token"))
    # GGUF runtimes decode tokens verbatim; transformers' default "clean up" would turn
    # "a , b" into "a, b" and make decoding lossy.
    tokenizer.clean_up_tokenization_spaces = False
    if meta.get("model") == "gpt2":
        # Byte-level BPE decodes with ByteLevel alone; the converter's SentencePiece-style
        # ByteFallback/Fuse/Replace(▁) steps do not belong to this kind of vocabulary.
        from tokenizers import decoders

        tokenizer.backend_tokenizer.decoder = decoders.ByteLevel()
    _verify_tokenizer(tokenizer, meta, gguf)


def _set_special_insertion(tokenizer: Any, add_bos: bool | None, add_eos: bool | None) -> None:
    """Make ``tokenizer(text)`` add BOS/EOS exactly as the file says (None: leave as is)."""
    if add_bos is None and add_eos is None:
        return
    if isinstance(getattr(type(tokenizer), "add_bos_token", None), property):
        # LlamaTokenizerFast & co.: the setters rebuild the post-processor and are saved
        # to tokenizer_config.json, so a reload keeps the behaviour.
        if add_bos is not None:
            tokenizer.add_bos_token = bool(add_bos)
        if add_eos is not None:
            tokenizer.add_eos_token = bool(add_eos)
    added = _specials_added(tokenizer)
    wanted = _wanted_specials(added, add_bos, add_eos)
    if added != wanted:
        _rebuild_post_processor(tokenizer, *wanted)


def _specials_added(tokenizer: Any) -> tuple[bool, bool]:
    """Whether encoding a probe text prepends BOS / appends EOS right now."""
    ids = tokenizer("Hi")["input_ids"]
    plain = tokenizer("Hi", add_special_tokens=False)["input_ids"]
    added_bos = len(ids) > len(plain) and ids[0] == tokenizer.bos_token_id
    added_eos = len(ids) > len(plain) and ids[-1] == tokenizer.eos_token_id
    return added_bos, added_eos


def _wanted_specials(
    added: tuple[bool, bool], add_bos: bool | None, add_eos: bool | None
) -> tuple[bool, bool]:
    """The (bos, eos) insertion the file asks for; an unspecified flag keeps ``added``."""
    return (
        added[0] if add_bos is None else bool(add_bos),
        added[1] if add_eos is None else bool(add_eos),
    )


def _rebuild_post_processor(tokenizer: Any, bos_wanted: bool, eos_wanted: bool) -> None:
    """Fallback for tokenizer classes without add_bos_token setters: write the template."""
    from tokenizers.processors import TemplateProcessing

    bos = [tokenizer.bos_token] if bos_wanted and tokenizer.bos_token else []
    eos = [tokenizer.eos_token] if eos_wanted and tokenizer.eos_token else []
    single = [*bos, "$A:0", *eos]
    pair = [*single, *(f"{t}:1" for t in bos), "$B:1", *(f"{t}:1" for t in eos)]
    specials = [(t, tokenizer.convert_tokens_to_ids(t)) for t in dict.fromkeys(bos + eos)]
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=single, pair=pair, special_tokens=specials
    )
    for flag, value in (("add_bos_token", bos_wanted), ("add_eos_token", eos_wanted)):
        if hasattr(tokenizer, flag):
            with contextlib.suppress(AttributeError):
                setattr(tokenizer, flag, value)


def _verify_tokenizer(tokenizer: Any, meta: dict[str, Any], gguf: Path) -> None:
    """Check the fix took: special ids, BOS/EOS insertion and a lossless decode."""
    for role, want in _ids_in_vocab(tokenizer, meta).items():
        got = getattr(tokenizer, f"{role}_token_id")
        if got != want:
            raise ExportError(f"{gguf}: tokenizer {role} id is {got}, the GGUF says {want}")
    add_bos, add_eos = meta.get("add_bos_token"), meta.get("add_eos_token")
    added = _specials_added(tokenizer)
    if added != _wanted_specials(added, add_bos, add_eos):
        raise ExportError(
            f"{gguf}: could not make the tokenizer add BOS/EOS as the GGUF says "
            f"(add_bos={add_bos}, add_eos={add_eos})"
        )
    ids = tokenizer(_ROUND_TRIP_TEXT, add_special_tokens=False)["input_ids"]
    decoded = tokenizer.decode(ids)
    if decoded != _ROUND_TRIP_TEXT:
        raise ExportError(
            f"{gguf}: the converted tokenizer does not decode losslessly: "
            f"{_ROUND_TRIP_TEXT!r} came back as {decoded!r}"
        )


def _fix_special_token_ids(model: Any, meta: dict[str, Any]) -> None:
    """Put the GGUF's bos/eos/pad ids into config.json and generation_config.json too."""
    for role in _ROLES:
        token_id = meta.get(f"{role}_token_id")
        if token_id is None:
            continue
        setattr(model.config, f"{role}_token_id", int(token_id))
        if getattr(model, "generation_config", None) is not None:
            setattr(model.generation_config, f"{role}_token_id", int(token_id))
