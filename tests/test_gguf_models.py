"""Tests of ``tests/gguf_models.py``: transformers' own GGUF loader accepts the tiny files.

transformers 4.57.6 (``from_pretrained(folder, gguf_file=name)``) is the independent
reference a GGUF -> ONNX builder is compared with, so for every arch, tied and untied, this
checks that it loads the file with the intended config and exactly the written weights, and
that the model is a fair test subject (greedy decoding runs, logits are spread). Files and
loaded models are built once per session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from tests.gguf_models import (
    ARCHS,
    SLIDING_WINDOW,
    VARIANTS,
    TinySpec,
    file_type,
    hf_reference_kwargs,
    hf_weights,
    llama3_rope_factors,
    tiny_spec,
    weight_qtype,
    write_tiny_gguf,
)
from tests.gguf_vocab import VOCAB_SIZE, tiny_vocab

#: (arch, tied, variant) the loader must accept; variants untied only (they differ in keys)
CASES = [
    (arch, tied, variant)
    for arch in ARCHS
    for variant in VARIANTS[arch]
    for tied in ((True, False) if variant is None else (False,))
    if variant != "mistral_name" and (tied or arch != "gemma2")
]
CASE_IDS = [f"{a}-{'tied' if t else 'untied'}{'-' + v if v else ''}" for a, t, v in CASES]
TEXT = "Hello world, the capital of France is Paris!"
Build = Callable[..., Path]  # the tiny_gguf fixture
Load = Callable[..., Any]  # the hf_model fixture

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_down": "mlp.down_proj",
}
_LLAMA_BLOCK = "attn_norm attn_q attn_k attn_v attn_output ffn_norm ffn_gate ffn_up ffn_down"
#: the per-block tensors (.weight unless a suffix is given) documented in gguf_models
BLOCK_TENSORS = {
    "llama": _LLAMA_BLOCK,
    "mistral": _LLAMA_BLOCK,
    "qwen2": _LLAMA_BLOCK + " attn_q.bias attn_k.bias attn_v.bias",
    "qwen3": _LLAMA_BLOCK + " attn_q_norm attn_k_norm",
    "gemma2": _LLAMA_BLOCK + " post_attention_norm post_ffw_norm",
    "gemma3": _LLAMA_BLOCK + " post_attention_norm post_ffw_norm attn_q_norm attn_k_norm",
    "phi3": "attn_norm attn_qkv attn_output ffn_norm ffn_up ffn_down",
}


def _hf_name(arch: str, name: str) -> str | None:
    """transformers' parameter for GGUF tensor ``name``, written out independently of the
    gguf-py name map both the writer and the loader use (None: no parameter)."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    if name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
        return None
    _, block, part, suffix = name.split(".")
    if part == "ffn_norm":
        hf = "pre_feedforward_layernorm" if arch.startswith("gemma") else "post_attention_layernorm"
    elif part == "ffn_up":
        hf = "mlp.gate_up_proj" if arch == "phi3" else "mlp.up_proj"
    else:
        hf = _BLOCK[part]
    return f"model.layers.{block}.{hf}.{suffix}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation (interleaved pairs -> halves, per head)."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny models run ~10x faster on one thread when the machine's cores are busy (measured:
    gemma3's 3 generations 0.8 s on 1 thread, 5-10 s on 2 with a load average of 6)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """Write (once per session) a tiny GGUF, each in its own folder, and return its path."""
    root = tmp_path_factory.mktemp("tiny-gguf")
    cache: dict[tuple[Any, ...], Path] = {}

    def build(
        arch: str,
        *,
        tied: bool = False,
        qtype: Q = Q.F32,
        variant: str | None = None,
        tokenizer: bool = True,
    ) -> Path:
        key = (arch, tied, qtype, variant, tokenizer)
        if key not in cache:
            folder = root / "-".join(
                str(part) for part in (arch, tied, qtype.name, variant, tokenizer)
            )
            cache[key] = write_tiny_gguf(
                folder / "model.gguf",
                arch,
                qtype=qtype,
                tied=tied,
                variant=variant,
                tokenizer=tokenizer,
            )
        return cache[key]

    return build


@pytest.fixture(scope="session")
def hf_model(tiny_gguf: Build) -> Load:
    """Load (once per session) a tiny GGUF with transformers' loader; ``reference=True`` adds
    :func:`hf_reference_kwargs`."""
    from transformers import AutoModelForCausalLM

    cache: dict[tuple[Any, ...], Any] = {}

    def load(
        arch: str,
        *,
        tied: bool = False,
        qtype: Q = Q.F32,
        variant: str | None = None,
        tokenizer: bool = True,
        reference: bool = False,
    ) -> Any:
        key = (arch, tied, qtype, variant, tokenizer, reference)
        if key not in cache:
            path = tiny_gguf(arch, tied=tied, qtype=qtype, variant=variant, tokenizer=tokenizer)
            spec = tiny_spec(arch, qtype=qtype, tied=tied, variant=variant)
            extra = hf_reference_kwargs(spec) if reference else {}
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **extra)
            cache[key] = model.eval()
        return cache[key]

    return load


