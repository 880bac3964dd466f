"""The fused graph family (onnxruntime-genai's builder) and the static cache, against transformers.

Tiny random Llama and Qwen2 models are exported at fp32 by the builder: greedy decoding
must equal transformers' PyTorch ``generate`` token for token, alone, in padded batches
(prefilled row by row), in chunks, and with both caches. On optimum graphs the static
cache must give exactly what the dynamic cache gives.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ortgen
from ortgen import InputError
from tests.tiny_models import EOS_ID, hf_greedy

FUSED_ARCHS = ("llama", "qwen2")
PROMPTS = [[1, 5, 9, 33, 70, 12], [1, 44, 3], [1, 100, 101, 102, 103, 104, 105, 106, 107]]
NEW = 12


@pytest.fixture(scope="module", params=FUSED_ARCHS)
def fused(request: pytest.FixtureRequest, fused_model_dirs):
    """(arch, transformers model, ortgen generator) for a fused fp32 export."""
    from transformers import AutoModelForCausalLM

    arch = request.param
    hf_dir, out = fused_model_dirs[arch]
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    return arch, hf, ortgen.load(out, threads=1)


def _hf_greedy(hf, prompt: list[int], new: int = NEW) -> list[int]:
    return hf_greedy(hf, prompt, new)


def test_fused_export_is_a_shared_buffer_graph_without_position_ids(fused) -> None:
    _arch, _hf, gen = fused
    signature = gen.model.signature
    assert signature.kv_layout == "shared" and signature.shared_kv
    assert not signature.has_position_ids
    files = {p.name for p in gen.path.iterdir()}
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "config.json"} <= files
    manifest = json.loads((gen.path / "ortgen_manifest.json").read_text())
    assert manifest["variant"]["graph"] == "fused"


def test_fused_prefill_returns_only_the_last_position(fused) -> None:
    """The LM head is pruned: a 6-token prefill gives (1, 1, V) logits, not (1, 6, V)."""
    _arch, _hf, gen = fused
    state = gen.start(PROMPTS[0], max_new_tokens=1)
    cache = state.chain.cache
    ids = np.asarray([PROMPTS[0]], dtype=np.int64)
    mask = np.ones_like(ids)
    logits, _ = gen.model.forward(ids, mask, None, cache.inputs(), cache.outputs(ids.shape[1]))
    assert logits.shape == (1, 1, gen.model.signature.vocab_size)


def test_fused_graph_gives_the_last_logits_to_keep_positions(fused) -> None:
    """``logits_to_keep`` (as Hugging Face's): K + 1 positions of logits in one forward,
    what verifying K drafted tokens needs; each equals transformers' at that position."""
    import torch

    _arch, hf, gen = fused
    assert gen.model.signature.keeps_logits
    prompt = PROMPTS[2]
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0].numpy()
    for keep in (1, 4, len(prompt)):
        state = gen.start(prompt, max_new_tokens=1)
        cache = state.chain.cache
        ids = np.asarray([prompt], dtype=np.int64)
        logits, _ = gen.model.forward(
            ids, np.ones_like(ids), None, cache.inputs(), cache.outputs(ids.shape[1]), keep=keep
        )
        assert logits.shape == (1, keep, gen.model.signature.vocab_size)
        np.testing.assert_allclose(logits[0], want[-keep:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_fused_greedy_equals_transformers_alone(fused, cache: str) -> None:
    _arch, hf, gen = fused
    for prompt in PROMPTS:
        out = gen.generate(prompt, max_new_tokens=NEW, eos_token_id=None, cache={"name": cache})
        assert out.tokens[0] == _hf_greedy(hf, prompt)


@pytest.mark.parametrize("chunk", [256, 2, 5])
def test_fused_padded_batch_equals_each_prompt_alone(fused, chunk: int) -> None:
    """Rows of different lengths are prefilled row by row (also in chunks) into one buffer."""
    _arch, hf, gen = fused
    state = gen.start(PROMPTS, max_new_tokens=NEW, eos_token_id=None)
    state.prefill_chunk = chunk
    while not state.is_done:
        state.step()
    for row, prompt in enumerate(PROMPTS):
        assert state.generated(row) == _hf_greedy(hf, prompt)


def test_fused_rows_finish_at_their_own_eos(fused) -> None:
    _arch, hf, gen = fused
    eos = {row: _hf_greedy(hf, p)[3] for row, p in enumerate(PROMPTS)}  # the 4th token of each
    out = gen.generate(PROMPTS, max_new_tokens=NEW, eos_token_id=[eos[0], eos[1], eos[2]])
    for row, prompt in enumerate(PROMPTS):
        ref = _hf_greedy(hf, prompt)
        stop = next(i for i, t in enumerate(ref) if t in eos.values())
        assert out.tokens[row] == ref[: stop + 1]
        assert out.finish_reasons[row] == "eos"


def test_fused_dynamic_cache_refuses_a_padded_batch_clearly(fused) -> None:
    _arch, _hf, gen = fused
    with pytest.raises(InputError, match=r"cannot hold prompts of different lengths.*static"):
        gen.generate(PROMPTS, max_new_tokens=2, cache={"name": "dynamic"})


def test_fused_chat_continuation_grows_the_static_cache(fused) -> None:
    """A continued conversation feeds several tokens on top of the cache; past the first
    turn's capacity the static cache grows, and the result equals one long prompt."""
    _arch, hf, gen = fused
    first = gen.start(PROMPTS[0], max_new_tokens=3, eos_token_id=None)
    while not first.is_done:
        first.step()
    capacity_before = first.chain.cache.nbytes
    held = first.sequences[0].tolist()
    follow_up = [*held, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    state = gen.next_turn(first, follow_up, max_new_tokens=8, eos_token_id=None)
    assert state is first  # the cache was reused
    while not state.is_done:
        state.step()
    assert state.chain.cache.nbytes > capacity_before
    assert state.generated(0) == _hf_greedy(hf, follow_up, 8)


def test_fused_rewind_then_continue(fused) -> None:
    _arch, hf, gen = fused
    state = gen.start(PROMPTS[2], max_new_tokens=6, eos_token_id=None)
    while not state.is_done:
        state.step()
    state.rewind(3)
    state.append([[7]])
    state.step()
    kept = state.sequences[0].tolist()
    assert kept[-1] == _hf_greedy(hf, kept[:-1], 1)[0]


def test_a_builder_folder_from_elsewhere_loads(fused, tmp_path: Path) -> None:
    """A folder as onnxruntime-genai's builder writes it (genai_config.json, no config.json,
    no ortgen manifest) loads: ids, context length and the shared buffer come from it."""
    _arch, hf, gen = fused
    folder = tmp_path / "genai"
    folder.mkdir()
    for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
        shutil.copyfile(gen.path / name, folder / name)
    other = ortgen.load(folder, threads=1)
    assert other.model.signature.shared_kv
    assert (
        other.model.max_context
        == json.loads((folder / "genai_config.json").read_text())["model"]["context_length"]
    )
    out = other.generate(PROMPTS, max_new_tokens=NEW, eos_token_id=None)
    assert out.tokens == [_hf_greedy(hf, p) for p in PROMPTS]
    assert other.resolve_config().config.eos_token_ids == (EOS_ID,)
    # the CLI's config report takes the folder too (it asked for a config.json before)
    shown = subprocess.run(
        [sys.executable, "-m", "ortgen.cli", "config", "show", "-m", str(folder), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["eos_token_id"] == {
        "value": EOS_ID,
        "set_by": "model config.json",
    }


# --------------------------------------------------------------- static cache, optimum graphs


def test_static_equals_dynamic_on_optimum_graphs(tiny_model_dirs, tiny_arch: str) -> None:
    """Ping-pong buffers on Concat-style graphs: same tokens as the dynamic cache, in a
    padded batch, with chunked prefill, after a rewind and a continuation."""
    _hf_dir, onnx_dir = tiny_model_dirs[tiny_arch]
    gen = ortgen.load(onnx_dir, threads=1)
    assert gen.model.signature.kv_layout == "concat"
    results = {}
    for cache in ("static", "dynamic"):
        state = gen.start(PROMPTS, max_new_tokens=NEW, eos_token_id=None, cache={"name": cache})
        state.prefill_chunk = 4
        while not state.is_done:
            state.step()
        state.rewind(5)
        state.append([[9, 8]] * len(PROMPTS))  # 3 positions left to generate
        steps = []
        while not state.is_done:
            steps.append(state.step().ids.tolist())
        results[cache] = ([state.generated(r) for r in range(len(PROMPTS))], steps)
        assert state.chain.cache_name == cache
    assert results["static"] == results["dynamic"]


def test_the_default_cache_follows_the_graph(fused, tiny_model_dirs) -> None:
    """static on shared-buffer graphs (what makes them fast), dynamic on Concat graphs
    (their presents are new tensors anyway); a named cache overrides either."""
    _arch, _hf, fused_gen = fused
    assert fused_gen.start(PROMPTS, max_new_tokens=2).chain.cache_name == "static"
    concat_gen = ortgen.load(tiny_model_dirs["llama"][1], threads=1)
    assert concat_gen.start(PROMPTS, max_new_tokens=2).chain.cache_name == "dynamic"
    chosen = concat_gen.start(PROMPTS, max_new_tokens=2, cache="static")
    assert chosen.chain.cache_name == "static"


def test_static_cache_reports_its_reserved_bytes(fused, tiny_model_dirs) -> None:
    for gen, halves in ((fused[2], 1), (ortgen.load(tiny_model_dirs["llama"][1]), 2)):
        state = gen.start(PROMPTS, max_new_tokens=4, cache="static")
        signature = gen.model.signature
        per_position = 2 * signature.num_layers * signature.num_kv_heads * signature.head_dim * 4
        max_length = state.ids.shape[1]  # the capacity: the request's max_length
        # shared graphs hold one buffer per tensor; concat graphs two halves (ping-pong)
        assert state.chain.cache.nbytes == halves * len(PROMPTS) * max_length * per_position


def test_a_builder_folder_with_a_symbolic_head_size_loads(fused, tmp_path: Path) -> None:
    """onnxruntime-genai 0.18's builder names the head size ('kv_cache_dim') instead of
    fixing it in the graph; its genai_config.json has the number, and ortgen reads it."""
    import onnx

    _arch, hf, gen = fused
    folder = tmp_path / "genai018"
    folder.mkdir()
    model = onnx.load(str(gen.path / "model.onnx"), load_external_data=False)
    for value in [*model.graph.input, *model.graph.output]:
        if value.name.startswith(("past_key_values.", "present.")):
            value.type.tensor_type.shape.dim[3].dim_param = "kv_cache_dim"
    onnx.save(model, str(folder / "model.onnx"))
    for name in ("model.onnx.data", "genai_config.json"):
        shutil.copyfile(gen.path / name, folder / name)
    other = ortgen.load(folder, threads=1)
    assert other.model.signature.head_dim == gen.model.signature.head_dim
    assert other.model.signature.num_kv_heads == gen.model.signature.num_kv_heads
    out = other.generate(PROMPTS[0], max_new_tokens=NEW, eos_token_id=None)
    assert out.tokens[0] == _hf_greedy(hf, PROMPTS[0])
    (folder / "genai_config.json").unlink()  # nothing left to say what the head size is
    shutil.copyfile(gen.path / "config.json", folder / "config.json")
    with pytest.raises(ortgen.ModelLoadError, match="not fixed in the graph"):
        ortgen.load(folder, threads=1)
