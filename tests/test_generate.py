"""The loop against transformers' PyTorch ``generate`` on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ortgen
from tests.tiny_models import PAD_ID

PROMPTS = [[5, 17, 42, 99, 3, 64], [7, 8], [200, 13, 55, 1, 9, 9, 9, 31, 77]]


def hf_greedy(hf, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_transformers(models, prompt):
    hf, gen = models
    expected = hf_greedy(hf, prompt, 24, eos=None)
    out = gen.generate(prompt, max_new_tokens=24, eos_token_id=None)
    assert out.tokens == [expected]
    assert out.finish_reasons == ["length"]
    assert len(set(expected)) > 3, "tiny model degenerate: the test would prove little"


def test_greedy_stops_at_eos_like_transformers(models):
    hf, gen = models
    prompt = PROMPTS[0]
    free = hf_greedy(hf, prompt, 16, eos=None)
    eos = free[5]  # a token greedy reaches at step 6 (or earlier)
    expected = hf_greedy(hf, prompt, 16, eos=eos)
    out = gen.generate(prompt, max_new_tokens=16, eos_token_id=eos)
    assert out.tokens == [expected]
    assert out.tokens[0][-1] == eos and out.finish_reasons == ["eos"]


def test_batch_rows_equal_single_prompts(models):
    hf, gen = models
    out = gen.generate(PROMPTS, max_new_tokens=12, eos_token_id=None)
    for row, prompt in enumerate(PROMPTS):
        assert out.tokens[row] == hf_greedy(hf, prompt, 12, eos=None), f"row {row}"
    width = max(map(len, PROMPTS)) + 12
    assert out.sequences.shape == (3, width)
    # row 1's 2-token prompt is left-padded with the model's pad id (tiny models: 0)
    assert out.sequences[1, : width - 12].tolist() == [PAD_ID] * (width - 14) + PROMPTS[1]


def test_batch_rows_finish_independently(models):
    hf, gen = models
    free = [hf_greedy(hf, p, 10, eos=None) for p in PROMPTS]
    eos = free[1][2]
    out = gen.generate(PROMPTS, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    for row, prompt in enumerate(PROMPTS):
        assert out.tokens[row] == hf_greedy(hf, prompt, 10, eos=eos)
    assert out.finish_reasons[1] == "eos"
    # finished rows are padded in `sequences`, as Hugging Face does
    finished_len = len(out.tokens[1])
    tail = out.sequences[1, out.sequences.shape[1] - 10 + finished_len :]
    assert (tail == 0).all()


def test_cached_path_equals_full_recomputation(models):
    """Each decode step with the cache gives the logits of a from-scratch forward."""
    _, gen = models
    model = gen.model
    prompt = np.array([PROMPTS[2]], dtype=np.int64)
    out = gen.generate(prompt, max_new_tokens=8, eos_token_id=None)
    full = out.sequences
    empty = {
        n: np.zeros((1, model.signature.num_kv_heads, 0, model.signature.head_dim), np.float32)
        for n in model.signature.past_inputs
    }
    mask = np.ones_like(full)
    positions = np.arange(full.shape[1])[None]
    logits, _ = model.forward(full, mask, positions, empty)
    recomputed = logits[0, prompt.shape[1] - 1 : -1].argmax(-1)
    assert recomputed.tolist() == out.tokens[0]


def test_seeded_sampling_reproduces(models):
    _, gen = models
    kwargs = dict(max_new_tokens=16, do_sample=True, temperature=1.5, top_k=0, eos_token_id=None)
    a = gen.generate(PROMPTS[0], seed=7, **kwargs).tokens
    b = gen.generate(PROMPTS[0], seed=7, **kwargs).tokens
    c = gen.generate(PROMPTS[0], seed=8, **kwargs).tokens
    assert a == b
    assert a != c


def test_step_object_rewind_and_append(models):
    _, gen = models
    reference = gen.generate(PROMPTS[0], max_new_tokens=6, eos_token_id=None).tokens[0]
    state = gen.start(PROMPTS[0], max_new_tokens=6, eos_token_id=None)
    first = [int(state.step().ids[0]) for _ in range(4)]
    state.rewind(2)
    again = [int(state.step().ids[0]) for _ in range(2)]
    assert first == reference[:4] and again == reference[2:4]
    state.append([[3, 4]])
    nxt = int(state.step().ids[0])
    full = gen.generate(PROMPTS[0] + reference[:4] + [3, 4], max_new_tokens=1, eos_token_id=None)
    assert nxt == full.tokens[0][0]


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_chunked_prefill_equals_one_forward(models, chunk):
    """Prompts fed in chunks through the cache give the same tokens (batch with padding)."""
    hf, gen = models
    state = gen.start(PROMPTS, max_new_tokens=10, eos_token_id=None)
    state.prefill_chunk = chunk
    while not state.is_done:
        state.step()
    for row, prompt in enumerate(PROMPTS):
        assert state.generated(row) == hf_greedy(hf, prompt, 10, eos=None), f"row {row}"


def test_num_return_sequences_expands_each_prompt(models):
    _, gen = models
    kwargs = dict(max_new_tokens=8, eos_token_id=None, do_sample=True, top_k=0, seed=3)
    out = gen.generate([PROMPTS[0], PROMPTS[1]], num_return_sequences=3, **kwargs)
    assert out.sequences.shape[0] == 6 and len(out.tokens) == 6
    # rows 0-2 continue PROMPTS[0], rows 3-5 PROMPTS[1]
    width = out.sequences.shape[1] - 8
    assert all(
        out.sequences[r, width - len(PROMPTS[0]) : width].tolist() == PROMPTS[0] for r in range(3)
    )
    assert all(
        out.sequences[r, width - len(PROMPTS[1]) : width].tolist() == PROMPTS[1]
        for r in range(3, 6)
    )
    assert len({tuple(t) for t in out.tokens[:3]}) > 1, "sampled rows should differ"


def hf_batch(hf, prompts: list[list[int]], max_new_tokens: int, eos, pad: int) -> np.ndarray:
    """transformers' batched greedy generate on left-padded prompts: (B, T) sequences."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    return out.numpy()