@pytest.mark.parametrize(("arch", "tied", "variant"), CASES, ids=CASE_IDS)
def test_config_is_the_written_one(
    hf_model: Load, arch: str, tied: bool, variant: str | None
) -> None:
    spec = tiny_spec(arch, tied=tied, variant=variant)
    cfg = hf_model(arch, tied=tied, variant=variant).config
    assert cfg.model_type == spec.hf_model_type
    want = {
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "intermediate_size": spec.ffn,
        "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context,
        "tie_word_embeddings": tied,
    }
    assert {name: getattr(cfg, name) for name in want} == want
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert head_dim == spec.head_dim
    assert cfg.rms_norm_eps == pytest.approx(spec.eps, rel=1e-6)
    assert cfg.rope_theta == pytest.approx(spec.rope_theta or 10000.0)  # gemma2: both default
    # llama3_rope too: transformers drops Llama 3.1 scaling (see gguf_models' docstring)
    assert getattr(cfg, "rope_scaling", None) is None
    ids = tiny_vocab(arch).special_ids
    assert (cfg.bos_token_id, cfg.eos_token_id) == (ids["bos"], ids["eos"])
    if spec.gemma:  # keys transformers reads, and llama.cpp's hard-coded values it defaults to
        assert cfg.sliding_window == spec.sliding_window == SLIDING_WINDOW
        pattern = 2 if arch == "gemma2" else 6
        kinds = ("sliding_attention", "full_attention")
        assert cfg.layer_types == [kinds[(i + 1) % pattern == 0] for i in range(spec.layers)]
        assert cfg.query_pre_attn_scalar == spec.head_dim  # llama.cpp scales by 1/sqrt(head_dim)
        assert cfg.attn_logit_softcapping == spec.attn_softcap
        assert cfg.final_logit_softcapping == spec.final_softcap
    if arch == "gemma3":
        assert cfg.rope_local_base_freq == spec.rope_theta_swa
    if arch in ("qwen2", "qwen3", "phi3"):
        assert cfg.sliding_window is None  # phi3's file says 0, the converter's "no window"


@pytest.mark.parametrize(("arch", "tied", "variant"), CASES, ids=CASE_IDS)
def test_loaded_weights_are_the_file(
    tiny_gguf: Build, hf_model: Load, arch: str, tied: bool, variant: str | None
) -> None:
    spec = tiny_spec(arch, tied=tied, variant=variant)
    model = hf_model(arch, tied=tied, variant=variant)
    _check_weights(spec, tiny_gguf(arch, tied=tied, variant=variant), model)
    # F32: the file holds exactly the intended weights, which catches a missing q/k
    # permutation or Gemma's +1 (both undone by the loader, so invisible above)
    state = model.state_dict()
    for name, w in hf_weights(spec).items():
        np.testing.assert_allclose(state[name].numpy(), w, rtol=1e-6, atol=1e-6, err_msg=name)


def _check_weights(spec: TinySpec, path: Path, model: Any) -> None:
    """Every parameter equals the file's tensor, dequantised and with the loader's transform
    (q/k un-permuted for llama, norms - 1 for gemma), and none was left unloaded."""
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    loaded = set()
    for tensor in gguf.GGUFReader(path).tensors:
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        name = _hf_name(spec.arch, tensor.name)
        if name is None:
            continue
        if spec.permuted and tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            w = _unpermute(w, spec.heads if ".attn_q." in tensor.name else spec.kv_heads)
        if spec.gemma and tensor.name.endswith("norm.weight"):
            w = w - np.float32(1)
        np.testing.assert_array_equal(state[name], w, err_msg=tensor.name)
        loaded.add(name)
    # transformers leaves a parameter with no GGUF tensor at its random init, silently
    assert set(state) - loaded == ({"lm_head.weight"} if spec.tied else set())
    if spec.tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize(("arch", "tied", "variant"), CASES, ids=CASE_IDS)
