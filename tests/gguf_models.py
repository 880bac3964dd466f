"""Tiny random-weight GGUF files, written the way llama.cpp's converter writes them.

Not a test module. :func:`write_tiny_gguf` writes a 0.5-5 MB GGUF (F32) for an architecture
with the metadata keys, tensor names and tensor transforms of llama.cpp's
``convert_hf_to_gguf.py`` (read on ggml-org/llama.cpp at 0024aa74; ``Class.method`` below
names where; hard-coded hyperparameters from ``llama_model::load_hparams`` in src/),
so transformers' own GGUF loader (``from_pretrained(folder, gguf_file=name)``) can serve as
an independent reference for a GGUF -> ONNX builder. ``tests/test_gguf_models.py`` checks
that the loader accepts every file and gets the intended config and weights.

Common to every file: ``general.architecture``, ``general.type = "model"``,
``general.name``, ``general.file_type`` (the ``LlamaFileType`` of ``qtype``),
``general.quantization_version``; then ``{arch}.block_count``, ``.context_length``,
``.embedding_length``, ``.feed_forward_length``, ``.attention.head_count``,
``.attention.head_count_kv``, ``.attention.layer_norm_rms_epsilon`` (all
``TextModel.set_gguf_parameters``) and the vocabulary (``tests/gguf_vocab.py``). Tensors:
``token_embd``, ``blk.N.attn_norm``, ``blk.N.attn_{q,k,v,output}``, ``blk.N.ffn_norm``,
``blk.N.ffn_{gate,up,down}``, ``output_norm``, and ``output`` unless tied (all ``.weight``).
1-D tensors and ``*_norm.weight`` stay F32 (``ModelBase.prepare_tensors``), every other
tensor is written in ``qtype``. Per architecture:

* ``llama``: + ``llama.rope.freq_base``, ``.attention.key_length``/``.value_length``,
  ``.vocab_size``, ``.rope.dimension_count`` (``LlamaModel.set_gguf_parameters``). q/k rows
  are permuted from HF's rotate-half layout to GGML's interleaved RoPE (``LlamaModel.permute``
  from ``modify_tensors``: q over its heads, k over its KV heads); transformers'
  ``LlamaTensorProcessor`` undoes it. Variant ``llama3_rope``: Llama 3.1 rope scaling is
  stored only as ``rope_freqs.weight`` (F32, head_dim/2 divisors of the rotary frequencies,
  ``LlamaModel.generate_extra_tensors``); ``TextModel.set_gguf_parameters`` writes no
  ``rope.scaling.*`` key for rope_type llama3 (the converter reads
  ``original_max_position_embeddings`` from the top level of config.json, default 8192).
  transformers 4.57.6 does not rebuild it: no rope-scaling key in ``GGUF_CONFIG_MAPPING``
  and ``rope_freqs`` maps to no parameter, so it loads plain RoPE (rope_scaling None); pass
  :func:`hf_reference_kwargs` to ``from_pretrained`` for the intended reference.
* ``mistral``: llama.cpp registers ``MistralForCausalLM`` on ``LlamaModel``: architecture
  ``llama``, keys, tensors and permutation as llama, and no sliding-window key (neither
  ``LlamaModel`` nor ``TextModel`` writes one; gguf 0.19 has no ``mistral`` arch, only
  ``mistral3``/``mistral4`` for the newer multimodal models), so Mistral v0.1's window is not
  in the file. transformers switches llama -> mistral only if ``"mistral" in model_name``,
  and model_name is the *list* ``read_field`` returns, so only for ``general.name ==
  "mistral"``; a real file ("Mistral 7B Instruct v0.3") loads as ``LlamaForCausalLM``, as
  this one (name "Tiny Mistral") does. Variant ``mistral_name`` writes that exact name: the
  model loads as ``MistralForCausalLM`` (sliding_window is MistralConfig's default 4096, not
  from the file) and AutoTokenizer fails (no "mistral" in ``GGUF_TO_FAST_CONVERTERS``).
* ``qwen2``: ``TextModel`` keys + ``rope.freq_base`` only (no key_length: Qwen2Config has no
  head_dim); + ``blk.N.attn_{q,k,v}.bias``; no permutation (NEOX RoPE).
* ``qwen3``: qwen2's keys + ``attention.key_length``/``value_length``; no biases, +
  ``blk.N.attn_{q,k}_norm`` [head_dim] (``Qwen3Model``). transformers maps no key_length for
  qwen3 (only qwen3_moe), so head_dim is Qwen3Config's default 128: the tiny model uses 128.
* ``gemma2``: ``Gemma2Model.set_gguf_parameters`` (not TextModel's): the common keys,
  ``key_length``/``value_length``, ``attn_logit_softcapping``, ``final_logit_softcapping``,
  ``attention.sliding_window``, no ``rope.freq_base`` (llama.cpp's default 10000). Tensors +
  ``blk.N.post_attention_norm``, ``blk.N.ffn_norm`` (HF pre_feedforward_layernorm),
  ``blk.N.post_ffw_norm``; never ``output`` (``modify_tensors`` drops lm_head and
  ``MODEL_TENSORS[GEMMA2]`` has no OUTPUT), so ``tied=False`` raises. Norms are stored +1
  (HF's Gemma RMSNorm scales by 1 + w; transformers' ``Gemma2TensorProcessor`` subtracts 1).
  llama.cpp hard-codes the local/global pattern (2: even layers local) and the attention
  scale 1/sqrt(head_dim) except for 27B (``load_hparams``, LLM_ARCH_GEMMA2). transformers
  reads the window and head_dim but not the softcaps (Gemma2Config defaults 50/30, which the
  file holds) nor query_pre_attn_scalar (default 256, hence head_dim 256 here).
* ``gemma3``: ``Gemma3Model.set_gguf_parameters``: TextModel's keys, ``rope.freq_base``
  (global), ``rope.freq_base_swa`` (local), ``key_length``/``value_length``,
  ``attention.sliding_window``; no softcap (Gemma 3 has none) and no rope scaling (the 1B
  style; 4B+ add linear factor 8, which transformers would drop). Tensors as gemma2 +
  ``blk.N.attn_{q,k}_norm``, norms +1 (``norm_shift``), and ``output`` may be present. No
  pattern key: llama.cpp hard-codes pattern 6 and local base 10000 (LLM_ARCH_GEMMA3), as do
  transformers' Gemma3TextConfig defaults (it reads neither), so the model has 6 layers.
* ``phi3``: ``Phi3MiniModel.set_gguf_parameters``: the common keys,
  ``rope.scaling.original_context_length``, ``rope.dimension_count``, ``rope.freq_base``,
  ``attention.sliding_window`` (0, the converter's "no window"). HF's fused tensors are
  copied: ``blk.N.attn_qkv`` ([q; k; v] rows) and ``blk.N.ffn_up`` = gate_up_proj ([gate; up]
  rows, 2 x ffn), no ``ffn_gate``; no permutation. transformers reads no window (None).
  Variant ``longrope`` (Phi-3 128k, Phi-3.5, Phi-4-mini): LongRoPE as
  ``Phi3MiniModel.generate_extra_tensors`` writes it, ``rope_factors_long.weight`` and
  ``rope_factors_short.weight`` (F32, head_dim/2 each) and ``rope.scaling.attn_factor``
  (sqrt(1 + ln(context/original) / ln(original))), with ``original_context_length`` 16 <
  context 128. transformers maps none of them (no rope-scaling key in
  ``GGUF_CONFIG_MAPPING["phi3"]``, the tensors to no parameter) and loads plain RoPE;
  :func:`hf_reference_kwargs` gives it back (``rope_scaling`` with exactly Phi3Config's three
  fields, and ``original_max_position_embeddings``).

Dimensions: hidden 64, ffn 128, 4 query heads over 2 KV heads, head_dim 16 (qwen3 128,
gemma 256, see above), 2 layers (gemma3 6), context 128, vocabulary 384, sliding window 8 (so
a prompt plus 8 new tokens crosses it). K-quants and IQ types need rows of a multiple of 256
(QK_K), so for those ``qtype`` the model is wider (hidden 256, ffn 256, head_dim 64 where it
was 16) and no tensor needs a fallback; a tensor whose row length still does not fit the
block falls back as llama-quantize does (:func:`weight_qtype`). Weights are drawn in HF
layout and meaning (:func:`hf_weights`), deterministic per seed: matrices, embeddings and
biases N(0, 0.5) (as ``tests/tiny_models.py``: a small std gives near-tied logits; the wide
models 0.5 * sqrt(64 / hidden), see :func:`hf_weights`), norms gain + N(0, 0.2) with gain 1
except where :func:`hf_weights` says why not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, QK_K
from gguf import GGMLQuantizationType as Q

from tests.gguf_vocab import VOCAB_SIZE, tiny_vocab, write_vocab

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
VARIANTS: dict[str, tuple[str | None, ...]] = {
    "llama": (None, "llama3_rope"),
    "mistral": (None, "mistral_name"),
    **{arch: (None,) for arch in ("qwen2", "qwen3", "gemma2", "gemma3")},
    "phi3": (None, "longrope"),
}
CONTEXT = 128
SLIDING_WINDOW = 8
INIT_STD = 0.5
NARROW_HIDDEN = 64  # hidden size of the F32 / legacy-type models; INIT_STD is for it
NORM_STD = 0.2

#: what gguf.quants.quantize writes itself; other types go to tests/gguf_quantizers.py
GGUF_PY_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0})
#: llama-quantize's fallback for a row that does not fit the block (src/llama-quant.cpp)
FALLBACK = {
    Q.TQ1_0: Q.Q4_0, Q.TQ2_0: Q.Q4_0,
    **dict.fromkeys((Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.Q2_K,
                     Q.Q3_K, Q.IQ4_XS), Q.IQ4_NL),
    Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0,
}  # fmt: skip
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _longrope(head_dim: int) -> dict[str, Any]:
    """Phi-3's LongRoPE (HF rope_scaling plus the top-level original context, kept here):
    per-pair divisors rising with the dimension, the short ones near 1 (float32 values)."""
    pairs = head_dim // 2
    return {
        "type": "longrope",
        "short_factor": np.linspace(1.0, 1.5, pairs, dtype=np.float32).tolist(),
        "long_factor": np.linspace(1.0, 6.0, pairs, dtype=np.float32).tolist(),
        "original_max_position_embeddings": 16,
    }


_GGUF_ARCH = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}


@dataclass(frozen=True)
class TinySpec:
    """Everything a tiny file is built from, and what a loader should make of it."""

    arch: str
    variant: str | None
    gguf_arch: str  # general.architecture
    name: str  # general.name
    hf_model_type: str  # the model_type transformers 4.57.6's loader gives the file
    qtype: Q
    tied: bool
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context: int
    eps: float
    rope_theta: float | None  # None: no key written (gemma2: llama.cpp's default 10000)
    rope_theta_swa: float | None = None
    sliding_window: int | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # HF rope_scaling (+ original_max_position_embeddings); the file holds rope_freqs or
    # rope_factors_long/short
    rope_scaling: dict[str, Any] | None = None

    @property
    def gemma(self) -> bool:
        return self.arch in ("gemma2", "gemma3")

    @property
    def permuted(self) -> bool:
        """q/k rows stored permuted (llama.cpp's LlamaModel)."""
        return self.gguf_arch == "llama"

    @property
    def writes_key_length(self) -> bool:
        """Whether the converter writes attention.key_length/value_length."""
        return self.arch not in ("qwen2", "phi3")


def tiny_spec(
    arch: str, *, qtype: Q = Q.F32, tied: bool = False, variant: str | None = None
) -> TinySpec:
    """The spec :func:`write_tiny_gguf` writes for these arguments (see the module doc)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny GGUF arch {arch!r}; choose one of {ARCHS}")
    if variant not in VARIANTS[arch]:
        raise ValueError(f"{arch} has no variant {variant!r}; choose one of {VARIANTS[arch]}")
    if arch == "gemma2" and not tied:
        raise ValueError(
            "gemma2 GGUFs are always tied: llama.cpp's Gemma2Model drops lm_head and its "
            "tensor list has no output.weight, so transformers would leave lm_head random"
        )
    wide = GGML_QUANT_SIZES[qtype][0] == QK_K
    hidden, ffn = (256, 256) if wide else (64, 128)
    mistral_name = "mistral" if variant == "mistral_name" else "Tiny Mistral"
    per_arch: dict[str, dict[str, Any]] = {
        "llama": {"eps": 1e-5, "rope_theta": 500000.0 if variant else 10000.0},
        "mistral": {"eps": 1e-5, "rope_theta": 1e6, "name": mistral_name, "gguf_arch": "llama",
                    "hf_model_type": "mistral" if variant else "llama"},
        "qwen2": {"eps": 1e-6, "rope_theta": 1e6},
        "qwen3": {"eps": 1e-6, "rope_theta": 1e6, "head_dim": 128},
        "gemma2": {"eps": 1e-6, "rope_theta": None, "head_dim": 256, "attn_softcap": 50.0,
                   "final_softcap": 30.0, "sliding_window": SLIDING_WINDOW},
        "gemma3": {"eps": 1e-6, "rope_theta": 1e6, "rope_theta_swa": 10000.0, "head_dim": 256,
                   "layers": 6, "sliding_window": SLIDING_WINDOW, "hf_model_type": "gemma3_text"},
        "phi3": {"eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 0},
    }  # fmt: skip
    fields: dict[str, Any] = {
        "gguf_arch": arch, "name": f"Tiny {arch}", "hf_model_type": arch, "layers": 2,
        "head_dim": hidden // 4, **per_arch[arch],
    }  # fmt: skip
    scaling = {
        "llama3_rope": _LLAMA3_ROPE, "longrope": _longrope(fields["head_dim"])
    }.get(variant or "")  # fmt: skip
    return TinySpec(
        arch=arch, variant=variant, qtype=qtype, tied=tied, hidden=hidden, heads=4, kv_heads=2,
        ffn=ffn, vocab=VOCAB_SIZE, context=CONTEXT,
        rope_scaling=dict(scaling) if scaling else None, **fields,
    )  # fmt: skip


def hf_reference_kwargs(spec: TinySpec) -> dict[str, Any]:
    """Extra ``from_pretrained`` kwargs for a transformers reference faithful to the file: the
    settings transformers 4.57.6's GGUF loader drops (Llama 3.1 and Phi-3 rope scaling), and eager
    attention where the file soft-caps attention scores (gemma2): the loader's default, SDPA,
    silently skips ``attn_logit_softcapping`` (measured: logits 1.9 apart from eager's)."""
    kwargs: dict[str, Any] = {}
    if spec.rope_scaling:
        kwargs["rope_scaling"] = dict(spec.rope_scaling)
    if spec.rope_scaling and spec.rope_scaling.get("type") == "longrope":
        # Phi3Config takes the original context at the top level, and exactly three fields
        original = kwargs["rope_scaling"].pop("original_max_position_embeddings")
        kwargs["original_max_position_embeddings"] = original
    if spec.attn_softcap:
        kwargs["attn_implementation"] = "eager"
    return kwargs


def hf_weights(spec: TinySpec, seed: int = 0) -> dict[str, np.ndarray]:
    """The intended weights in transformers' names, layouts and meaning (float32), drawn from
    a generator seeded by (seed, arch) so two archs never make the same function.

    Norm gains above 1 where unit gains make a random model degenerate (measured: greedy
    decoding then repeats the previous token in 12-48 of 48 steps, against 0-4 with these):
    q/k norms (qwen3, gemma3) give q and k unit RMS, so q.k/sqrt(head_dim) is ~N(0, 1) and
    attention is near uniform; gain 2.5 sharpens it. Gemma multiplies the input embedding by
    sqrt(hidden) while each sublayer's output is RMS-normed to ~1, so the token's own
    embedding dominates the residual and, through the tied head, its own logit: gemma gets
    embeddings of std 1/sqrt(hidden) (input RMS 1), post-sublayer norm gains 8 and a final
    norm gain 4 (which also keeps the tied head's logits spread); an untied Gemma head is
    drawn like the embedding, so its logits spread as the tied head's (std ~4, not ~16).

    The wide models (K-quant and IQ types: hidden 256) draw matrices with std
    INIT_STD * sqrt(64 / hidden), so every activation, attention score and logit has the
    narrow models' scale. At INIT_STD itself their attention scores have std ~64 and logits
    ~8: transformers' own float32 logits then differ from float64 by up to 9e-4 (measured),
    which leaves no room to compare a runtime at 1e-3; scaled, 1e-4 (the narrow models').
    Logit errors of float32 arithmetic scale with the logits, so the untied Gemma head is
    scaled for the same reason.
    """
    rng = np.random.default_rng([seed, ARCHS.index(spec.arch)])

    def mat(
        *shape: int, std: float = INIT_STD * math.sqrt(NARROW_HIDDEN / spec.hidden)
    ) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n: int, gain: float = 1.0) -> np.ndarray:
        w = gain + rng.standard_normal(n) * NORM_STD
        return (w - 1.0 if spec.gemma else w).astype(np.float32)  # Gemma's RMSNorm: 1 + w

    h, hd = spec.hidden, spec.head_dim
    q_rows, kv_rows = spec.heads * hd, spec.kv_heads * hd
    post_gain = 8.0 if spec.gemma else 1.0
    emb_std = 1 / math.sqrt(h) if spec.gemma else INIT_STD * math.sqrt(NARROW_HIDDEN / h)
    out = {"model.embed_tokens.weight": mat(spec.vocab, h, std=emb_std)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(h)
        if spec.arch == "phi3":
            out[p + "self_attn.qkv_proj.weight"] = mat(q_rows + 2 * kv_rows, h)
        else:
            for proj, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
                out[p + f"self_attn.{proj}_proj.weight"] = mat(rows, h)
        if spec.arch == "qwen2":
            for proj, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
                out[p + f"self_attn.{proj}_proj.bias"] = mat(rows)
        out[p + "self_attn.o_proj.weight"] = mat(h, q_rows)
        if spec.arch in ("qwen3", "gemma3"):
            out[p + "self_attn.q_norm.weight"] = norm(hd, 2.5)
            out[p + "self_attn.k_norm.weight"] = norm(hd, 2.5)
        out[p + "post_attention_layernorm.weight"] = norm(h, post_gain)
        if spec.gemma:
            out[p + "pre_feedforward_layernorm.weight"] = norm(h)
            out[p + "post_feedforward_layernorm.weight"] = norm(h, post_gain)
        if spec.arch == "phi3":
            out[p + "mlp.gate_up_proj.weight"] = mat(2 * spec.ffn, h)
        else:
            out[p + "mlp.gate_proj.weight"] = mat(spec.ffn, h)
            out[p + "mlp.up_proj.weight"] = mat(spec.ffn, h)
        out[p + "mlp.down_proj.weight"] = mat(h, spec.ffn)
    out["model.norm.weight"] = norm(h, 4.0 if spec.gemma else 1.0)
    if not spec.tied:
        out["lm_head.weight"] = mat(spec.vocab, h, std=emb_std)
    return out


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: per head, rows (first half, second half) ->
    interleaved pairs, the layout GGML's non-NEOX RoPE rotates."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama3_rope_factors(spec: TinySpec) -> np.ndarray:
    """``rope_freqs.weight`` as ``LlamaModel.generate_extra_tensors`` computes it."""
    assert spec.rope_scaling is not None and spec.rope_theta is not None
    rs, dim = spec.rope_scaling, spec.head_dim
    freqs = 1.0 / (spec.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    old_ctx = rs["original_max_position_embeddings"]
    low_wavelen = old_ctx / rs["low_freq_factor"]
    high_wavelen = old_ctx / rs["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(rs["factor"])
        else:
            smooth = (old_ctx / wavelen - rs["low_freq_factor"]) / (
                rs["high_freq_factor"] - rs["low_freq_factor"]
            )
            factors.append(1 / ((1 - smooth) / rs["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def gguf_tensors(spec: TinySpec, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """The float32 tensors (GGUF names, llama.cpp's transforms) before quantisation."""
    if spec.rope_scaling is not None and spec.arch == "phi3":  # generate_extra_tensors first
        for kind in ("long", "short"):
            yield (
                f"rope_factors_{kind}.weight",
                np.array(spec.rope_scaling[f"{kind}_factor"], np.float32),
            )
    elif spec.rope_scaling is not None:
        yield "rope_freqs.weight", llama3_rope_factors(spec)
    name_map = gguf.get_tensor_name_map(_GGUF_ARCH[spec.gguf_arch], spec.layers)
    for hf_name, w in hf_weights(spec, seed).items():
        if spec.permuted and hf_name.endswith("q_proj.weight"):
            w = llama_permute(w, spec.heads)
        elif spec.permuted and hf_name.endswith("k_proj.weight"):
            w = llama_permute(w, spec.kv_heads)
        if spec.gemma and hf_name.endswith("norm.weight"):
            w = w + np.float32(1.0)
        base, suffix = hf_name.rsplit(".", 1)
        name = name_map.get_name(base)
        if name is None:
            raise KeyError(f"{spec.gguf_arch} has no GGUF name for {hf_name}")
        yield f"{name}.{suffix}", w


def weight_qtype(row_len: int, qtype: Q) -> Q:
    """The type a 2-D tensor with rows of ``row_len`` is written in when ``qtype`` is asked
    for: ``qtype`` if the row fits its block, else llama-quantize's fallback
    (``llama_tensor_get_type`` in src/llama-quant.cpp: K-quants to a legacy type, IQ types and
    Q2_K/Q3_K to IQ4_NL, TQ to Q4_0) and F16 if that does not fit either (also the
    converter's fallback for a type without one, on gguf.QuantError)."""
    if row_len % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    fallback = FALLBACK.get(qtype, Q.F16)
    return fallback if row_len % GGML_QUANT_SIZES[fallback][0] == 0 else Q.F16


def quantize(rows: np.ndarray, qtype: Q) -> np.ndarray:
    """Raw data of ``rows`` (float32 (..., K)) in ``qtype``, as ``GGUFWriter.add_tensor``
    takes it with ``raw_dtype=qtype``. gguf-py writes the legacy and float types; the others
    come from ``tests/gguf_quantizers.py``, and raise NotImplementedError if it is missing."""
    if qtype in GGUF_PY_TYPES:
        return gguf.quants.quantize(rows, qtype)
    try:
        from tests.gguf_quantizers import quantize as external_quantize
    except ModuleNotFoundError as exc:
        if exc.name != "tests.gguf_quantizers":
            raise
        raise NotImplementedError(f"writing {qtype.name} needs tests/gguf_quantizers.py") from exc
    return external_quantize(rows, qtype)


def encode_tensor(name: str, w: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """(data, type) ``name`` is written with: 1-D tensors and norms F32, others in
    :func:`weight_qtype`."""
    if w.ndim <= 1 or name.endswith("_norm.weight"):
        return np.asarray(w, dtype=np.float32), Q.F32
    wtype = weight_qtype(w.shape[-1], qtype)
    return quantize(w, wtype), wtype


def file_type(qtype: Q) -> gguf.LlamaFileType:
    """``general.file_type`` for a file mostly in ``qtype`` (K-quants: the _M mixes)."""
    if qtype == Q.F32:
        return gguf.LlamaFileType.ALL_F32
    for name in (f"MOSTLY_{qtype.name}", f"MOSTLY_{qtype.name}_M", f"MOSTLY_{qtype.name}_MOE"):
        if name in gguf.LlamaFileType.__members__:
            return gguf.LlamaFileType[name]
    return gguf.LlamaFileType.GUESSED


def _write_model_keys(w: gguf.GGUFWriter, spec: TinySpec) -> None:
    """The general.* and {arch}.* keys the converter writes for ``spec.arch``."""
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(spec.name)
    if spec.arch == "phi3":  # Phi3MiniModel.set_gguf_parameters
        w.add_context_length(spec.context)
        original = (spec.rope_scaling or {}).get("original_max_position_embeddings")
        w.add_rope_scaling_orig_ctx_len(original or spec.context)
        if original:  # generate_extra_tensors' attention factor for longrope
            w.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(spec.context / original) / math.log(original))
            )
    else:
        w.add_block_count(spec.layers)
        w.add_context_length(spec.context)
    w.add_embedding_length(spec.hidden)
    w.add_feed_forward_length(spec.ffn)
    if spec.arch == "phi3":
        w.add_block_count(spec.layers)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    if spec.rope_theta is not None and spec.arch != "phi3":
        w.add_rope_freq_base(spec.rope_theta)
    if spec.rope_theta_swa is not None:
        w.add_rope_freq_base_swa(spec.rope_theta_swa)
    w.add_layer_norm_rms_eps(spec.eps)
    if spec.writes_key_length:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    if spec.arch == "phi3":
        w.add_rope_dimension_count(spec.head_dim)
        assert spec.rope_theta is not None
        w.add_rope_freq_base(spec.rope_theta)
    w.add_file_type(file_type(spec.qtype))
    if spec.gguf_arch == "llama":  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(spec.vocab)
        w.add_rope_dimension_count(spec.head_dim)
    if spec.attn_softcap is not None:
        w.add_attn_logit_softcapping(spec.attn_softcap)
    if spec.final_softcap is not None:
        w.add_final_logit_softcapping(spec.final_softcap)
    if spec.sliding_window is not None:
        w.add_sliding_window(spec.sliding_window)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_tiny_gguf(
    path: str | Path,
    arch: str,
    *,
    qtype: Q = Q.F32,
    tied: bool = False,
    seed: int = 0,
    tokenizer: bool = True,
    variant: str | None = None,
    types: Mapping[str, Q] | None = None,
) -> Path:
    """Write a tiny random ``arch`` GGUF to ``path`` (a file name) and return the path.

    ``qtype``: the type of the 2-D weights (any GGML type; see :func:`weight_qtype` and
    :func:`quantize`). ``tied``: no ``output.weight`` (gemma2 must be tied). ``tokenizer``:
    False writes no ``tokenizer.*`` key at all, for "GGUF without a tokenizer" errors.
    ``variant``: one of :data:`VARIANTS` ``[arch]``. ``types``: per-tensor types, as
    llama-quantize's mixes write them (Q4_K_M: ``attn_v`` and ``ffn_down`` in Q6_K): a 2-D
    tensor with a key among its name's dotted parts (``"attn_v"``, ``"output"``) is written
    in that type instead of ``qtype`` (with the same fallback). Same arguments, same bytes.
    """
    spec = tiny_spec(arch, qtype=qtype, tied=tied, variant=variant)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, arch=spec.gguf_arch)
    _write_model_keys(writer, spec)
    if tokenizer:
        write_vocab(writer, tiny_vocab(arch))
    for name, w in gguf_tensors(spec, seed):
        wanted = next((t for key, t in (types or {}).items() if key in name.split(".")), None)
        data, wtype = encode_tensor(name, w, wanted or spec.qtype)
        writer.add_tensor(name, data, raw_dtype=wtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