@pytest.mark.parametrize("pad", [0, 5])
def test_batch_sequences_equal_transformers_padded_batch(models, pad):
    """The whole (B, T) array, prompt padding and post-EOS padding included, equals
    transformers' batched generate with the same pad id."""
    hf, gen = models
    free = [hf_greedy(hf, p, 10, eos=None) for p in PROMPTS]
    eos = free[1][2]  # row 1 finishes early; the others may too
    expected = hf_batch(hf, PROMPTS, 10, eos=eos, pad=pad)
    out = gen.generate(PROMPTS, max_new_tokens=10, eos_token_id=eos, pad_token_id=pad)
    assert out.finish_reasons[1] == "eos"
    width = max(map(len, PROMPTS))
    assert out.sequences[1, : width - 2].tolist() == [pad] * (width - 2)
    assert out.sequences[1, width + len(out.tokens[1]) :].tolist() == [pad] * (
        out.sequences.shape[1] - width - len(out.tokens[1])
    )
    np.testing.assert_array_equal(out.sequences, expected[:, : out.sequences.shape[1]])
    assert expected.shape[1] == out.sequences.shape[1]


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_step_after_force_says_what_to_do(graph, tiny_model_dirs, fused_model_dirs) -> None:
    """force() feeds every token it writes, so no newest token is left for step() to
    feed: a clear InputError, not onnxruntime's shape error from an empty forward."""
    dirs = tiny_model_dirs if graph == "optimum" else fused_model_dirs
    gen = ortgen.load(dirs["llama"][1], threads=1)
    state = gen.start([[5, 6, 7, 8]], max_new_tokens=3, eos_token_id=None)
    state.force([9])
    with pytest.raises(ortgen.InputError, match="step\\(\\) after force\\(\\)"):
        state.step()
    state.append([[10]])  # a new token to feed: stepping goes on
    assert len(state.step().ids) == 1