def test_greedy_generate_and_spread_logits(
    hf_model: Load, arch: str, tied: bool, variant: str | None
) -> None:
    model = hf_model(arch, tied=tied, variant=variant)
    bos = tiny_vocab(arch).special_ids["bos"]
    gaps, spreads = [], []
    # each prompt plus 8 new tokens is longer than the sliding window (gemma)
    for prompt in ([bos, 50, 60, 70, 80, 90], [bos, 100, 7, 300, 12], [bos, *range(200, 206)]):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        assert out.sequences.shape == (1, len(prompt) + 8)
        assert int(out.sequences.max()) < VOCAB_SIZE
        logits = out.logits[0][0]  # raw, at the prompt's last position
        top2 = logits.topk(2).values
        gaps.append(float(top2[0] - top2[1]))
        spreads.append(float(logits.std()))
    assert min(gaps) > 1e-3, gaps  # no near-tie for a runtime's float error to flip
    assert min(spreads) > 1.0, spreads


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_loads(tiny_gguf: Build, arch: str) -> None:
    from transformers import AutoTokenizer

    path = tiny_gguf(arch, tied=arch == "gemma2")
    vocab = tiny_vocab(arch)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert tok.chat_template == vocab.chat_template
    special = (gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL)
    n_special = next(i for i, t in enumerate(vocab.token_types) if t not in special)
    for text in vocab.tokens[:n_special]:
        assert tok.convert_tokens_to_ids(text) == vocab.token_id(text)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert max(ids) < VOCAB_SIZE
    assert len(ids) < len(TEXT.replace(" ", "")) / 1.5  # real multi-character pieces
    # transformers' GGUFPhi3Converter sets no normalizer or pre-tokenizer, so "▁" never
    # matches and spaces are dropped (its bug; llama.cpp encodes them)
    assert tok.decode(ids) == (TEXT.replace(" ", "") if arch == "phi3" else TEXT)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "Hi" in chat


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0, Q.Q4_K], ids=lambda q: q.name)
def test_quantized_file_loads(tiny_gguf: Build, hf_model: Load, qtype: Q) -> None:
    spec = tiny_spec("llama", qtype=qtype)
    path = tiny_gguf("llama", qtype=qtype)
    model = hf_model("llama", qtype=qtype)
    for tensor in gguf.GGUFReader(path).tensors:  # norms F32, the rest as asked
        assert tensor.tensor_type == (Q.F32 if tensor.name.endswith("norm.weight") else qtype)
    _check_weights(spec, path, model)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([[0, 50, 60]]), max_new_tokens=8, min_new_tokens=8, do_sample=False
        )
    assert out.shape == (1, 11)


# 2-D weights within this relative RMS error of the intended ones: the type is really used
_MAX_ERROR = {
    Q.F16: 1e-3,
    Q.BF16: 1e-2,
    Q.Q8_0: 1e-2,
    Q.Q6_K: 0.03,
    Q.Q5_0: 0.06,
    Q.Q5_1: 0.06,
    Q.Q5_K: 0.06,
    Q.Q4_0: 0.12,
    Q.Q4_1: 0.12,
    Q.Q4_K: 0.12,
    Q.IQ4_NL: 0.12,
    Q.IQ4_XS: 0.12,
    Q.Q3_K: 0.25,
    Q.Q2_K: 0.5,
}


@pytest.mark.parametrize("qtype", list(_MAX_ERROR), ids=lambda q: q.name)
def test_every_writable_qtype(tmp_path: Path, qtype: Q) -> None:
    spec = tiny_spec("llama", qtype=qtype)
    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype=qtype))
    assert _field(reader, "general.file_type") == file_type(qtype)
    intended = dict(hf_weights(spec))
    for tensor in reader.tensors:
        if tensor.name.endswith("norm.weight"):
            assert tensor.tensor_type == Q.F32
            continue
        assert tensor.tensor_type == qtype, tensor.name
        w = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        name = _hf_name("llama", tensor.name)
        assert name is not None
        if tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            w = _unpermute(w, spec.heads if ".attn_q." in tensor.name else spec.kv_heads)
        ref = intended[name]
        error = float(np.sqrt(np.mean((w - ref) ** 2) / np.mean(ref**2)))
        assert 0 < error < _MAX_ERROR[qtype], (tensor.name, error)


def test_unwritable_qtype_raises_not_implemented(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError):
        write_tiny_gguf(tmp_path / "m.gguf", "llama", qtype=Q.IQ2_XXS)


def test_file_type() -> None:
    assert file_type(Q.F32) == gguf.LlamaFileType.ALL_F32
    assert file_type(Q.Q8_0) == gguf.LlamaFileType.MOSTLY_Q8_0
    assert file_type(Q.Q4_K) == gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert file_type(Q.IQ4_XS) == gguf.LlamaFileType.MOSTLY_IQ4_XS


def test_weight_qtype_falls_back_as_llama_quantize() -> None:
    assert weight_qtype(256, Q.Q4_K) == Q.Q4_K
    assert weight_qtype(64, Q.Q4_K) == Q.Q5_0
    assert weight_qtype(64, Q.Q5_K) == Q.Q5_1
    assert weight_qtype(64, Q.Q6_K) == Q.Q8_0
    assert weight_qtype(64, Q.Q2_K) == Q.IQ4_NL
    assert weight_qtype(64, Q.IQ4_XS) == Q.IQ4_NL
    assert weight_qtype(48, Q.Q4_K) == Q.F16  # Q5_0's 32-block does not fit either
    assert weight_qtype(48, Q.Q8_0) == Q.F16  # the converter's QuantError fallback


