"""The ``sliding_window`` KV cache.

Exact where it should be (a Mistral-style model that declares the window, against
transformers' own sliding-window generate), equal to the full cache while the window
holds everything, flat in memory past the window, and on fused graphs a correct
re-rotation of the keys it moves back (checked against keys computed at the new
positions).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import ortgen
from ortgen import ConfigError
from ortgen.plugins._rope import KeyShifter, inverse_frequencies
from tests.tiny_models import SLIDING_WINDOW, export_tiny, hf_greedy

PROMPTS = [[1, 5, 9, 33, 70, 12, 40, 41, 42, 43, 44, 45], [1, 44, 3], [1, 100, 101, 102, 103]]


@pytest.fixture(scope="module")
def mistral(tiny_root: Path):
    """(transformers model, ortgen generator): a tiny Mistral with an 8-position window."""
    from transformers import AutoModelForCausalLM

    out = export_tiny("mistral", tiny_root / "window")
    hf = AutoModelForCausalLM.from_pretrained(tiny_root / "window" / "mistral-hf").eval()
    return hf, ortgen.load(out, threads=1)


def _greedy(gen, prompts, new: int, cache) -> list[list[int]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = gen.generate(
            prompts, max_new_tokens=new, do_sample=False, eos_token_id=None, cache=cache
        )
    return out.tokens


def test_declared_window_is_exact_against_transformers(mistral) -> None:
    hf, gen = mistral
    assert gen.model.config["sliding_window"] == SLIDING_WINDOW
    expected = [hf_greedy(hf, p, 30) for p in PROMPTS]
    assert _greedy(gen, PROMPTS, 30, "sliding_window") == expected  # a padded batch
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        assert _greedy(gen, prompt, 30, {"name": "sliding_window"}) == [tokens]


def test_declared_window_holds_window_minus_one_positions(mistral) -> None:
    _hf, gen = mistral
    state = gen.start(PROMPTS[0], max_new_tokens=40, eos_token_id=None, cache="sliding_window")
    cache = state.chain.cache
    assert cache.exact
    sizes = []
    while not state.is_done:
        state.step()
        sizes.append(cache.nbytes)
    assert len(set(sizes)) == 1, "memory must stay flat"
    sig = gen.model.signature
    per_position = len(sig.past_inputs) * sig.num_kv_heads * sig.head_dim * 4
    assert sizes[0] == (SLIDING_WINDOW - 1) * per_position
    assert cache.length == len(PROMPTS[0]) + 39


def test_a_window_that_holds_everything_equals_the_full_cache(tiny_model_dirs, fused_model_dirs):
    for folder in (tiny_model_dirs["llama"][1], fused_model_dirs["llama"][1]):
        gen = ortgen.load(folder, threads=1)
        full = _greedy(gen, PROMPTS, 20, None)
        big = {"name": "sliding_window", "window": 64, "sink": 4}
        assert _greedy(gen, PROMPTS, 20, big) == full, folder


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_a_small_window_changes_output_and_keeps_memory_flat(
    graph, tiny_model_dirs, fused_model_dirs
) -> None:
    folder = (tiny_model_dirs if graph == "optimum" else fused_model_dirs)["llama"][1]
    gen = ortgen.load(folder, threads=1)
    spec = {"name": "sliding_window", "window": 6, "sink": 2}
    with pytest.warns(UserWarning, match="approximates full attention"):
        state = gen.start(PROMPTS[0], max_new_tokens=40, eos_token_id=None, cache=spec)
    sizes = set()
    while not state.is_done:
        state.step()
        sizes.add(state.chain.cache.nbytes)
    assert len(sizes) == 1
    sig = gen.model.signature
    per_position = len(sig.past_inputs) * sig.num_kv_heads * sig.head_dim * 4
    assert sizes.pop() <= (6 + 2) * per_position
    assert state.generated(0) != _greedy(gen, PROMPTS[0], 40, None)[0]


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_rows_of_a_batch_equal_each_row_alone(graph, tiny_model_dirs, fused_model_dirs) -> None:
    folder = (tiny_model_dirs if graph == "optimum" else fused_model_dirs)["llama"][1]
    gen = ortgen.load(folder, threads=1)
    spec = {"name": "sliding_window", "window": 6, "sink": 2}
    batch = _greedy(gen, PROMPTS, 25, spec)
    assert batch == [_greedy(gen, p, 25, spec)[0] for p in PROMPTS]


def test_moved_keys_equal_keys_computed_at_the_new_positions(fused_model_dirs) -> None:
    """Layer 0's keys depend only on the token and its position: keys of tokens 3..9
    computed at positions 3..9 and moved back 3 equal the same tokens prefilled at 0..6."""
    gen = ortgen.load(fused_model_dirs["llama"][1], threads=1)
    tokens = [1, 17, 99, 23, 54, 201, 7, 8, 150, 42]

    def layer0_keys(ids: list[int]) -> np.ndarray:
        state = gen.start(ids, max_new_tokens=1, cache="static")
        state.step()
        return state.chain.cache._array(0)[0, :, : len(ids)].copy()

    moved = layer0_keys(tokens)[:, 3:]
    assert not np.allclose(moved, layer0_keys(tokens[3:]), atol=1e-3)  # positions matter
    inv_freq = inverse_frequencies(gen.model.config, gen.model.signature.head_dim)
    KeyShifter(inv_freq, np.dtype(np.float32)).shift_back(moved, 3)
    np.testing.assert_allclose(moved, layer0_keys(tokens[3:]), atol=2e-5)


def test_fused_window_generates_past_the_trained_context(fused_model_dirs) -> None:
    gen = ortgen.load(fused_model_dirs["llama"][1], threads=1)
    context = gen.model.max_context
    spec = {"name": "sliding_window", "window": 16, "sink": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = gen.generate(PROMPTS[1], max_new_tokens=context + 20, eos_token_id=None, cache=spec)
    assert len(out.tokens[0]) == context + 20
    capped = gen.generate(PROMPTS[1], max_new_tokens=context + 20, eos_token_id=None)
    assert len(capped.tokens[0]) == context - len(PROMPTS[1])  # the full cache stops there


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_rewind_inside_the_window_and_refusal_past_it(
    graph, tiny_model_dirs, fused_model_dirs
) -> None:
    folder = (tiny_model_dirs if graph == "optimum" else fused_model_dirs)["llama"][1]
    gen = ortgen.load(folder, threads=1)
    spec = {"name": "sliding_window", "window": 32}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = gen.start(PROMPTS[1], max_new_tokens=10, eos_token_id=None, cache=spec)
        for _ in range(6):
            state.step()
        state.rewind(3)
        while not state.is_done:
            state.step()
        assert state.generated(0) == _greedy(gen, PROMPTS[1], 10, spec)[0]

        small = {"name": "sliding_window", "window": 4}
        state = gen.start(PROMPTS[0], max_new_tokens=10, eos_token_id=None, cache=small)
        for _ in range(6):
            state.step()
        with pytest.raises(ortgen.ComponentError, match="past positions it already dropped"):
            state.rewind(3)


@pytest.mark.parametrize("graph", ["optimum", "fused"])
def test_beam_search_with_a_window_that_holds_everything(
    graph, tiny_model_dirs, fused_model_dirs
) -> None:
    folder = (tiny_model_dirs if graph == "optimum" else fused_model_dirs)["llama"][1]
    gen = ortgen.load(folder, threads=1)
    settings = dict(max_new_tokens=12, num_beams=3, num_return_sequences=2, eos_token_id=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        windowed = gen.generate(
            PROMPTS[0], cache={"name": "sliding_window", "window": 64}, **settings
        )
    assert windowed.tokens == gen.generate(PROMPTS[0], **settings).tokens


def test_bad_parameters_name_the_problem(tiny_llama_gen) -> None:
    with pytest.raises(ConfigError, match="window is required"):
        tiny_llama_gen.generate([1, 2], cache="sliding_window")
    with pytest.raises(ConfigError, match="window must be an integer of at least 2"):
        tiny_llama_gen.generate([1, 2], cache={"name": "sliding_window", "window": 1})
    with pytest.raises(ConfigError, match="sink must be a non-negative integer"):
        tiny_llama_gen.generate([1, 2], cache={"name": "sliding_window", "window": 8, "sink": -1})
    with pytest.raises(ConfigError, match="unexpected 'size'"):
        tiny_llama_gen.generate([1, 2], cache={"name": "sliding_window", "size": 8})


def test_rope_types_that_depend_on_length_are_refused() -> None:
    config = {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    with pytest.raises(ValueError, match="depends on the sequence length"):
        inverse_frequencies(config, 64)


def test_llama3_frequencies_match_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    }  # fmt: skip
    config = LlamaConfig(hidden_size=2048, num_attention_heads=32, rope_scaling=scaling)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = inverse_frequencies(config.to_dict(), 64)
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6)
