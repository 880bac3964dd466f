"""Tiny random-weight models for tests: built from a config in well under a second.

Not a test module. ``tests/conftest.py`` calls these from session-scoped fixtures.

The weights are random but chosen so greedy decoding is a fair test of an ONNX runtime
against PyTorch: the initializer std is raised (default 0.02 gives near-zero logits,
i.e. near-ties, and tied embeddings then just repeat the input token), so logits are
spread out and the greedy continuation of a prompt varies from step to step. Measured
with these settings (12 prompts x 40 greedy steps per arch): ONNX and PyTorch agreed on
every token; ONNX-vs-PyTorch logit differences were ~1e-5 (max 2e-4; gpt2 max 1e-5, its
std is lower because its un-normalised residual stream amplifies float error at larger
std), the smallest top-1/top-2 gap seen was ~4e-4 and about 0.1% of steps had a gap
below 1e-3.

Token ids: pad 0, bos 1, eos 2; vocabulary 256.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY_ARCHS = ("llama", "gpt2", "qwen2")

VOCAB_SIZE = 256
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MAX_POSITIONS = 128

# Per arch: raised init std (see module doc) and whether the lm_head is tied to the
# embeddings. gpt2 keeps its usual tying so the tied-weight export path is covered;
# llama/qwen2 use 4 query heads over 2 KV heads to cover grouped-query attention.
_INIT_STD = {"llama": 0.5, "gpt2": 0.2, "qwen2": 0.5, "mistral": 0.5}
#: the tiny Mistral's sliding window (not in TINY_ARCHS: only window tests use it)
SLIDING_WINDOW = 8


def _config(arch: str) -> Any:
    """A small transformers config for ``arch`` (2 layers, hidden 64, 4 heads)."""
    common = {
        "vocab_size": VOCAB_SIZE,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "initializer_range": _INIT_STD[arch],
    }
    if arch == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_positions=MAX_POSITIONS, tie_word_embeddings=True,
            **common,
        )  # fmt: skip
    decoder = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": False,
        **common,
    }
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**decoder)
    if arch == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**decoder)
    if arch == "mistral":
        from transformers import MistralConfig

        return MistralConfig(**decoder, sliding_window=SLIDING_WINDOW)
    raise ValueError(f"unknown tiny arch {arch!r}; choose one of {TINY_ARCHS}")


def build_tiny_hf(arch: str, dest: Path, *, seed: int = 0, with_tokenizer: bool = False) -> Path:
    """Write a tiny random ``arch`` model (safetensors, config, generation config) to dest.

    Deterministic for a given ``seed``. Without a tokenizer (the default) the model
    generates from token ids only; ``with_tokenizer`` adds ``save_tiny_tokenizer``'s.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = _config(arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    dest = Path(dest)
    model.save_pretrained(dest, safe_serialization=True)
    generation = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    generation.save_pretrained(dest)
    if with_tokenizer:
        save_tiny_tokenizer(dest)
    return dest