def test_llama3_rope_is_only_rope_freqs(tiny_gguf: Build, hf_model: Load) -> None:
    spec = tiny_spec("llama", variant="llama3_rope")
    reader = gguf.GGUFReader(tiny_gguf("llama", variant="llama3_rope"))
    assert not [k for k in reader.fields if k.startswith("llama.rope.scaling")]
    (freqs,) = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    factors = np.asarray(freqs.data)
    assert freqs.tensor_type == Q.F32 and factors.shape == (spec.head_dim // 2,)
    np.testing.assert_array_equal(factors, llama3_rope_factors(spec))
    assert factors[0] == 1 and factors[-1] == 8 and ((factors > 1) & (factors < 8)).any()
    # transformers loads plain RoPE; with the reference kwargs its llama3 frequencies are the
    # plain ones divided by the file's factors, as llama.cpp divides them
    plain = hf_model("llama", variant="llama3_rope").model.rotary_emb.inv_freq.numpy()
    ref = hf_model("llama", variant="llama3_rope", reference=True)
    assert ref.config.rope_scaling["rope_type"] == "llama3"
    np.testing.assert_allclose(ref.model.rotary_emb.inv_freq.numpy(), plain / factors, rtol=1e-6)


def test_mistral_is_llama_and_the_mistral_name_breaks_transformers(tiny_gguf: Build) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    reader = gguf.GGUFReader(tiny_gguf("mistral"))
    assert (_field(reader, "general.architecture"), _field(reader, "general.name")) == (
        "llama",
        "Tiny Mistral",
    )
    assert not [k for k in reader.fields if "sliding_window" in k]
    path = tiny_gguf("mistral", variant="mistral_name")
    assert AutoConfig.from_pretrained(path.parent, gguf_file=path.name).model_type == "mistral"
    with pytest.raises(NotImplementedError, match="Unknown gguf model_type: mistral"):
        AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    with pytest.raises(KeyError, match="mistral"):
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_without_tokenizer(tiny_gguf: Build, hf_model: Load) -> None:
    from transformers import AutoTokenizer

    path = tiny_gguf("llama", tokenizer=False)
    assert not [k for k in gguf.GGUFReader(path).fields if k.startswith("tokenizer.")]
    assert hf_model("llama", tokenizer=False).config.vocab_size == VOCAB_SIZE  # llama.vocab_size
    with pytest.raises(ValueError, match="tokens and scores"):
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_gemma2_cannot_be_untied(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="always tied"):
        write_tiny_gguf(tmp_path / "m.gguf", "gemma2", tied=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_names_and_keys(tiny_gguf: Build, arch: str) -> None:
    spec = tiny_spec(arch, tied=arch == "gemma2")
    reader = gguf.GGUFReader(tiny_gguf(arch, tied=arch == "gemma2"))
    names = {t.name for t in reader.tensors}
    block = {p if "." in p else f"{p}.weight" for p in BLOCK_TENSORS[arch].split()}
    expected = {
        "token_embd.weight",
        "output_norm.weight",
        *([] if spec.tied else ["output.weight"]),
    }
    expected |= {f"blk.{i}.{p}" for i in range(spec.layers) for p in block}
    assert names == expected
    keys = {k.removeprefix(f"{spec.gguf_arch}.") for k in reader.fields}
    assert _field(reader, "general.architecture") == spec.gguf_arch
    assert {
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.layer_norm_rms_epsilon",
    } <= keys
    assert ("attention.key_length" in keys) == (arch not in ("qwen2", "phi3"))
    assert ("rope.freq_base" in keys) == (arch != "gemma2")
    assert ("rope.dimension_count" in keys) == (arch in ("llama", "mistral", "phi3"))
    assert ("vocab_size" in keys) == (arch in ("llama", "mistral"))
    assert ("attention.sliding_window" in keys) == (arch in ("gemma2", "gemma3", "phi3"))
    assert (
        ("attn_logit_softcapping" in keys)
        == ("final_logit_softcapping" in keys)
        == (arch == "gemma2")
    )
    assert ("rope.freq_base_swa" in keys) == (arch == "gemma3")
    assert ("rope.scaling.original_context_length" in keys) == (arch == "phi3")
    if arch == "phi3":
        assert _field(reader, "phi3.attention.sliding_window") == 0


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf", "qwen2", seed=3).read_bytes()
    b = write_tiny_gguf(tmp_path / "b.gguf", "qwen2", seed=3).read_bytes()
    c = write_tiny_gguf(tmp_path / "c.gguf", "qwen2", seed=4).read_bytes()
    assert a == b != c