def save_tiny_tokenizer(
    dest: Path,
    *,
    special_tokens: tuple[str, ...] = (),
    template: str | None = None,
    control_tokens: tuple[str, ...] = (),
) -> Path:
    """Save a character-level tokenizer covering exactly the tiny vocabulary to ``dest``.

    Ids: 0 <pad>, 1 <s> (bos), 2 </s> (eos), 3 <unk>, then printable ASCII, newline and
    tab (one token per character), then ``special_tokens`` (each one token, matched
    before the characters, as a model's added tokens are; those also in
    ``control_tokens`` are special, left out of decoded text as ``<|im_end|>`` is, the
    others text, as Qwen's ``<think>``), then ``<extra_N>`` up to id
    255, so every id a tiny model can emit decodes to something. It has a small chat
    template unless ``template`` is given.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = ["<pad>", "<s>", "</s>", "<unk>", *map(chr, range(32, 127)), "\n", "\t"]
    tokens += [t for t in special_tokens if t not in tokens]
    tokens += [f"<extra_{i}>" for i in range(VOCAB_SIZE - len(tokens))]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>", clean_up_tokenization_spaces=False,
    )  # fmt: skip
    if special_tokens:  # one token each, never split into characters (special=False, as
        # Qwen's <think> and <tool_call>: they decode as text)
        from tokenizers import AddedToken

        added = [
            AddedToken(t, special=t in control_tokens, normalized=False) for t in special_tokens
        ]
        tokenizer.add_tokens(added)
    tokenizer.chat_template = template or (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )
    tokenizer.save_pretrained(dest)
    return Path(dest)


def export_tiny(
    arch: str,
    root: Path,
    *,
    with_tokenizer: bool = False,
    graph: str = "optimum",
    embeddings: bool = False,
) -> Path:
    """Build ``root/{arch}-hf`` and export it at fp32 with ortgen to ``root/{arch}-{graph}``.

    ``graph`` is the family: ``optimum`` (every arch) or ``fused`` (onnxruntime-genai's
    builder; llama and qwen2). fp32, so greedy decoding must equal transformers'. An
    existing export there is replaced, so use one ``root`` per variant. ``embeddings``:
    the graph also returns ``hidden_states`` (``ortgen export --embeddings``).
    """
    from ortgen.export import Variant, export_model

    root = Path(root)
    hf = build_tiny_hf(arch, root / f"{arch}-hf", with_tokenizer=with_tokenizer)
    out = root / (f"{arch}-onnx" if graph == "optimum" else f"{arch}-{graph}")
    variant = Variant(graph=graph, precision="fp32", embeddings=embeddings)
    return export_model(hf, out, variant=variant, progress=lambda _msg: None, overwrite=True)


def export_backbone(root: Path) -> Path:
    """A tiny llama exported as ``feature-extraction``: no logits output (a bad model).

    The folder looks finished (model.onnx, config.json, manifest) so that only a check
    of the graph itself can reject it.
    """
    return _export_bad(root, "llama-backbone", "feature-extraction")


def export_without_past(root: Path) -> Path:
    """A tiny llama exported as ``text-generation``: no past-KV inputs/outputs (bad)."""
    return _export_bad(root, "llama-nopast", "text-generation")


def _export_bad(root: Path, name: str, task: str) -> Path:
    """Export a tiny llama for ``task`` straight with optimum, then fake a manifest."""
    from optimum.exporters.onnx import main_export

    from ortgen.export.quiet import quiet

    root = Path(root)
    hf = root / "llama-hf"
    if not (hf / "config.json").is_file():
        build_tiny_hf("llama", hf)
    out = root / name
    with quiet():
        main_export(
            str(hf), output=out, task=task, framework="pt", library_name="transformers",
            do_validation=False, local_files_only=True,
        )  # fmt: skip
    if not (out / "model.onnx").is_file():
        raise RuntimeError(f"optimum wrote no model.onnx for task {task} into {out}")
    manifest = {
        "format": 1,
        "source": str(hf),
        "source_sha256": None,
        "task": "text-generation-with-past",  # a lie, so only the graph check can object
        "created": None,
        "tools": {},
        "files": sorted(p.name for p in out.iterdir() if p.is_file()),
    }
    (out / "ortgen_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def hf_greedy(hf: Any, prompt: list[int], new: int) -> list[int]:
    """transformers' own greedy continuation of ``prompt`` (EOS ignored): the reference
    the exported graphs are compared with token for token."""
    import torch

    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
            pad_token_id=PAD_ID,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def export_chat_family(
    root: Path,
    name: str,
    template: str,
    *,
    special_tokens: tuple[str, ...] = (),
    control_tokens: tuple[str, ...] | None = None,
    eos: str = "</s>",
    arch: str = "qwen2",
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """A tiny random ``arch`` model speaking one model family's chat format: the
    character tokenizer with ``special_tokens`` (``<|im_start|>``, ``<think>``, ...) as
    single tokens in the ``<extra_N>`` slots, ``template`` as its chat template, ``eos``
    (one of them, or ``</s>``) as its end of sequence, and a context of ``max_positions``
    (a family's tool prompt is long in characters). ``control_tokens`` (default: ``eos``)
    are special tokens, left out of decoded text. Exported at fp32 to
    ``root/name-onnx``; returns that folder. For the chat-format tests: only the
    grammar makes a random model's calls well-formed, which is what they check.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from ortgen.export import Variant, export_model

    root = Path(root)
    hf = root / f"{name}-hf"
    control = (eos,) if control_tokens is None else control_tokens
    tokenizer = save_tiny_tokenizer(
        hf, special_tokens=special_tokens, template=template, control_tokens=control
    )
    eos_id = _token_id(tokenizer, eos)
    config = _config(arch)
    config.max_position_embeddings = max_positions
    config.eos_token_id = eos_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(hf, safe_serialization=True)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=eos_id, pad_token_id=PAD_ID).save_pretrained(
        hf
    )
    out = root / f"{name}-onnx"
    variant = Variant(graph="optimum", precision="fp32")
    return export_model(hf, out, variant=variant, progress=lambda _msg: None, overwrite=True)


def _token_id(folder: Path, token: str) -> int:
    vocab = json.loads((Path(folder) / "tokenizer.json").read_text())["model"]["vocab"]
    return int(vocab[token])
